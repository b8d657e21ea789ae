package kernels

import (
	"encoding/binary"
	"math"
)

// RMSNorm writes the root-mean-square normalisation of x to dst:
// dst[i] = w[i]·x[i]/sqrt(mean(x²)+eps), or (1+w[i])·… when onePlus (the
// zero-centred weights of Qwen3-Next and Qwen3.5). dst may alias x.
func RMSNorm(dst, x, w []float32, eps float32, onePlus bool) {
	n := len(x)
	dst, w = dst[:n], w[:n]
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := float32(1 / math.Sqrt(float64(float32(ss/float64(n))+eps)))
	if onePlus {
		for i, v := range x {
			dst[i] = (v * inv) * (1 + w[i])
		}
		return
	}
	for i, v := range x {
		dst[i] = w[i] * (v * inv)
	}
}

// Softmax replaces x by softmax(x) in float32 (the maximum is subtracted
// first, the sum accumulates in float64).
func Softmax(x []float32) {
	if len(x) == 0 {
		return
	}
	mx := x[0]
	for _, v := range x[1:] {
		mx = max(mx, v)
	}
	sum := expSumVec(x, mx)
	inv := float32(1 / sum)
	for i := range x {
		x[i] *= inv
	}
}

// SiLUMul computes a[i] = silu(a[i])·b[i] with silu(x) = x·sigmoid(x)
// (the SwiGLU gate: down(silu(gate(x)) ⊙ up(x))).
func SiLUMul(a, b []float32) {
	b = b[:len(a)]
	if len(a) > 0 {
		siluMulVec(a, b)
	}
}

// expSumVec sets x[i] = Exp(x[i]-mx) and returns Σ x[i] in float64:
// expSumGo or an assembly twin.
var expSumVec = expSumGo

func expSumGo(x []float32, mx float32) float64 {
	var sum float64
	for i, v := range x {
		e := Exp(v - mx)
		x[i] = e
		sum += float64(e)
	}
	return sum
}

// siluMulVec is SiLUMul's kernel in use: siluMulGo or an assembly twin.
var siluMulVec = siluMulGo

func siluMulGo(a, b []float32) {
	b = b[:len(a)]
	for i, v := range a {
		a[i] = v / (1 + Exp(-v)) * b[i]
	}
}

// Add computes dst[i] += x[i].
func Add(dst, x []float32) {
	x = x[:len(dst)]
	for i := range dst {
		dst[i] += x[i]
	}
}

// AXPY computes y[i] += a·x[i].
func AXPY(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	if len(y) > 0 {
		axpyVec(y, a, x)
	}
}

// axpyVec is AXPY's kernel in use: axpyGo or an assembly twin.
var axpyVec = axpyGo

func axpyGo(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	i := 0
	for ; i+4 <= len(y); i += 4 {
		yy, xx := y[i:i+4:i+4], x[i:i+4:i+4]
		yy[0] += a * xx[0]
		yy[1] += a * xx[1]
		yy[2] += a * xx[2]
		yy[3] += a * xx[3]
	}
	for ; i < len(y); i++ {
		y[i] += a * x[i]
	}
}

// Exp returns e^x in float32 with an error of at most about 2 ulp (checked
// against math.Exp in the tests): Cody–Waite reduction x = n·ln2 + r,
// |r| ≤ ln2/2, and a degree-7 polynomial for e^r. Values outside the
// normal float32 range go through math.Exp.
func Exp(x float32) float32 {
	if !(x > -87 && x < 88) { // also NaN
		return float32(math.Exp(float64(x)))
	}
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375
		ln2lo = -2.12194440e-4
	)
	n := float32(math.Floor(float64(x*log2e) + 0.5))
	r := (x - n*ln2hi) - n*ln2lo
	p := float32(1.0 / 5040)
	p = p*r + 1.0/720
	p = p*r + 1.0/120
	p = p*r + 1.0/24
	p = p*r + 1.0/6
	p = p*r + 0.5
	p = p*r + 1
	p = p*r + 1
	return p * math.Float32frombits(uint32(int32(n)+127)<<23)
}

// streamRead reads all of b (the read-bandwidth probe of the benchmarks)
// and returns a checksum so the reads cannot be optimised away.
func streamRead(b []byte) uint64 {
	n := len(b) &^ 255
	var s uint64
	if n > 0 {
		s = streamVec(b[:n])
	}
	for _, v := range b[n:] {
		s ^= uint64(v)
	}
	return s
}

// streamVec is streamRead's kernel in use: streamGo or an assembly twin.
var streamVec = streamGo

func streamGo(b []byte) uint64 {
	var s0, s1, s2, s3 uint64
	for i := 0; i+32 <= len(b); i += 32 {
		w := b[i : i+32 : i+32]
		s0 ^= binary.LittleEndian.Uint64(w)
		s1 ^= binary.LittleEndian.Uint64(w[8:])
		s2 ^= binary.LittleEndian.Uint64(w[16:])
		s3 ^= binary.LittleEndian.Uint64(w[24:])
	}
	return s0 ^ s1 ^ s2 ^ s3
}
