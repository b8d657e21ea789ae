// Package kernels holds cortiq's CPU compute kernels: matrix-vector and
// matrix-matrix products over weights stored in any CMF format (read in
// place from the memory-mapped file, never decoded up front), a persistent
// worker pool that runs them over contiguous row blocks, and the
// elementwise operations of a transformer (RMSNorm, RoPE, softmax, SiLU).
//
// The per-format row kernels live in one table (kernelFor, dot.go) with
// quant.Codec.DotRow as the plain reference beside each; the tests compare
// the two on random inputs.
//
// On amd64 the table's entries are replaced once at start by assembly
// kernels for the best instruction set the CPU has (ISA(): "avx512" with
// VNNI, "avx2", or the plain Go "generic"; build tag purego forces the
// latter). The quantized formats then run on int8 activations
// (quantx.go): the input vector is quantized once per MatVec (and per
// position in MatMul) to blocks of 32 with a float32 scale, and rows are
// dotted with VPDPBUSD (AVX2: VPMADDUBSW) in int32 and scaled per block,
// four rows per pass over the input, with software prefetches that walk
// the next rows linearly. The error this adds is bounded per row by
// Σ_blocks absmax/254·Σ|w| (tested). f32, f16 and bf16 weights keep
// float32 activations. Prefill (MatMul) unpacks each block of four rows
// once into an L1 scratch and runs every position over it. For 4 or more
// positions on AVX-512 (batched decode, prefill) the int8 formats unpack
// it transposed (rows of a multiple of 512 columns): each int32 lane then
// holds one block of 32 (q8: half a block) over 8 (q8: 4) VPDPBUSDs,
// so the block's sum is converted and scaled once instead of per
// VPDPBUSD or per two; the inputs are transposed alike once per tile
// (dot_amd64.s: q4tpMM4TXAVX512, q8MM4TAVX512).
package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/hugemem"
	"github.com/cortiq/cortiq/quant"
)

// Mat is a rows×cols weight matrix (y = W·x, W row-major [out, in]) viewed
// in place in its stored bytes: Data is the tensor's bytes in the CMF
// layout of DType (a slice of the model mapping). The kernels keep small
// side tables next to it (row scales, the q8_2f column field, q4tp
// ladders), built once by NewMat or on first use; the weights themselves
// are never copied or decoded up front.
//
// A Mat is used through a pointer and must not be copied after first use.
type Mat struct {
	DType      quant.DType
	Rows, Cols int
	Data       []byte

	once sync.Once
	err  error
	side
	keep *hugemem.Buf // the buffer Data lies in, when MoE.Pack copied it there
}

// side holds what the kernels derive from Data once.
type side struct {
	f32   []float32 // F32: Data viewed as float32
	u16   []uint16  // F16, BF16: Data viewed as uint16
	scale []float32 // Q8Row, Q82F: per-row scale; Q4TP: unused
	col   []float32 // Q82F: column field
	lad   []float32 // Q4TP: 32 rungs per row, built on first use (ladder)
	// Q4TP: the rows' ladder parameters (f16 a, b per row).
	params  []byte
	ladOnce sync.Once
	codes   []byte // Q4TP: code section (Q4TPCodeStride bytes per row)
	cstr    int    // Q4TP: code bytes per row
	// Q4TP: a copy of the codes of the rows from codesEnd0 on, followed by
	// 16 zero bytes, for kernels that read codes in 16-byte loads.
	codesEnd  []byte
	codesEnd0 int
}

// ladder returns the q4tp rungs of every row (32 per row), computed on
// first use: the AVX-512 kernels compute them on the fly from the ladder
// parameters instead of reading 128 bytes a row.
func (m *Mat) ladder() []float32 {
	m.ladOnce.Do(func() {
		lad := make([]float32, 32*m.Rows)
		for r := range m.Rows {
			a := half.F16ToF32(binary.LittleEndian.Uint16(m.params[4*r:]))
			b := half.F16ToF32(binary.LittleEndian.Uint16(m.params[4*r+2:]))
			l := lad[32*r : 32*r+32]
			for k := range l {
				e := a + float32(float32(k)*b) // as the codec: no FMA
				l[k] = float32(math.Exp2(float64(e)))
			}
		}
		m.lad = lad
	})
	return m.lad
}

// codePtr returns a pointer to row r's q4tp codes from which 16 bytes
// past the row's last code byte are readable.
func (m *Mat) codePtr(r int) *byte {
	if r >= m.codesEnd0 {
		return &m.codesEnd[(r-m.codesEnd0)*m.cstr]
	}
	return &m.codes[r*m.cstr]
}

// NewMat checks that data holds a rows×cols tensor of format d and
// prepares its side tables.
func NewMat(d quant.DType, rows, cols int, data []byte) (*Mat, error) {
	m := &Mat{DType: d, Rows: rows, Cols: cols, Data: data}
	if err := m.Prepare(); err != nil {
		return nil, err
	}
	return m, nil
}

// Prepare validates the matrix and builds its side tables; it runs once,
// and the kernels call it, so a Mat literal works too.
func (m *Mat) Prepare() error {
	m.once.Do(func() { m.err = m.prepare() })
	return m.err
}

// SideBytes returns the memory the side tables take (views excluded).
func (m *Mat) SideBytes() int64 {
	return int64(4 * (len(m.scale) + len(m.col) + len(m.lad)))
}

var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

func (m *Mat) prepare() error {
	if m.Rows <= 0 || m.Cols <= 0 {
		return fmt.Errorf("kernels: %s matrix %d×%d has no elements", m.DType, m.Rows, m.Cols)
	}
	if kernelFor(m.DType) == nil {
		return fmt.Errorf("kernels: no CPU kernel for format %s", m.DType)
	}
	want, err := quant.ExpectedBytes(m.DType, []int{m.Rows, m.Cols})
	if err != nil {
		return fmt.Errorf("kernels: %s %d×%d: %w", m.DType, m.Rows, m.Cols, err)
	}
	if int64(len(m.Data)) != want {
		return fmt.Errorf("kernels: %s %d×%d needs %d bytes, have %d", m.DType, m.Rows, m.Cols, want, len(m.Data))
	}
	if !littleEndian {
		return fmt.Errorf("kernels: big-endian hosts are not supported")
	}
	n := m.Rows * m.Cols
	switch m.DType {
	case quant.F32:
		if uintptr(unsafe.Pointer(&m.Data[0]))%4 != 0 {
			return fmt.Errorf("kernels: f32 data is not 4-byte aligned")
		}
		m.f32 = unsafe.Slice((*float32)(unsafe.Pointer(&m.Data[0])), n)
	case quant.F16, quant.BF16:
		if uintptr(unsafe.Pointer(&m.Data[0]))%2 != 0 {
			return fmt.Errorf("kernels: %s data is not 2-byte aligned", m.DType)
		}
		m.u16 = unsafe.Slice((*uint16)(unsafe.Pointer(&m.Data[0])), n)
	case quant.Q8Row, quant.Q82F:
		m.scale = make([]float32, m.Rows)
		for r := range m.scale {
			m.scale[r] = half.F16ToF32(binary.LittleEndian.Uint16(m.Data[n+2*r:]))
		}
		if m.DType == quant.Q82F {
			off := quant.Q82FColOffset(m.Rows, m.Cols)
			m.col = make([]float32, m.Cols)
			for i := range m.col {
				m.col[i] = math.Float32frombits(binary.LittleEndian.Uint32(m.Data[off+int64(4*i):]))
			}
		}
	case quant.Q4TP:
		gpr := m.Cols / quant.GroupSize
		po := m.Rows * gpr * 16
		m.cstr = quant.Q4TPCodeStride(m.Cols)
		m.codes = m.Data[po+4*m.Rows:]
		m.codesEnd0 = max(0, m.Rows-16/m.cstr-1)
		m.codesEnd = append(m.codes[m.codesEnd0*m.cstr:len(m.codes):len(m.codes)], make([]byte, 16)...)
		m.params = m.Data[po : po+4*m.Rows]
	}
	return nil
}

// Row decodes row r into dst[:Cols] (an embedding lookup).
func (m *Mat) Row(r int, dst []float32) {
	if err := m.Prepare(); err != nil {
		panic(err)
	}
	if r < 0 || r >= m.Rows {
		panic(fmt.Sprintf("kernels: row %d of a %d-row matrix", r, m.Rows))
	}
	d := dst[:m.Cols]
	post := kernelFor(m.DType).decode(m, r, d)
	switch {
	case m.col != nil:
		for i, c := range m.col {
			d[i] = d[i] * post * c
		}
	case post != 1:
		for i := range d {
			d[i] *= post
		}
	}
}
