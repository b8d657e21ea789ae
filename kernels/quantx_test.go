package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/quant"
)

// testBest is the best kernel set the tests compare: the CPU's, or the
// one -isa names (go test ./kernels -args -isa=generic runs as on a CPU
// without SIMD, skipping the SIMD comparisons by name).
var testBest = bestISA()

// isaLevels returns the kernel sets the tests run, generic first.
func isaLevels() []isaLevel {
	var ls []isaLevel
	for l := isaGeneric; l <= testBest; l++ {
		ls = append(ls, l)
	}
	return ls
}

// isaNeeds says what each SIMD kernel set needs of the CPU.
var isaNeeds = map[isaLevel]string{isaAVX2: "AVX2, FMA and F16C", isaAVX512: "AVX-512 F/BW/DQ/VL, VNNI and GFNI"}

// skipMissingISAs adds a skipped subtest, named for the kernel set, for
// each set this CPU cannot run, so that a test comparing the SIMD kernels
// with the reference says what it did not compare instead of passing.
func skipMissingISAs(t *testing.T) {
	t.Helper()
	for l := testBest + 1; l <= isaAVX512; l++ {
		t.Run(l.String(), func(t *testing.T) {
			if l <= bestISA() {
				t.Skipf("-isa=%s: the %s kernels are not compared with the reference", testBest, l)
			}
			t.Skipf("this CPU lacks %s: the %s kernels are not compared with the reference", isaNeeds[l], l)
		})
	}
}

// withISA runs f with the kernels of level l installed.
func withISA(t testing.TB, l isaLevel, f func()) {
	t.Helper()
	prev := useISA(l)
	defer useISA(prev)
	f()
}

var intFormats = []quant.DType{quant.Q8Row, quant.Q82F, quant.Q4TP}

// edgeVec returns test inputs of length n: normal values, a block of
// zeros, a block of tiny values, a huge outlier, exact ties.
func edgeVecs(r *rand.Rand, n int) map[string][]float32 {
	vs := map[string][]float32{}
	x := randVec(r, n+1)[1:] // unaligned
	vs["normal"] = x
	y := randVec(r, n)
	for i := range y {
		switch b := i / qblock; b % 4 {
		case 1:
			y[i] = 0
		case 2:
			y[i] *= 1e-30
		case 3:
			if i%qblock == 5 {
				y[i] = -3e4
			}
		}
	}
	vs["edges"] = y
	z := make([]float32, n)
	for i := range z {
		z[i] = float32(i%5-2) * 0.5 // 127/absmax·x lands on .5 ties
	}
	vs["ties"] = z
	u := make([]float32, n)
	for i := range u {
		u[i] = float32(r.IntN(3)-1) * 1e-37 // below qxMinAbs: zero blocks
	}
	vs["underflow"] = u
	return vs
}

func TestQuantizeMatchesReference(t *testing.T) {
	skipMissingISAs(t)
	r := rand.New(rand.NewPCG(5, 6))
	for _, l := range isaLevels() {
		for _, lay := range []qlayout{qPlain, qNib} {
			for _, n := range []int{1, 7, 31, 32, 33, 64, 100, 128, 160, 256, 1000, 2048} {
				if lay == qNib && n%32 != 0 {
					continue
				}
				for name, x := range edgeVecs(r, n) {
					var got, want qbatch
					withISA(t, l, func() {
						got.reset(lay, n, 1)
						fill(got.q, 0xAA)
						got.quantize(x)
					})
					want.reset(lay, n, 1)
					withISA(t, isaGeneric, func() { want.quantize(x) })
					for i := range want.q {
						if got.q[i] != want.q[i] {
							t.Fatalf("%s/%d/%d/%s: q[%d] = %d, reference %d", l, lay, n, name, i, int8(got.q[i]), int8(want.q[i]))
						}
					}
					for i := range want.d {
						if got.d[i] != want.d[i] || got.s[i] != want.s[i] {
							t.Fatalf("%s/%d/%d/%s: block %d: d %g s %d, reference d %g s %d", l, lay, n, name, i, got.d[i], got.s[i], want.d[i], want.s[i])
						}
					}
				}
			}
		}
	}
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// TestQuantizeBlock pins the arithmetic: scale absmax/127, round to
// nearest even, Σq, zero blocks.
func TestQuantizeBlock(t *testing.T) {
	var q [qblock]int8
	x := []float32{127, -63.5, 0.5, 1.5, -127, 2.5}
	d, sum := quantizeBlock(x, &q)
	want := []int8{127, -64, 0, 2, -127, 2}
	if d != 1 || sum != 127-64+2-127+2 {
		t.Fatalf("d %g, sum %d", d, sum)
	}
	for i, w := range want {
		if q[i] != w {
			t.Fatalf("q[%d] = %d, want %d", i, q[i], w)
		}
	}
	if d, sum := quantizeBlock([]float32{0, 0, 1e-37}, &q); d != 0 || sum != 0 || q != [qblock]int8{} {
		t.Fatalf("tiny block: d %g sum %d q %v", d, sum, q)
	}
}

// rowView returns row r as the integer kernels see it: W'[i] with
// y = Σ W'[i]·x'[i], x' the (for q8_2f column-scaled) input.
func rowView(m *Mat, r int) []float32 {
	w := make([]float32, m.Cols)
	post := genericTable[m.DType].decode(m, r, w)
	for i := range w {
		w[i] *= post
	}
	return w
}

// quantBound returns the bound on |int8 path - exact| for row r:
// Σ_blocks d_b/2·Σ_{i∈b}|W'[i]| (a block flushed to zero, d_b = 0, can
// lose all of Σ|W'[i]·x'[i]|), and the scale Σ|W'[i]·x'[i]|.
func quantBound(m *Mat, r int, xs []float32, v qvec) (bound, scale float64) {
	w := rowView(m, r)
	for i, wi := range w {
		wx := math.Abs(float64(wi) * float64(xs[i]))
		if d := v.d[i/qblock]; d != 0 {
			bound += float64(d) / 2 * math.Abs(float64(wi))
		} else {
			bound += wx
		}
		scale += wx
	}
	return bound, scale
}

// intMag is the size of the int path's float32 partial sums for row r:
// Σ_i (|w|+offset)·|q|·d·(row factor).
func intMag(m *Mat, r int, v qvec) float64 {
	var s float64
	if m.DType == quant.Q4TP {
		gpr := m.Cols / 32
		codes := m.codes[r*m.cstr : (r+1)*m.cstr]
		for g := range gpr {
			c, k := g/4*128, g%4*16
			var a float64
			for i := range 16 {
				a += 15 * (math.Abs(float64(int8(v.q[c+k+i]))) + math.Abs(float64(int8(v.q[c+64+k+i]))))
			}
			s += a * math.Abs(float64(v.d[g])*float64(m.ladder()[32*r+q4tpCode(codes, g)]))
		}
		return s
	}
	w := m.Data[r*m.Cols : (r+1)*m.Cols]
	for i, b := range w {
		s += (math.Abs(float64(int8(b))) + 128) * math.Abs(float64(int8(v.q[i]))) * float64(v.d[i/qblock])
	}
	return s * math.Abs(float64(m.scale[r]))
}

// checkIntKernels compares every installed int8 row kernel with the plain
// integer reference, and the reference with the float reference within
// the quantization bound.
func checkIntKernels(t *testing.T, m *Mat, x []float32) {
	t.Helper()
	xs := x
	if m.col != nil {
		xs = make([]float32, m.Cols)
		for i := range xs {
			xs[i] = x[i] * m.col[i]
		}
	}
	lay := qPlain
	if m.DType == quant.Q4TP {
		lay = qNib
	}
	var qb qbatch
	qb.reset(lay, m.Cols, 1)
	withISA(t, isaGeneric, func() { qb.quantize(xs) })
	v := qb.pos(0)
	codec, _ := quant.CodecFor(m.DType)
	ref := make([]float32, m.Rows)
	qrowsInt(m, 0, m.Rows, v, ref)
	for i := range m.Rows {
		exact := codec.DotRow(m.Data, m.Rows, m.Cols, i, x)
		bound, scale := quantBound(m, i, xs, v)
		tol := bound + 1e-5*scale + 2e-6*intMag(m, i, v)
		if d := math.Abs(float64(ref[i] - exact)); !(d <= tol) {
			t.Errorf("row %d: int8 reference %g, float reference %g: |diff| %g > bound %g", i, ref[i], exact, d, tol)
		}
	}
	for _, l := range isaLevels() {
		k := kernelTable[m.DType]
		withISA(t, l, func() { k = kernelTable[m.DType] })
		if k.qrows == nil {
			continue
		}
		for _, lo := range []int{0, 1} {
			got := make([]float32, m.Rows+1)
			got[m.Rows] = 42
			k.qrows(m, lo, m.Rows, v, got)
			if got[m.Rows] != 42 {
				t.Fatalf("%s: qrows wrote past hi", l)
			}
			for i := lo; i < m.Rows; i++ {
				tol := 2e-6*intMag(m, i, v) + 1e-30
				if d := math.Abs(float64(got[i] - ref[i])); !(d <= tol) {
					t.Errorf("%s lo=%d row %d: kernel %g, int8 reference %g (diff %g > %g)", l, lo, i, got[i], ref[i], d, tol)
				}
			}
		}
	}
}

func TestIntKernelsMatchReference(t *testing.T) {
	skipMissingISAs(t)
	r := rand.New(rand.NewPCG(7, 8))
	for _, d := range intFormats {
		sh := [][2]int{{1, 32}, {3, 64}, {4, 96}, {5, 32}, {13, 256}, {9, 160}, {8, 2048}, {6, 224}}
		if d != quant.Q4TP {
			sh = append(sh, [][2]int{{1, 1}, {3, 7}, {5, 33}, {2, 63}, {7, 65}, {4, 127}, {9, 200}}...)
		}
		for _, s := range sh {
			t.Run(fmt.Sprintf("%s/%dx%d", d, s[0], s[1]), func(t *testing.T) {
				m, _ := randMat(t, r, d, s[0], s[1])
				for _, x := range edgeVecs(r, s[1]) {
					checkIntKernels(t, m, x)
				}
			})
		}
	}
}

// rawMat returns a matrix of format d with random stored bytes, its f16
// fields (row scales, ladder parameters) set by f16(r).
func rawMat(t *testing.T, r *rand.Rand, d quant.DType, rows, cols int, fill func(i int) byte, f16 func(row, k int) float32) *Mat {
	t.Helper()
	n, err := quant.ExpectedBytes(d, []int{rows, cols})
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, n)
	switch d {
	case quant.Q8Row:
		for i := range rows * cols {
			b[i] = fill(i)
		}
		for i := range rows {
			binary.LittleEndian.PutUint16(b[rows*cols+2*i:], half.F32ToF16(f16(i, 0)))
		}
	case quant.Q4TP:
		po := rows * cols / 2
		for i := range po {
			b[i] = fill(i)
		}
		for i := range rows {
			binary.LittleEndian.PutUint16(b[po+4*i:], half.F32ToF16(f16(i, 0)))
			binary.LittleEndian.PutUint16(b[po+4*i+2:], half.F32ToF16(f16(i, 1)))
		}
		for i := po + 4*rows; i < len(b); i++ {
			b[i] = byte(r.Uint32())
		}
	}
	m, err := NewMat(d, rows, cols, b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestIntKernelsExtremes runs the int8 kernels on extreme stored values:
// all ±127/-128 quants, all-0 and all-15 nibbles, huge and tiny scales.
func TestIntKernelsExtremes(t *testing.T) {
	skipMissingISAs(t)
	r := rand.New(rand.NewPCG(11, 12))
	rnd := func(int) byte { return byte(r.Uint32()) }
	cases := []struct {
		name string
		d    quant.DType
		fill func(int) byte
		f16  func(row, k int) float32
	}{
		{"q8/-128", quant.Q8Row, func(int) byte { return 0x80 }, func(int, int) float32 { return 1 }},
		{"q8/127", quant.Q8Row, func(int) byte { return 127 }, func(int, int) float32 { return 1 }},
		{"q8/±", quant.Q8Row, func(i int) byte { return []byte{0x80, 127, 0x81, 0}[i%4] }, func(int, int) float32 { return 0.001 }},
		{"q8/huge", quant.Q8Row, rnd, func(int, int) float32 { return 60000 }},
		{"q8/tiny", quant.Q8Row, rnd, func(int, int) float32 { return 6e-8 }},
		{"q4/0", quant.Q4TP, func(int) byte { return 0 }, func(_, k int) float32 { return []float32{-3, 0.25}[k] }},
		{"q4/15", quant.Q4TP, func(int) byte { return 0xff }, func(_, k int) float32 { return []float32{-3, 0.25}[k] }},
		{"q4/huge", quant.Q4TP, rnd, func(_, k int) float32 { return []float32{80, 0.5}[k] }},
		{"q4/tiny", quant.Q4TP, rnd, func(_, k int) float32 { return []float32{-120, 0.5}[k] }},
		{"q4/random", quant.Q4TP, rnd, func(row, k int) float32 { return float32(r.NormFloat64()) }},
	}
	for _, c := range cases {
		for _, s := range [][2]int{{5, 64}, {4, 96}, {9, 2048}, {3, 32}} {
			t.Run(fmt.Sprintf("%s/%dx%d", c.name, s[0], s[1]), func(t *testing.T) {
				m := rawMat(t, r, c.d, s[0], s[1], c.fill, c.f16)
				for _, x := range edgeVecs(r, s[1]) {
					checkIntKernels(t, m, x)
				}
			})
		}
	}
}

// TestQuantErrorRelative states the bound in the terms of the brief: the
// int8 path's error on a row is at most Σ|W|·max|x|/254 and, on Gaussian
// inputs, typically a small fraction of that.
func TestQuantErrorRelative(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, d := range intFormats {
		m, _ := randMat(t, r, d, 64, 2048)
		x := randVec(r, 2048)
		p := NewPool(1)
		defer p.Close()
		y := make([]float32, m.Rows)
		p.MatVec(m, x, y)
		ref := refMatVec(t, m, x)
		var worst, mean float64
		for i := range y {
			w := rowView(m, i)
			var wx float64
			var xmax float64
			for j := range w {
				xs := float64(x[j])
				if m.col != nil {
					xs *= float64(m.col[j])
				}
				wx += math.Abs(float64(w[j]))
				xmax = max(xmax, math.Abs(xs))
			}
			if wx == 0 {
				continue // the all-zero row
			}
			rel := math.Abs(float64(y[i]-ref[i])) / (wx * xmax)
			if rel > 1.0/254+1e-6 {
				t.Errorf("%s row %d: error %g of Σ|W|·max|x| > 1/254", d, i, rel)
			}
			worst = max(worst, rel)
			mean += rel / float64(len(y))
		}
		t.Logf("%s (%s): |error| / (Σ|W|·max|x|): mean %.2g, worst %.2g (bound %.2g)", d, ISA(), mean, worst, 1.0/254)
	}
}

// TestDispatch forces each kernel set through the public entry points
// (MatVec, MatMul) and compares with the generic one.
func TestDispatch(t *testing.T) {
	skipMissingISAs(t)
	r := rand.New(rand.NewPCG(15, 16))
	p := NewPool(2)
	defer p.Close()
	for _, d := range floatFormats {
		m, _ := randMat(t, r, d, 67, 320)
		const n = 5
		X := randVec(r, n*320)
		want := make([]float32, n*67)
		var wantISA string
		withISA(t, isaGeneric, func() {
			wantISA = ISA()
			p.MatMul(m, X, n, want)
		})
		if wantISA != "generic" {
			t.Fatalf("forced generic, ISA() = %s", wantISA)
		}
		for _, l := range isaLevels()[1:] {
			withISA(t, l, func() {
				if ISA() != l.String() {
					t.Fatalf("forced %s, ISA() = %s", l, ISA())
				}
				got := make([]float32, n*67)
				p.MatMul(m, X, n, got)
				y := make([]float32, 67)
				for j := range n {
					// The int8 path runs the same row kernel for both.
					p.MatVec(m, X[j*320:(j+1)*320], y)
					tol := 1e-5
					if kernelTable[d].qx != qNone {
						tol = 0
					}
					if i, ok := closeRel(got[j*67:(j+1)*67], y, tol); !ok {
						t.Fatalf("%s %s: MatVec %g and MatMul %g differ at position %d row %d", l, d, y[i], got[j*67+i], j, i)
					}
				}
				tol := 1e-5
				if kernelTable[d].qx != qNone {
					tol = 2e-2 // int8 activations: bounded above, relative to the largest output
				}
				if i, ok := closeRel(got, want, tol); !ok {
					t.Fatalf("%s %s: element %d: %g, generic %g", l, d, i, got[i], want[i])
				}
			})
		}
	}
}

// TestMatMulTiles covers MatMul's position tiles (long rows: a tile holds
// few positions) and row blocks with a remainder, against MatVec.
func TestMatMulTiles(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	p := NewPool(2)
	defer p.Close()
	for _, d := range intFormats {
		m, _ := randMat(t, r, d, 11, 8192)
		const n = 70
		X := randVec(r, n*8192)
		Y := make([]float32, n*11)
		p.MatMul(m, X, n, Y)
		y := make([]float32, 11)
		// The transposed MatMul kernels sum in another order than the row
		// kernels, and q4tp's adds the -8·Σq bias in int32 where the row
		// kernel adds it in float32 (whose cancellation leaves ~1e-7 of
		// 8·Σ|q|·d·rung: -3e-4 for the zero row here);
		// TestIntMatMulMatchesReference holds both to the integer
		// reference.
		tol := 1e-3
		if kernelTable[d].qx == qNone {
			tol = 1e-5
		}
		for j := range n {
			p.MatVec(m, X[j*8192:(j+1)*8192], y)
			if i, ok := closeRel(Y[j*11:(j+1)*11], y, tol); !ok {
				t.Fatalf("%s position %d row %d: MatMul %g, MatVec %g", d, j, i, Y[j*11+i], y[i])
			}
		}
	}
}

// TestDot4f compares MatMul's inner kernel in use with the plain dot4 on
// contiguous rows (the assembly path) and on separate ones (its fallback).
func TestDot4f(t *testing.T) {
	skipMissingISAs(t)
	for _, l := range isaLevels() {
		withISA(t, l, func() { testDot4f(t) })
	}
}

func testDot4f(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 20))
	for _, n := range []int{1, 3, 15, 16, 17, 31, 32, 33, 64, 100, 2048} {
		buf := randVec(r, 4*n+1)[1:]
		x := randVec(r, n+2)[2:]
		sep := [4][]float32{randVec(r, n), randVec(r, n), randVec(r, n), randVec(r, n)}
		for _, w := range [][4][]float32{{buf[:n], buf[n : 2*n], buf[2*n : 3*n], buf[3*n:]}, sep} {
			a0, a1, a2, a3 := dot4f(w[0], w[1], w[2], w[3], x)
			b0, b1, b2, b3 := dot4(w[0], w[1], w[2], w[3], x)
			for i, p := range [][2]float32{{a0, b0}, {a1, b1}, {a2, b2}, {a3, b3}} {
				var mag float64
				for j := range x {
					mag += math.Abs(float64(w[i][j] * x[j]))
				}
				if d := math.Abs(float64(p[0] - p[1])); d > 1e-6*mag {
					t.Fatalf("%s n=%d row %d: %g, dot4 %g", ISA(), n, i, p[0], p[1])
				}
			}
		}
	}
}

// TestQ4TPLadder checks the rungs the kernels use (the AVX-512 ones compute
// them on the fly with a polynomial exp2) against the correctly rounded
// reference: a row whose group g has code g and first weight -8 (nibble
// 0; the others 0), dotted with one-hot inputs, returns -8·127 times rung
// g times the input's scale, with no other rounding.
func TestQ4TPLadder(t *testing.T) {
	skipMissingISAs(t)
	r := rand.New(rand.NewPCG(21, 22))
	const gpr = 32
	for trial := range 200 {
		a := float32(r.NormFloat64() * 20)
		b := float32(r.NormFloat64())
		if trial < 3 {
			a, b = []float32{0, -14, 7}[trial], []float32{0, 0.5, -0.25}[trial]
		}
		if math.Abs(float64(a))+31*math.Abs(float64(b)) > 120 {
			continue
		}
		m := rawMat(t, r, quant.Q4TP, 1, 32*gpr, func(i int) byte {
			if i%16 == 0 {
				return 0x80
			}
			return 0x88
		}, func(_, k int) float32 { return []float32{a, b}[k] })
		clear(m.codes)
		for g := range gpr {
			for j := range 5 {
				m.codes[(5*g+j)/8] |= byte(g>>j&1) << ((5*g + j) % 8)
			}
		}
		copy(m.codesEnd, m.codes)
		ref := m.ladder()
		for _, l := range isaLevels()[1:] {
			withISA(t, l, func() {
				k := kernelTable[quant.Q4TP]
				for g := range gpr {
					x := make([]float32, 32*gpr)
					x[32*g] = 1
					var qb qbatch
					qb.reset(qNib, len(x), 1)
					qb.quantize(x)
					y := make([]float32, 1)
					k.qrows(m, 0, 1, qb.pos(0), y)
					want := float32(-8*127) * (ref[g] * qb.d[g])
					if d := math.Abs(float64(y[0]-want)) / math.Abs(float64(want)); !(d <= 2.5e-7) {
						t.Fatalf("%s a=%g b=%g rung %d: kernel %g, reference %g (rel %g)", l, a, b, g, y[0], want, d)
					}
				}
			})
		}
	}
}

// FuzzIntKernels runs the int8 kernels of every ISA level on arbitrary
// stored bytes (any bytes are a valid q8_row or q4tp matrix) and inputs:
// they must not fault, and where the plain reference is finite and not
// huge they must agree with it.
func FuzzIntKernels(f *testing.F) {
	f.Add([]byte{1, 2, 3, 250, 0x80, 0x7f, 9, 0x3c}, uint8(5), uint8(3), false)
	f.Add([]byte{0xff, 0, 0x55, 0xaa}, uint8(1), uint8(1), true)
	f.Add([]byte("q4tp rows of groups"), uint8(17), uint8(9), true)
	if testBest == isaGeneric {
		f.Skip("this CPU runs only the generic kernels: no SIMD kernel to compare with the reference")
	}
	f.Fuzz(func(t *testing.T, data []byte, rows, width uint8, q4 bool) {
		if len(data) == 0 {
			return
		}
		d, cols := quant.Q8Row, 1+int(width)
		if q4 {
			d, cols = quant.Q4TP, 32*(1+int(width)%20)
		}
		nr := 1 + int(rows)%40
		n, err := quant.ExpectedBytes(d, []int{nr, cols})
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = data[i%len(data)] ^ byte(i/len(data))
		}
		if q4 { // ladders in a range where every path stays finite
			po := nr * cols / 2
			for r := range nr {
				b[po+4*r+1] &= 0xcf // |a| < 16 (f16 exponent below 19)
				b[po+4*r+3] &= 0xbb // |b| < 1
			}
		}
		m, err := NewMat(d, nr, cols, b)
		if err != nil {
			t.Fatal(err)
		}
		x := make([]float32, cols)
		for i := range x {
			x[i] = float32(int8(data[(i*7)%len(data)])) / 16
		}
		var qb qbatch
		lay := qPlain
		if q4 {
			lay = qNib
		}
		qb.reset(lay, cols, 1)
		withISA(t, isaGeneric, func() { qb.quantize(x) })
		v := qb.pos(0)
		ref := make([]float32, nr)
		qrowsInt(m, 0, nr, v, ref)
		for _, l := range isaLevels()[1:] {
			withISA(t, l, func() {
				got := make([]float32, nr)
				kernelTable[d].qrows(m, 0, nr, v, got)
				for i := range nr {
					mag := intMag(m, i, v)
					if math.IsInf(float64(ref[i]), 0) || math.IsNaN(float64(ref[i])) || !(mag < 1e30) {
						continue
					}
					if diff := math.Abs(float64(got[i] - ref[i])); !(diff <= 2e-6*mag+1e-30) {
						t.Fatalf("%s %s %dx%d row %d: kernel %g, reference %g", l, d, nr, cols, i, got[i], ref[i])
					}
				}
			})
		}
	})
}

// quantSpecials are the float32 bit patterns FuzzQuantizeRow mixes in:
// NaNs, infinities, ±0, denormals, the extremes, the zero-block threshold
// 0x1p-120 and the value just below it, ±127 and ties.
var quantSpecials = []uint32{
	0x7fc00000, 0xffc00001, 0x7f800001, 0x7f800000, 0xff800000, 0x80000000, 0,
	1, 0x807fffff, 0x7f7fffff, 0xff7fffff, 0x03800000, 0x037fffff, 0x83800000,
	0x42fe0000, 0xc2fe0000, 0x3f000000, 0xbfc00000, 0x40200000,
}

// fuzzQuantInput builds a quantizer input of n values from data, in one
// of four modes: raw bit patterns (any float32, NaN and denormals
// included), values of sign and mantissa from data in a few binades,
// small multiples of a power of two (exact values and ties), and the
// latter with specials mixed in.
func fuzzQuantInput(data []byte, n int, mode uint8) []float32 {
	x := make([]float32, n)
	for i := range x {
		var w uint32
		for j := range 4 {
			k := 4*i + j
			w |= uint32(data[k%len(data)]^byte(k/len(data))) << (8 * j)
		}
		switch mode % 4 {
		case 0:
			x[i] = math.Float32frombits(w)
		case 1:
			e := 120 + (w>>23)%16
			x[i] = math.Float32frombits(w&0x807fffff | e<<23)
		case 2:
			x[i] = float32(int8(w)) * float32(math.Ldexp(1, int(mode>>2)%64-40))
		default:
			if w>>24 < 24 {
				x[i] = math.Float32frombits(quantSpecials[int(w>>8)%len(quantSpecials)])
			} else {
				x[i] = float32(int8(w)) * float32(math.Ldexp(1, int(mode>>2)%64-40))
			}
		}
	}
	return x
}

// FuzzQuantizeRow compares the activation quantizer of every SIMD level
// with quantizeRowGo byte for byte, on arbitrary float32 inputs (NaN,
// infinities, denormals, huge values) of any length and alignment, in
// both layouts (qNib for whole blocks): the q bytes, scales and biases,
// and that nothing past the blocks is written. In the last partial
// qPlain block the positions past the input may be left alone (as
// quantizeRowGo does) or zeroed.
func FuzzQuantizeRow(f *testing.F) {
	f.Add([]byte{1, 2, 3, 250, 0x80, 0x7f, 9, 0x3c}, uint16(37), uint8(0))
	f.Add([]byte("activations of a mixture of experts"), uint16(64), uint8(1))
	f.Add([]byte{0x10, 0xff, 0x02, 0x81}, uint16(100), uint8(2))
	f.Add([]byte{0x10, 0xff, 0x02, 0x81, 7, 8, 9, 0x20}, uint16(95), uint8(0x9e))
	f.Add([]byte{0, 0, 0xc0, 0x7f, 0, 0, 0x80, 0x7f}, uint16(32), uint8(0))
	f.Add([]byte{0, 0, 0x80, 0x7f, 0, 0, 0x80, 0x3f}, uint16(256), uint8(0))
	f.Add([]byte{5, 0, 0, 0x10}, uint16(31), uint8(0x23))
	if testBest == isaGeneric {
		f.Skip("this CPU runs only the generic kernels: no SIMD quantizer to compare with the reference")
	}
	f.Fuzz(func(t *testing.T, data []byte, length uint16, mode uint8) {
		if len(data) == 0 {
			return
		}
		n := int(length) % 601
		off := int(mode>>4) % 4 // unaligned starts
		x := append(make([]float32, off), fuzzQuantInput(data, n, mode)...)[off:]
		nb := (n + qblock - 1) / qblock
		for _, lay := range []qlayout{qPlain, qNib} {
			if lay == qNib && n%qblock != 0 {
				continue
			}
			alloc := func() qvec {
				v := qvec{q: make([]byte, (nb*qblock+qpad-1)/qpad*qpad+qpad), d: make([]float32, nb+16), s: make([]int32, nb+16)}
				fill(v.q, 0xAA)
				for i := range v.d {
					v.d[i], v.s[i] = math.Float32frombits(0x7fc0dead), 0x5a5a5a5a
				}
				return v
			}
			want := alloc()
			quantizeRowGo(x, want, lay)
			for _, l := range isaLevels()[1:] {
				got := alloc()
				withISA(t, l, func() { quantizeRow(x, got, lay) })
				for i := range want.d {
					if math.Float32bits(got.d[i]) != math.Float32bits(want.d[i]) || got.s[i] != want.s[i] {
						t.Fatalf("%s layout %d n=%d block %d (x %v): d %g s %d, reference d %g s %d",
							l, lay, n, i, x[min(n, 32*i):min(n, 32*i+32)], got.d[i], got.s[i], want.d[i], want.s[i])
					}
				}
				for i := range want.q {
					if got.q[i] == want.q[i] || lay == qPlain && i >= n && i < nb*qblock && got.q[i] == 0 {
						continue
					}
					b := i / qblock // the block byte i belongs to
					if lay == qNib {
						b = i/128*4 + i%64/16
					}
					t.Fatalf("%s layout %d n=%d: q[%d] = %#x, reference %#x (x of block %d: %v)",
						l, lay, n, i, got.q[i], want.q[i], b, x[min(n, b*qblock):min(n, b*qblock+qblock)])
				}
			}
		}
	})
}

// TestIntMatMulMatchesReference runs every int8 MatMul kernel of this
// build (on amd64 the transposed small-batch one and the chunked one) for
// each int8 format at batch sizes around their thresholds, on rows of
// multiples of 512 columns and not, against the plain integer reference
// of each position.
func TestIntMatMulMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	p := NewPool(2)
	defer p.Close()
	for _, d := range intFormats {
		for _, sh := range [][2]int{{4, 512}, {9, 1024}, {37, 2560}, {8, 8192}, {13, 96}, {6, 544}} {
			rows, cols := sh[0], sh[1]
			m, _ := randMat(t, r, d, rows, cols)
			for _, n := range []int{2, 3, 4, 5, 8, 16, 33} {
				X := randVec(r, n*cols)
				for j := range cols { // a position of zeros and one of large values
					X[j], X[(n-1)*cols+j] = 0, X[(n-1)*cols+j]*1e4
				}
				xs := X
				if m.col != nil {
					xs = make([]float32, len(X))
					for i := range xs {
						xs[i] = X[i] * m.col[i%cols]
					}
				}
				var qb qbatch
				qb.reset(kernelTable[d].qx, cols, n)
				if qb.layout == qNone {
					qb.reset(qPlain, cols, n)
					if d == quant.Q4TP {
						qb.reset(qNib, cols, n)
					}
				}
				withISA(t, isaGeneric, func() { qb.quantize(xs) })
				want := make([]float32, n*rows)
				for j := range n {
					qrowsInt(m, 0, rows, qb.pos(j), want[j*rows:(j+1)*rows])
				}
				for _, k := range smallBatchKernels(d) {
					restore := k.use()
					got := make([]float32, n*rows+1)
					got[n*rows] = 42
					p.MatMul(m, X, n, got[:n*rows])
					restore()
					if got[n*rows] != 42 {
						t.Fatalf("%s%s %dx%d n=%d: wrote past Y", d, k.name, rows, cols, n)
					}
					if kernelTable[d].qx == qNone {
						continue // generic build: float kernels, checked elsewhere
					}
					for j := range n {
						v := qb.pos(j)
						for i := range rows {
							tol := 2e-6*intMag(m, i, v) + 1e-30
							if diff := math.Abs(float64(got[j*rows+i] - want[j*rows+i])); !(diff <= tol) {
								t.Fatalf("%s %s%s %dx%d n=%d position %d row %d: %g, int8 reference %g (diff %g > %g)",
									ISA(), d, k.name, rows, cols, n, j, i, got[j*rows+i], want[j*rows+i], diff, tol)
							}
						}
					}
				}
			}
		}
	}
}
