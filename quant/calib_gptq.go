package quant

import (
	"fmt"
	"math"
	"runtime"
	"sync"
)

// GPTQ-style q4tp encoding (Frantar et al., "GPTQ: Accurate Post-Training
// Quantization for Generative Pre-trained Transformers", 2022).
//
// With calibration inputs X (tokens × cols) the squared output error of a
// row w quantized to ŵ is (w−ŵ)ᵀH(w−ŵ), H = XᵀX. GPTQ quantizes the
// columns in order and, after each one, moves its rounding error onto the
// columns not yet quantized along the direction that H says cancels it
// best: with U the upper Cholesky factor of H⁻¹ (Uᵀ·U = H⁻¹) the update
// after column j is w[k] −= (w[j]−ŵ[j])/U[j,j]·U[j,k] for k > j. q4tp fits
// it naturally: the row's ladder is chosen first (by the encoder with each
// column weighted by H's diagonal), and each group's rung when the group is
// reached, from the weights as the earlier updates left them. A few sweeps
// of coordinate descent then move single nibbles by ±1 where that lowers
// (w−ŵ)ᵀH(w−ŵ).

// Gram accumulates the Gram matrix XᵀX of a linear layer's inputs
// (cols × cols, float64: 8·cols² bytes). Use NewGram.
type Gram struct {
	cols int
	n    int
	h    []float64 // row-major; only the upper triangle is accumulated
}

// NewGram returns an empty accumulator for inputs of cols columns.
func NewGram(cols int) *Gram { return &Gram{cols: cols, h: make([]float64, cols*cols)} }

// GPTQBytes is the memory a Gram of cols columns and the GPTQ encoder
// made from it take together.
func GPTQBytes(cols int) int64 { return 16 * int64(cols) * int64(cols) }

// Cols returns the number of input columns.
func (g *Gram) Cols() int { return g.cols }

// Rows returns the number of input rows (tokens) accumulated.
func (g *Gram) Rows() int { return g.n }

// Add accumulates rows input rows, row-major in x (rows·Cols values).
// Large additions run on several goroutines.
func (g *Gram) Add(x []float32, rows int) error {
	c := g.cols
	if g.h == nil {
		return fmt.Errorf("quant: gram: used after NewGPTQ took it over")
	}
	if rows < 0 || len(x) != rows*c {
		return fmt.Errorf("quant: gram: %d values for %d rows of %d columns", len(x), rows, c)
	}
	for i, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("quant: gram: non-finite activation %v at row %d, column %d", v, i/c, i%c)
		}
	}
	// Split the upper triangle's rows into parts of about equal work.
	parts := 1
	if work := int64(rows) * int64(c) * int64(c) / 2; work > 1<<22 {
		parts = min(runtime.GOMAXPROCS(0), c)
	}
	if parts == 1 {
		g.addRange(x, rows, 0, c)
	} else {
		var wg sync.WaitGroup
		total := float64(c) * float64(c+1) / 2
		lo := 0
		for p := range parts {
			// Rows [lo, hi) of the triangle hold about total/parts entries.
			hi := c
			if p < parts-1 {
				rem := float64(c-lo) * float64(c-lo+1) / 2
				target := rem - total/float64(parts)
				hi = c - int(math.Round((math.Sqrt(1+8*max(target, 0))-1)/2))
				hi = max(hi, lo+1)
			}
			if lo >= c {
				break
			}
			a, b := lo, min(hi, c)
			wg.Go(func() { g.addRange(x, rows, a, b) })
			lo = hi
		}
		wg.Wait()
	}
	g.n += rows
	return nil
}

// addRange accumulates rows i ∈ [i0, i1) of the upper triangle, four input
// rows at a time (each H row is loaded once per four).
func (g *Gram) addRange(x []float32, rows, i0, i1 int) {
	c := g.cols
	r := 0
	for ; r+4 <= rows; r += 4 {
		x0, x1, x2, x3 := x[r*c:(r+1)*c], x[(r+1)*c:(r+2)*c], x[(r+2)*c:(r+3)*c], x[(r+3)*c:(r+4)*c]
		for i := i0; i < i1; i++ {
			a0, a1, a2, a3 := float64(x0[i]), float64(x1[i]), float64(x2[i]), float64(x3[i])
			if a0 == 0 && a1 == 0 && a2 == 0 && a3 == 0 {
				continue
			}
			hi := g.h[i*c+i : (i+1)*c]
			y0, y1, y2, y3 := x0[i:c], x1[i:c], x2[i:c], x3[i:c]
			y1, y2, y3 = y1[:len(hi)], y2[:len(hi)], y3[:len(hi)]
			y0 = y0[:len(hi)]
			for j := range hi {
				hi[j] += a0*float64(y0[j]) + a1*float64(y1[j]) + a2*float64(y2[j]) + a3*float64(y3[j])
			}
		}
	}
	for ; r < rows; r++ {
		xr := x[r*c : (r+1)*c]
		for i := i0; i < i1; i++ {
			a := float64(xr[i])
			if a == 0 {
				continue
			}
			hi := g.h[i*c+i : (i+1)*c]
			y := xr[i:c]
			y = y[:len(hi)]
			for j := range hi {
				hi[j] += a * float64(y[j])
			}
		}
	}
}

// RMS returns each column's root mean square (the square root of the
// diagonal of XᵀX/rows), the statistic EncodeOptions.ColStats takes.
func (g *Gram) RMS() []float32 {
	out := make([]float32, g.cols)
	if g.n == 0 || g.h == nil {
		return out
	}
	for i := range out {
		out[i] = float32(math.Sqrt(g.h[i*g.cols+i] / float64(g.n)))
	}
	return out
}

// OutputError returns Σ_rows (w−ŵ)ᵀH(w−ŵ) and Σ_rows wᵀHw for a rows×cols
// matrix w and its quantized ŵ: the squared output error on the
// calibration inputs, and the squared output itself.
func (g *Gram) OutputError(w, what []float32) (errSq, outSq float64) {
	n := g.cols
	rows := len(w) / n
	e := make([]float64, n)
	x := make([]float64, n)
	quad := func(v []float64) float64 {
		var s float64
		for i, vi := range v {
			if vi == 0 {
				continue
			}
			hi := g.h[i*n : (i+1)*n]
			var t float64
			for j := i + 1; j < n; j++ {
				t += hi[j] * v[j]
			}
			s += vi*vi*hi[i] + 2*vi*t
		}
		return s
	}
	for r := range rows {
		for i := range n {
			x[i] = float64(w[r*n+i])
			e[i] = x[i] - float64(what[r*n+i])
		}
		errSq += quad(e)
		outSq += quad(x)
	}
	return errSq, outSq
}

// GPTQOptions tune NewGPTQ. The zero value is the default.
type GPTQOptions struct {
	// Damp is added to H's diagonal as a fraction of its mean (0: 0.01),
	// which keeps H invertible and the updates tame.
	Damp float64
	// Refine is the number of coordinate-descent sweeps after GPTQ (0: 4;
	// negative: none).
	Refine int
}

// GPTQ encodes q4tp rows against the Gram matrix of their input; one GPTQ
// serves every weight that reads the same input (q/k/v, gate/up). It is
// safe for concurrent EncodeRows calls.
type GPTQ struct {
	cols   int
	h      []float64 // H + damping, dense symmetric
	u      []float64 // upper Cholesky factor of (H + damping)⁻¹
	cw     []float32 // column weights of the ladder fit (H's diagonal)
	refine int
}

// NewGPTQ factors the Gram matrix g for encoding. It takes g's memory
// over: g must not be used afterwards.
func NewGPTQ(g *Gram, opt GPTQOptions) (*GPTQ, error) {
	if g == nil || g.h == nil {
		return nil, fmt.Errorf("quant: gptq: no gram matrix")
	}
	n := g.cols
	if n%GroupSize != 0 || n == 0 {
		return nil, fmt.Errorf("quant: gptq: %d columns is not a positive multiple of %d", n, GroupSize)
	}
	damp := opt.Damp
	if damp <= 0 {
		damp = 0.01
	}
	h := g.h
	g.h = nil
	var mean float64
	for i := range n {
		for j := i + 1; j < n; j++ {
			h[j*n+i] = h[i*n+j]
		}
		mean += h[i*n+i]
	}
	mean /= float64(n)
	if !(mean > 0) || math.IsInf(mean, 0) {
		mean = 1
	}
	stats := make([]float32, n)
	for i := range n {
		h[i*n+i] += damp * mean
		stats[i] = float32(math.Sqrt(h[i*n+i]))
	}
	u, err := invCholUpper(h, n)
	if err != nil {
		return nil, fmt.Errorf("quant: gptq: %w", err)
	}
	q := &GPTQ{cols: n, h: h, u: u, cw: StatWeights(stats), refine: opt.Refine}
	if q.refine == 0 {
		q.refine = 4
	}
	return q, nil
}

// Cols returns the number of input columns the encoder was made for.
func (q *GPTQ) Cols() int { return q.cols }

// EncodeRows encodes rows [r0, r0+len(w)/cols) of a rows×cols q4tp tensor
// into dst (the whole tensor's ExpectedBytes buffer), as
// Codec.EncodeRows does; rows are independent, so chunks and whole
// tensors give the same bytes.
func (q *GPTQ) EncodeRows(dst []byte, w []float32, rows, cols, r0 int) error {
	if cols != q.cols {
		return fmt.Errorf("quant: gptq: %d columns, the gram matrix has %d", cols, q.cols)
	}
	n, err := checkRows(Q4TP, dst, w, rows, cols, r0)
	if err != nil {
		return err
	}
	if err := checkFinite(Q4TP, w, cols, r0); err != nil {
		return err
	}
	for i, v := range w {
		if math.Abs(float64(v)) >= q4tpMaxWeight {
			return fmt.Errorf("quant: q4tp: weight %g at row %d, column %d is beyond the format's range (|w| < 2^100)", v, r0+i/cols, i%cols)
		}
	}
	e := newQ4TPEncoder(cols)
	e.cw = q.cw
	rw := make([]float64, cols)
	for k := range n {
		row := w[k*cols : (k+1)*cols]
		ah, bh := e.encodeRow(row)
		q.row(e, rw, row, ah, bh)
		if q.refine > 0 {
			q.refineRow(e, rw, row)
		}
		q4tpPutRow(dst, rows, cols, r0+k, e.q, e.code, ah, bh)
	}
	return nil
}

// row requantizes one row with error feedback on the ladder (ah, bh),
// leaving nibbles in e.q and codes in e.code. rw is scratch.
func (q *GPTQ) row(e *q4tpEncoder, rw []float64, row []float32, ah, bh uint16) {
	n, u := q.cols, q.u
	q4tpLadder(&e.lad, ah, bh)
	for i, v := range row {
		rw[i] = float64(v)
	}
	for g := range n / GroupSize {
		j0 := g * GroupSize
		// The group's rung for its weights as the updates left them, each
		// column's error weighted by its conditional curvature 1/U[j,j]².
		k, best := 0, math.Inf(1)
		for c := range q4tpRungs {
			s := e.lad[c]
			inv := 1 / s
			var err float64
			for i := range GroupSize {
				v := float32(rw[j0+i])
				x := min(max(float32(v*inv), -8), 7)
				d := float64(v - float32((float32(int32(x+8.5))-8)*s))
				ujj := u[(j0+i)*n+j0+i]
				err += d * d / (ujj * ujj)
			}
			if err < best {
				k, best = c, err
			}
		}
		e.code[g] = uint8(k)
		s := float64(e.lad[k])
		for i := range GroupSize {
			j := j0 + i
			x := min(max(float32(float32(rw[j])/float32(s)), -8), 7)
			qv := int32(x+8.5) - 8
			e.q[j] = int8(qv)
			d := (rw[j] - float64(qv)*s) / u[j*n+j]
			uj := u[j*n+j+1 : (j+1)*n]
			rest := rw[j+1 : n]
			for t := range uj {
				rest[t] -= d * uj[t]
			}
		}
	}
}

// refineRow lowers f(ŵ) = (w−ŵ)ᵀH(w−ŵ) for one encoded row (nibbles e.q,
// codes e.code, ladder e.lad) by coordinate descent: a nibble moves by ±1
// when that lowers f. With r = H(w−ŵ), moving ŵ[j] by δ changes f by
// −2δ·r[j] + δ²·H[j,j]. gr is scratch of cols values.
func (q *GPTQ) refineRow(e *q4tpEncoder, gr []float64, row []float32) {
	n, h := q.cols, q.h
	err := make([]float64, n)
	for j := range n {
		err[j] = float64(row[j]) - float64(e.q[j])*float64(e.lad[e.code[j/GroupSize]])
	}
	for i := range n {
		var s float64
		for j, hij := range h[i*n : (i+1)*n] {
			s += hij * err[j]
		}
		gr[i] = s
	}
	for range q.refine {
		moved := false
		for j := range n {
			sc := float64(e.lad[e.code[j/GroupSize]])
			hjj := h[j*n+j]
			best, bd := 0.0, 0
			for _, d := range [2]int{-1, 1} {
				if v := int(e.q[j]) + d; v < -8 || v > 7 {
					continue
				}
				delta := float64(d) * sc
				if df := -2*delta*gr[j] + delta*delta*hjj; df < best {
					best, bd = df, d
				}
			}
			if bd == 0 {
				continue
			}
			moved = true
			e.q[j] += int8(bd)
			delta := float64(bd) * sc
			for i, hji := range h[j*n : (j+1)*n] {
				gr[i] -= delta * hji
			}
		}
		if !moved {
			break
		}
	}
}

// invCholUpper returns U, upper triangular with Uᵀ·U = A⁻¹, for the
// symmetric positive definite n×n row-major A (left unchanged). With J
// the order reversal, M = chol(J·A·J) (lower) gives A⁻¹ = J·M⁻ᵀ·M⁻¹·J =
// Uᵀ·U for U = J·M⁻¹·J: one factorization and one triangular inverse in a
// single n×n buffer.
func invCholUpper(a []float64, n int) ([]float64, error) {
	m := make([]float64, n*n)
	for i := range n {
		for j := range n {
			m[i*n+j] = a[(n-1-i)*n+(n-1-j)]
		}
	}
	if err := cholLower(m, n); err != nil {
		return nil, err
	}
	invLower(m, n)
	for i, j := 0, n*n-1; i < j; i, j = i+1, j-1 {
		m[i], m[j] = m[j], m[i]
	}
	return m, nil
}

// parallelMin is the work (multiply-adds) below which a step of the
// factorization stays on one goroutine.
const parallelMin = 1 << 14

// parallelRange calls fn on parts of [lo, hi) on several goroutines when
// work is large, else once on the caller's.
func parallelRange(lo, hi int, work int64, fn func(lo, hi int)) {
	parts := min(runtime.GOMAXPROCS(0), hi-lo)
	if work < parallelMin || parts <= 1 {
		fn(lo, hi)
		return
	}
	var wg sync.WaitGroup
	step := (hi - lo + parts - 1) / parts
	for a := lo; a < hi; a += step {
		b := min(hi, a+step)
		wg.Go(func() { fn(a, b) })
	}
	wg.Wait()
}

// cholLower overwrites the lower triangle of the symmetric positive
// definite a (n×n row-major) with L, a = L·Lᵀ; the upper triangle is
// cleared. Each column's rows are computed in parallel when large.
func cholLower(a []float64, n int) error {
	for j := range n {
		rj := a[j*n : j*n+j]
		s := a[j*n+j]
		for _, v := range rj {
			s -= v * v
		}
		if !(s > 0) || math.IsInf(s, 0) {
			return fmt.Errorf("matrix not positive definite at column %d", j)
		}
		d := math.Sqrt(s)
		a[j*n+j] = d
		parallelRange(j+1, n, int64(n-j)*int64(j), func(lo, hi int) {
			for i := lo; i < hi; i++ {
				ri := a[i*n : i*n+j]
				s := a[i*n+j]
				for k, v := range rj {
					s -= ri[k] * v
				}
				a[i*n+j] = s / d
			}
		})
		clear(a[j*n+j+1 : (j+1)*n])
	}
	return nil
}

// invLower inverts the lower-triangular l (n×n row-major) in place. Row i
// of the inverse X is −(Σ_{k<i} L[i,k]·X[k,:])/L[i,i] off the diagonal
// and 1/L[i,i] on it: rows of X already computed are read along their
// length (cache-friendly), into a scratch row (split across goroutines by
// columns when large) that then replaces row i of L.
func invLower(l []float64, n int) {
	acc := make([]float64, n)
	for i := range n {
		d := l[i*n+i]
		li := l[i*n : i*n+i]
		parallelRange(0, i, int64(i)*int64(i)/2, func(c0, c1 int) {
			out := acc[c0:c1]
			clear(out)
			for k := c0; k < i; k++ {
				a := li[k]
				if a == 0 {
					continue
				}
				xk := l[k*n+c0 : k*n+min(c1, k+1)]
				for c, v := range xk {
					out[c] -= a * v
				}
			}
		})
		for j := range i {
			l[i*n+j] = acc[j] / d
		}
		l[i*n+i] = 1 / d
	}
}

// Merge adds the accumulated o (same number of columns) to g.
func (g *Gram) Merge(o *Gram) error {
	if o.cols != g.cols || g.h == nil || o.h == nil {
		return fmt.Errorf("quant: gram: merging %d columns into %d (or a gram taken over by NewGPTQ)", o.cols, g.cols)
	}
	for i, v := range o.h {
		g.h[i] += v
	}
	g.n += o.n
	return nil
}
