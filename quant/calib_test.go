package quant

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestColumnStats(t *testing.T) {
	s := NewColumnStats(3)
	if err := s.Add([]float32{1, 2, 0, 3, -2, 0}, 2); err != nil {
		t.Fatal(err)
	}
	o := NewColumnStats(3)
	if err := o.Add([]float32{0, 0, 4}, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Merge(o); err != nil {
		t.Fatal(err)
	}
	want := []float64{math.Sqrt(10.0 / 3), math.Sqrt(8.0 / 3), math.Sqrt(16.0 / 3)}
	got := s.RMS()
	for i := range want {
		if math.Abs(float64(got[i])-want[i]) > 1e-6 {
			t.Fatalf("RMS %v, want %v", got, want)
		}
	}
	if s.Rows() != 3 || s.Cols() != 3 {
		t.Fatalf("rows %d cols %d", s.Rows(), s.Cols())
	}
	for _, c := range []struct {
		x    []float32
		rows int
	}{{[]float32{1, 2}, 1}, {[]float32{1, 2, float32(math.NaN())}, 1}, {[]float32{1, 2, 3}, -1}} {
		if err := s.Add(c.x, c.rows); err == nil {
			t.Errorf("Add(%v, %d) accepted", c.x, c.rows)
		}
	}
	if s.Rows() != 3 {
		t.Fatal("a failed Add changed the statistics")
	}
	if err := s.Merge(NewColumnStats(2)); err == nil {
		t.Fatal("merged statistics of another width")
	}
	if r := NewColumnStats(2).RMS(); r[0] != 0 || r[1] != 0 {
		t.Fatalf("empty statistics give %v", r)
	}
}

func TestStatWeights(t *testing.T) {
	if StatWeights(nil) != nil || StatWeights([]float32{0, 0}) != nil {
		t.Fatal("no statistics must mean no weights")
	}
	w := StatWeights([]float32{1, 2, 0, 4})
	var sum float64
	for _, v := range w {
		sum += float64(v)
	}
	if math.Abs(sum/4-1) > 1e-6 {
		t.Fatalf("weights %v do not average 1", w)
	}
	if !(w[2] > 0) || math.Abs(float64(w[3]/w[1])-4) > 1e-5 || math.Abs(float64(w[1]/w[0])-4) > 1e-5 {
		t.Fatalf("weights %v: want mean squares, the silent column floored above 0", w)
	}
}

// unevenInputs returns n input rows of cols columns whose per-column RMS
// is log-normal (σ = 1 in log space), as activations with a few strong
// channels are, plus those RMS values.
func unevenInputs(r *rand.Rand, n, cols int) ([]float32, []float32) {
	rms := make([]float32, cols)
	for i := range rms {
		rms[i] = float32(math.Exp(r.NormFloat64()))
	}
	x := make([]float32, n*cols)
	for i := range x {
		x[i] = rms[i%cols] * float32(r.NormFloat64())
	}
	return x, rms
}

// outputErr returns ‖(Ŵ−W)X‖/‖WX‖ over the rows of x.
func outputErr(w, got, x []float32, rows, cols int) float64 {
	var num, den float64
	for t := 0; t < len(x)/cols; t++ {
		xt := x[t*cols : (t+1)*cols]
		for o := range rows {
			var y, d float64
			for i, v := range xt {
				y += float64(w[o*cols+i]) * float64(v)
				d += float64(got[o*cols+i]-w[o*cols+i]) * float64(v)
			}
			num += d * d
			den += y * y
		}
	}
	return math.Sqrt(num / den)
}

// TestQ4TPColStatsBeatPlain encodes matrices for inputs with uneven
// column scales: with the inputs' RMS as ColStats the output error must
// drop against the plain encoding, and the encoding stays deterministic
// and chunkable.
func TestQ4TPColStatsBeatPlain(t *testing.T) {
	const rows, cols = 64, 512
	r := rand.New(rand.NewPCG(21, 21))
	for _, kind := range []string{"gaussian", "uneven-columns"} {
		w, err := TestMatrix(kind, rows, cols, 3)
		if err != nil {
			t.Fatal(err)
		}
		x, rms := unevenInputs(r, 256, cols)
		shape := []int{rows, cols}
		plain := mustEncode(t, Q4TP, w, shape, nil)
		opt := &EncodeOptions{ColStats: rms}
		cal := mustEncode(t, Q4TP, w, shape, opt)
		if !bytes.Equal(cal, mustEncode(t, Q4TP, w, shape, opt)) {
			t.Fatal("calibrated encoding is not deterministic")
		}
		// Chunks of rows encode to the same bytes.
		chunked := make([]byte, len(cal))
		c, _ := CodecFor(Q4TP)
		for r0 := 0; r0 < rows; r0 += 5 {
			r1 := min(rows, r0+5)
			if err := c.EncodeRows(chunked, w[r0*cols:r1*cols], rows, cols, r0, opt); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(chunked, cal) {
			t.Fatal("chunked calibrated encoding differs")
		}
		gp, _ := Decode(Q4TP, plain, shape)
		gc, _ := Decode(Q4TP, cal, shape)
		ep, ec := outputErr(w, gp, x, rows, cols), outputErr(w, gc, x, rows, cols)
		t.Logf("%s: output error plain %.5f, with ColStats %.5f", kind, ep, ec)
		if ec > 0.9*ep {
			t.Errorf("%s: calibrated output error %.5f is not 10%% below plain %.5f", kind, ec, ep)
		}
	}
}

func TestQ4TPColStatsRejected(t *testing.T) {
	w := make([]float32, 64)
	for _, st := range [][]float32{make([]float32, 63), append(make([]float32, 63), -1), append(make([]float32, 63), float32(math.Inf(1)))} {
		_, err := Encode(Q4TP, w, []int{1, 64}, &EncodeOptions{ColStats: st})
		if err == nil || !strings.Contains(err.Error(), "q4tp") {
			t.Errorf("statistics %v...: error %v", st[len(st)-1], err)
		}
	}
}

// correlatedInputs returns n rows of inputs whose columns are correlated
// (a random mix of fewer latent factors plus noise) and unevenly scaled,
// where GPTQ's error feedback has something to exploit.
func correlatedInputs(r *rand.Rand, n, cols int) []float32 {
	k := cols / 4
	mix := make([]float64, k*cols)
	for i := range mix {
		mix[i] = r.NormFloat64()
	}
	scale := make([]float64, cols)
	for i := range scale {
		scale[i] = math.Exp(0.7 * r.NormFloat64())
	}
	x := make([]float32, n*cols)
	z := make([]float64, k)
	for t := range n {
		for j := range z {
			z[j] = r.NormFloat64()
		}
		for i := range cols {
			s := 0.3 * r.NormFloat64()
			for j, zj := range z {
				s += zj * mix[j*cols+i] / math.Sqrt(float64(k))
			}
			x[t*cols+i] = float32(s * scale[i])
		}
	}
	return x
}

// TestGPTQBeatsWeighted checks the GPTQ encoder on correlated inputs: its
// output error must be well below the plain and RMS-weighted encodings',
// chunked encoding must equal whole, and OutputError must agree with a
// direct computation.
func TestGPTQBeatsWeighted(t *testing.T) {
	const rows, cols = 48, 256
	r := rand.New(rand.NewPCG(22, 22))
	w, _ := TestMatrix("gaussian", rows, cols, 4)
	x := correlatedInputs(r, 1024, cols)
	g := NewGram(cols)
	for t0 := 0; t0 < 1024; t0 += 100 { // uneven pieces
		n := min(100, 1024-t0)
		if err := g.Add(x[t0*cols:(t0+n)*cols], n); err != nil {
			t.Fatal(err)
		}
	}
	shape := []int{rows, cols}
	plain := mustEncode(t, Q4TP, w, shape, nil)
	weighted := mustEncode(t, Q4TP, w, shape, &EncodeOptions{ColStats: g.RMS()})
	probe := NewGram(cols)
	probe.Merge(g)
	q, err := NewGPTQ(g, GPTQOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Add(x[:cols], 1); err == nil {
		t.Fatal("a gram taken over by NewGPTQ still accepts rows")
	}
	enc := make([]byte, len(plain))
	if err := q.EncodeRows(enc, w, rows, cols, 0); err != nil {
		t.Fatal(err)
	}
	chunked := make([]byte, len(plain))
	for r0 := 0; r0 < rows; r0 += 7 {
		r1 := min(rows, r0+7)
		if err := q.EncodeRows(chunked, w[r0*cols:r1*cols], rows, cols, r0); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(enc, chunked) {
		t.Fatal("chunked GPTQ encoding differs from whole")
	}
	noRefine, _ := NewGPTQ(func() *Gram { c := NewGram(cols); c.Merge(probe); return c }(), GPTQOptions{Refine: -1})
	enc0 := make([]byte, len(plain))
	if err := noRefine.EncodeRows(enc0, w, rows, cols, 0); err != nil {
		t.Fatal(err)
	}
	errs := map[string]float64{}
	for name, b := range map[string][]byte{"plain": plain, "weighted": weighted, "gptq": enc0, "gptq+refine": enc} {
		got, _ := Decode(Q4TP, b, shape)
		errs[name] = outputErr(w, got, x, rows, cols)
		num, den := probe.OutputError(w, got)
		if d := math.Abs(math.Sqrt(num/den) - errs[name]); d > 1e-6 {
			t.Fatalf("%s: OutputError %.6f, direct %.6f", name, math.Sqrt(num/den), errs[name])
		}
	}
	t.Logf("output error: plain %.5f, rms-weighted %.5f, gptq %.5f, gptq+refine %.5f", errs["plain"], errs["weighted"], errs["gptq"], errs["gptq+refine"])
	if errs["gptq"] > 0.85*errs["plain"] || errs["gptq"] > 0.85*errs["weighted"] {
		t.Errorf("gptq does not beat the plain and weighted encodings by 15%%")
	}
	if errs["gptq+refine"] > errs["gptq"] {
		t.Errorf("refinement raised the error")
	}
	if err := q.EncodeRows(enc, w[:cols*2], rows, cols*2, 0); err == nil {
		t.Fatal("encoded with a gram matrix of another width")
	}
	bad := append([]float32(nil), w...)
	bad[5] = float32(math.NaN())
	if err := q.EncodeRows(enc, bad, rows, cols, 0); err == nil {
		t.Fatal("encoded a NaN weight")
	}
}

// TestGramAddMatchesNaive compares the blocked, parallel accumulation with
// a plain double loop, including a large addition split across
// goroutines and a row count that is not a multiple of four.
func TestGramAddMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 23))
	for _, c := range []struct{ rows, cols int }{{3, 5}, {7, 64}, {130, 256}} {
		x := make([]float32, c.rows*c.cols)
		for i := range x {
			x[i] = float32(r.NormFloat64())
			if i%11 == 0 {
				x[i] = 0
			}
		}
		g := NewGram(c.cols)
		if err := g.Add(x, c.rows); err != nil {
			t.Fatal(err)
		}
		for i := range c.cols {
			for j := i; j < c.cols; j++ {
				var s float64
				for k := range c.rows {
					s += float64(x[k*c.cols+i]) * float64(x[k*c.cols+j])
				}
				if got := g.h[i*c.cols+j]; math.Abs(got-s) > 1e-9*(1+math.Abs(s)) {
					t.Fatalf("%dx%d: H[%d,%d] = %v, want %v", c.rows, c.cols, i, j, got, s)
				}
			}
		}
		if g.Rows() != c.rows {
			t.Fatalf("rows %d", g.Rows())
		}
	}
	if err := NewGram(4).Add(make([]float32, 5), 1); err == nil {
		t.Fatal("accepted a ragged input")
	}
	if err := NewGram(2).Add([]float32{1, float32(math.Inf(-1))}, 1); err == nil {
		t.Fatal("accepted an infinite input")
	}
}

// TestInvCholUpper checks the single-buffer factor against the definition
// Uᵀ·U·A = I, U upper triangular.
func TestInvCholUpper(t *testing.T) {
	for _, n := range []int{1, 37, 300} { // 300 runs the parallel steps
		testInvCholUpper(t, n)
	}
}

func testInvCholUpper(t *testing.T, n int) {
	r := rand.New(rand.NewPCG(24, uint64(n)))
	b := make([]float64, n*n)
	for i := range b {
		b[i] = r.NormFloat64()
	}
	a := make([]float64, n*n)
	for i := range n {
		for j := range n {
			var s float64
			for k := range n {
				s += b[i*n+k] * b[j*n+k]
			}
			a[i*n+j] = s
		}
		a[i*n+i] += 0.1
	}
	u, err := invCholUpper(a, n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		for j := range i {
			if u[i*n+j] != 0 {
				t.Fatalf("U[%d,%d] = %v below the diagonal", i, j, u[i*n+j])
			}
		}
	}
	// Uᵀ·U·A = I, through V = U·A: (UᵀUA)[i,j] = Σ_m U[m,i]·V[m,j].
	v := make([]float64, n*n)
	for m := range n {
		for k := m; k < n; k++ {
			if um := u[m*n+k]; um != 0 {
				for j := range n {
					v[m*n+j] += um * a[k*n+j]
				}
			}
		}
	}
	for i := range n {
		for j := range n {
			var s float64
			for m := 0; m <= i; m++ {
				s += u[m*n+i] * v[m*n+j]
			}
			want := 0.0
			if i == j {
				want = 1
			}
			if math.Abs(s-want) > 1e-6 {
				t.Fatalf("n=%d: (UᵀUA)[%d,%d] = %v", n, i, j, s)
			}
		}
	}
	if n != 37 {
		return
	}
	notPD := make([]float64, 4)
	notPD[0], notPD[3] = 1, -1
	if _, err := invCholUpper(notPD, 2); err == nil {
		t.Fatal("factored a matrix that is not positive definite")
	}
}

func TestNewGPTQRejects(t *testing.T) {
	if _, err := NewGPTQ(nil, GPTQOptions{}); err == nil {
		t.Fatal("accepted no gram")
	}
	if _, err := NewGPTQ(NewGram(48), GPTQOptions{}); err == nil {
		t.Fatal("accepted 48 columns")
	}
	// An all-zero Gram (no calibration rows) still factors thanks to the
	// damping, and encodes like a plain ladder.
	q, err := NewGPTQ(NewGram(32), GPTQOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, _ := TestMatrix("gaussian", 2, 32, 5)
	dst := make([]byte, len(mustEncode(t, Q4TP, w, []int{2, 32}, nil)))
	if err := q.EncodeRows(dst, w, 2, 32, 0); err != nil {
		t.Fatal(err)
	}
}

func BenchmarkGramAdd(b *testing.B) {
	const rows, cols = 64, 3072
	x, _ := unevenInputs(rand.New(rand.NewPCG(25, 25)), rows, cols)
	g := NewGram(cols)
	b.SetBytes(int64(4 * rows * cols))
	for b.Loop() {
		if err := g.Add(x, rows); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rows)*float64(cols)*float64(cols+1)/2*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s")
}

func BenchmarkGPTQEncode(b *testing.B) {
	const rows, cols = 256, 1024
	r := rand.New(rand.NewPCG(26, 26))
	w, _ := TestMatrix("gaussian", rows, cols, 6)
	g := NewGram(cols)
	x, _ := unevenInputs(r, 2048, cols)
	if err := g.Add(x, 2048); err != nil {
		b.Fatal(err)
	}
	q, err := NewGPTQ(g, GPTQOptions{})
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]byte, len(mustEncode(b, Q4TP, w, []int{rows, cols}, nil)))
	b.SetBytes(int64(4 * rows * cols))
	for b.Loop() {
		if err := q.EncodeRows(dst, w, rows, cols, 0); err != nil {
			b.Fatal(err)
		}
	}
}
