package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cortiq/cortiq/quant"
)

var floatFormats = []quant.DType{quant.F32, quant.F16, quant.BF16, quant.Q8Row, quant.Q82F, quant.Q4TP}

// randMat encodes a random rows×cols matrix (normal weights with a few
// outliers and some all-zero rows) in format d.
func randMat(t testing.TB, r *rand.Rand, d quant.DType, rows, cols int) (*Mat, []float32) {
	t.Helper()
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(r.NormFloat64() * 0.05)
		if r.IntN(97) == 0 {
			w[i] *= 20
		}
	}
	if rows > 2 {
		clear(w[cols : 2*cols]) // an all-zero row
	}
	data, err := quant.Encode(d, w, []int{rows, cols}, nil)
	if err != nil {
		t.Fatalf("%s %d×%d: %v", d, rows, cols, err)
	}
	m, err := NewMat(d, rows, cols, data)
	if err != nil {
		t.Fatal(err)
	}
	return m, w
}

func randVec(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// shapes returns odd and even shapes the format can hold.
func shapes(d quant.DType) [][2]int {
	if d == quant.Q4TP {
		return [][2]int{{1, 32}, {3, 64}, {4, 96}, {5, 32}, {13, 256}, {9, 160}}
	}
	return [][2]int{{1, 1}, {3, 7}, {4, 8}, {5, 33}, {13, 100}, {9, 256}, {2, 15}, {4, 31}, {8, 47}, {5, 64}, {4, 1000}}
}

// absDot returns Σ|W[r,i]·x[i]| of the stored (decoded) weights: the scale
// of the rounding error of any summation order.
func absDot(c quant.Codec, m *Mat, r int, x []float32) float64 {
	row := make([]float32, m.Cols)
	c.DecodeRow(row, m.Data, m.Rows, m.Cols, r)
	var s float64
	for i, v := range row {
		s += math.Abs(float64(v) * float64(x[i]))
	}
	return s
}

// TestRowKernelsMatchReference compares every format's fast row dot (and
// dot4 and decode) with the codec's plain DotRow/DecodeRow.
func TestRowKernelsMatchReference(t *testing.T) {
	skipMissingISAs(t)
	for _, l := range isaLevels() {
		withISA(t, l, func() { testRowKernels(t, l) })
	}
}

func testRowKernels(t *testing.T, l isaLevel) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, d := range floatFormats {
		c, err := quant.CodecFor(d)
		if err != nil {
			t.Fatal(err)
		}
		k := kernelFor(d)
		for _, sh := range shapes(d) {
			rows, cols := sh[0], sh[1]
			t.Run(fmt.Sprintf("%s/%s/%dx%d", l, d, rows, cols), func(t *testing.T) {
				m, _ := randMat(t, r, d, rows, cols)
				// An unaligned view of x: start one element into a buffer.
				x := randVec(r, cols+1)[1:]
				xc := x
				if m.col != nil {
					xc = make([]float32, cols)
					for i := range xc {
						xc[i] = x[i] * m.col[i]
					}
				}
				got := make([]float32, rows)
				for i := range rows {
					got[i] = k.dot(m, i, xc)
					want := c.DotRow(m.Data, rows, cols, i, x)
					tol := 1e-6*absDot(c, m, i, x) + 1e-30
					if diff := math.Abs(float64(got[i] - want)); diff > tol {
						t.Errorf("row %d: fast %g, reference %g (diff %g > %g)", i, got[i], want, diff, tol)
					}
				}
				for i := 0; i+4 <= rows; i += 4 {
					a, b, cc, dd := k.dot4(m, i, xc)
					for j, v := range []float32{a, b, cc, dd} {
						tol := 1e-6*absDot(c, m, i+j, x) + 1e-30
						if diff := math.Abs(float64(v - got[i+j])); diff > tol {
							t.Errorf("dot4 row %d: %g, dot %g", i+j, v, got[i+j])
						}
					}
				}
				row, ref := make([]float32, cols), make([]float32, cols)
				for i := range rows {
					m.Row(i, row)
					c.DecodeRow(ref, m.Data, rows, cols, i)
					for j := range row {
						if row[j] != ref[j] && !(math.IsNaN(float64(row[j])) && math.IsNaN(float64(ref[j]))) {
							t.Fatalf("Row(%d)[%d] = %g, DecodeRow %g", i, j, row[j], ref[j])
						}
					}
				}
			})
		}
	}
}

// refMatVec is the plain reference: one DotRow per row.
func refMatVec(t testing.TB, m *Mat, x []float32) []float32 {
	c, err := quant.CodecFor(m.DType)
	if err != nil {
		t.Fatal(err)
	}
	y := make([]float32, m.Rows)
	for r := range y {
		y[r] = c.DotRow(m.Data, m.Rows, m.Cols, r, x)
	}
	return y
}

// refMatVecInt is the plain reference of the int8-activation path:
// the reference quantizer and the integer row references.
func refMatVecInt(m *Mat, x []float32) []float32 {
	xs := x[:m.Cols]
	if m.col != nil {
		xs = make([]float32, m.Cols)
		for i := range xs {
			xs[i] = x[i] * m.col[i]
		}
	}
	var qb qbatch
	qb.reset(kernelTable[m.DType].qx, m.Cols, 1)
	quantizeRowGo(xs, qb.pos(0), qb.layout)
	y := make([]float32, m.Rows)
	qrowsInt(m, 0, m.Rows, qb.pos(0), y)
	return y
}

func closeRel(a, b []float32, tol float64) (int, bool) {
	var scale float64
	for _, v := range b {
		scale = max(scale, math.Abs(float64(v)))
	}
	for i := range a {
		if math.Abs(float64(a[i]-b[i])) > tol*(scale+1e-30) {
			return i, false
		}
	}
	return 0, true
}

func TestMatVecAndMatMul(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, workers := range []int{1, 2, 3} {
		p := NewPool(workers)
		defer p.Close()
		for _, d := range floatFormats {
			for _, sh := range [][2]int{{7, 64}, {130, 96}, {257, 320}, {1000, 64}} {
				rows, cols := sh[0], sh[1]
				t.Run(fmt.Sprintf("w%d/%s/%dx%d", workers, d, rows, cols), func(t *testing.T) {
					m, _ := randMat(t, r, d, rows, cols)
					x := randVec(r, cols+3)[3:]
					y := make([]float32, rows)
					p.MatVec(m, x, y)
					want := refMatVec(t, m, x)
					if kernelTable[d].qx != qNone {
						want = refMatVecInt(m, x)
					}
					if i, ok := closeRel(y, want, 1e-5); !ok {
						t.Fatalf("MatVec row %d: %g, reference %g", i, y[i], want[i])
					}
					for _, n := range []int{2, 3, 33, 70} {
						X := randVec(r, n*cols+1)[1:]
						Y := make([]float32, n*rows)
						p.MatMul(m, X, n, Y)
						for j := range n {
							p.MatVec(m, X[j*cols:(j+1)*cols], y)
							if i, ok := closeRel(Y[j*rows:(j+1)*rows], y, 1e-5); !ok {
								t.Fatalf("n=%d position %d row %d: MatMul %g, MatVec %g", n, j, i, Y[j*rows+i], y[i])
							}
						}
					}
				})
			}
		}
	}
}

func TestNewMatRejects(t *testing.T) {
	good, _ := quant.Encode(quant.F32, make([]float32, 6), []int{2, 3}, nil)
	for _, c := range []struct {
		name       string
		d          quant.DType
		rows, cols int
		data       []byte
	}{
		{"short", quant.F32, 2, 3, good[:20]},
		{"long", quant.F32, 2, 2, good},
		{"empty", quant.F32, 0, 3, nil},
		{"u8", quant.U8, 2, 12, good},
		{"unknown", quant.DType(42), 2, 12, good},
		{"q4tp cols", quant.Q4TP, 1, 24, make([]byte, 64)},
		{"unaligned", quant.F32, 2, 3, append(make([]byte, 1, 25), good...)[1:]},
	} {
		if _, err := NewMat(c.d, c.rows, c.cols, c.data); err == nil {
			t.Errorf("%s: accepted", c.name)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
}

type markTask struct{ seen []int32 }

func (m *markTask) Run(lo, hi, _ int) {
	for i := lo; i < hi; i++ {
		m.seen[i]++
	}
}

func TestPoolCoversRange(t *testing.T) {
	for _, w := range []int{1, 2, 3, 8} {
		p := NewPool(w)
		for _, n := range []int{0, 1, 2, 5, 17, 1000} {
			mt := &markTask{seen: make([]int32, n)}
			p.For(n, 1<<20, mt)
			for i, s := range mt.seen {
				if s != 1 {
					t.Fatalf("workers %d, n %d: index %d ran %d times", w, n, i, s)
				}
			}
		}
		p.Close()
		p.Close() // idempotent
	}
}

func TestExp(t *testing.T) {
	var worst float64
	for x := float32(-100); x < 89; x += 0.0137 {
		got, want := float64(Exp(x)), math.Exp(float64(x))
		if want < 0x1p-126 || want > math.MaxFloat32 {
			continue
		}
		worst = max(worst, math.Abs(got-want)/want)
	}
	if worst > 3e-7 {
		t.Fatalf("Exp max relative error %g", worst)
	}
	if !math.IsNaN(float64(Exp(float32(math.NaN())))) || Exp(-200) != 0 || !math.IsInf(float64(Exp(200)), 1) {
		t.Fatal("Exp special values")
	}
	t.Logf("Exp max relative error %.3g", worst)
}

func TestRMSNormSoftmaxSiLU(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	x, w := randVec(r, 37), randVec(r, 37)
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := 1 / math.Sqrt(ss/37+1e-6)
	for _, onePlus := range []bool{false, true} {
		y := make([]float32, 37)
		RMSNorm(y, x, w, 1e-6, onePlus)
		for i := range y {
			ww := float64(w[i])
			if onePlus {
				ww++
			}
			if want := ww * float64(x[i]) * inv; math.Abs(float64(y[i])-want) > 1e-6*(1+math.Abs(want)) {
				t.Fatalf("onePlus=%v: y[%d] = %g, want %g", onePlus, i, y[i], want)
			}
		}
	}
	s := append([]float32(nil), x...)
	s[3] = 80 // large values must not overflow
	Softmax(s)
	var sum, mx float64
	for _, v := range x {
		mx = max(mx, float64(v))
	}
	mx = max(mx, 80)
	for i, v := range x {
		if i == 3 {
			v = 80
		}
		sum += math.Exp(float64(v) - mx)
	}
	for i, v := range x {
		if i == 3 {
			v = 80
		}
		if want := math.Exp(float64(v)-mx) / sum; math.Abs(float64(s[i])-want) > 1e-6 {
			t.Fatalf("softmax[%d] = %g, want %g", i, s[i], want)
		}
	}
	a, b := append([]float32(nil), x...), randVec(r, 37)
	SiLUMul(a, b)
	for i := range a {
		v := float64(x[i])
		if want := v / (1 + math.Exp(-v)) * float64(b[i]); math.Abs(float64(a[i])-want) > 1e-6*(1+math.Abs(want)) {
			t.Fatalf("silu[%d] = %g, want %g", i, a[i], want)
		}
	}
}

// refInvFreq computes RoPE inverse frequencies in float64 straight from
// the formulas of transformers' modeling_rope_utils.py (v5).
func refInvFreq(c RopeConfig, seqLen int) ([]float64, float64) {
	prf := c.PartialRotaryFactor
	if prf == 0 {
		prf = 1
	}
	d := int(float64(c.HeadDim) * prf)
	omp := float64(c.OriginalMaxPos)
	if omp == 0 {
		omp = float64(c.MaxPositions)
	}
	base := c.Theta
	if c.Type == "dynamic" {
		L := float64(max(seqLen, c.MaxPositions))
		base *= math.Pow(c.Factor*L/float64(c.MaxPositions)-(c.Factor-1), float64(d)/float64(d-2))
	}
	inv := make([]float64, d/2)
	for i := range inv {
		inv[i] = 1 / math.Pow(base, float64(2*i)/float64(d))
	}
	scale := 1.0
	switch c.Type {
	case "linear":
		for i := range inv {
			inv[i] /= c.Factor
		}
	case "llama3":
		lw, hw := omp/c.LowFreqFactor, omp/c.HighFreqFactor
		for i, v := range inv {
			wl := 2 * math.Pi / v
			switch {
			case wl < hw:
			case wl > lw:
				inv[i] = v / c.Factor
			default:
				s := (omp/wl - c.LowFreqFactor) / (c.HighFreqFactor - c.LowFreqFactor)
				inv[i] = (1-s)*v/c.Factor + s*v
			}
		}
	case "yarn":
		scale = 0.1*math.Log(c.Factor) + 1
		if c.AttnFactor != 0 {
			scale = c.AttnFactor
		}
		bf, bs := 32.0, 1.0
		cd := func(rot float64) float64 {
			return float64(d) * math.Log(omp/(rot*2*math.Pi)) / (2 * math.Log(c.Theta))
		}
		lo, hi := math.Max(math.Floor(cd(bf)), 0), math.Min(math.Ceil(cd(bs)), float64(d-1))
		for i, v := range inv {
			ramp := math.Min(math.Max((float64(i)-lo)/(hi-lo), 0), 1)
			inv[i] = v/c.Factor*ramp + v*(1-ramp)
		}
	}
	return inv, scale
}

func TestRopeFrequencies(t *testing.T) {
	base := RopeConfig{HeadDim: 64, Theta: 10000, MaxPositions: 128}
	cases := map[string]RopeConfig{}
	add := func(name string, f func(c *RopeConfig)) {
		c := base
		f(&c)
		cases[name] = c
	}
	add("default", func(c *RopeConfig) {})
	add("partial", func(c *RopeConfig) { c.PartialRotaryFactor = 0.25; c.Theta = 1e7 })
	add("linear", func(c *RopeConfig) { c.Type, c.Factor = "linear", 4 })
	add("dynamic", func(c *RopeConfig) { c.Type, c.Factor = "dynamic", 2 })
	add("llama3", func(c *RopeConfig) {
		c.Type, c.Factor, c.LowFreqFactor, c.HighFreqFactor, c.OriginalMaxPos, c.Theta = "llama3", 8, 1, 4, 64, 500000
	})
	add("yarn", func(c *RopeConfig) { c.Type, c.Factor, c.OriginalMaxPos, c.Theta = "yarn", 4, 32, 1e6 })
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r, err := NewRope(c)
			if err != nil {
				t.Fatal(err)
			}
			for _, L := range []int{10, 128, 300} {
				inv, scale := r.Freqs(L, make([]float32, r.Dim()/2))
				want, wscale := refInvFreq(c, L)
				if len(inv) != len(want) || math.Abs(float64(scale)-wscale) > 1e-6 {
					t.Fatalf("L=%d: %d freqs scale %g, want %d scale %g", L, len(inv), scale, len(want), wscale)
				}
				for i := range inv {
					if math.Abs(float64(inv[i])-want[i]) > 2e-6*want[i] {
						t.Fatalf("L=%d: inv_freq[%d] = %g, want %g", L, i, inv[i], want[i])
					}
				}
			}
		})
	}
	if _, err := NewRope(RopeConfig{HeadDim: 64, Theta: 1e4, Type: "longrope", Factor: 2}); err == nil {
		t.Error("longrope accepted")
	}
	if _, err := NewRope(RopeConfig{HeadDim: 10, PartialRotaryFactor: 0.3, Theta: 1e4}); err == nil {
		t.Error("odd rotary dimension accepted")
	}
}

func TestApplyRope(t *testing.T) {
	r, err := NewRope(RopeConfig{HeadDim: 8, PartialRotaryFactor: 0.5, Theta: 100, MaxPositions: 64})
	if err != nil {
		t.Fatal(err)
	}
	inv, scale := r.Freqs(1, nil)
	x := []float32{1, 2, 3, 4, 5, 6, 7, 8}
	cos, sin := make([]float32, 2), make([]float32, 2)
	CosSin(inv, scale, 0, cos, sin)
	y := append([]float32(nil), x...)
	ApplyRope(y, cos, sin)
	for i := range x {
		if y[i] != x[i] {
			t.Fatalf("position 0 changed x: %v", y)
		}
	}
	CosSin(inv, scale, 5, cos, sin)
	ApplyRope(y, cos, sin)
	// Pairs (0,2) and (1,3) rotate by 5·inv[i]; dims 4..7 pass through.
	for i := 0; i < 2; i++ {
		a := 5 * float64(inv[i])
		w0 := float64(x[i])*math.Cos(a) - float64(x[i+2])*math.Sin(a)
		w1 := float64(x[i+2])*math.Cos(a) + float64(x[i])*math.Sin(a)
		if math.Abs(float64(y[i])-w0) > 1e-5 || math.Abs(float64(y[i+2])-w1) > 1e-5 {
			t.Fatalf("pair %d: got %g,%g want %g,%g", i, y[i], y[i+2], w0, w1)
		}
	}
	for i := 4; i < 8; i++ {
		if y[i] != x[i] {
			t.Fatalf("pass-through dim %d changed", i)
		}
	}
}

func BenchmarkMatVec(b *testing.B) {
	r := rand.New(rand.NewPCG(9, 9))
	p := NewPool(0)
	defer p.Close()
	for _, sh := range [][2]int{{2048, 2048}, {8192, 2048}} {
		for _, d := range floatFormats {
			m, _ := randMat(b, r, d, sh[0], sh[1])
			x, y := randVec(r, sh[1]), make([]float32, sh[0])
			b.Run(fmt.Sprintf("%s/%dx%d", d, sh[0], sh[1]), func(b *testing.B) {
				b.SetBytes(int64(len(m.Data)))
				for b.Loop() {
					p.MatVec(m, x, y)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(sh[0]*sh[1])*1e3, "ps/weight")
			})
		}
	}
}

func BenchmarkMatMul(b *testing.B) {
	r := rand.New(rand.NewPCG(9, 9))
	p := NewPool(0)
	defer p.Close()
	const n = 64
	for _, d := range floatFormats {
		m, _ := randMat(b, r, d, 2048, 2048)
		X, Y := randVec(r, n*2048), make([]float32, n*2048)
		b.Run(fmt.Sprintf("%s/2048x2048/n%d", d, n), func(b *testing.B) {
			b.SetBytes(int64(len(m.Data)))
			for b.Loop() {
				p.MatMul(m, X, n, Y)
			}
			b.ReportMetric(2*n*2048*2048*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// TestSetISA switches kernel sets by name and refuses unknown ones.
func TestSetISA(t *testing.T) {
	best := ISA()
	sets := ISAs()
	if sets[0] != "generic" || sets[len(sets)-1] != best {
		t.Fatalf("ISAs() = %v with %s in use", sets, best)
	}
	for _, s := range sets {
		prev, err := SetISA(s)
		if err != nil || ISA() != s {
			t.Fatalf("SetISA(%s): %v, ISA() = %s", s, err, ISA())
		}
		if _, err := SetISA(prev); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := SetISA("neon"); err == nil || ISA() != best {
		t.Fatalf("SetISA(neon): %v, ISA() = %s", err, ISA())
	}
	if best != "avx512" {
		if _, err := SetISA("avx512"); err == nil {
			t.Fatal("SetISA(avx512) on a CPU without it succeeded")
		}
	}
}
