package quant

import (
	"math"

	"github.com/cortiq/cortiq/half"
)

// Column field fitting for q8_2f.
//
// Model: a weight quantized with row scale rs[o] and column scale c[i] has
// rounding noise of variance (rs[o]·c[i])²/12, and rs[o] = M[o]/127 where
// M[o] = max_i |W[o,i]|/c[i]. With activations of RMS σ[i] (1 without
// statistics) the expected output error is then proportional to
//
//	F(c) = Σ_o M[o]² · Σ_i c[i]²·σ[i]²
//
// which is invariant to scaling c and convex in log c. FitColumns
// minimises a smooth version of F (the max replaced by a 16-norm) by a few
// mirror-descent steps on a sample of rows, tightens the result (shrinks
// every column to the smallest scale that keeps all row maxima, which can
// only lower F), and then picks, by the real quantization error weighted by
// σ² over all rows (up to 2048 evenly spaced rows of a larger matrix), the
// best of: no column field (all ones), sqrt of the column absmax, the column
// absmax, and the fitted field before and after tightening (the sample may
// miss rows that tightening then clips hard).

const (
	colFitSampleRows = 512  // rows the surrogate is optimised on
	colFitEvalRows   = 2048 // rows the candidates are judged on
	colFitIters      = 30   // mirror-descent steps
	colFitP          = 16   // norm replacing the row max (a power of two)
)

// FitColumns fits the q8_2f column field of a rows×cols row-major matrix.
// stats, when not nil, is the per-column RMS of the activations (len cols)
// and weights the error, so that the expected output error rather than the
// weight error is minimised. The field is normalised by a power of two to a
// geometric mean near 1 (moved only if the row scales would otherwise leave
// the normal f16 range). It returns nil if the arguments are inconsistent.
func FitColumns(w []float32, rows, cols int, stats []float32) []float32 {
	if rows <= 0 || cols <= 0 || len(w) != rows*cols || (stats != nil && len(stats) != cols) {
		return nil
	}
	sig2 := colWeights(stats, cols)
	colmax := make([]float64, cols)
	for o := range rows {
		for i, v := range w[o*cols : (o+1)*cols] {
			if a := math.Abs(float64(v)); a > colmax[i] && !math.IsInf(a, 0) { // NaN compares false
				colmax[i] = a
			}
		}
	}
	nz := 0
	for _, m := range colmax {
		if m > 0 {
			nz++
		}
	}
	ones := make([]float64, cols)
	for i := range ones {
		ones[i] = 1
	}
	if nz == 0 {
		return normaliseCols(w, rows, cols, ones, colmax)
	}
	sq := make([]float64, cols)
	for i, m := range colmax {
		sq[i] = math.Sqrt(m)
	}
	f := newColFit(w, rows, cols, sig2)
	raw := f.optimise(colmax)
	fitted := append([]float64(nil), raw...)
	f.tighten(fitted)

	// Judge the candidates on up to colFitEvalRows evenly spaced rows, then
	// normalise the winner against all rows.
	ew, erows := w, rows
	if rows > colFitEvalRows {
		erows = colFitEvalRows
		ew = make([]float32, erows*cols)
		for k := range erows {
			o := k * rows / erows
			copy(ew[k*cols:(k+1)*cols], w[o*cols:(o+1)*cols])
		}
	}
	// The column absmax is the fallback: when no candidate has a finite
	// error (row scales beyond f16 whatever the field, or non-finite
	// weights, which the codec then refuses) it is the field that keeps
	// every W/col within [-1, 1].
	best := colmax
	bestErr := math.Inf(1)
	for _, c := range [][]float64{ones, sq, colmax, raw, fitted} {
		c32 := normaliseCols(ew, erows, cols, c, colmax)
		if e := q82fError(ew, erows, cols, c32, sig2); e < bestErr {
			best, bestErr = c, e
		}
	}
	return normaliseCols(w, rows, cols, best, colmax)
}

// colWeights returns σ² per column: 1 without statistics, else the squared
// statistics floored at 1e-4 of their mean square so that a column that was
// silent during calibration is not ignored entirely.
func colWeights(stats []float32, cols int) []float64 {
	s := make([]float64, cols)
	var mean float64
	for i := range s {
		s[i] = 1
		if stats != nil {
			s[i] = float64(stats[i]) * float64(stats[i])
			mean += s[i]
		}
	}
	if stats == nil {
		return s
	}
	mean /= float64(cols)
	if mean == 0 {
		for i := range s {
			s[i] = 1
		}
		return s
	}
	for i := range s {
		s[i] = max(s[i], 1e-4*mean)
	}
	return s
}

// normaliseCols turns a candidate field into the stored float32 one:
// all-zero columns get the neutral value, values are clamped to a safe
// range, and the whole field is scaled by a power of two to a geometric
// mean near 1, unless that would push row scales out of the normal f16
// range.
func normaliseCols(w []float32, rows, cols int, c, colmax []float64) []float32 {
	var lsum float64
	n := 0
	for i, v := range c {
		if colmax[i] > 0 && v > 0 {
			lsum += math.Log2(v)
			n++
		}
	}
	shift := 0.0
	if n > 0 {
		shift = -math.Round(lsum / float64(n))
	}
	// Row scales in log2 for this shift: rs = max_i |w|/c / 127.
	lmin, lmax := math.Inf(1), math.Inf(-1)
	for o := range rows {
		var m float64
		for i, v := range w[o*cols : (o+1)*cols] {
			if colmax[i] > 0 && c[i] > 0 {
				m = max(m, math.Abs(float64(v))/c[i])
			}
		}
		if m > 0 {
			l := math.Log2(m/127) - shift
			lmin, lmax = min(lmin, l), max(lmax, l)
		}
	}
	// Keep rs within [2^-14, 2^14] when possible, preferring no overflow.
	if lmin < -14 {
		d := math.Floor(lmin) + 14
		shift += d
		lmax -= d // every row scale moved up by -d
	}
	if lmax > 14 {
		shift += math.Ceil(lmax) - 14
	}
	out := make([]float32, cols)
	for i, v := range c {
		if colmax[i] == 0 || !(v > 0) {
			out[i] = 1
			continue
		}
		// Within the normal float32 range: a column of weights near 3e38
		// needs a field near 2^(128-14-7) to keep its row scales in f16.
		l := min(max(math.Log2(v)+shift, -126), 127)
		out[i] = float32(math.Exp2(l))
	}
	return out
}

// q82fError returns Σ σ²[i]·(Ŵ[o,i]−W[o,i])² for the field col, with the
// codec's exact arithmetic.
func q82fError(w []float32, rows, cols int, col []float32, sig2 []float64) float64 {
	v := make([]float32, cols)
	var total float64
	for o := range rows {
		row := w[o*cols : (o+1)*cols]
		var amax float32
		for i, x := range row {
			v[i] = x / col[i]
			amax = max(amax, float32(math.Abs(float64(v[i]))))
		}
		h := half.F32ToF16(amax / 127)
		if h == 0x7c00 {
			return math.Inf(1)
		}
		s := half.F16ToF32(h)
		for i, x := range row {
			var got float32
			if s != 0 {
				got = float32(s*roundClamp(v[i]/s, 127)) * col[i]
			}
			d := float64(got) - float64(x)
			total += sig2[i] * d * d
		}
	}
	return total
}

// colFit holds the sampled rows the surrogate is optimised on.
type colFit struct {
	rows, cols int
	a          []float32 // |W| of the sampled rows
	sig2       []float64
	pg, inv    []float64
}

func newColFit(w []float32, rows, cols int, sig2 []float64) *colFit {
	n := min(rows, colFitSampleRows)
	f := &colFit{rows: n, cols: cols, a: make([]float32, n*cols), sig2: sig2,
		pg: make([]float64, cols), inv: make([]float64, cols)}
	for k := range n {
		o := k * rows / n
		for i, v := range w[o*cols : (o+1)*cols] {
			a := float32(math.Abs(float64(v)))
			if math.IsInf(float64(a), 0) || math.IsNaN(float64(a)) {
				a = 0
			}
			f.a[k*cols+i] = a
		}
	}
	return f
}

// surrogate returns log P + log S of the smoothed model for the field
// c = exp(u) and fills f.pg with each column's share of P and sShare with
// its share of S.
func (f *colFit) surrogate(u, sShare []float64) float64 {
	for i, x := range u {
		f.inv[i] = math.Exp(-x)
	}
	clear(f.pg)
	var p float64
	for o := range f.rows {
		row := f.a[o*f.cols : (o+1)*f.cols]
		var h float64
		for i, a := range row {
			h = max(h, float64(a)*f.inv[i])
		}
		if h == 0 {
			continue
		}
		ih := 1 / h
		var z float64
		for i, a := range row {
			t := float64(a) * f.inv[i] * ih
			t *= t
			t *= t
			t *= t
			t *= t // t^16
			z += t
		}
		m2 := h * h * math.Pow(z, 2.0/colFitP)
		p += m2
		k := m2 / z
		for i, a := range row {
			t := float64(a) * f.inv[i] * ih
			t *= t
			t *= t
			t *= t
			t *= t
			f.pg[i] += k * t
		}
	}
	var s float64
	for i, x := range u {
		sShare[i] = math.Exp(2*x) * f.sig2[i]
		s += sShare[i]
	}
	for i := range sShare {
		sShare[i] /= s
		f.pg[i] /= p
	}
	return math.Log(p) + math.Log(s)
}

// optimise minimises the smoothed model from the starting field c0 (zero
// entries stay fixed at zero) and returns the field.
func (f *colFit) optimise(c0 []float64) []float64 {
	u := make([]float64, f.cols)
	live := make([]bool, f.cols)
	for i, c := range c0 {
		if c > 0 {
			u[i], live[i] = math.Log(c), true
		}
	}
	sh := make([]float64, f.cols)
	un := make([]float64, f.cols)
	shn := make([]float64, f.cols)
	pgn := make([]float64, f.cols)
	l := f.surrogate(u, sh)
	eta := 0.5
	for range colFitIters {
		ok := false
		for range 6 {
			for i := range u {
				un[i] = u[i]
				if live[i] {
					un[i] += eta * 0.5 * max(-1, min(1, math.Log(f.pg[i]/sh[i])))
				}
			}
			copy(pgn, f.pg)
			ln := f.surrogate(un, shn)
			if ln < l {
				u, un = un, u
				sh, shn = shn, sh
				l, ok = ln, true
				eta = min(eta*1.25, 1)
				break
			}
			copy(f.pg, pgn)
			eta /= 2
		}
		if !ok {
			break
		}
	}
	c := make([]float64, f.cols)
	for i := range c {
		if live[i] {
			c[i] = math.Exp(u[i])
		}
	}
	return c
}

// tighten shrinks every column of c to the smallest scale that keeps each
// sampled row's maximum |W|/c, which leaves the row scales and lowers S.
func (f *colFit) tighten(c []float64) {
	m := make([]float64, f.rows)
	for o := range f.rows {
		for i, a := range f.a[o*f.cols : (o+1)*f.cols] {
			if c[i] > 0 {
				m[o] = max(m[o], float64(a)/c[i])
			}
		}
	}
	need := make([]float64, f.cols)
	for o := range f.rows {
		if m[o] == 0 {
			continue
		}
		for i, a := range f.a[o*f.cols : (o+1)*f.cols] {
			need[i] = max(need[i], float64(a)/m[o])
		}
	}
	for i := range c {
		if need[i] > 0 && need[i] < c[i] {
			c[i] = need[i]
		}
	}
}
