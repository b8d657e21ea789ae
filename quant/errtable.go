package quant

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/cortiq/cortiq/half"
)

// ErrorRow is one line of the quantization error table: how well a format
// stores one kind of test matrix.
type ErrorRow struct {
	Matrix        string  // the kind of test matrix
	Format        string  // a cortiq format, or a llama.cpp reference (Q4_0, Q8_0)
	BitsPerWeight float64 // storage cost including scales and codes; NaN for a bound
	WeightErr     float64 // ‖Ŵ−W‖/‖W‖ (Frobenius)
	OutputErr     float64 // ‖(Ŵ−W)x‖/‖Wx‖ over random x ~ N(0, I)
}

// ErrorMatrices names the test matrices ErrorTable measures.
var ErrorMatrices = []string{"gaussian", "student-t3+outliers", "uneven-columns"}

// TestMatrix returns a deterministic rows×cols test matrix of one of the
// ErrorMatrices kinds:
//
//   - gaussian: iid N(0, 0.02²);
//   - student-t3+outliers: iid Student-t with 3 degrees of freedom scaled by
//     0.02, with 1 column in 256 (at least one) scaled up 10×;
//   - uneven-columns: gaussian with each column scaled by 10^u, u uniform
//     in [-1, 1].
func TestMatrix(kind string, rows, cols int, seed uint64) ([]float32, error) {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	w := make([]float32, rows*cols)
	switch kind {
	case "gaussian":
		for i := range w {
			w[i] = float32(0.02 * r.NormFloat64())
		}
	case "student-t3+outliers":
		for i := range w {
			z := r.NormFloat64()
			a, b, c := r.NormFloat64(), r.NormFloat64(), r.NormFloat64()
			w[i] = float32(0.02 * z / math.Sqrt((a*a+b*b+c*c)/3))
		}
		for range max(cols/256, 1) {
			j := r.IntN(cols)
			for o := range rows {
				w[o*cols+j] *= 10
			}
		}
	case "uneven-columns":
		sc := make([]float64, cols)
		for j := range sc {
			sc[j] = math.Pow(10, 2*r.Float64()-1)
		}
		for i := range w {
			w[i] = float32(0.02 * sc[i%cols] * r.NormFloat64())
		}
	default:
		return nil, fmt.Errorf("quant: unknown test matrix %q", kind)
	}
	return w, nil
}

// ErrorTable quantizes each ErrorMatrices kind of rows×cols (cols a
// multiple of 32) with q4tp, q8_row and q8_2f and with llama.cpp's Q4_0
// and Q8_0 schemes (reimplemented here for comparison only; they are not
// cortiq formats), and measures the errors.
func ErrorTable(rows, cols int, seed uint64) ([]ErrorRow, error) {
	if rows <= 0 || cols <= 0 || cols%GroupSize != 0 {
		return nil, fmt.Errorf("quant: error table needs cols a positive multiple of %d, got %d×%d", GroupSize, rows, cols)
	}
	shape := []int{rows, cols}
	r := rand.New(rand.NewPCG(seed, 1))
	xs := make([][]float32, 8)
	for i := range xs {
		xs[i] = make([]float32, cols)
		for j := range xs[i] {
			xs[i][j] = float32(r.NormFloat64())
		}
	}
	var out []ErrorRow
	for mi, kind := range ErrorMatrices {
		w, err := TestMatrix(kind, rows, cols, seed+uint64(mi))
		if err != nil {
			return nil, err
		}
		add := func(name string, bpw float64, got []float32) {
			we, oe := relErrors(w, got, rows, cols, xs)
			out = append(out, ErrorRow{Matrix: kind, Format: name, BitsPerWeight: bpw, WeightErr: we, OutputErr: oe})
		}
		for _, d := range []DType{Q4TP, Q8Row, Q82F, BF16} {
			enc, err := Encode(d, w, shape, nil)
			if err != nil {
				return nil, fmt.Errorf("quant: error table: %s %s: %w", kind, d, err)
			}
			got, err := Decode(d, enc, shape)
			if err != nil {
				return nil, fmt.Errorf("quant: error table: %s %s: %w", kind, d, err)
			}
			add(d.String(), BitsPerWeight(d, shape), got)
		}
		add("Q4_0 (llama.cpp)", 4.5, RefQ4_0(w))
		add("Q8_0 (llama.cpp)", 8.5, RefQ8_0(w))
		add("bound: 4-bit, best positive scale per group", math.NaN(), q4IdealScale(w, false))
		add("bound: 4-bit, best signed scale per group", math.NaN(), q4IdealScale(w, true))
	}
	return out, nil
}

// q4IdealScale quantizes w (a multiple of 32 values) to nibbles -8..7
// with, per group of 32, the best float32 scale of a fine search between
// absmax/10 and absmax/6 (about 0.04% apart near the best). With signed, negative
// scales are tried too, which lets the -8 end take the largest weight of
// either sign, as Q4_0's d = max/-8 does. q4tp's rungs are positive, so the
// unsigned search bounds what any q4tp encoder can reach; the signed one
// bounds Q4_0-style formats.
func q4IdealScale(w []float32, signed bool) []float32 {
	out := make([]float32, len(w))
	var neg [GroupSize]float32
	var q [GroupSize]int8
	for b := 0; b+GroupSize <= len(w); b += GroupSize {
		gw := w[b : b+GroupSize]
		var amax float32
		for i, v := range gw {
			amax = max(amax, float32(math.Abs(float64(v))))
			neg[i] = -v
		}
		if amax == 0 {
			continue
		}
		best, bs := float32(math.Inf(1)), float32(0)
		try := func(d float64) {
			s := float32(float64(amax) / d)
			if e := q4tpGroupErr(gw, s); e < best {
				best, bs = e, s
			}
			if signed {
				if e := q4tpGroupErr(neg[:], s); e < best {
					best, bs = e, -s
				}
			}
		}
		// 48 log-spaced divisors from 6 to 10, then 32 around the best.
		const n, fine = 48, 32
		ratio := math.Pow(10.0/6, 1.0/(n-1))
		for k := range n {
			try(6 * math.Pow(ratio, float64(k)))
		}
		d0 := float64(amax / float32(math.Abs(float64(bs))))
		for k := range fine {
			try(d0 * math.Pow(ratio, 2*float64(k)/(fine-1)-1))
		}
		if bs > 0 {
			q4tpGroupQuant(q[:], gw, bs)
		} else {
			q4tpGroupQuant(q[:], neg[:], -bs)
		}
		for i := range gw {
			out[b+i] = float32(q[i]) * bs
		}
	}
	return out
}

// relErrors returns ‖got−w‖/‖w‖ and the pooled ‖(got−w)x‖/‖wx‖ over xs.
func relErrors(w, got []float32, rows, cols int, xs [][]float32) (float64, float64) {
	var dw, ww float64
	for i := range w {
		d := float64(got[i]) - float64(w[i])
		dw += d * d
		ww += float64(w[i]) * float64(w[i])
	}
	var dy, yy float64
	for _, x := range xs {
		for o := range rows {
			var y, yq float64
			for i, xi := range x {
				y += float64(w[o*cols+i]) * float64(xi)
				yq += float64(got[o*cols+i]) * float64(xi)
			}
			dy += (yq - y) * (yq - y)
			yy += y * y
		}
	}
	return math.Sqrt(dw / ww), math.Sqrt(dy / yy)
}

// RefQ4_0 quantizes and dequantizes w (a multiple of 32 values) the way
// llama.cpp's reference Q4_0 does: per block of 32 the value of largest
// magnitude max gives d = max/-8, stored as f16; q = min(15, ⌊x/d + 8.5⌋)
// with 1/d taken before rounding d; the weight is (q-8)·f16(d).
// For comparison only.
func RefQ4_0(w []float32) []float32 {
	out := make([]float32, len(w))
	for b := 0; b+GroupSize <= len(w); b += GroupSize {
		var amax, mx float32
		for _, v := range w[b : b+GroupSize] {
			if a := float32(math.Abs(float64(v))); a > amax {
				amax, mx = a, v
			}
		}
		d := mx / -8
		var id float32
		if d != 0 {
			id = 1 / d
		}
		dh := half.RoundF16(d)
		for i, v := range w[b : b+GroupSize] {
			q := min(15, int32(v*id+8.5))
			out[b+i] = float32(q-8) * dh
		}
	}
	return out
}

// RefQ8_0 quantizes and dequantizes w (a multiple of 32 values) the way
// llama.cpp's reference Q8_0 does: per block of 32, d = absmax/127 stored
// as f16, q = round(x/d) with 1/d taken before rounding d; the weight is
// q·f16(d). For comparison only.
func RefQ8_0(w []float32) []float32 {
	out := make([]float32, len(w))
	for b := 0; b+GroupSize <= len(w); b += GroupSize {
		var amax float32
		for _, v := range w[b : b+GroupSize] {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		dh := half.RoundF16(d)
		for i, v := range w[b : b+GroupSize] {
			out[b+i] = float32(math.Round(float64(v*id))) * dh
		}
	}
	return out
}

// MarkdownErrorTable formats rows as a Markdown table.
func MarkdownErrorTable(rows []ErrorRow) string {
	var sb strings.Builder
	sb.WriteString("| matrix | format | bits/weight | ‖ΔW‖/‖W‖ | ‖ΔW·x‖/‖W·x‖ |\n")
	sb.WriteString("|---|---|---:|---:|---:|\n")
	for _, r := range rows {
		bpw := "—"
		if !math.IsNaN(r.BitsPerWeight) {
			bpw = fmt.Sprintf("%.3f", r.BitsPerWeight)
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %.5f | %.5f |\n", r.Matrix, r.Format, bpw, r.WeightErr, r.OutputErr)
	}
	return sb.String()
}
