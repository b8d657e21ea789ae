package quant

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cortiq/cortiq/half"
)

var floatDTypes = []DType{F32, F16, BF16, Q8Row, Q82F, Q4TP}

// randMatrix returns a rows×cols matrix of Gaussian weights whose rows and
// columns have mildly different scales, with an exact zero sprinkled in.
func randMatrix(r *rand.Rand, rows, cols int) []float32 {
	w := make([]float32, rows*cols)
	cs := make([]float64, cols)
	for i := range cs {
		cs[i] = math.Exp(0.5 * r.NormFloat64())
	}
	for o := range rows {
		rs := 0.02 * math.Exp(0.5*r.NormFloat64())
		for i := range cols {
			w[o*cols+i] = float32(rs * cs[i] * r.NormFloat64())
		}
	}
	if len(w) > 3 {
		w[len(w)/3] = 0
	}
	return w
}

// shapesFor returns the test shapes a format can hold.
func shapesFor(d DType) [][2]int {
	s := [][2]int{{1, 32}, {3, 64}, {7, 96}, {33, 4096}}
	if d != Q4TP {
		s = append(s, [2]int{1, 1}, [2]int{2, 7}, [2]int{5, 33}, [2]int{4, 100})
	}
	return s
}

func mustEncode(t testing.TB, d DType, w []float32, shape []int, opt *EncodeOptions) []byte {
	t.Helper()
	b, err := Encode(d, w, shape, opt)
	if err != nil {
		t.Fatalf("%s %v: %v", d, shape, err)
	}
	return b
}

// halfULP returns half the spacing of a float format with the given
// mantissa bits and minimum normal exponent around |v|.
func halfULP(v float32, mant, minExp int) float64 {
	a := math.Abs(float64(v))
	e := minExp
	if a > 0 {
		e = max(int(math.Floor(math.Log2(a))), minExp)
	}
	return math.Ldexp(1, e-mant-1)
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, d := range floatDTypes {
		for _, sh := range shapesFor(d) {
			rows, cols := sh[0], sh[1]
			shape := []int{rows, cols}
			w := randMatrix(r, rows, cols)
			enc := mustEncode(t, d, w, shape, nil)
			got, err := Decode(d, enc, shape)
			if err != nil {
				t.Fatal(err)
			}
			switch d {
			case F32:
				for i := range w {
					if math.Float32bits(got[i]) != math.Float32bits(w[i]) {
						t.Fatalf("f32 %v: [%d] %v != %v", shape, i, got[i], w[i])
					}
				}
			case F16, BF16:
				mant, minExp, round := 10, -14, half.RoundF16
				if d == BF16 {
					mant, minExp, round = 7, -126, half.RoundBF16
				}
				for i := range w {
					if got[i] != round(w[i]) {
						t.Fatalf("%s %v: [%d] %v, want %v", d, shape, i, got[i], round(w[i]))
					}
					if diff := math.Abs(float64(got[i]) - float64(w[i])); diff > halfULP(w[i], mant, minExp) {
						t.Fatalf("%s %v: [%d] |%v-%v| above half an ulp", d, shape, i, got[i], w[i])
					}
				}
			case Q8Row:
				for o := range rows {
					s := half.F16ToF32(leU16(enc[rows*cols+2*o:]))
					for i := range cols {
						if diff := math.Abs(float64(got[o*cols+i] - w[o*cols+i])); diff > float64(s)/2*1.0001 {
							t.Fatalf("q8_row %v: [%d,%d] error %g above half a step %g", shape, o, i, diff, s)
						}
					}
				}
			case Q82F:
				col := q82fCol(enc, rows, cols)
				for o := range rows {
					rs := half.F16ToF32(leU16(enc[rows*cols+2*o:]))
					for i := range cols {
						step := float64(rs) * float64(col[i])
						if diff := math.Abs(float64(got[o*cols+i] - w[o*cols+i])); diff > step/2*1.0001+1e-12 {
							t.Fatalf("q8_2f %v: [%d,%d] error %g above half a step %g", shape, o, i, diff, step)
						}
					}
				}
			case Q4TP:
				for o := range rows {
					if e := relErr(w[o*cols:(o+1)*cols], got[o*cols:(o+1)*cols]); e > 0.2 {
						t.Fatalf("q4tp %v: row %d relative error %.3f", shape, o, e)
					}
				}
				if e := relErr(w, got); cols >= 96 && e > 0.15 {
					t.Fatalf("q4tp %v: relative error %.3f", shape, e)
				}
			}
		}
	}
}

func leU16(b []byte) uint16 { return uint16(b[0]) | uint16(b[1])<<8 }

func q82fCol(enc []byte, rows, cols int) []float32 {
	off := Q82FColOffset(rows, cols)
	col := make([]float32, cols)
	for i := range col {
		b := enc[off+int64(4*i):]
		col[i] = math.Float32frombits(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24)
	}
	return col
}

func relErr(w, got []float32) float64 {
	var d, n float64
	for i := range w {
		e := float64(got[i]) - float64(w[i])
		d += e * e
		n += float64(w[i]) * float64(w[i])
	}
	if n == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / n)
}

// TestDotRowMatchesDecode checks the reference dot product against the
// decoded row.
func TestDotRowMatchesDecode(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	for _, d := range floatDTypes {
		c, _ := CodecFor(d)
		for _, sh := range shapesFor(d) {
			rows, cols := sh[0], sh[1]
			w := randMatrix(r, rows, cols)
			enc := mustEncode(t, d, w, []int{rows, cols}, nil)
			x := make([]float32, cols)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			row := make([]float32, cols)
			for o := range rows {
				c.DecodeRow(row, enc, rows, cols, o)
				var want, mag float64
				for i := range row {
					want += float64(row[i]) * float64(x[i])
					mag += math.Abs(float64(row[i]) * float64(x[i]))
				}
				got := float64(c.DotRow(enc, rows, cols, o, x))
				if math.Abs(got-want) > 1e-5*mag+1e-30 {
					t.Fatalf("%s %dx%d row %d: DotRow %g, decoded dot %g", d, rows, cols, o, got, want)
				}
			}
		}
	}
}

// TestChunkedEncode checks that encoding a tensor in chunks of rows, into a
// buffer full of garbage, gives the bytes of a whole-tensor Encode.
func TestChunkedEncode(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	for _, d := range floatDTypes {
		c, _ := CodecFor(d)
		for _, sh := range [][2]int{{13, 64}, {33, 4096}} {
			rows, cols := sh[0], sh[1]
			shape := []int{rows, cols}
			w := randMatrix(r, rows, cols)
			var opt *EncodeOptions
			if d == Q82F {
				opt = &EncodeOptions{Col: FitColumns(w, rows, cols, nil)}
			}
			want := mustEncode(t, d, w, shape, opt)
			got := bytes.Repeat([]byte{0xa5}, len(want))
			for r0, n := 0, 1; r0 < rows; r0, n = r0+n, n*2+1 {
				n = min(n, rows-r0)
				if err := c.EncodeRows(got, w[r0*cols:(r0+n)*cols], rows, cols, r0, opt); err != nil {
					t.Fatalf("%s %v rows [%d,%d): %v", d, shape, r0, r0+n, err)
				}
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s %v: chunked encoding differs from whole-tensor encoding", d, shape)
			}
			if d == Q82F {
				// Without Col the whole tensor fits its own field: the same one.
				if fit := mustEncode(t, d, w, shape, nil); !bytes.Equal(fit, want) {
					t.Fatalf("q8_2f %v: Encode without Col differs from Encode with FitColumns' field", shape)
				}
			}
		}
	}
}

func TestQ82FPartialNeedsCol(t *testing.T) {
	c, _ := CodecFor(Q82F)
	w := randMatrix(rand.New(rand.NewPCG(4, 4)), 4, 8)
	nb, _ := ExpectedBytes(Q82F, []int{4, 8})
	dst := make([]byte, nb)
	if err := c.EncodeRows(dst, w[8:], 4, 8, 1, nil); !errors.Is(err, ErrNeedCol) {
		t.Fatalf("partial encode without Col: %v", err)
	}
	if err := c.EncodeRows(dst, w[:8], 4, 8, 0, &EncodeOptions{ColStats: make([]float32, 8)}); !errors.Is(err, ErrNeedCol) {
		t.Fatalf("partial encode with stats but no Col: %v", err)
	}
}

func TestExpectedBytesMatchesEncode(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for _, d := range floatDTypes {
		shapes := [][]int{{2, 3, 64}, {1, 32}, {5, 128}}
		if d != Q4TP {
			shapes = append(shapes, []int{3, 5}, []int{2, 2, 3})
		}
		if !d.Quantized() {
			shapes = append(shapes, []int{7}, []int{})
		}
		for _, shape := range shapes {
			rows, cols, _ := Matrix(shape)
			enc := mustEncode(t, d, randMatrix(r, rows, cols), shape, nil)
			nb, err := ExpectedBytes(d, shape)
			if err != nil || int64(len(enc)) != nb {
				t.Fatalf("%s %v: encoded %d bytes, ExpectedBytes %d (%v)", d, shape, len(enc), nb, err)
			}
			if _, err := Decode(d, enc[:len(enc)-1], shape); err == nil {
				t.Fatalf("%s %v: Decode accepted a short buffer", d, shape)
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	w64 := make([]float32, 64)
	for i := range w64 {
		w64[i] = float32(i) - 30
	}
	bad := []struct {
		name  string
		d     DType
		w     []float32
		shape []int
		opt   *EncodeOptions
	}{
		{"q4tp 2x16", Q4TP, w64[:32], []int{2, 16}, nil},
		{"q4tp 48 cols", Q4TP, w64[:48], []int{1, 48}, nil},
		{"q4tp 1-D", Q4TP, w64, []int{64}, nil},
		{"q8_row 1-D", Q8Row, w64, []int{64}, nil},
		{"q8_2f 1-D", Q82F, w64, []int{64}, nil},
		{"length mismatch", F32, w64, []int{3, 32}, nil},
		{"negative dim", F16, w64, []int{-1, 64}, nil},
		{"q8_row NaN", Q8Row, withValue(w64, 5, float32(math.NaN())), []int{2, 32}, nil},
		{"q8_2f Inf", Q82F, withValue(w64, 5, float32(math.Inf(1))), []int{2, 32}, nil},
		{"q4tp NaN", Q4TP, withValue(w64, 40, float32(math.NaN())), []int{2, 32}, nil},
		{"q4tp huge", Q4TP, withValue(w64, 40, 1e35), []int{2, 32}, nil},
		{"q8_row scale overflow", Q8Row, withValue(w64, 3, 1e7), []int{2, 32}, nil},
		{"f16 overflow", F16, withValue(w64, 3, 1e5), []int{2, 32}, nil},
		{"bf16 overflow", BF16, withValue(w64, 3, math.MaxFloat32), []int{2, 32}, nil},
		{"q8_2f short Col", Q82F, w64, []int{2, 32}, &EncodeOptions{Col: make([]float32, 31)}},
		{"q8_2f zero Col", Q82F, w64, []int{2, 32}, &EncodeOptions{Col: make([]float32, 32)}},
		{"q8_2f NaN Col", Q82F, w64, []int{2, 32}, &EncodeOptions{Col: withValue(ones(32), 7, float32(math.NaN()))}},
		{"q8_2f negative stats", Q82F, w64, []int{2, 32}, &EncodeOptions{ColStats: withValue(ones(32), 7, -1)}},
		{"q8_2f short stats", Q82F, w64, []int{2, 32}, &EncodeOptions{ColStats: ones(5)}},
	}
	for _, b := range bad {
		if _, err := Encode(b.d, b.w, b.shape, b.opt); err == nil {
			t.Errorf("%s: Encode accepted it", b.name)
		}
	}
	// EncodeRows argument checks.
	for _, d := range floatDTypes {
		c, _ := CodecFor(d)
		nb, _ := ExpectedBytes(d, []int{2, 32})
		opt := &EncodeOptions{Col: ones(32)}
		if err := c.EncodeRows(make([]byte, nb-1), w64, 2, 32, 0, opt); err == nil {
			t.Errorf("%s: EncodeRows accepted a short destination", d)
		}
		if err := c.EncodeRows(make([]byte, nb), w64[:32], 2, 32, 2, opt); err == nil {
			t.Errorf("%s: EncodeRows accepted rows past the end", d)
		}
		if err := c.EncodeRows(make([]byte, nb), w64[:32], 2, 32, -1, opt); err == nil {
			t.Errorf("%s: EncodeRows accepted a negative first row", d)
		}
		if err := c.EncodeRows(make([]byte, nb), w64[:40], 2, 32, 0, opt); err == nil {
			t.Errorf("%s: EncodeRows accepted a partial row", d)
		}
	}
	if _, err := CodecFor(U8); err == nil {
		t.Error("CodecFor(u8) should have no float codec")
	}
}

func withValue(w []float32, i int, v float32) []float32 {
	c := append([]float32(nil), w...)
	c[i] = v
	return c
}

func ones(n int) []float32 {
	o := make([]float32, n)
	for i := range o {
		o[i] = 1
	}
	return o
}

func TestDeterministic(t *testing.T) {
	w := randMatrix(rand.New(rand.NewPCG(6, 6)), 17, 256)
	for _, d := range []DType{Q8Row, Q82F, Q4TP} {
		a := mustEncode(t, d, w, []int{17, 256}, nil)
		b := mustEncode(t, d, w, []int{17, 256}, nil)
		if !bytes.Equal(a, b) {
			t.Fatalf("%s: two encodings of the same tensor differ", d)
		}
	}
}

// TestZeros checks all-zero rows and groups.
func TestZeros(t *testing.T) {
	rows, cols := 3, 64
	w := randMatrix(rand.New(rand.NewPCG(7, 7)), rows, cols)
	clear(w[:cols])             // row 0 all zero
	clear(w[cols+32 : cols+64]) // row 1 group 1 zero
	clear(w[2*cols : 2*cols+32])
	w[2*cols+5] = 1e-35 // row 2: a group of one tiny weight next to a normal one
	for _, d := range floatDTypes {
		enc := mustEncode(t, d, w, []int{rows, cols}, nil)
		got, _ := Decode(d, enc, []int{rows, cols})
		for i := range cols {
			if got[i] != 0 || got[cols+32+i%32] != 0 {
				t.Fatalf("%s: zero weights decode to %v, %v", d, got[i], got[cols+32+i%32])
			}
		}
		for i, v := range got {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("%s: weight %d decodes to %v", d, i, v)
			}
		}
	}
	enc := mustEncode(t, Q8Row, w, []int{rows, cols}, nil)
	if !bytes.Equal(enc[:cols], make([]byte, cols)) || enc[rows*cols] != 0 || enc[rows*cols+1] != 0 {
		t.Fatal("q8_row: a zero row must store q 0 and scale 0")
	}
	enc = mustEncode(t, Q4TP, w, []int{rows, cols}, nil)
	for i := range 32 {
		if enc[i] != 0x88 || enc[48+i%16] != 0x88 { // row 0; row 1 group 1
			t.Fatalf("q4tp: zero group byte %d is %#x, want 0x88", i, enc[i])
		}
	}
	po, co, _ := q4tpSections(rows, cols)
	if !bytes.Equal(enc[po:po+4], []byte{0, 0, 0, 0}) || enc[co] != 0 || enc[co+1] != 0 {
		t.Fatalf("q4tp: zero row params % x code %#x, want zeros", enc[po:po+4], enc[co])
	}
}

// TestQ82FBeatsQ8Row checks the column field on matrices whose columns have
// very uneven scales, for the weight error and for the output error with
// activations that are uneven per column too (with and without statistics).
func TestQ82FBeatsQ8Row(t *testing.T) {
	rows, cols := 128, 512
	r := rand.New(rand.NewPCG(8, 8))
	for _, kind := range []string{"uneven-columns", "student-t3+outliers"} {
		w, err := TestMatrix(kind, rows, cols, 9)
		if err != nil {
			t.Fatal(err)
		}
		sigma := make([]float32, cols)
		for i := range sigma {
			sigma[i] = float32(math.Exp(1.2 * r.NormFloat64()))
		}
		xs := make([][]float32, 16)
		for k := range xs {
			xs[k] = make([]float32, cols)
			for i := range cols {
				xs[k][i] = sigma[i] * float32(r.NormFloat64())
			}
		}
		shape := []int{rows, cols}
		errs := map[string][2]float64{}
		for name, c := range map[string]struct {
			d   DType
			opt *EncodeOptions
		}{"q8_row": {Q8Row, nil}, "q8_2f": {Q82F, nil}, "q8_2f+stats": {Q82F, &EncodeOptions{ColStats: sigma}}} {
			got, _ := Decode(c.d, mustEncode(t, c.d, w, shape, c.opt), shape)
			we, oe := relErrors(w, got, rows, cols, xs)
			errs[name] = [2]float64{we, oe}
		}
		t.Logf("%s: weight/output error q8_row %.5f/%.5f q8_2f %.5f/%.5f q8_2f+stats %.5f/%.5f", kind,
			errs["q8_row"][0], errs["q8_row"][1], errs["q8_2f"][0], errs["q8_2f"][1], errs["q8_2f+stats"][0], errs["q8_2f+stats"][1])
		if errs["q8_2f"][0] > 0.6*errs["q8_row"][0] || errs["q8_2f"][1] > 0.6*errs["q8_row"][1] {
			t.Errorf("%s: q8_2f does not beat q8_row clearly", kind)
		}
		if errs["q8_2f+stats"][1] > errs["q8_2f"][1] {
			t.Errorf("%s: statistics made the output error worse", kind)
		}
	}
}

// TestQ82FNeverWorse checks that the fitted field never loses to no field
// (which is one of the candidates) in the σ-weighted error it minimises.
func TestQ82FNeverWorse(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 10))
	for trial := range 12 {
		rows, cols := 1+r.IntN(40), 1+r.IntN(200)
		w := randMatrix(r, rows, cols)
		var stats []float32
		if trial%2 == 1 {
			stats = make([]float32, cols)
			for i := range stats {
				stats[i] = float32(r.ExpFloat64())
			}
		}
		sig2 := colWeights(stats, cols)
		col := FitColumns(w, rows, cols, stats)
		if err := checkCol(col, cols); err != nil {
			t.Fatal(err)
		}
		got := q82fError(w, rows, cols, col, sig2)
		q8, _ := Decode(Q8Row, mustEncode(t, Q8Row, w, []int{rows, cols}, nil), []int{rows, cols})
		var base float64
		for i := range w {
			d := float64(q8[i]) - float64(w[i])
			base += sig2[i%cols] * d * d
		}
		if got > base*(1+1e-9) {
			t.Fatalf("trial %d (%dx%d): q8_2f error %g above q8_row's %g", trial, rows, cols, got, base)
		}
		// Normalisation: geometric mean of the field within a factor 2 of 1.
		var ls float64
		for _, c := range col {
			ls += math.Log2(float64(c))
		}
		if g := ls / float64(cols); math.Abs(g) > 1 {
			t.Fatalf("trial %d: column field geometric mean 2^%.2f", trial, g)
		}
	}
	// A tall matrix: the fit and the choice work on samples of rows.
	tall, _ := TestMatrix("uneven-columns", 3000, 64, 13)
	shape := []int{3000, 64}
	f2, _ := Decode(Q82F, mustEncode(t, Q82F, tall, shape, nil), shape)
	f1, _ := Decode(Q8Row, mustEncode(t, Q8Row, tall, shape, nil), shape)
	if e2, e1 := relErr(tall, f2), relErr(tall, f1); e2 > 0.6*e1 {
		t.Fatalf("3000×64: q8_2f error %.5f, q8_row %.5f", e2, e1)
	}
	if FitColumns(make([]float32, 5), 2, 3, nil) != nil || FitColumns(make([]float32, 6), 2, 3, ones(2)) != nil {
		t.Fatal("FitColumns accepted inconsistent arguments")
	}
}
