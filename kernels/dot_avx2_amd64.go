//go:build amd64 && !purego

package kernels

import (
	"unsafe"

	"github.com/cortiq/cortiq/quant"
)

// AVX2 kernels (dot_avx2_amd64.s): whole blocks only; the wrappers here
// add the last columns in plain Go. The activation quantizer is
// quantizeAVX2, which gives quantizeRowGo's bytes.

// q8Dot4AVX2 is q8Dot4AVX512 over the first 32·blocks columns, with the
// sign trick (|w| times x carrying w's sign) instead of a bias.
//
//go:noescape
func q8Dot4AVX2(w *byte, stride, blocks int, x *byte, d *float32, out *[4]float32)

// q4tpDot4AVX2 is q4tpDot4AVX512, one group at a time.
//
//go:noescape
func q4tpDot4AVX2(rows *[4]q4row, gpr int, x *byte, d *float32, s *int32, out *[4]float32)

//go:noescape
func f32Dot4AVX2(w *float32, stride, n int, x *float32, out *[4]float32)

//go:noescape
func f16Dot4AVX2(w *uint16, stride, n int, x *float32, out *[4]float32)

//go:noescape
func bf16Dot4AVX2(w *uint16, stride, n int, x *float32, out *[4]float32)

// quantizeAVX2 is quantizeAVX512 on AVX2: quantizeRowGo for n values
// (qNib when nib) with bias shift shift, the same bytes for every input.
// It writes only the blocks, and of a last partial qPlain block only its
// n%32 values.
//
//go:noescape
func quantizeAVX2(x *float32, n int, q *byte, d *float32, s *int32, shift int, nib bool)

func installAVX2() {
	quantizeRow = quantizeRowAVX2
	dot4f = dot4AVX2
	for _, d := range []quant.DType{quant.Q8Row, quant.Q82F} {
		kernelTable[d].qx, kernelTable[d].qrows = qPlain, q8RowsAVX2
	}
	kernelTable[quant.Q4TP].qx, kernelTable[quant.Q4TP].qrows = qNib, q4tpRowsAVX2
	kernelTable[quant.F32].dot, kernelTable[quant.F32].dot4 = dotF32AVX2, dot4F32AVX2
	kernelTable[quant.F16].dot, kernelTable[quant.F16].dot4 = dotF16AVX2, dot4F16AVX2
	kernelTable[quant.BF16].dot, kernelTable[quant.BF16].dot4 = dotBF16AVX2, dot4BF16AVX2
}

func quantizeRowAVX2(x []float32, v qvec, l qlayout) {
	n := len(x)
	if n == 0 {
		return
	}
	nb := (n + qblock - 1) / qblock
	last := n - 1 // the last q byte written
	if l == qNib {
		b := nb - 1
		last = b/4*128 + 64 + b%4*16 + 15
	}
	_, _, _ = v.q[last], v.d[nb-1], v.s[nb-1]
	quantizeAVX2(&x[0], n, &v.q[0], &v.d[0], &v.s[0], int(l.biasShift()), l == qNib)
}

// q8Tail returns Σ w[i]·q[i]·d over the columns past the last whole block.
func q8Tail(w, q []byte, d float32) float32 {
	var s int32
	for i, b := range w {
		s += int32(int8(b)) * int32(int8(q[i]))
	}
	return float32(s) * d
}

func q8RowsAVX2(m *Mat, lo, hi int, x qvec, y []float32) {
	c := m.Cols
	nb, t := c/qblock, c/qblock*qblock
	_, _ = m.Data[hi*c-1], y[:hi]
	_, _ = x.q[c-1], x.d[(c+qblock-1)/qblock-1]
	var out [4]float32
	r := lo
	for ; r+4 <= hi; r += 4 {
		w := m.Data[r*c : (r+4)*c]
		out = [4]float32{}
		if nb > 0 {
			q8Dot4AVX2(&w[0], c, nb, &x.q[0], &x.d[0], &out)
		}
		if t < c {
			for i := range 4 {
				out[i] += q8Tail(w[i*c+t:(i+1)*c], x.q[t:c], x.d[nb])
			}
		}
		s := m.scale[r : r+4 : r+4]
		y[r], y[r+1], y[r+2], y[r+3] = out[0]*s[0], out[1]*s[1], out[2]*s[2], out[3]*s[3]
	}
	for ; r < hi; r++ {
		w := m.Data[r*c : (r+1)*c]
		out[0] = 0
		if nb > 0 {
			q8Dot4AVX2(&w[0], 0, nb, &x.q[0], &x.d[0], &out)
		}
		if t < c {
			out[0] += q8Tail(w[t:], x.q[t:c], x.d[nb])
		}
		y[r] = out[0] * m.scale[r]
	}
}

func q4tpRowsAVX2(m *Mat, lo, hi int, x qvec, y []float32) {
	gpr := m.Cols / quant.GroupSize
	nb := 16 * gpr
	_, _, _ = x.q[(gpr+3)/4*128-1], x.d[gpr-1], x.s[gpr-1]
	lad := m.ladder()
	_, _, _ = m.Data[hi*nb-1], lad[32*hi-1], y[:hi]
	var out [4]float32
	var rs [4]q4row
	r := lo
	for ; r+4 <= hi; r += 4 {
		for i := range rs {
			rs[i] = q4row{nib: &m.Data[(r+i)*nb], codes: m.codePtr(r + i), lad: &lad[32*(r+i)]}
		}
		q4tpDot4AVX2(&rs, gpr, &x.q[0], &x.d[0], &x.s[0], &out)
		y[r], y[r+1], y[r+2], y[r+3] = out[0], out[1], out[2], out[3]
	}
	for ; r < hi; r++ {
		rs[0] = q4row{nib: &m.Data[r*nb], codes: m.codePtr(r), lad: &lad[32*r]}
		rs[1], rs[2], rs[3] = rs[0], rs[0], rs[0]
		q4tpDot4AVX2(&rs, gpr, &x.q[0], &x.d[0], &x.s[0], &out)
		y[r] = out[0]
	}
}

// Float wrappers: the kernel covers the columns up to a multiple of 16.

func dotF32AVX2(m *Mat, r int, x []float32) float32 {
	c := m.Cols
	w := m.f32[r*c : (r+1)*c]
	x = x[:c]
	var out [4]float32
	t := c &^ 15
	if t > 0 {
		f32Dot4AVX2(&w[0], 0, c, &x[0], &out)
	}
	return out[0] + Dot(w[t:], x[t:])
}

func dot4F32AVX2(m *Mat, r int, x []float32) (float32, float32, float32, float32) {
	c := m.Cols
	w := m.f32[r*c : (r+4)*c]
	return f32Rows4AVX2(w[:c], w[c:2*c], w[2*c:3*c], w[3*c:], x[:c])
}

// f32Rows4AVX2 returns the dots of four rows of len(x) that lie one after
// another in memory with x.
func f32Rows4AVX2(w0, w1, w2, w3, x []float32) (float32, float32, float32, float32) {
	c := len(x)
	w0, w1, w2, w3 = w0[:c], w1[:c], w2[:c], w3[:c]
	var out [4]float32
	t := c &^ 15
	if t > 0 {
		f32Dot4AVX2(&w0[0], 4*c, c, &x[0], &out)
	}
	if t < c {
		out[0] += Dot(w0[t:], x[t:])
		out[1] += Dot(w1[t:], x[t:])
		out[2] += Dot(w2[t:], x[t:])
		out[3] += Dot(w3[t:], x[t:])
	}
	return out[0], out[1], out[2], out[3]
}

func dotF16AVX2(m *Mat, r int, x []float32) float32 {
	c := m.Cols
	w := m.u16[r*c : (r+1)*c]
	x = x[:c]
	var out [4]float32
	t := c &^ 15
	if t > 0 {
		f16Dot4AVX2(&w[0], 0, c, &x[0], &out)
	}
	tab := f16Table()
	for i := t; i < c; i++ {
		out[0] += tab[w[i]] * x[i]
	}
	return out[0]
}

func dot4F16AVX2(m *Mat, r int, x []float32) (float32, float32, float32, float32) {
	c := m.Cols
	w := m.u16[r*c : (r+4)*c]
	x = x[:c]
	var out [4]float32
	t := c &^ 15
	if t > 0 {
		f16Dot4AVX2(&w[0], 2*c, c, &x[0], &out)
	}
	tab := f16Table()
	for k := range 4 {
		for i := t; i < c; i++ {
			out[k] += tab[w[k*c+i]] * x[i]
		}
	}
	return out[0], out[1], out[2], out[3]
}

func dotBF16AVX2(m *Mat, r int, x []float32) float32 {
	c := m.Cols
	w := m.u16[r*c : (r+1)*c]
	x = x[:c]
	var out [4]float32
	t := c &^ 15
	if t > 0 {
		bf16Dot4AVX2(&w[0], 0, c, &x[0], &out)
	}
	for i := t; i < c; i++ {
		out[0] += bf(w[i]) * x[i]
	}
	return out[0]
}

func dot4BF16AVX2(m *Mat, r int, x []float32) (float32, float32, float32, float32) {
	c := m.Cols
	w := m.u16[r*c : (r+4)*c]
	x = x[:c]
	var out [4]float32
	t := c &^ 15
	if t > 0 {
		bf16Dot4AVX2(&w[0], 2*c, c, &x[0], &out)
	}
	for k := range 4 {
		for i := t; i < c; i++ {
			out[k] += bf(w[k*c+i]) * x[i]
		}
	}
	return out[0], out[1], out[2], out[3]
}

// dot4AVX2 is dot4 for four consecutive rows (MatMul's scratch).
func dot4AVX2(w0, w1, w2, w3, x []float32) (float32, float32, float32, float32) {
	n := len(x)
	if n == 0 || len(w0) < n || len(w1) < n || len(w2) < n || len(w3) < n {
		return dot4(w0, w1, w2, w3, x)
	}
	p0 := uintptr(unsafe.Pointer(&w0[0]))
	if uintptr(unsafe.Pointer(&w1[0])) != p0+uintptr(4*n) || uintptr(unsafe.Pointer(&w2[0])) != p0+uintptr(8*n) || uintptr(unsafe.Pointer(&w3[0])) != p0+uintptr(12*n) {
		return dot4(w0, w1, w2, w3, x)
	}
	return f32Rows4AVX2(w0, w1, w2, w3, x)
}
