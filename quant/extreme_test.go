package quant

import (
	"math"
	"slices"
	"strings"
	"testing"
)

// extremeCase is a matrix of unusual magnitudes and what each format must
// do with it: encode (and decode close to it) or refuse with an error.
type extremeCase struct {
	name string
	make func(rows, cols int) []float32
	// refuse lists the formats that must return an error; every other
	// format must encode.
	refuse []DType
	// whole lists the formats whose error is judged against the tensor's
	// largest magnitude rather than the row's (q8_2f's f16 row scales span
	// 2^40, not the 2^133 between the rows of "huge and tiny rows").
	whole []DType
}

// extremeRows and extremeCols are a shape every format holds.
const extremeRows, extremeCols = 5, 64

func fill(f func(o, i int) float32) func(rows, cols int) []float32 {
	return func(rows, cols int) []float32 {
		w := make([]float32, rows*cols)
		for o := range rows {
			for i := range cols {
				w[o*cols+i] = f(o, i)
			}
		}
		return w
	}
}

// wave is a deterministic pattern in (-1, 1) with both signs and no zeros.
func wave(o, i int) float32 {
	return float32(math.Sin(float64(3*o+7*i)+0.5)*0.9 + 0.05)
}

var extremeCases = []extremeCase{
	{name: "all zero", make: fill(func(o, i int) float32 { return 0 })},
	{name: "negative zero", make: fill(func(o, i int) float32 { return float32(math.Copysign(0, -1)) })},
	{name: "zero row", make: fill(func(o, i int) float32 {
		if o == 2 {
			return 0
		}
		return 0.02 * wave(o, i)
	})},
	{name: "zero column", make: fill(func(o, i int) float32 {
		if i == 5 {
			return 0
		}
		return 0.02 * wave(o, i)
	})},
	{name: "near 3e38", make: fill(func(o, i int) float32 { return 3e38 * wave(o, i) }),
		refuse: []DType{F16, Q8Row, Q4TP}},
	{name: "max float32", make: fill(func(o, i int) float32 {
		if (o+i)%2 == 0 {
			return -math.MaxFloat32
		}
		return math.MaxFloat32
	}), refuse: []DType{F16, BF16, Q8Row, Q4TP}},
	{name: "one huge column", make: fill(func(o, i int) float32 {
		if i == 3 {
			return 3e38 * wave(o, i)
		}
		return 0.02 * wave(o, i)
	}), refuse: []DType{F16, Q8Row, Q4TP}},
	{name: "1e30", make: fill(func(o, i int) float32 { return 1e30 * wave(o, i) }),
		refuse: []DType{F16, Q8Row}},
	{name: "2e30", make: fill(func(o, i int) float32 { return 2e30 * wave(o, i) }),
		refuse: []DType{F16, Q8Row, Q4TP}}, // q4tp holds |w| < 2^100
	{name: "1e15", make: fill(func(o, i int) float32 { return 1e15 * wave(o, i) }),
		refuse: []DType{F16, Q8Row}},
	{name: "1e-20", make: fill(func(o, i int) float32 { return 1e-20 * wave(o, i) })},
	{name: "1e-35", make: fill(func(o, i int) float32 { return 1e-35 * wave(o, i) })},
	{name: "subnormal", make: fill(func(o, i int) float32 { return 1e-40 * wave(o, i) })},
	{name: "smallest subnormal", make: fill(func(o, i int) float32 {
		return float32(math.Copysign(math.SmallestNonzeroFloat32, float64(wave(o, i))))
	})},
	{name: "huge and tiny rows", make: fill(func(o, i int) float32 {
		if o%2 == 0 {
			return 1e20 * wave(o, i)
		}
		return 1e-20 * wave(o, i)
	}), refuse: []DType{F16, Q8Row}, whole: []DType{Q82F}},
	{name: "NaN", make: fill(func(o, i int) float32 {
		if o == 1 && i == 9 {
			return float32(math.NaN())
		}
		return 0.02 * wave(o, i)
	}), refuse: []DType{Q8Row, Q82F, Q4TP}},
	{name: "infinity", make: fill(func(o, i int) float32 {
		if o == 3 && i == 1 {
			return float32(math.Inf(-1))
		}
		return 0.02 * wave(o, i)
	}), refuse: []DType{Q8Row, Q82F, Q4TP}},
}

// extremeTol is the largest error a format may make on a row, relative to
// the row's largest magnitude, plus an absolute floor for values below what
// the format can hold at all.
func extremeTol(d DType) (rel, abs float64) {
	switch d {
	case F32:
		return 0, 0
	case F16:
		return 1.0 / 2048, 0x1p-25 // half f16's smallest subnormal
	case BF16:
		return 1.0 / 256, 0x1p-134 // half bf16's smallest subnormal
	case Q8Row:
		return 1.0 / 127, 127 * 0x1p-24 // the row scale is an f16
	case Q82F:
		return 1.0 / 127, 0x1p-128 // the column field is a normal float32
	default: // Q4TP
		return 0.25, 0x1p-100 // groups below 2^-100 are stored as zeros
	}
}

// TestEncodeExtremes: huge, tiny, subnormal and all-zero rows and columns
// encode and decode to finite values close to the input (relative to each
// row's largest magnitude), or are refused with an error naming the
// problem, in every format; NaN and infinity are stored bit for bit by the
// float formats and refused, with their row and column, by the quantized ones.
func TestEncodeExtremes(t *testing.T) {
	for _, tc := range extremeCases {
		w := tc.make(extremeRows, extremeCols)
		for _, d := range floatDTypes {
			t.Run(tc.name+"/"+d.String(), func(t *testing.T) {
				mustRefuse := slices.Contains(tc.refuse, d)
				shape := []int{extremeRows, extremeCols}
				enc, err := Encode(d, w, shape, nil)
				if mustRefuse {
					if err == nil {
						t.Fatalf("encoded; want an error")
					}
					if !strings.Contains(err.Error(), d.String()) || !strings.Contains(err.Error(), "row") {
						t.Fatalf("error %q does not name the format and the row", err)
					}
					return
				}
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				got, err := Decode(d, enc, shape)
				if err != nil {
					t.Fatal(err)
				}
				rel, abs := extremeTol(d)
				whole := slices.Contains(tc.whole, d)
				var tmax float64
				for _, v := range w {
					if !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) {
						tmax = max(tmax, math.Abs(float64(v)))
					}
				}
				for o := range extremeRows {
					var amax float64
					for _, v := range w[o*extremeCols : (o+1)*extremeCols] {
						if !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) {
							amax = max(amax, math.Abs(float64(v)))
						}
					}
					if whole {
						amax = tmax
					}
					for i := range extremeCols {
						x, y := w[o*extremeCols+i], got[o*extremeCols+i]
						if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
							if math.Float32bits(x) != math.Float32bits(y) && !(math.IsNaN(float64(x)) && math.IsNaN(float64(y))) {
								t.Fatalf("[%d,%d]: %v stored as %v", o, i, x, y)
							}
							continue
						}
						if math.IsNaN(float64(y)) || math.IsInf(float64(y), 0) {
							t.Fatalf("[%d,%d]: finite %g decodes to %v", o, i, x, y)
						}
						if e := math.Abs(float64(y) - float64(x)); e > rel*amax+abs {
							t.Fatalf("[%d,%d]: %g decodes to %g, error %.3g of the row's max %g (allowed %.3g)", o, i, x, y, e/amax, amax, rel)
						}
					}
				}
			})
		}
	}
}

// TestEncodeExtremesCalibrated runs the extreme matrices through the
// calibrated encoders: q4tp and q8_2f with column statistics and GPTQ.
// They must refuse what plain q4tp refuses and otherwise stay as close.
func TestEncodeExtremesCalibrated(t *testing.T) {
	stats := make([]float32, extremeCols)
	x := make([]float32, 3*extremeCols)
	for i := range stats {
		stats[i] = 0.5 + float32(i%5)
	}
	for i := range x {
		x[i] = wave(i/extremeCols, i%extremeCols) * stats[i%extremeCols]
	}
	g := NewGram(extremeCols)
	if err := g.Add(x, 3); err != nil {
		t.Fatal(err)
	}
	gq, err := NewGPTQ(g, GPTQOptions{})
	if err != nil {
		t.Fatal(err)
	}
	shape := []int{extremeRows, extremeCols}
	nb, _ := ExpectedBytes(Q4TP, shape)
	for _, tc := range extremeCases {
		w := tc.make(extremeRows, extremeCols)
		plain := map[DType][]byte{}
		for _, d := range []DType{Q4TP, Q82F} {
			plain[d], _ = Encode(d, w, shape, nil)
		}
		encs := []struct {
			name string
			d    DType
			enc  func() ([]byte, error)
		}{
			{"q4tp stats", Q4TP, func() ([]byte, error) { return Encode(Q4TP, w, shape, &EncodeOptions{ColStats: stats}) }},
			{"q8_2f stats", Q82F, func() ([]byte, error) { return Encode(Q82F, w, shape, &EncodeOptions{ColStats: stats}) }},
			{"q8_2f fitted field", Q82F, func() ([]byte, error) {
				// What convert does: fit the field first (on any input),
				// then encode with it.
				col := FitColumns(w, extremeRows, extremeCols, stats)
				if len(col) != extremeCols {
					t.Fatalf("FitColumns returned %d values", len(col))
				}
				return Encode(Q82F, w, shape, &EncodeOptions{Col: col})
			}},
			{"gptq", Q4TP, func() ([]byte, error) {
				dst := make([]byte, nb)
				return dst, gq.EncodeRows(dst, w, extremeRows, extremeCols, 0)
			}},
		}
		for _, e := range encs {
			t.Run(tc.name+"/"+e.name, func(t *testing.T) {
				enc, err := e.enc()
				if (err != nil) != (plain[e.d] == nil) {
					t.Fatalf("error %v; the plain encoder's refusal: %v", err, plain[e.d] == nil)
				}
				if err != nil {
					if !strings.Contains(err.Error(), "row") {
						t.Fatalf("error %q does not name the row", err)
					}
					return
				}
				got, err := Decode(e.d, enc, shape)
				if err != nil {
					t.Fatal(err)
				}
				rel, abs := extremeTol(e.d)
				if e.d == Q4TP {
					rel = 0.5 // calibrated: the weighted error, not the plain one, is minimised
				}
				var tmax float64
				for _, v := range w {
					tmax = max(tmax, math.Abs(float64(v)))
				}
				for o := range extremeRows {
					var amax float64
					for _, v := range w[o*extremeCols : (o+1)*extremeCols] {
						amax = max(amax, math.Abs(float64(v)))
					}
					if slices.Contains(tc.whole, e.d) {
						amax = tmax
					}
					for i := range extremeCols {
						x, y := w[o*extremeCols+i], got[o*extremeCols+i]
						if math.IsNaN(float64(y)) || math.IsInf(float64(y), 0) {
							t.Fatalf("[%d,%d]: finite %g decodes to %v", o, i, x, y)
						}
						if e := math.Abs(float64(y) - float64(x)); e > rel*amax+abs {
							t.Fatalf("[%d,%d]: %g decodes to %g, error %.3g of the row's max %g (allowed %.3g)", o, i, x, y, e/amax, amax, rel)
						}
					}
				}
			})
		}
	}
}
