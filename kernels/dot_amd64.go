//go:build amd64 && !purego

package kernels

import (
	"unsafe"

	"golang.org/x/sys/cpu"

	"github.com/cortiq/cortiq/quant"
)

// Assembly kernels (dot_amd64.s). Each reads exactly the rows it is given
// (tails through masked loads), the quantized input in full padded chunks
// (qbatch pads to qpad), and writes four float32 results.

// q8Dot4AVX512 sets out[4k+i] = scale[4k+i]·Σ_j w[(4k+i)·stride+j]·q[j]·d[j/32]
// over j < n for nq blocks of four int8 weight rows (stride 0: one row
// four times) and an input in qPlain layout (bias s = -128·Σq per block).
//
//go:noescape
func q8Dot4AVX512(w *byte, stride, n int, x *byte, d *float32, s *int32, nq int, scale, out *float32)

// q4row locates one q4tp row for the q4tp kernels.
type q4row struct {
	nib   *byte    // the row's nibbles
	codes *byte    // its codes; 16 bytes from each multiple of 10 below the code stride must be readable
	lad   *float32 // its 32 rungs: the AVX-512 kernels write them there from ab
	ab    *byte    // its ladder parameters (f16 a, b)
}

// q4rowAt returns row r of m for the AVX-512 kernels, its rungs to be
// computed into lad.
func q4rowAt(m *Mat, r int, lad *[32]float32) q4row {
	nb := m.Cols / 2
	return q4row{nib: &m.Data[r*nb], codes: m.codePtr(r), lad: &lad[0], ab: &m.params[4*r]}
}

// q4job is a run of blocks of four q4tp rows for q4tpQuadsAVX512.
type q4job struct {
	nib, codes, params *byte // row 0's nibbles, codes (readable as q4row.codes) and ladder parameters
	nstride, cstride   int   // bytes between rows' nibbles, codes
	quads              int   // blocks of four rows
	out                *float32
}

// q4tpQuadsAVX512 writes the q4tp dots of the job's 4·quads rows (gpr
// groups) with an input in qNib layout whose scales and biases are
// readable in whole multiples of 16 blocks to job.out.
//
//go:noescape
func q4tpQuadsAVX512(job *q4job, gpr int, x *byte, d *float32, s *int32)

// quantizeAVX512 is quantizeRowGo for n values (qNib when nib) with bias
// shift shift, writing only the blocks.
//
//go:noescape
func quantizeAVX512(x *float32, n int, q *byte, d *float32, s *int32, shift int, nib bool)

func bestISA() isaLevel {
	x := &cpu.X86
	switch {
	// Ice Lake, Zen 4 and later; Cascade Lake (VNNI without GFNI) runs
	// the AVX2 kernels.
	case x.HasAVX512F && x.HasAVX512BW && x.HasAVX512DQ && x.HasAVX512VL && x.HasAVX512VNNI && x.HasAVX512GFNI:
		return isaAVX512
	case x.HasAVX2 && x.HasFMA && x.HasF16C:
		return isaAVX2
	}
	return isaGeneric
}

func installISA(l isaLevel) {
	if l < isaAVX2 {
		return
	}
	if l == isaAVX2 {
		installAVX2()
		return
	}
	quantizeRow = quantizeRowAVX512
	dot4f = dot4AVX512
	dotVec, axpyVec, siluMulVec, expSumVec = dotOpAVX512, axpyOpAVX512, siluMulOpAVX512, expSumOpAVX512
	streamVec = streamOpAVX512
	kernelTable[quant.F32].dot, kernelTable[quant.F32].dot4 = dotF32AVX512, dot4F32AVX512
	kernelTable[quant.F16].dot, kernelTable[quant.F16].dot4 = dotF16AVX512, dot4F16AVX512
	kernelTable[quant.BF16].dot, kernelTable[quant.BF16].dot4 = dotBF16AVX512, dot4BF16AVX512
	for _, d := range []quant.DType{quant.Q8Row, quant.Q82F} {
		kernelTable[d].qx, kernelTable[d].qrows = qPlain, q8RowsAVX512
		kernelTable[d].qmm = q8MatMulAVX512
	}
	kernelTable[quant.Q4TP].qx, kernelTable[quant.Q4TP].qrows = qNib, q4tpRowsAVX512
	kernelTable[quant.Q4TP].qmm = q4tpMatMulAVX512
}

func quantizeRowAVX512(x []float32, v qvec, l qlayout) {
	if len(x) == 0 {
		return
	}
	nb := (len(x) + qblock - 1) / qblock
	_, _, _ = v.q[nb*qblock-1], v.d[nb-1], v.s[nb-1]
	quantizeAVX512(&x[0], len(x), &v.q[0], &v.d[0], &v.s[0], int(l.biasShift()), l == qNib)
}

// q8RowsAVX512 sets y[lo:hi] for q8_row and q8_2f (x quantized from the
// prescaled input).
func q8RowsAVX512(m *Mat, lo, hi int, x qvec, y []float32) {
	c := m.Cols
	_, _, _ = x.q[(c+63)/64*64-1], x.d[(c+63)/64*2-1], x.s[(c+63)/64*2-1]
	_, _, _ = m.Data[hi*c-1], m.scale[hi-1], y[:hi] // slice, not load: workers write y
	if nq := (hi - lo) / 4; nq > 0 {
		q8Dot4AVX512(&m.Data[lo*c], c, c, &x.q[0], &x.d[0], &x.s[0], nq, &m.scale[lo], &y[lo])
		lo += 4 * nq
	}
	for r := lo; r < hi; r++ {
		var out [4]float32
		sc := [4]float32{m.scale[r], m.scale[r], m.scale[r], m.scale[r]}
		q8Dot4AVX512(&m.Data[r*c], 0, c, &x.q[0], &x.d[0], &x.s[0], 1, &sc[0], &out[0])
		y[r] = out[0]
	}
}

// q4tpRowsAVX512 sets y[lo:hi] for q4tp: runs of four-row blocks in one
// call, the rows near the matrix's end (codes read from the padded copy)
// in their own.
func q4tpRowsAVX512(m *Mat, lo, hi int, x qvec, y []float32) {
	gpr := m.Cols / quant.GroupSize
	nb, cs := 16*gpr, m.cstr
	_, _, _ = x.q[(gpr+3)/4*128-1], x.d[(gpr+15)/16*16-1], x.s[(gpr+15)/16*16-1]
	_, _, _ = m.Data[hi*nb-1], m.params[4*hi-1], y[:hi]
	for r := lo; r < hi; {
		end := hi
		if r < m.codesEnd0 {
			end = min(hi, m.codesEnd0)
		}
		if nq := (end - r) / 4; nq > 0 {
			job := q4job{nib: &m.Data[r*nb], codes: m.codePtr(r), params: &m.params[4*r], nstride: nb, cstride: cs, quads: nq, out: &y[r]}
			q4tpQuadsAVX512(&job, gpr, &x.q[0], &x.d[0], &x.s[0])
			r += 4 * nq
			continue
		}
		var out [4]float32
		job := q4job{nib: &m.Data[r*nb], codes: m.codePtr(r), params: &m.params[4*r], quads: 1, out: &out[0]}
		q4tpQuadsAVX512(&job, gpr, &x.q[0], &x.d[0], &x.s[0])
		y[r] = out[0]
		r++
	}
}

// streamAVX512 reads n bytes (a multiple of 256) and returns a checksum.
//
//go:noescape
func streamAVX512(p *byte, n int) uint64

// q4tpUnpack4AVX512 writes rows' nibbles and rungs into dst in the scratch
// layout of q4tpMM4AVX512 (q4tpScratchBytes(gpr) bytes).
//
//go:noescape
func q4tpUnpack4AVX512(rows *[4]q4row, gpr int, dst *byte)

// q4tpMM4AVX512 writes, for npos positions, the four dots of the unpacked
// rows in w with the position's input (at x + j·xstride, scales and biases
// at d and s + j·bstride bytes) to out + j·ostride bytes.
//
//go:noescape
func q4tpMM4AVX512(w *byte, gpr int, x *byte, xstride int, d *float32, s *int32, bstride, npos int, out *float32, ostride int)

// q4tpScratchBytes is the size of an unpacked block of four rows.
func q4tpScratchBytes(gpr int) int { return (gpr+3)/4*512 + (gpr+15)/16*256 }

// q4tpUnpack4TAVX512 is q4tpUnpack4AVX512 in the transposed layout of
// q4tpMM4TXAVX512 (gpr a multiple of 16, q4tpScratchTBytes(gpr) bytes).
//
//go:noescape
func q4tpUnpack4TAVX512(rows *[4]q4row, gpr int, dst *byte)

// q4tpXposeAVX512 writes one input of nsc·16 groups in qNib layout (x, d,
// s) transposed for q4tpMM4TXAVX512 to dst (nsc·640 bytes: the inputs,
// then the scales, then the biases, each 16 groups in lanesT order).
//
//go:noescape
func q4tpXposeAVX512(x *byte, d *float32, s *int32, nsc int, dst *byte)

// q4tpMM4TXAVX512 is q4tpMM4AVX512 for a block unpacked by
// q4tpUnpack4TAVX512 and inputs transposed by q4tpXposeAVX512 (d and s
// pointing at their scales and biases): one int32 lane per group and
// position collects the group's 32 products, so each group is converted
// and scaled once (8 VPDPBUSDs per conversion instead of 2). Along the
// way it prefetches the pfn bytes at pf into L2 (the next block's
// weights: spread over the loop, they arrive while it computes). With
// add it adds its dots to out (a later part of the rows' columns).
//
//go:noescape
func q4tpMM4TXAVX512(w *byte, gpr int, x *byte, xstride int, d *float32, s *int32, bstride, npos int, out *float32, ostride int, pf *byte, pfn int, add bool)

// q4tpScratchTBytes is the size of a transposed block of four rows.
func q4tpScratchTBytes(gpr int) int { return gpr / 16 * 2304 }

// q4tpSplitGroups is the most groups of a row the transposed q4tp MatMul
// runs over at once: longer rows go in parts (their sums added up), so
// that a block's unpacked part and a tile's inputs of it stay in L1.
const q4tpSplitGroups = 64

// q4tpMatMulTAVX512 is q4tpMatMulAVX512 through the transposed kernels:
// the worker transposes each tile's inputs once (a few µs), then every
// block of four rows is unpacked transposed, q4tpSplitGroups groups at a
// time, and run over the tile.
func q4tpMatMulTAVX512(m *Mat, lo, hi int, x *qbatch, y []float32, scratch *[]byte) {
	gpr := m.Cols / quant.GroupSize
	nb, nsc := 16*gpr, gpr/16
	rows, n := m.Rows, x.n
	xs := 640 * nsc // one transposed position
	tile := max(1, mmTileBytes/xs)
	kg := min(gpr, q4tpSplitGroups)
	parts := (gpr + kg - 1) / kg
	wb := q4tpScratchTBytes(kg)
	need := wb + min(tile, n)*xs
	if cap(*scratch) < need {
		*scratch = make([]byte, need)
	}
	buf := (*scratch)[:need]
	_, _, _ = x.q[n*x.qstride-1], x.d[n*x.bstride-1], x.s[n*x.bstride-1]
	_, _ = m.Data[hi*nb-1], y[:n*rows]
	xt := buf[wb:]
	var rs [4]q4row
	var lad [4][32]float32
	for j0 := 0; j0 < n; j0 += tile {
		nt := min(tile, n-j0)
		for j := range nt {
			v := x.pos(j0 + j)
			q4tpXposeAVX512(&v.q[0], &v.d[0], &v.s[0], nsc, &xt[j*xs])
		}
		r := lo
		for ; r+4 <= hi; r += 4 {
			// The next block's weights, a share per part.
			next, share := 0, 0
			if (r+8)*nb <= len(m.Data) {
				next, share = (r+4)*nb, 4*nb/parts/64*64
			}
			for p := range parts {
				g0 := p * kg
				gn := min(kg, gpr-g0)
				for i := range rs {
					rs[i] = q4rowAt(m, r+i, &lad[i])
					rs[i].nib = &m.Data[(r+i)*nb+16*g0]
					rs[i].codes = (*byte)(unsafe.Add(unsafe.Pointer(rs[i].codes), 10*(g0/16)))
				}
				q4tpUnpack4TAVX512(&rs, gn, &buf[0])
				pf, pfn := &m.Data[next+p*share], share
				if share > 0 && p == parts-1 {
					pfn = 4*nb - p*share
				}
				d := (*float32)(unsafe.Pointer(&xt[512*nsc+4*g0]))
				s := (*int32)(unsafe.Pointer(&xt[576*nsc+4*g0]))
				q4tpMM4TXAVX512(&buf[0], gn, &xt[32*g0], xs, d, s, xs, nt, &y[j0*rows+r], 4*rows, pf, pfn, p > 0)
			}
		}
		if r < hi {
			for j := j0; j < j0+nt; j++ {
				q4tpRowsAVX512(m, r, hi, x.pos(j), y[j*rows:(j+1)*rows])
			}
		}
	}
}

// q4tpTransposed says whether MatMul runs the transposed kernels on rows
// of gpr groups for n positions (a variable so tests and benchmarks can
// run the other pair as well). Their unpacking costs more (a transpose
// per 16 groups), which 2 positions do not repay.
var q4tpTransposed = func(gpr, n int) bool { return gpr%16 == 0 && n >= 4 }

// mmTileBytes bounds the quantized inputs one pass over a row block
// reads, so that they stay in L2.
const mmTileBytes = 256 << 10

// q4tpMatMulAVX512 sets Y[j·Rows+r] for rows [lo, hi) and every position
// of x: each block of four rows is unpacked once per tile of positions.
func q4tpMatMulAVX512(m *Mat, lo, hi int, x *qbatch, y []float32, scratch *[]byte) {
	gpr := m.Cols / quant.GroupSize
	nb := 16 * gpr
	rows, n := m.Rows, x.n
	if q4tpTransposed(gpr, n) {
		q4tpMatMulTAVX512(m, lo, hi, x, y, scratch)
		return
	}
	need := q4tpScratchBytes(gpr)
	if cap(*scratch) < need {
		*scratch = make([]byte, need)
	}
	buf := (*scratch)[:need]
	_, _, _ = x.q[n*x.qstride-1], x.d[n*x.bstride-1], x.s[n*x.bstride-1]
	_, _ = m.Data[hi*nb-1], y[:n*rows]
	tile := max(1, mmTileBytes/x.qstride)
	var rs [4]q4row
	var lad [4][32]float32
	for j0 := 0; j0 < n; j0 += tile {
		nt := min(tile, n-j0)
		r := lo
		for ; r+4 <= hi; r += 4 {
			for i := range rs {
				rs[i] = q4rowAt(m, r+i, &lad[i])
			}
			q4tpUnpack4AVX512(&rs, gpr, &buf[0])
			if (r+8)*nb <= len(m.Data) {
				// The next block's nibbles arrive while this one runs.
				prefetchL2(&m.Data[(r+4)*nb], 4*nb)
			}
			q4tpMM4AVX512(&buf[0], gpr, &x.q[j0*x.qstride], x.qstride, &x.d[j0*x.bstride], &x.s[j0*x.bstride], 4*x.bstride, nt, &y[j0*rows+r], 4*rows)
		}
		if r < hi {
			for j := j0; j < j0+nt; j++ {
				q4tpRowsAVX512(m, r, hi, x.pos(j), y[j*rows:(j+1)*rows])
			}
		}
	}
}

// f32Dot4AVX512, f16Dot4AVX512 and bf16Dot4AVX512 set out[i] to the dot
// of the n-element row at w + i·stride bytes (stride 0: one row) with x.
//
//go:noescape
func f32Dot4AVX512(w *float32, stride, n int, x *float32, out *[4]float32)

//go:noescape
func f16Dot4AVX512(w *uint16, stride, n int, x *float32, out *[4]float32)

//go:noescape
func bf16Dot4AVX512(w *uint16, stride, n int, x *float32, out *[4]float32)

func dotF32AVX512(m *Mat, r int, x []float32) float32 {
	c := m.Cols
	_, _ = m.f32[(r+1)*c-1], x[c-1]
	var out [4]float32
	f32Dot4AVX512(&m.f32[r*c], 0, c, &x[0], &out)
	return out[0]
}

func dot4F32AVX512(m *Mat, r int, x []float32) (float32, float32, float32, float32) {
	c := m.Cols
	_, _ = m.f32[(r+4)*c-1], x[c-1]
	var out [4]float32
	f32Dot4AVX512(&m.f32[r*c], 4*c, c, &x[0], &out)
	return out[0], out[1], out[2], out[3]
}

func dotF16AVX512(m *Mat, r int, x []float32) float32 {
	c := m.Cols
	_, _ = m.u16[(r+1)*c-1], x[c-1]
	var out [4]float32
	f16Dot4AVX512(&m.u16[r*c], 0, c, &x[0], &out)
	return out[0]
}

func dot4F16AVX512(m *Mat, r int, x []float32) (float32, float32, float32, float32) {
	c := m.Cols
	_, _ = m.u16[(r+4)*c-1], x[c-1]
	var out [4]float32
	f16Dot4AVX512(&m.u16[r*c], 2*c, c, &x[0], &out)
	return out[0], out[1], out[2], out[3]
}

func dotBF16AVX512(m *Mat, r int, x []float32) float32 {
	c := m.Cols
	_, _ = m.u16[(r+1)*c-1], x[c-1]
	var out [4]float32
	bf16Dot4AVX512(&m.u16[r*c], 0, c, &x[0], &out)
	return out[0]
}

func dot4BF16AVX512(m *Mat, r int, x []float32) (float32, float32, float32, float32) {
	c := m.Cols
	_, _ = m.u16[(r+4)*c-1], x[c-1]
	var out [4]float32
	bf16Dot4AVX512(&m.u16[r*c], 2*c, c, &x[0], &out)
	return out[0], out[1], out[2], out[3]
}

// dot4AVX512 is dot4 (MatMul's inner kernel over decoded rows) when the
// four rows lie one after another, as MatMul's scratch does.
func dot4AVX512(w0, w1, w2, w3, x []float32) (float32, float32, float32, float32) {
	n := len(x)
	if n == 0 || len(w0) < n || len(w1) < n || len(w2) < n || len(w3) < n {
		return dot4(w0, w1, w2, w3, x)
	}
	p0 := uintptr(unsafe.Pointer(&w0[0]))
	if uintptr(unsafe.Pointer(&w1[0])) != p0+uintptr(4*n) || uintptr(unsafe.Pointer(&w2[0])) != p0+uintptr(8*n) || uintptr(unsafe.Pointer(&w3[0])) != p0+uintptr(12*n) {
		return dot4(w0, w1, w2, w3, x)
	}
	var out [4]float32
	f32Dot4AVX512(&w0[0], 4*n, n, &x[0], &out)
	return out[0], out[1], out[2], out[3]
}

// prefetchL2 prefetches the n bytes at p into L2.
//
//go:noescape
func prefetchL2(p *byte, n int)

// q8Unpack4AVX512 copies the four n-column rows at w (stride bytes apart)
// into dst for q8MM4AVX512: per 64 columns, the four rows' bytes with the
// top bit flipped (zero weights past n); ⌈n/64⌉·256 bytes.
//
//go:noescape
func q8Unpack4AVX512(w *byte, stride, n int, dst *byte)

// q8MM4AVX512 is q4tpMM4AVX512 for an unpacked q8 block of chunks
// 64-column chunks, the results multiplied by the rows' scales.
//
//go:noescape
func q8MM4AVX512(w *byte, chunks int, x *byte, xstride int, d *float32, s *int32, bstride, npos int, out *float32, ostride int, scale *[4]float32)

// q8MatMulAVX512 sets Y[j·Rows+r] for rows [lo, hi) and every position of
// x (q8_row, q8_2f): each block of four rows is unpacked once per tile of
// positions.
func q8MatMulAVX512(m *Mat, lo, hi int, x *qbatch, y []float32, scratch *[]byte) {
	c := m.Cols
	if q8Transposed(c, x.n) {
		q8MatMulTAVX512(m, lo, hi, x, y, scratch)
		return
	}
	chunks := (c + 63) / 64
	rows, n := m.Rows, x.n
	need := 256 * chunks
	if cap(*scratch) < need {
		*scratch = make([]byte, need)
	}
	buf := (*scratch)[:need]
	_, _, _ = x.q[n*x.qstride-1], x.d[n*x.bstride-1], x.s[n*x.bstride-1]
	_, _, _ = m.Data[hi*c-1], m.scale[hi-1], y[:n*rows]
	tile := max(1, mmTileBytes/x.qstride)
	var sc [4]float32
	for j0 := 0; j0 < n; j0 += tile {
		nt := min(tile, n-j0)
		r := lo
		for ; r+4 <= hi; r += 4 {
			q8Unpack4AVX512(&m.Data[r*c], c, c, &buf[0])
			if (r+8)*c <= len(m.Data) {
				prefetchL2(&m.Data[(r+4)*c], 4*c)
			}
			copy(sc[:], m.scale[r:r+4])
			q8MM4AVX512(&buf[0], chunks, &x.q[j0*x.qstride], x.qstride, &x.d[j0*x.bstride], &x.s[j0*x.bstride], 4*x.bstride, nt, &y[j0*rows+r], 4*rows, &sc)
		}
		if r < hi {
			for j := j0; j < j0+nt; j++ {
				q8RowsAVX512(m, r, hi, x.pos(j), y[j*rows:(j+1)*rows])
			}
		}
	}
}

// q8Unpack4TAVX512 writes the four rows at w (stride bytes apart) of sb
// 512-column blocks, top bits flipped, transposed for q8MM4TAVX512 to dst
// (2048·sb bytes).
//
//go:noescape
func q8Unpack4TAVX512(w *byte, stride, sb int, dst *byte)

// q8XposeAVX512 writes one input of sb 512-column blocks in qPlain layout
// (x, d, s) transposed for q8MM4TAVX512 to dst (768·sb bytes: the inputs,
// then the scales, then the biases).
//
//go:noescape
func q8XposeAVX512(x *byte, d *float32, s *int32, sb int, dst *byte)

// q8MM4TAVX512 is q8MM4AVX512 for a block unpacked by q8Unpack4TAVX512
// and inputs transposed by q8XposeAVX512 (d and s pointing at their
// scales and biases): two int32 lanes per block and position collect the
// block's 32 products, converted and scaled once per 4 VPDPBUSDs instead
// of once per VPDPBUSD. It prefetches the pfn bytes at pf along the way,
// as q4tpMM4TXAVX512 does.
//
//go:noescape
func q8MM4TAVX512(w *byte, sb int, x *byte, xstride int, d *float32, s *int32, bstride, npos int, out *float32, ostride int, scale *[4]float32, pf *byte, pfn int)

// q8Transposed says whether MatMul runs the transposed q8 kernels on rows
// of c columns for n positions (a variable for the tests and benchmarks).
var q8Transposed = func(c, n int) bool { return c%512 == 0 && n >= 4 }

// q8MatMulTAVX512 is q8MatMulAVX512 through the transposed kernels (c a
// multiple of 512): each tile's inputs are transposed once per worker.
func q8MatMulTAVX512(m *Mat, lo, hi int, x *qbatch, y []float32, scratch *[]byte) {
	c := m.Cols
	sb := c / 512
	rows, n := m.Rows, x.n
	xs := 768 * sb
	tile := max(1, mmTileBytes/xs)
	wb := 2048 * sb
	need := wb + min(tile, n)*xs
	if cap(*scratch) < need {
		*scratch = make([]byte, need)
	}
	buf := (*scratch)[:need]
	_, _, _ = x.q[n*x.qstride-1], x.d[n*x.bstride-1], x.s[n*x.bstride-1]
	_, _, _ = m.Data[hi*c-1], m.scale[hi-1], y[:n*rows]
	xt := buf[wb:]
	var sc [4]float32
	for j0 := 0; j0 < n; j0 += tile {
		nt := min(tile, n-j0)
		for j := range nt {
			v := x.pos(j0 + j)
			q8XposeAVX512(&v.q[0], &v.d[0], &v.s[0], sb, &xt[j*xs])
		}
		d := (*float32)(unsafe.Pointer(&xt[512*sb]))
		s := (*int32)(unsafe.Pointer(&xt[640*sb]))
		r := lo
		for ; r+4 <= hi; r += 4 {
			q8Unpack4TAVX512(&m.Data[r*c], c, sb, &buf[0])
			pf, pfn := &m.Data[0], 0
			if (r+8)*c <= len(m.Data) {
				pf, pfn = &m.Data[(r+4)*c], 4*c
			}
			copy(sc[:], m.scale[r:r+4])
			q8MM4TAVX512(&buf[0], sb, &xt[0], xs, d, s, xs, nt, &y[j0*rows+r], 4*rows, &sc, pf, pfn)
		}
		if r < hi {
			for j := j0; j < j0+nt; j++ {
				q8RowsAVX512(m, r, hi, x.pos(j), y[j*rows:(j+1)*rows])
			}
		}
	}
}
