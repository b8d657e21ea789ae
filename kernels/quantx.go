package kernels

import (
	"math"

	"github.com/cortiq/cortiq/quant"
)

// Activation quantization for the integer kernels of the quantized weight
// formats (q8_row, q8_2f, q4tp), the scheme llama.cpp uses for its q8_0/q8_1
// activations: once per matrix-vector product the input vector is cut into
// blocks of 32 and each block is stored as int8 with one float32 scale,
//
//	d = absmax/127,  q[i] = roundToEven(x[i]·(127/absmax)),  x[i] ≈ d·q[i],
//
// so the dot with a row becomes, per block, an exact int32 sum of int8
// products times d (and the row's scales). The error this adds is bounded:
// |x[i] - d·q[i]| ≤ d/2, hence for a row w
//
//	|Σ w[i]·x[i] - Σ w[i]·d·q[i]| ≤ Σ_blocks (d_b/2)·Σ_{i∈b} |w[i]|
//	                               = Σ_blocks absmax_b/254 · Σ_{i∈b} |w[i]|,
//
// at most 1/254 of Σ|w[i]|·max|x| and in practice (errors of random sign)
// far less. quantx_test.go checks that bound. Float formats keep float32
// activations.
//
// Blocks whose absmax is below qxMinAbs (or not a number) are stored as
// zeros: 127/absmax would overflow float32. Activations of a transformer
// are far above that; non-finite activations give meaningless results here
// as in the float kernels.

// qblock is the number of activations sharing one scale.
const qblock = 32

// qxMinAbs is the smallest block absmax that is quantized (127/qxMinAbs
// is finite in float32).
const qxMinAbs = 0x1p-120

// qlayout says how a quantized vector is ordered for the kernels that read
// it.
type qlayout uint8

const (
	// qNone: the format's kernels take float32 activations.
	qNone qlayout = iota
	// qPlain: int8 values in order (q8_row, q8_2f); the bias of a block is
	// -128·Σq (the AVX-512 kernel computes Σ (w+128)·q).
	qPlain
	// qNib: q4tp order. Each chunk of 128 values (4 groups of 32) holds the
	// even-indexed values of its 4 groups, 16 per group, then the
	// odd-indexed ones: byte 16k+i of a chunk is x[32k+2i], byte 64+16k+i is
	// x[32k+2i+1]. That is where the low and high nibbles of the chunk's 64
	// weight bytes land after an AND and a shift. The bias of a block is
	// -8·Σq (the kernels multiply the raw nibble 0..15).
	qNib
)

// qpad is the padding of a quantized vector: values, scales and biases
// past the logical length are zero up to a multiple of qpad, so kernels
// read whole 64- and 128-byte chunks without bounds checks.
const qpad = 128

// biasShift returns log2 of the offset a layout's bias removes.
func (l qlayout) biasShift() uint {
	if l == qNib {
		return 3
	}
	return 7
}

// qbatch is n quantized activation vectors of cols values each, stored one
// after another (position j at q[j*qstride:], d and s at j*bstride), in
// buffers that are reused from call to call.
type qbatch struct {
	layout  qlayout
	cols, n int
	qstride int // bytes of q per position: cols rounded up to qpad
	bstride int // blocks per position: qstride/qblock rounded up to 16
	q       []byte
	d       []float32 // per block scale
	s       []int32   // per block bias: -(Σq)<<layout.biasShift()
}

// qvec is one position of a qbatch.
type qvec struct {
	q []byte
	d []float32
	s []int32
}

// reset sizes b for n vectors of cols values, reusing its buffers.
func (b *qbatch) reset(l qlayout, cols, n int) {
	b.layout, b.cols, b.n = l, cols, n
	b.qstride = (cols + qpad - 1) / qpad * qpad
	b.bstride = (b.qstride/qblock + 15) / 16 * 16
	if cap(b.q) < n*b.qstride {
		b.q = make([]byte, n*b.qstride)
		b.d = make([]float32, n*b.bstride)
		b.s = make([]int32, n*b.bstride)
	}
	b.q, b.d, b.s = b.q[:n*b.qstride], b.d[:n*b.bstride], b.s[:n*b.bstride]
}

func (b *qbatch) pos(j int) qvec {
	return qvec{
		q: b.q[j*b.qstride : (j+1)*b.qstride],
		d: b.d[j*b.bstride : (j+1)*b.bstride],
		s: b.s[j*b.bstride : (j+1)*b.bstride],
	}
}

// quantize fills b from n rows of x (row j at x[j*cols:]) with the
// quantizer in use, then zeroes the padding.
func (b *qbatch) quantize(x []float32) {
	nb := (b.cols + qblock - 1) / qblock
	for j := range b.n {
		v := b.pos(j)
		quantizeRow(x[j*b.cols:(j+1)*b.cols], v, b.layout)
		clear(v.d[nb:])
		clear(v.s[nb:])
		if b.layout == qPlain {
			clear(v.q[b.cols:])
			continue
		}
		// qNib: the groups of the last chunk past the end.
		c := nb / 4 * 128
		for k := nb % 4; k > 0 && k < 4; k++ {
			clear(v.q[c+16*k : c+16*k+16])
			clear(v.q[c+64+16*k : c+64+16*k+16])
		}
	}
}

// quantizeRow is the quantizer in use (quantizeRowGo or an assembly twin
// that gives the same bytes): it writes the ⌈len(x)/32⌉ blocks of x into v
// in layout l and nothing else. For qNib, len(x) is a multiple of 32.
var quantizeRow = quantizeRowGo

// quantizeRowGo is the plain reference quantizer.
func quantizeRowGo(x []float32, v qvec, l qlayout) {
	var blk [qblock]int8
	sh := l.biasShift()
	n := len(x)
	for b := range (n + qblock - 1) / qblock {
		xb := x[b*qblock : min(n, (b+1)*qblock)]
		d, sum := quantizeBlock(xb, &blk)
		v.d[b], v.s[b] = d, -(sum << sh)
		if l == qNib {
			c, k := b/4*128, b%4*16
			for i := range 16 {
				v.q[c+k+i] = byte(blk[2*i])
				v.q[c+64+k+i] = byte(blk[2*i+1])
			}
			continue
		}
		for i := range xb {
			v.q[b*qblock+i] = byte(blk[i])
		}
	}
}

// quantizeBlock quantizes up to 32 values into q (the rest of q zeroed)
// and returns the scale and Σq.
func quantizeBlock(x []float32, q *[qblock]int8) (d float32, sum int32) {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	*q = [qblock]int8{}
	if !(amax >= qxMinAbs) {
		return 0, 0
	}
	id := 127 / amax
	for i, v := range x {
		t := int32(math.RoundToEven(float64(v * id)))
		q[i] = int8(t)
		sum += t
	}
	return amax / 127, sum
}

// Plain integer references of the quantized-activation row kernels: exact
// int32 sums per block, scaled per block in float32 in order. The assembly
// kernels are tested against these (up to float32 summation order) and
// these against the float kernels (up to the quantization bound above).

// dotQ8Int returns W[r,:]·x for q8_row/q8_2f with x quantized in qPlain
// layout (for q8_2f, from the input times the column field).
func dotQ8Int(m *Mat, r int, x qvec) float32 {
	c := m.Cols
	w := m.Data[r*c : (r+1)*c]
	var acc float32
	for b := 0; b*qblock < c; b++ {
		var s int32
		for i := b * qblock; i < min(c, (b+1)*qblock); i++ {
			s += int32(int8(w[i])) * int32(int8(x.q[i]))
		}
		acc += float32(s) * x.d[b]
	}
	return acc * m.scale[r]
}

// dotQ4TPInt returns W[r,:]·x for q4tp with x quantized in qNib layout.
func dotQ4TPInt(m *Mat, r int, x qvec) float32 {
	gpr := m.Cols / quant.GroupSize
	nib := m.Data[r*gpr*16 : (r+1)*gpr*16]
	codes := m.codes[r*m.cstr : (r+1)*m.cstr]
	lad := m.ladder()[32*r : 32*r+32]
	var acc float32
	for g := range gpr {
		c, k := g/4*128, g%4*16
		var s int32
		for i, b := range nib[16*g : 16*g+16] {
			s += (int32(b&15) - 8) * int32(int8(x.q[c+k+i]))
			s += (int32(b>>4) - 8) * int32(int8(x.q[c+64+k+i]))
		}
		acc += float32(s) * x.d[g] * lad[q4tpCode(codes, g)]
	}
	return acc
}

// q4tpCode reads the 5-bit code of group g from a row's code bytes.
func q4tpCode(codes []byte, g int) int {
	bit := 5 * g
	w := uint(codes[bit/8])
	if bit/8+1 < len(codes) {
		w |= uint(codes[bit/8+1]) << 8
	}
	return int(w >> (bit % 8) & 31)
}

// qrowsInt is the generic int8 row kernel: y[lo:hi] from the references.
func qrowsInt(m *Mat, lo, hi int, x qvec, y []float32) {
	dot := dotQ8Int
	if m.DType == quant.Q4TP {
		dot = dotQ4TPInt
	}
	for r := lo; r < hi; r++ {
		y[r] = dot(m, r, x)
	}
}
