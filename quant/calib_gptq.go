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

// addRange accumulates rows i ∈ [i0, i1) of the upper triangle. Each H
// row takes every input row in turn while it stays in cache, four input
// rows at a time; the inputs (rows·cols float32) are read once per H row
// from the caches rather than H streamed from memory once per input row.
func (g *Gram) addRange(x []float32, rows, i0, i1 int) {
	c := g.cols
	for i := i0; i < i1; i++ {
		hi := g.h[i*c+i : (i+1)*c]
		n := len(hi)
		r := 0
		for ; r+4 <= rows; r += 4 {
			b := x[r*c : (r+4)*c]
			a0, a1, a2, a3 := float64(b[i]), float64(b[c+i]), float64(b[2*c+i]), float64(b[3*c+i])
			if a0 == 0 && a1 == 0 && a2 == 0 && a3 == 0 {
				continue
			}
			y0, y1, y2, y3 := b[i:i+n], b[c+i:c+i+n], b[2*c+i:2*c+i+n], b[3*c+i:3*c+i+n]
			y0, y1, y2, y3 = y0[:len(hi)], y1[:len(hi)], y2[:len(hi)], y3[:len(hi)]
			for j := range hi {
				hi[j] += a0*float64(y0[j]) + a1*float64(y1[j]) + a2*float64(y2[j]) + a3*float64(y3[j])
			}
		}
		for ; r < rows; r++ {
			xr := x[r*c : (r+1)*c]
			a := float64(xr[i])
			if a == 0 {
				continue
			}
			y := xr[i : i+n]
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
	// Rows go through in blocks: each row of U (and of H) is then read
	// once per block rather than once per row, which keeps the encoder off
	// the memory bus. Rows stay independent: a row's arithmetic is the
	// same whatever block it is in.
	b := min(n, gptqBlock)
	blk := &gptqBlockState{b: b, rw: make([]float64, cols*b), d: make([]float64, b), enc: make([]*q4tpEncoder, b)}
	for i := range blk.enc {
		blk.enc[i] = newQ4TPEncoder(cols)
		blk.enc[i].cw = q.cw
	}
	for k0 := 0; k0 < n; k0 += b {
		k1 := min(n, k0+b)
		m := k1 - k0
		for k := range m {
			e := blk.enc[k]
			row := w[(k0+k)*cols : (k0+k+1)*cols]
			ah, bh := e.encodeRow(row)
			q4tpLadder(&e.lad, ah, bh)
			blk.ah[k], blk.bh[k] = ah, bh
			for j, v := range row {
				blk.rw[j*b+k] = float64(v)
			}
		}
		q.rows(blk, m)
		if q.refine > 0 {
			q.refineRows(blk, w[k0*cols:k1*cols], m)
		}
		for k := range m {
			e := blk.enc[k]
			q4tpPutRow(dst, rows, cols, r0+k0+k, e.q, e.code, blk.ah[k], blk.bh[k])
		}
	}
	return nil
}

// gptqBlock is the number of rows encoded together.
const gptqBlock = 8

// gptqBlockState is the scratch of a block of rows: one encoder per row
// (its ladder in lad, nibbles in q, codes in code), and the rows' working
// values interleaved column-major (rw[j·b + k] is column j of row k).
type gptqBlockState struct {
	b      int
	enc    []*q4tpEncoder
	ah, bh [gptqBlock]uint16
	rw     []float64
	d      []float64
}

// rows requantizes the first m rows of the block with error feedback,
// leaving nibbles and codes in their encoders.
func (q *GPTQ) rows(s *gptqBlockState, m int) {
	n, u, b := q.cols, q.u, s.b
	for g := range n / GroupSize {
		j0 := g * GroupSize
		// Each row's rung for the group as the updates left it, each
		// column's error weighted by its conditional curvature 1/U[j,j]².
		for k := range m {
			e := s.enc[k]
			kb, best := 0, math.Inf(1)
			for c := range q4tpRungs {
				sc := e.lad[c]
				inv := 1 / sc
				var err float64
				for i := range GroupSize {
					v := float32(s.rw[(j0+i)*b+k])
					x := min(max(float32(v*inv), -8), 7)
					d := float64(v - float32((float32(int32(x+8.5))-8)*sc))
					ujj := u[(j0+i)*n+j0+i]
					err += d * d / (ujj * ujj)
				}
				if err < best {
					kb, best = c, err
				}
			}
			e.code[g] = uint8(kb)
		}
		for i := range GroupSize {
			j := j0 + i
			ujj := u[j*n+j]
			for k := range m {
				e := s.enc[k]
				sc := float64(e.lad[e.code[g]])
				v := s.rw[j*b+k]
				x := min(max(float32(float32(v)/float32(sc)), -8), 7)
				qv := int32(x+8.5) - 8
				e.q[j] = int8(qv)
				s.d[k] = (v - float64(qv)*sc) / ujj
			}
			d := s.d[:m]
			uj := u[j*n+j+1 : (j+1)*n]
			rest := s.rw[(j+1)*b:]
			for t, ut := range uj {
				r := rest[t*b : t*b+m]
				for k, dk := range d {
					r[k] -= dk * ut
				}
			}
		}
	}
}

// refineRows lowers f(ŵ) = (w−ŵ)ᵀH(w−ŵ) for each of the first m rows of
// the block (w holds their original values) by coordinate descent: a
// nibble moves by ±1 when that lowers f. With r = H(w−ŵ), moving ŵ[j] by
// δ changes f by −2δ·r[j] + δ²·H[j,j]; r then loses δ·H[j,:]. The r of the
// block's rows are interleaved like rw (whose space they reuse).
func (q *GPTQ) refineRows(s *gptqBlockState, w []float32, m int) {
	n, h, b := q.cols, q.h, s.b
	errs := s.rw // the working values are no longer needed: reuse for w−ŵ
	for j := range n {
		for k := range m {
			e := s.enc[k]
			errs[j*b+k] = float64(w[k*n+j]) - float64(e.q[j])*float64(e.lad[e.code[j/GroupSize]])
		}
	}
	gr := make([]float64, n*b)
	acc := s.d[:m]
	for i := range n {
		clear(acc)
		for j, hij := range h[i*n : (i+1)*n] {
			ej := errs[j*b : j*b+m]
			for k, v := range ej {
				acc[k] += hij * v
			}
		}
		copy(gr[i*b:i*b+m], acc)
	}
	var delta [gptqBlock]float64
	for range q.refine {
		moved := false
		for j := range n {
			hjj := h[j*n+j]
			any := false
			for k := range m {
				e := s.enc[k]
				sc := float64(e.lad[e.code[j/GroupSize]])
				best, bd := 0.0, 0
				for _, d := range [2]int{-1, 1} {
					if v := int(e.q[j]) + d; v < -8 || v > 7 {
						continue
					}
					dl := float64(d) * sc
					if df := -2*dl*gr[j*b+k] + dl*dl*hjj; df < best {
						best, bd = df, d
					}
				}
				delta[k] = 0
				if bd != 0 {
					e.q[j] += int8(bd)
					delta[k] = float64(bd) * sc
					any = true
				}
			}
			if !any {
				continue
			}
			moved = true
			dl := delta[:m]
			for i, hji := range h[j*n : (j+1)*n] {
				g := gr[i*b : i*b+m]
				for k, v := range dl {
					g[k] -= v * hji
				}
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
