package kernels

import (
	"fmt"
	"math"
	"sync"

	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/quant"
)

// dtypeKernel is one storage format's CPU row kernels. The plain reference
// of dot is quant.Codec.DotRow of the same format; kernels_test.go compares
// them on random inputs. An assembly kernel replaces an entry here.
type dtypeKernel struct {
	// dot returns W[r,:]·x. For q8_2f, x must already be multiplied by the
	// column field (MatVec does that once per call).
	dot func(m *Mat, r int, x []float32) float32
	// dot4 returns the dots of rows r..r+3 with x (same contract as dot).
	dot4 func(m *Mat, r int, x []float32) (float32, float32, float32, float32)
	// decode writes row r into dst[:Cols] up to a per-row factor post that
	// it returns: W[r,i] = post·dst[i] (times col[i] for q8_2f).
	decode func(m *Mat, r int, dst []float32) (post float32)

	// qx, when not qNone, says that the products run on int8 activations
	// (quantx.go) in that layout through qrows, which sets y[lo:hi] to
	// W[lo:hi,:]·x; dot and dot4 stay the float reference.
	qx    qlayout
	qrows func(m *Mat, lo, hi int, x qvec, y []float32)
	// qmm, when set, is MatMul's kernel on int8 activations: Y[j·Rows+r]
	// for rows [lo, hi) and every position of x, with a scratch buffer of
	// the worker's (nil: qrows per block of rows and position).
	qmm func(m *Mat, lo, hi int, x *qbatch, y []float32, scratch *[]byte)
}

var kernelTable = [...]dtypeKernel{
	quant.F32:   {dot: dotF32, dot4: dot4F32, decode: decodeF32},
	quant.F16:   {dot: dotF16, dot4: dot4F16, decode: decodeF16},
	quant.BF16:  {dot: dotBF16, dot4: dot4BF16, decode: decodeBF16},
	quant.Q8Row: {dot: dotQ8, dot4: dot4Q8, decode: decodeQ8},
	quant.Q82F:  {dot: dotQ8, dot4: dot4Q8, decode: decodeQ8},
	quant.Q4TP:  {dot: dotQ4TP, dot4: dot4Q4TP, decode: decodeQ4TP},
}

// genericTable is kernelTable as written above: the plain Go kernels.
var genericTable = kernelTable

// isaLevel is a set of kernels chosen for a CPU.
type isaLevel int

const (
	isaGeneric isaLevel = iota // plain Go
	isaAVX2                    // AVX2 + FMA + F16C
	isaAVX512                  // AVX-512 F/BW/DQ/VL + VNNI + GFNI
)

func (l isaLevel) String() string {
	return [...]string{"generic", "avx2", "avx512"}[l]
}

// isa is the level in use, the best the CPU supports unless a test or
// SetISA chose another.
var isa isaLevel

func init() { useISA(bestISA()) }

// useISA installs the kernels of level l (at most the CPU's best) in
// kernelTable, quantizeRow and dot4f, and returns the previous level. It
// must not run concurrently with kernels.
func useISA(l isaLevel) isaLevel {
	prev := isa
	l = min(l, bestISA())
	kernelTable = genericTable
	quantizeRow = quantizeRowGo
	dot4f = dot4
	dotVec, axpyVec, siluMulVec, expSumVec = dotGo, axpyGo, siluMulGo, expSumGo
	streamVec = streamGo
	installISA(l)
	isa = l
	return prev
}

// ISA names the kernel set in use: "avx512", "avx2" or "generic".
func ISA() string { return isa.String() }

// SetISA installs the kernel set named ("generic", "avx2", "avx512") and
// returns the name of the previous one, so that tests and tools can
// compare the SIMD kernels with the plain Go ones on the same model. A set
// the CPU lacks is an error. It must not run while kernels run.
func SetISA(name string) (string, error) {
	for l := isaGeneric; l <= isaAVX512; l++ {
		if l.String() == name {
			if l > bestISA() {
				return ISA(), fmt.Errorf("kernels: this CPU cannot run the %s kernels (best: %s)", name, bestISA())
			}
			return useISA(l).String(), nil
		}
	}
	return ISA(), fmt.Errorf("kernels: unknown kernel set %q (generic, avx2, avx512)", name)
}

// ISAs lists the kernel sets this CPU can run, plain Go first.
func ISAs() []string {
	var out []string
	for l := isaGeneric; l <= bestISA(); l++ {
		out = append(out, l.String())
	}
	return out
}

// kernelFor returns the kernels of a format, nil if there are none.
func kernelFor(d quant.DType) *dtypeKernel {
	if int(d) >= len(kernelTable) || kernelTable[d].dot == nil {
		return nil
	}
	return &kernelTable[d]
}

// Dot returns Σ a[i]·b[i] over len(a) (b must be at least as long).
func Dot(a, b []float32) float32 {
	b = b[:len(a)]
	if len(a) == 0 {
		return 0
	}
	return dotVec(a, b)
}

// dotVec is Dot's kernel in use: dotGo or an assembly twin.
var dotVec = dotGo

// dotGo is the plain Dot. Four accumulators each taking two products per
// step measured fastest in plain Go (no FMA, no SIMD); the same shape is
// used by every row kernel.
func dotGo(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+8 <= len(a); i += 8 {
		aa, bb := a[i:i+8:i+8], b[i:i+8:i+8]
		s0 += aa[0]*bb[0] + aa[4]*bb[4]
		s1 += aa[1]*bb[1] + aa[5]*bb[5]
		s2 += aa[2]*bb[2] + aa[6]*bb[6]
		s3 += aa[3]*bb[3] + aa[7]*bb[7]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// dot4f is the MatMul inner kernel over decoded rows in use: dot4 or an
// assembly twin.
var dot4f = dot4

// dot4 returns the dots of four equal-length rows with x, loading x once
// (the MatMul inner kernel over decoded rows).
func dot4(w0, w1, w2, w3, x []float32) (float32, float32, float32, float32) {
	n := len(x)
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	var a0, a1, b0, b1, c0, c1, d0, d1 float32
	i := 0
	for ; i+4 <= n; i += 4 {
		xx := x[i : i+4 : i+4]
		p, q, r, s := w0[i:i+4:i+4], w1[i:i+4:i+4], w2[i:i+4:i+4], w3[i:i+4:i+4]
		a0 += p[0]*xx[0] + p[2]*xx[2]
		a1 += p[1]*xx[1] + p[3]*xx[3]
		b0 += q[0]*xx[0] + q[2]*xx[2]
		b1 += q[1]*xx[1] + q[3]*xx[3]
		c0 += r[0]*xx[0] + r[2]*xx[2]
		c1 += r[1]*xx[1] + r[3]*xx[3]
		d0 += s[0]*xx[0] + s[2]*xx[2]
		d1 += s[1]*xx[1] + s[3]*xx[3]
	}
	for ; i < n; i++ {
		x0 := x[i]
		a0 += w0[i] * x0
		b0 += w1[i] * x0
		c0 += w2[i] * x0
		d0 += w3[i] * x0
	}
	return a0 + a1, b0 + b1, c0 + c1, d0 + d1
}

// f32.

func dotF32(m *Mat, r int, x []float32) float32 {
	c := m.Cols
	return Dot(m.f32[r*c:(r+1)*c], x)
}

func dot4F32(m *Mat, r int, x []float32) (float32, float32, float32, float32) {
	c := m.Cols
	w := m.f32[r*c : (r+4)*c]
	return dot4(w[:c], w[c:2*c], w[2*c:3*c], w[3*c:], x[:c])
}

func decodeF32(m *Mat, r int, dst []float32) float32 {
	c := m.Cols
	copy(dst[:c], m.f32[r*c:(r+1)*c])
	return 1
}

// f16: converted through a 64K-entry table (exact).

var (
	f16Once sync.Once
	f16Tab  *[1 << 16]float32
)

func f16Table() *[1 << 16]float32 {
	f16Once.Do(func() {
		t := new([1 << 16]float32)
		for i := range t {
			t[i] = half.F16ToF32(uint16(i))
		}
		f16Tab = t
	})
	return f16Tab
}

func dotF16(m *Mat, r int, x []float32) float32 {
	c := m.Cols
	w := m.u16[r*c : (r+1)*c]
	x = x[:c]
	t := f16Table()
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= c; i += 4 {
		ww, xx := w[i:i+4:i+4], x[i:i+4:i+4]
		s0 += t[ww[0]] * xx[0]
		s1 += t[ww[1]] * xx[1]
		s2 += t[ww[2]] * xx[2]
		s3 += t[ww[3]] * xx[3]
	}
	for ; i < c; i++ {
		s0 += t[w[i]] * x[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func dot4F16(m *Mat, r int, x []float32) (float32, float32, float32, float32) {
	return dotF16(m, r, x), dotF16(m, r+1, x), dotF16(m, r+2, x), dotF16(m, r+3, x)
}

func decodeF16(m *Mat, r int, dst []float32) float32 {
	c := m.Cols
	w := m.u16[r*c : (r+1)*c]
	t := f16Table()
	for i, h := range w {
		dst[i] = t[h]
	}
	return 1
}

// bf16: the top half of a float32.

func bf(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

func dotBF16(m *Mat, r int, x []float32) float32 {
	c := m.Cols
	w := m.u16[r*c : (r+1)*c]
	x = x[:c]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= c; i += 4 {
		ww, xx := w[i:i+4:i+4], x[i:i+4:i+4]
		s0 += bf(ww[0]) * xx[0]
		s1 += bf(ww[1]) * xx[1]
		s2 += bf(ww[2]) * xx[2]
		s3 += bf(ww[3]) * xx[3]
	}
	for ; i < c; i++ {
		s0 += bf(w[i]) * x[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func dot4BF16(m *Mat, r int, x []float32) (float32, float32, float32, float32) {
	return dotBF16(m, r, x), dotBF16(m, r+1, x), dotBF16(m, r+2, x), dotBF16(m, r+3, x)
}

func decodeBF16(m *Mat, r int, dst []float32) float32 {
	c := m.Cols
	for i, h := range m.u16[r*c : (r+1)*c] {
		dst[i] = bf(h)
	}
	return 1
}

// q8_row and q8_2f: int8 quants times a row scale (q8_2f: x prescaled).

// i8f maps a quant byte to its value as float32.
var i8f = func() (t [256]float32) {
	for i := range t {
		t[i] = float32(int8(uint8(i)))
	}
	return
}()

func dotQ8(m *Mat, r int, x []float32) float32 {
	c := m.Cols
	q := m.Data[r*c : (r+1)*c]
	x = x[:c]
	t := &i8f
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+8 <= c; i += 8 {
		qq, xx := q[i:i+8:i+8], x[i:i+8:i+8]
		s0 += t[qq[0]]*xx[0] + t[qq[4]]*xx[4]
		s1 += t[qq[1]]*xx[1] + t[qq[5]]*xx[5]
		s2 += t[qq[2]]*xx[2] + t[qq[6]]*xx[6]
		s3 += t[qq[3]]*xx[3] + t[qq[7]]*xx[7]
	}
	for ; i < c; i++ {
		s0 += t[q[i]] * x[i]
	}
	return ((s0 + s1) + (s2 + s3)) * m.scale[r]
}

func dot4Q8(m *Mat, r int, x []float32) (float32, float32, float32, float32) {
	c := m.Cols
	q := m.Data[r*c : (r+4)*c]
	q0, q1, q2, q3 := q[:c], q[c:2*c], q[2*c:3*c], q[3*c:4*c]
	x = x[:c]
	t := &i8f
	var a, b, cc, d, a1, b1, c1, d1 float32
	i := 0
	for ; i+2 <= c; i += 2 {
		x0, x1 := x[i], x[i+1]
		a += t[q0[i]] * x0
		b += t[q1[i]] * x0
		cc += t[q2[i]] * x0
		d += t[q3[i]] * x0
		a1 += t[q0[i+1]] * x1
		b1 += t[q1[i+1]] * x1
		c1 += t[q2[i+1]] * x1
		d1 += t[q3[i+1]] * x1
	}
	if i < c {
		x0 := x[i]
		a += t[q0[i]] * x0
		b += t[q1[i]] * x0
		cc += t[q2[i]] * x0
		d += t[q3[i]] * x0
	}
	s := m.scale[r : r+4 : r+4]
	return (a + a1) * s[0], (b + b1) * s[1], (cc + c1) * s[2], (d + d1) * s[3]
}

func decodeQ8(m *Mat, r int, dst []float32) float32 {
	c := m.Cols
	t := &i8f
	for i, b := range m.Data[r*c : (r+1)*c] {
		dst[i] = t[b]
	}
	return m.scale[r]
}

// q4tp: groups of 32 nibbles (value nibble-8) times a rung of the row's
// ladder, chosen by a 5-bit code per group.

// nibf maps a nibble byte to its two weights (low nibble first), minus 8.
var nibf = func() (t [256][2]float32) {
	for i := range t {
		t[i] = [2]float32{float32(i&15) - 8, float32(i>>4) - 8}
	}
	return
}()

// q4tpCodes8 returns the 5-bit codes of groups g0..g0+7 (g0 a multiple of
// 8) packed in the low 40 bits; codes past the row's last group are junk.
func q4tpCodes8(codes []byte, g0 int) uint64 {
	b := codes[g0/8*5:]
	if len(b) >= 5 {
		b = b[:5:5]
		return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 | uint64(b[4])<<32
	}
	var w uint64
	for j, v := range b {
		w |= uint64(v) << (8 * j)
	}
	return w
}

// q4tpGroup returns Σ (nibble-8)·x over one group of 16 bytes / 32 weights.
func q4tpGroup(nb []byte, x []float32) float32 {
	nb, x = nb[:16:16], x[:32:32]
	t := &nibf
	var s0, s1, s2, s3 float32
	for i := 0; i < 16; i += 2 {
		p, q := &t[nb[i]], &t[nb[i+1]]
		xx := x[2*i : 2*i+4 : 2*i+4]
		s0 += p[0] * xx[0]
		s1 += p[1] * xx[1]
		s2 += q[0] * xx[2]
		s3 += q[1] * xx[3]
	}
	return (s0 + s1) + (s2 + s3)
}

func dotQ4TP(m *Mat, r int, x []float32) float32 {
	gpr := m.Cols / quant.GroupSize
	nib := m.Data[r*gpr*16 : (r+1)*gpr*16]
	codes := m.codes[r*m.cstr : (r+1)*m.cstr]
	lad := m.ladder()[32*r : 32*r+32 : 32*r+32]
	x = x[:m.Cols]
	var acc float32
	for g0 := 0; g0 < gpr; g0 += 8 {
		cw := q4tpCodes8(codes, g0)
		for g := g0; g < min(g0+8, gpr); g++ {
			s := q4tpGroup(nib[16*g:], x[32*g:])
			acc += s * lad[cw&31]
			cw >>= 5
		}
	}
	return acc
}

func dot4Q4TP(m *Mat, r int, x []float32) (float32, float32, float32, float32) {
	gpr := m.Cols / quant.GroupSize
	nb := gpr * 16
	nib := m.Data[r*nb : (r+4)*nb]
	n0, n1, n2, n3 := nib[:nb], nib[nb:2*nb], nib[2*nb:3*nb], nib[3*nb:]
	cs := m.cstr
	codes := m.codes[r*cs : (r+4)*cs]
	lad := m.ladder()[32*r : 32*r+128 : 32*r+128]
	l0, l1, l2, l3 := lad[:32:32], lad[32:64:64], lad[64:96:96], lad[96:128:128]
	x = x[:m.Cols]
	var a0, a1, a2, a3 float32
	for g0 := 0; g0 < gpr; g0 += 8 {
		c0, c1 := q4tpCodes8(codes[:cs], g0), q4tpCodes8(codes[cs:2*cs], g0)
		c2, c3 := q4tpCodes8(codes[2*cs:3*cs], g0), q4tpCodes8(codes[3*cs:], g0)
		for g := g0; g < min(g0+8, gpr); g++ {
			s0, s1, s2, s3 := q4tpGroup4(n0[16*g:], n1[16*g:], n2[16*g:], n3[16*g:], x[32*g:])
			a0 += s0 * l0[c0&31]
			a1 += s1 * l1[c1&31]
			a2 += s2 * l2[c2&31]
			a3 += s3 * l3[c3&31]
			c0, c1, c2, c3 = c0>>5, c1>>5, c2>>5, c3>>5
		}
	}
	return a0, a1, a2, a3
}

// q4tpGroup4 is q4tpGroup for the same group of four rows, loading x once.
func q4tpGroup4(b0, b1, b2, b3 []byte, x []float32) (float32, float32, float32, float32) {
	b0, b1, b2, b3, x = b0[:16:16], b1[:16:16], b2[:16:16], b3[:16:16], x[:32:32]
	t := &nibf
	var s0, s1, s2, s3, u0, u1, u2, u3 float32
	for i := 0; i < 16; i++ {
		xx := x[2*i : 2*i+2 : 2*i+2]
		p, q, r, s := &t[b0[i]], &t[b1[i]], &t[b2[i]], &t[b3[i]]
		s0 += p[0] * xx[0]
		u0 += p[1] * xx[1]
		s1 += q[0] * xx[0]
		u1 += q[1] * xx[1]
		s2 += r[0] * xx[0]
		u2 += r[1] * xx[1]
		s3 += s[0] * xx[0]
		u3 += s[1] * xx[1]
	}
	return s0 + u0, s1 + u1, s2 + u2, s3 + u3
}

func decodeQ4TP(m *Mat, r int, dst []float32) float32 {
	gpr := m.Cols / quant.GroupSize
	nib := m.Data[r*gpr*16 : (r+1)*gpr*16]
	codes := m.codes[r*m.cstr : (r+1)*m.cstr]
	lad := m.ladder()[32*r : 32*r+32 : 32*r+32]
	t := &nibf
	for g0 := 0; g0 < gpr; g0 += 8 {
		cw := q4tpCodes8(codes, g0)
		for g := g0; g < min(g0+8, gpr); g++ {
			s := lad[cw&31]
			cw >>= 5
			nb := nib[16*g : 16*g+16 : 16*g+16]
			d := dst[32*g : 32*g+32 : 32*g+32]
			for i, b := range nb {
				p := &t[b]
				d[2*i] = p[0] * s
				d[2*i+1] = p[1] * s
			}
		}
	}
	return 1
}
