package cpu

import (
	"fmt"
	"math"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/kernels"
)

// state is the run state of one step: the residual stream and the
// activations of its rows, grown to the largest step seen and reused.
type state struct {
	dev *Device
	b   *backend.Batch
	err error

	rows   int
	rowSeq []int // per row: index into b.Seqs
	rowPos []int // per row: position in its sequence
	last   []int // per sequence: its last row

	x, xb, xb2 []float32 // (rows, H): residual stream, normed input, block output
	q, att     []float32 // (rows, heads·hd)
	k, v       []float32 // (rows, kvHeads·hd)
	hb, hb2    []float32 // (rows, I)
	qg, gate   []float32 // gated attention: (rows, 2·heads·hd) q_proj output, (rows, heads·hd) gate
	jobs       []kernels.MatVecJob
	hy         hybridState
	inv        []float32 // rope frequencies of a dynamic-scaling sequence
	cos, sin   []float32 // (rows, rotary/2)
	ropeOf     rope      // the rope cos/sin were computed for
	scores     [][]float32
	attn       attnTask
	logits     []float32 // (sequences, vocab): Batch.OutRows' rows before they are copied out
}

// grow returns buf resized to n, reallocated only when too small.
func grow(buf *[]float32, n int) []float32 {
	if cap(*buf) < n {
		*buf = make([]float32, n)
	}
	*buf = (*buf)[:n]
	return *buf
}

func growInts(buf *[]int, n int) []int {
	if cap(*buf) < n {
		*buf = make([]int, n)
	}
	*buf = (*buf)[:n]
	return *buf
}

func (st *state) begin(d *Device, b *backend.Batch) error {
	st.dev, st.b, st.err, st.ropeOf = d, b, nil, rope{}
	st.rows = b.Rows()
	rowSeq, rowPos := growInts(&st.rowSeq, st.rows), growInts(&st.rowPos, st.rows)
	last := growInts(&st.last, len(b.Seqs))
	r := 0
	for i, toks := range b.Tokens {
		p0 := b.Seqs[i].Len()
		for t := range toks {
			rowSeq[r], rowPos[r] = i, p0+t
			r++
		}
		last[i] = r - 1
	}
	if b.RopeLen != nil && len(b.RopeLen) != len(b.Seqs) {
		return fmt.Errorf("cpu: %d RoPE lengths for %d sequences", len(b.RopeLen), len(b.Seqs))
	}
	return nil
}

func (st *state) fail(err error) {
	if st.err == nil {
		st.err = err
	}
}

// see reports x (rows×cols) as the input of each weight to the observer.
func (st *state) see(x []float32, rows, cols int, ms ...backend.Mat) {
	if st.dev.obs == nil {
		return
	}
	for _, m := range ms {
		st.dev.obs.Observe(matOf(m).name, x, rows, cols)
	}
}

// norm writes the RMSNorm of every row of x (rows of len(n.W)) to dst.
func norm(dst, x []float32, n *backend.Norm) {
	w := vecOf(n.W)
	H := len(w)
	for t := 0; t < len(x); t += H {
		kernels.RMSNorm(dst[t:t+H], x[t:t+H], w, n.Eps, n.OnePlus)
	}
}

// addBias adds b to every row of y (rows of len(b)); nil b is no bias.
func addBias(y []float32, bv backend.Vec) {
	b := vecOf(bv)
	if b == nil {
		return
	}
	for i := 0; i < len(y); i += len(b) {
		kernels.Add(y[i:i+len(b)], b)
	}
}

// Embed sets x to the table rows of the step's tokens.
func (st *state) Embed(table backend.Mat) {
	m := matOf(table)
	H := m.Cols
	x := grow(&st.x, st.rows*H)
	r := 0
	for _, toks := range st.b.Tokens {
		for _, tok := range toks {
			if tok < 0 || tok >= m.Rows {
				st.fail(fmt.Errorf("cpu: token %d outside the %d-row embedding table", tok, m.Rows))
				return
			}
			m.Row(tok, x[r*H:(r+1)*H])
			r++
		}
	}
}

// ropeRows computes cos/sin for every row's position.
func (st *state) ropeRows(r rope) {
	if st.ropeOf == r {
		return
	}
	st.ropeOf = r
	h2 := r.Dim() / 2
	cos, sin := grow(&st.cos, st.rows*h2), grow(&st.sin, st.rows*h2)
	if !r.Dynamic() {
		inv, scale := r.Freqs(0, nil)
		for t := range st.rows {
			kernels.CosSin(inv, scale, st.rowPos[t], cos[t*h2:(t+1)*h2], sin[t*h2:(t+1)*h2])
		}
		return
	}
	// Dynamic NTK: frequencies from each sequence's length (a sequence's
	// rows are consecutive).
	buf := grow(&st.inv, h2)
	var inv []float32
	var scale float32
	for t := range st.rows {
		if i := st.rowSeq[t]; t == 0 || i != st.rowSeq[t-1] {
			n := st.b.Seqs[i].Len() + len(st.b.Tokens[i])
			if st.b.RopeLen != nil && st.b.RopeLen[i] > 0 {
				n = st.b.RopeLen[i]
			}
			inv, scale = r.Freqs(n, buf)
		}
		kernels.CosSin(inv, scale, st.rowPos[t], cos[t*h2:(t+1)*h2], sin[t*h2:(t+1)*h2])
	}
}

// Attention adds layer's attention block to x.
func (st *state) Attention(w *backend.Attention, layer int) {
	if st.err != nil {
		return
	}
	pool := st.dev.pool
	T, hd := st.rows, w.HeadDim
	_, H := w.Q.Dims()
	qd, kvd := w.Heads*hd, w.KVHeads*hd
	x, xb, xb2 := st.x[:T*H], grow(&st.xb, T*H), grow(&st.xb2, T*H)
	q, k, v, att := grow(&st.q, T*qd), grow(&st.k, T*kvd), grow(&st.v, T*kvd), grow(&st.att, T*qd)
	r := w.Rope.(rope)
	st.ropeRows(r)
	h2 := r.Dim() / 2

	// xb = input_layernorm(x)
	norm(xb, x, &w.Norm)
	st.see(xb, T, H, w.Q, w.K, w.V)
	// q, k, v = q_proj(xb), k_proj(xb), v_proj(xb); a gated q_proj holds
	// [q_j ; gate_j] per head.
	var gate []float32
	qout := q
	if w.Gated {
		qout, gate = grow(&st.qg, T*2*qd), grow(&st.gate, T*qd)
	}
	if T == 1 {
		// One pool operation for the three products of a decode row.
		st.jobs = append(st.jobs[:0], kernels.MatVecJob{M: matOf(w.Q).Mat, X: xb, Y: qout},
			kernels.MatVecJob{M: matOf(w.K).Mat, X: xb, Y: k}, kernels.MatVecJob{M: matOf(w.V).Mat, X: xb, Y: v})
		pool.MatVecs(st.jobs)
	} else {
		pool.MatMul(matOf(w.Q).Mat, xb, T, qout)
		pool.MatMul(matOf(w.K).Mat, xb, T, k)
		pool.MatMul(matOf(w.V).Mat, xb, T, v)
	}
	if w.Gated {
		qg := qout
		for t := range T {
			for h := range w.Heads {
				src := qg[t*2*qd+h*2*hd : t*2*qd+(h+1)*2*hd]
				copy(q[t*qd+h*hd:t*qd+(h+1)*hd], src[:hd])
				copy(gate[t*qd+h*hd:t*qd+(h+1)*hd], src[hd:])
			}
		}
	}
	addBias(q, w.BQ)
	addBias(k, w.BK)
	addBias(v, w.BV)
	for t := range T {
		cos, sin := st.cos[t*h2:(t+1)*h2], st.sin[t*h2:(t+1)*h2]
		// q = rope(q_norm(q)) per head; k likewise.
		for h := range w.Heads {
			qh := q[t*qd+h*hd : t*qd+(h+1)*hd]
			if w.QNorm != nil {
				kernels.RMSNorm(qh, qh, vecOf(w.QNorm.W), w.QNorm.Eps, w.QNorm.OnePlus)
			}
			kernels.ApplyRope(qh, cos, sin)
		}
		c, pos := st.b.Seqs[st.rowSeq[t]].(*seq), st.rowPos[t]
		for h := range w.KVHeads {
			kh := k[t*kvd+h*hd : t*kvd+(h+1)*hd]
			if w.KNorm != nil {
				kernels.RMSNorm(kh, kh, vecOf(w.KNorm.W), w.KNorm.Eps, w.KNorm.OnePlus)
			}
			kernels.ApplyRope(kh, cos, sin)
			// Cache K (after norm and RoPE) and V at the row's position.
			copy(c.kv(layer, h, pos, false), kh)
			copy(c.kv(layer, h, pos, true), v[t*kvd+h*hd:t*kvd+(h+1)*hd])
		}
	}
	// att = softmax(q·Kᵀ/√hd + causal mask)·V, per query head.
	if len(st.scores) < pool.Workers() {
		st.scores = make([][]float32, pool.Workers())
	}
	work := 0
	for t := range T {
		work += w.Heads * (st.rowPos[t] + 1) * hd * 2
	}
	st.attn = attnTask{st: st, w: w, l: layer, q: q, out: att}
	pool.For(T*w.Heads, work, &st.attn)
	st.attn = attnTask{}
	// att = att ⊙ σ(gate) (gated attention)
	for i, g := range gate {
		att[i] *= 1 / (1 + kernels.Exp(-g))
	}
	// x = x + o_proj(att)
	st.see(att, T, qd, w.O)
	pool.MatMul(matOf(w.O).Mat, att, T, xb2)
	addBias(xb2, w.BO)
	kernels.Add(x, xb2)
}

// attnTask computes causal GQA attention for rows·heads (row, head)
// pairs of one layer, reading K and V from each row's sequence.
type attnTask struct {
	st     *state
	w      *backend.Attention
	l      int
	q, out []float32 // (rows, heads·hd)
}

func (a *attnTask) Run(lo, hi, worker int) {
	hd, nh := a.w.HeadDim, a.w.Heads
	group := nh / a.w.KVHeads // query heads per kv head
	scale := float32(1 / math.Sqrt(float64(hd)))
	for it := lo; it < hi; it++ {
		t, h := it/nh, it%nh
		kvh := h / group
		c := a.st.b.Seqs[a.st.rowSeq[t]].(*seq)
		n := a.st.rowPos[t] + 1 // positions 0..pos are visible
		q := a.q[t*nh*hd+h*hd : t*nh*hd+(h+1)*hd]
		K, V := c.head(a.l, kvh, false), c.head(a.l, kvh, true)
		s := grow(&a.st.scores[worker], n)
		for j := range s {
			s[j] = kernels.Dot(q, K[j*hd:(j+1)*hd]) * scale
		}
		kernels.Softmax(s)
		o := a.out[t*nh*hd+h*hd : t*nh*hd+(h+1)*hd]
		clear(o)
		for j, p := range s {
			kernels.AXPY(o, p, V[j*hd:(j+1)*hd])
		}
	}
}

// MLP adds the SwiGLU block to x.
func (st *state) MLP(w *backend.MLP) {
	if st.err != nil {
		return
	}
	pool := st.dev.pool
	T := st.rows
	I, H := w.Gate.Dims()
	x, xb, xb2 := st.x[:T*H], grow(&st.xb, T*H), grow(&st.xb2, T*H)
	hb, hb2 := grow(&st.hb, T*I), grow(&st.hb2, T*I)
	// xb = post_attention_layernorm(x)
	norm(xb, x, &w.Norm)
	// x = x + down_proj(silu(gate_proj(xb)) * up_proj(xb))
	st.see(xb, T, H, w.Gate, w.Up)
	if T == 1 {
		st.jobs = append(st.jobs[:0], kernels.MatVecJob{M: matOf(w.Gate).Mat, X: xb, Y: hb}, kernels.MatVecJob{M: matOf(w.Up).Mat, X: xb, Y: hb2})
		pool.MatVecs(st.jobs)
	} else {
		pool.MatMul(matOf(w.Gate).Mat, xb, T, hb)
		pool.MatMul(matOf(w.Up).Mat, xb, T, hb2)
	}
	addBias(hb, w.BGate)
	addBias(hb2, w.BUp)
	kernels.SiLUMul(hb, hb2)
	st.see(hb, T, I, w.Down)
	pool.MatMul(matOf(w.Down).Mat, hb, T, xb2)
	addBias(xb2, w.BDown)
	kernels.Add(x, xb2)
}

// Head writes the logits the batch asks for to b.Out.
func (st *state) Head(w *backend.Head) {
	if st.err != nil {
		return
	}
	b := st.b
	V, H := w.W.Dims()
	head := matOf(w.W)
	var rows []int // rows whose logits are wanted, nil for all
	n := st.rows
	switch b.Logits {
	case backend.NoLogits:
		return
	case backend.LastLogits:
		rows, n = st.last, len(st.last)
	}
	out := b.Out
	if b.OutRows != nil {
		if rows == nil || len(b.OutRows) < n {
			st.fail(fmt.Errorf("cpu: %d logits rows for %d sequences (LastLogits only)", len(b.OutRows), n))
			return
		}
		for k, r := range b.OutRows[:n] {
			if len(r) < V {
				st.fail(fmt.Errorf("cpu: logits row %d of %d for a vocabulary of %d", k, len(r), V))
				return
			}
		}
		out = grow(&st.logits, n*V)
		if n == 1 {
			out = b.OutRows[0][:V] // written in place
		}
	}
	if len(out) < n*V {
		st.fail(fmt.Errorf("cpu: logits buffer of %d for %d rows of %d", len(out), n, V))
		return
	}
	xb := grow(&st.xb, n*H)
	if rows == nil {
		norm(xb, st.x[:n*H], &w.Norm)
	} else {
		for i, r := range rows {
			kernels.RMSNorm(xb[i*H:(i+1)*H], st.x[r*H:(r+1)*H], vecOf(w.Norm.W), w.Norm.Eps, w.Norm.OnePlus)
		}
	}
	st.see(xb, n, H, w.W)
	st.dev.pool.MatMul(head.Mat, xb, n, out[:n*V])
	if b.OutRows != nil && n > 1 {
		for k, r := range b.OutRows[:n] {
			copy(r[:V], out[k*V:(k+1)*V])
		}
	}
}
