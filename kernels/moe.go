package kernels

import (
	"fmt"

	"github.com/cortiq/cortiq/hugemem"
)

// Mixture-of-experts FFN (architectures.md §5, §6.5, §8): a router
// softmax over all experts in float32, the top k, renormalised when the
// config says so, each selected expert a SwiGLU, plus an optional shared
// expert scaled by a sigmoid gate. Only the selected experts' weights are
// read; a prefill chunk groups its rows by expert so that each expert is
// read once per chunk.

// Route turns one token's router logits (len = number of experts) into
// the top len(idx) experts and their weights: softmax over ALL experts
// first (in place, float32), then the k largest probabilities in
// descending order (ties: the lower index first, as a stable sort), then
// w /= Σw when renorm.
func Route(logits []float32, renorm bool, idx []int, w []float32) {
	Softmax(logits)
	TopK(logits, renorm, idx, w)
}

// TopK is Route's selection over probabilities p: the len(idx) largest in
// descending order (ties: the lower index first) with their values in w,
// renormalised to Σw = 1 when renorm.
func TopK(p []float32, renorm bool, idx []int, w []float32) {
	logits := p
	k := len(idx)
	w = w[:k]
	for j := range k {
		best := -1
		for e, p := range logits {
			if best >= 0 && p <= logits[best] {
				continue
			}
			taken := false
			for _, c := range idx[:j] {
				if c == e {
					taken = true
					break
				}
			}
			if !taken {
				best = e
			}
		}
		idx[j], w[j] = best, logits[best]
	}
	if renorm {
		var s float32
		for _, v := range w {
			s += v
		}
		for j := range w {
			w[j] /= s
		}
	}
}

// Expert is one SwiGLU FFN: down(silu(gate(x)) ⊙ up(x)).
type Expert struct {
	Gate, Up *Mat // (inter, dim)
	Down     *Mat // (dim, inter)
}

// MoE is one layer's sparse FFN.
type MoE struct {
	Router     *Mat // (experts, dim)
	Experts    []Expert
	TopK       int
	Renorm     bool    // norm_topk_prob
	Shared     *Expert // optional shared expert
	SharedGate *Mat    // (1, dim): sigmoid gate of the shared expert
}

// Check validates the shapes.
func (m *MoE) Check(dim int) error {
	if m.Router == nil || m.Router.Cols != dim || m.Router.Rows != len(m.Experts) {
		return fmt.Errorf("kernels: moe router does not map %d to %d experts", dim, len(m.Experts))
	}
	if m.TopK <= 0 || m.TopK > len(m.Experts) {
		return fmt.Errorf("kernels: moe top-k %d of %d experts", m.TopK, len(m.Experts))
	}
	if (m.Shared == nil) != (m.SharedGate == nil) {
		return fmt.Errorf("kernels: shared expert and its gate come together")
	}
	return nil
}

// ExpertBytes returns the stored bytes of expert e's three matrices.
func (m *MoE) ExpertBytes(e int) int64 {
	x := &m.Experts[e]
	return int64(len(x.Gate.Data) + len(x.Up.Data) + len(x.Down.Data))
}

// MoEScratch holds the buffers of MoEForward, grown on first use.
type MoEScratch struct {
	logits []float32 // (T, experts)
	idx    []int     // (T, k)
	w      []float32 // (T, k)
	rows   [][]int   // per expert: the (token·k + slot) entries routed to it
	x      []float32 // (n, dim): the rows of one expert
	g, u   []float32 // (n, inter)
	y      []float32 // (n, dim)
	sg     []float32 // (T)
	jobs   []MatVecJob
	ex     []*Expert
	// Bytes is the expert weight bytes the last call read (selected
	// experts once each, plus the shared expert).
	Bytes int64
	// Observe, when set, is called with each matrix and the rows×cols
	// inputs it multiplies, before the product (calibration).
	Observe func(m *Mat, x []float32, rows, cols int)
}

func (s *MoEScratch) see(m *Mat, x []float32, rows int) {
	if s.Observe != nil {
		s.Observe(m, x[:rows*m.Cols], rows, m.Cols)
	}
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// MoEForward adds the layer's output for T rows of x (T, dim) to out
// (T, dim). Rows are routed, then each expert selected by any row runs
// once over all of its rows (a MatMul over the gathered rows), its output
// scaled by the routing weight and scattered back.
func MoEForward(p *Pool, m *MoE, x []float32, T int, out []float32, s *MoEScratch) {
	E, k, dim := len(m.Experts), m.TopK, m.Router.Cols
	s.logits = grow(s.logits, T*E)
	s.w = grow(s.w, T*k)
	if cap(s.idx) < T*k {
		s.idx = make([]int, T*k)
	}
	s.idx = s.idx[:T*k]
	s.see(m.Router, x, T)
	p.MatMul(m.Router, x[:T*dim], T, s.logits)
	if T == 1 {
		s.decode(p, m, x[:dim], out[:dim])
		return
	}
	if len(s.rows) != E {
		s.rows = make([][]int, E)
	}
	for e := range s.rows {
		s.rows[e] = s.rows[e][:0]
	}
	for t := range T {
		Route(s.logits[t*E:(t+1)*E], m.Renorm, s.idx[t*k:(t+1)*k], s.w[t*k:(t+1)*k])
		for j, e := range s.idx[t*k : (t+1)*k] {
			s.rows[e] = append(s.rows[e], t*k+j)
		}
	}
	s.Bytes = 0
	for e, rows := range s.rows {
		if len(rows) == 0 {
			continue
		}
		n := len(rows)
		s.x = grow(s.x, n*dim)
		for i, r := range rows {
			t := r / k
			copy(s.x[i*dim:(i+1)*dim], x[t*dim:(t+1)*dim])
		}
		s.expert(p, &m.Experts[e], n, dim)
		for i, r := range rows {
			t := r / k
			AXPY(out[t*dim:(t+1)*dim], s.w[r], s.y[i*dim:(i+1)*dim])
		}
		s.Bytes += m.ExpertBytes(e)
	}
	if m.Shared != nil {
		s.x = grow(s.x, T*dim)
		copy(s.x, x[:T*dim])
		s.expert(p, m.Shared, T, dim)
		s.sg = grow(s.sg, T)
		s.see(m.SharedGate, x, T)
		p.MatMul(m.SharedGate, x[:T*dim], T, s.sg)
		for t := range T {
			g := 1 / (1 + Exp(-s.sg[t]))
			AXPY(out[t*dim:(t+1)*dim], g, s.y[t*dim:(t+1)*dim])
		}
		s.Bytes += int64(len(m.Shared.Gate.Data) + len(m.Shared.Up.Data) + len(m.Shared.Down.Data) + len(m.SharedGate.Data))
	}
	s.Bytes += int64(len(m.Router.Data))
}

// decode is MoEForward for one row whose router logits are in s.logits:
// the gate and up products of every selected expert (and the shared one)
// run as one pool operation, then all the down products as another.
func (s *MoEScratch) decode(p *Pool, m *MoE, x, out []float32) {
	k, dim := m.TopK, m.Router.Cols
	Route(s.logits, m.Renorm, s.idx[:k], s.w[:k])
	ex := s.ex[:0]
	for _, e := range s.idx[:k] {
		ex = append(ex, &m.Experts[e])
	}
	if m.Shared != nil {
		ex = append(ex, m.Shared)
	}
	I := 0
	for _, e := range ex {
		I = max(I, e.Gate.Rows)
	}
	n := len(ex)
	s.g, s.u, s.y = grow(s.g, n*I), grow(s.u, n*I), grow(s.y, n*dim)
	s.sg = grow(s.sg, 1)
	jobs := s.jobs[:0]
	for j, e := range ex {
		jobs = append(jobs, MatVecJob{M: e.Gate, X: x, Y: s.g[j*I:]}, MatVecJob{M: e.Up, X: x, Y: s.u[j*I:]})
		s.see(e.Gate, x, 1)
		s.see(e.Up, x, 1)
	}
	if m.Shared != nil {
		jobs = append(jobs, MatVecJob{M: m.SharedGate, X: x, Y: s.sg})
		s.see(m.SharedGate, x, 1)
	}
	p.MatVecs(jobs)
	jobs = jobs[:0]
	for j, e := range ex {
		Ie := e.Gate.Rows
		g, u := s.g[j*I:j*I+Ie], s.u[j*I:j*I+Ie]
		if s.Observe == nil { // the SwiGLU inside the operation, by the workers
			jobs = append(jobs, MatVecJob{M: e.Down, X: g, Y: s.y[j*dim:], Up: u})
			continue
		}
		SiLUMul(g, u)
		jobs = append(jobs, MatVecJob{M: e.Down, X: g, Y: s.y[j*dim:]})
		s.see(e.Down, g, 1)
	}
	p.MatVecs(jobs)
	s.jobs, s.ex = jobs[:0], ex[:0]
	s.Bytes = int64(len(m.Router.Data))
	for j := range k {
		AXPY(out, s.w[j], s.y[j*dim:(j+1)*dim])
		s.Bytes += m.ExpertBytes(s.idx[j])
	}
	if m.Shared != nil {
		AXPY(out, 1/(1+Exp(-s.sg[0])), s.y[k*dim:(k+1)*dim])
		s.Bytes += int64(len(m.Shared.Gate.Data) + len(m.Shared.Up.Data) + len(m.Shared.Down.Data) + len(m.SharedGate.Data))
	}
}

// expert runs ex over the n rows of s.x into s.y.
func (s *MoEScratch) expert(p *Pool, ex *Expert, n, dim int) {
	I := ex.Gate.Rows
	s.g, s.u, s.y = grow(s.g, n*I), grow(s.u, n*I), grow(s.y, n*dim)
	s.see(ex.Gate, s.x, n)
	s.see(ex.Up, s.x, n)
	p.MatMul(ex.Gate, s.x[:n*dim], n, s.g)
	p.MatMul(ex.Up, s.x[:n*dim], n, s.u)
	SiLUMul(s.g, s.u)
	s.see(ex.Down, s.g, n)
	p.MatMul(ex.Down, s.g, n, s.y)
}

// PackedBytes returns the bytes Pack copies: the routed experts' matrices,
// each rounded up to 64 bytes.
func (m *MoE) PackedBytes() int64 {
	var n int64
	for e := range m.Experts {
		x := &m.Experts[e]
		for _, w := range []*Mat{x.Gate, x.Up, x.Down} {
			n += int64(len(w.Data)+63) &^ 63
		}
	}
	return n
}

// Pack returns a copy of m whose routed experts' matrices have been copied
// into one buffer advised for huge pages (hugemem), expert after expert
// as gate, up, down, each at a 64-byte boundary; the router and the shared
// expert stay where they are, and m is unchanged. Decode reads k experts
// chosen at random per token, each a few 0.1–1 MB matrices: over 4 KB
// pages (the model file's mapping, or the Go heap) every expert starts
// with TLB misses and a fresh page walk, over 2 MB pages it does not (on
// the 2-core test machine the MoE decode benchmark read ~8% faster).
// Products are bit for bit those of m.
func (m *MoE) Pack() (*MoE, error) {
	buf, err := hugemem.Alloc(int(max(m.PackedBytes(), 1)))
	if err != nil {
		return nil, fmt.Errorf("kernels: moe pack: %w", err)
	}
	mem := buf.Bytes()
	p := *m
	p.Experts = make([]Expert, len(m.Experts))
	off := 0
	cp := func(w *Mat) (*Mat, error) {
		n := len(w.Data)
		d := mem[off : off+n : off+n]
		copy(d, w.Data)
		off += (n + 63) &^ 63
		c, err := NewMat(w.DType, w.Rows, w.Cols, d)
		if err != nil {
			return nil, fmt.Errorf("kernels: moe pack: %w", err)
		}
		c.keep = buf
		return c, nil
	}
	for e := range m.Experts {
		x, y := &m.Experts[e], &p.Experts[e]
		if y.Gate, err = cp(x.Gate); err != nil {
			return nil, err
		}
		if y.Up, err = cp(x.Up); err != nil {
			return nil, err
		}
		if y.Down, err = cp(x.Down); err != nil {
			return nil, err
		}
	}
	return &p, nil
}
