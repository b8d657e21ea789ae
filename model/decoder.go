package model

import (
	"fmt"
	"math"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/kernels"
)

// The Llama-lineage decoder shared by llama, qwen2 and qwen3
// (architectures.md §1): pre-norm blocks of GQA attention with RoPE and a
// SwiGLU MLP, a final RMSNorm and the output head. The family files say
// which optional parts (biases, q/k norm) a checkpoint has.

// config holds the dimensions of the network.
type config struct {
	dim     int // hidden size H
	hidden  int // MLP width I
	layers  int
	heads   int // query heads nh
	kvHeads int // key/value heads nkv (nh is a multiple)
	headDim int // hd
	vocab   int
	eps     float32
	onePlus bool // RMSNorm weights are zero-centred: (1+w)·x̂
	tied    bool // the output head is the token embedding
	features
}

func newConfig(a *cmf.Arch, f features) (config, error) {
	c := config{
		dim: a.HiddenSize, hidden: a.IntermediateSize, layers: a.NumLayers, heads: a.NumAttentionHeads,
		kvHeads: a.NumKVHeads, headDim: a.HeadDim, vocab: a.VocabSize, eps: float32(a.RMSNormEps),
		onePlus: a.NormStyle == "one_plus", tied: a.TieWordEmbeddings, features: f,
	}
	switch {
	case c.dim <= 0 || c.hidden <= 0 || c.layers <= 0 || c.vocab <= 0:
		return c, fmt.Errorf("hidden_size %d, intermediate_size %d, num_layers %d, vocab_size %d must all be positive", c.dim, c.hidden, c.layers, c.vocab)
	case c.heads <= 0 || c.kvHeads <= 0 || c.headDim <= 0 || c.heads%c.kvHeads != 0:
		return c, fmt.Errorf("%d attention heads, %d kv heads, head_dim %d: need positive counts, heads a multiple of kv heads", c.heads, c.kvHeads, c.headDim)
	case a.HiddenAct != "" && a.HiddenAct != "silu":
		return c, fmt.Errorf("hidden_act %q is not supported (silu)", a.HiddenAct)
	case a.MoE != nil:
		return c, fmt.Errorf("mixture-of-experts layers are not runnable on CPU yet")
	case a.AttnOutputGate:
		return c, fmt.Errorf("gated attention output is not runnable on CPU yet")
	case !(c.eps >= 0):
		return c, fmt.Errorf("rms_norm_eps %g", a.RMSNormEps)
	}
	for l := range c.layers {
		if lt := LayerType(a, l); lt != "full_attention" {
			return c, fmt.Errorf("layer %d is %s; the CPU decoder runs full attention only", l, lt)
		}
	}
	return c, nil
}

// weights are views into the CMF mapping (matrices) and small decoded
// vectors (norms, biases).
type weights struct {
	embed  *kernels.Mat // (vocab, dim)
	layers []layer
	norm   []float32    // (dim)
	head   *kernels.Mat // (vocab, dim); embed when tied
}

type layer struct {
	attnNorm     []float32    // (dim)
	wq           *kernels.Mat // (heads*headDim, dim)
	wk, wv       *kernels.Mat // (kvHeads*headDim, dim)
	wo           *kernels.Mat // (dim, heads*headDim)
	bq, bk, bv   []float32    // optional (qkvBias)
	bo           []float32    // optional (outBias)
	qNorm, kNorm []float32    // (headDim), optional (qkNorm)
	ffnNorm      []float32    // (dim)
	wGate, wUp   *kernels.Mat // (hidden, dim)
	wDown        *kernels.Mat // (dim, hidden)
	bGate, bUp   []float32    // optional (mlpBias)
	bDown        []float32
}

func loadWeights(ld *loader, c *config) weights {
	H, I, hd := c.dim, c.hidden, c.headDim
	qd, kvd := c.heads*hd, c.kvHeads*hd
	w := weights{embed: ld.mat("model.embed_tokens.weight", c.vocab, H), layers: make([]layer, c.layers)}
	for l := range w.layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		ly := &w.layers[l]
		ly.attnNorm = ld.vec(p+"input_layernorm.weight", H)
		ly.wq = ld.mat(p+"self_attn.q_proj.weight", qd, H)
		ly.wk = ld.mat(p+"self_attn.k_proj.weight", kvd, H)
		ly.wv = ld.mat(p+"self_attn.v_proj.weight", kvd, H)
		ly.wo = ld.mat(p+"self_attn.o_proj.weight", H, qd)
		if c.qkvBias {
			ly.bq = ld.vec(p+"self_attn.q_proj.bias", qd)
			ly.bk = ld.vec(p+"self_attn.k_proj.bias", kvd)
			ly.bv = ld.vec(p+"self_attn.v_proj.bias", kvd)
		}
		if c.outBias {
			ly.bo = ld.vec(p+"self_attn.o_proj.bias", H)
		}
		if c.qkNorm {
			ly.qNorm = ld.vec(p+"self_attn.q_norm.weight", hd)
			ly.kNorm = ld.vec(p+"self_attn.k_norm.weight", hd)
		}
		ly.ffnNorm = ld.vec(p+"post_attention_layernorm.weight", H)
		ly.wGate = ld.mat(p+"mlp.gate_proj.weight", I, H)
		ly.wUp = ld.mat(p+"mlp.up_proj.weight", I, H)
		ly.wDown = ld.mat(p+"mlp.down_proj.weight", H, I)
		if c.mlpBias {
			ly.bGate = ld.vec(p+"mlp.gate_proj.bias", I)
			ly.bUp = ld.vec(p+"mlp.up_proj.bias", I)
			ly.bDown = ld.vec(p+"mlp.down_proj.bias", H)
		}
	}
	w.norm = ld.vec("model.norm.weight", H)
	if c.tied {
		w.head = w.embed
	} else {
		w.head = ld.mat("lm_head.weight", c.vocab, H)
	}
	return w
}

// Observer sees the input of every linear layer during Forward, for
// calibration: Observe gets the weight's tensor name and the rows×cols
// row-major inputs (one row per position) that the weight multiplies. x is
// the model's own buffer, valid only during the call. Weights that share an
// input (q/k/v, gate/up) are each called with it. The output head is
// observed on the positions whose logits Forward computes.
type Observer interface {
	Observe(weight string, x []float32, rows, cols int)
}

// observer is an installed Observer with the weight names it reports.
type observer struct {
	o      Observer
	layers []layerNames
	head   string
}

// layerNames are one layer's weight names, by input.
type layerNames struct{ q, k, v, o, gate, up, down string }

// SetObserver installs o, called from the goroutine that runs Forward (so
// concurrently when several caches run at once); nil removes it. Not to be
// called during a Forward.
func (m *Model) SetObserver(o Observer) {
	if o == nil {
		m.obs = nil
		return
	}
	ob := &observer{o: o, layers: make([]layerNames, m.cfg.layers), head: "lm_head.weight"}
	if m.cfg.tied {
		ob.head = "model.embed_tokens.weight"
	}
	for l := range ob.layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		ob.layers[l] = layerNames{
			q: p + "self_attn.q_proj.weight", k: p + "self_attn.k_proj.weight", v: p + "self_attn.v_proj.weight",
			o: p + "self_attn.o_proj.weight", gate: p + "mlp.gate_proj.weight", up: p + "mlp.up_proj.weight",
			down: p + "mlp.down_proj.weight",
		}
	}
	m.obs = ob
}

// see reports x (rows×cols) as the input of each named weight.
func (ob *observer) see(x []float32, rows, cols int, names ...string) {
	for _, n := range names {
		ob.o.Observe(n, x, rows, cols)
	}
}

// Forward runs tokens at positions pos, pos+1, … through the network,
// appending their keys and values to the cache, which must hold exactly
// pos tokens. It returns the logits selected by want: LastLogits returns
// the cache's own buffer, valid until the next Forward on that cache;
// AllLogits returns a new [len(tokens)×vocab] slice. A prompt that does
// not fit the cache's context is an error, never truncated.
func (m *Model) Forward(c *Cache, tokens []int, pos int, want Logits) ([]float32, error) {
	if c.m != m {
		return nil, fmt.Errorf("model: the cache belongs to another model")
	}
	if pos != c.n {
		return nil, fmt.Errorf("model: forward at position %d but the cache holds %d tokens (Truncate it first)", pos, c.n)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("model: no tokens")
	}
	if pos+len(tokens) > c.ctx {
		return nil, fmt.Errorf("model: %d tokens at position %d exceed the context of %d tokens", len(tokens), pos, c.ctx)
	}
	V := m.cfg.vocab
	for i, t := range tokens {
		if t < 0 || t >= V {
			return nil, fmt.Errorf("model: token %d at index %d is outside the vocabulary of %d", t, i, V)
		}
	}
	rs := &c.rs
	// RoPE frequencies for this call: only dynamic scaling depends on the
	// call's last position, as in transformers.
	inv, scale := m.rope.Freqs(pos+len(tokens), rs.invFreq)
	var all []float32
	if want == AllLogits {
		all = make([]float32, len(tokens)*V)
	}
	H := m.cfg.dim
	for s := 0; s < len(tokens); s += m.batch {
		chunk := tokens[s:min(s+m.batch, len(tokens))]
		T := len(chunk)
		if m.hy != nil {
			m.hybridStep(c, chunk, pos+s, inv, scale)
		} else {
			m.step(c, chunk, pos+s, inv, scale)
		}
		switch {
		case want == AllLogits:
			for t := range T {
				kernels.RMSNorm(rs.xb[t*H:(t+1)*H], rs.x[t*H:(t+1)*H], m.w.norm, m.cfg.eps, m.cfg.onePlus)
			}
			if m.obs != nil {
				m.obs.see(rs.xb[:T*H], T, H, m.obs.head)
			}
			m.pool.MatMul(m.w.head, rs.xb, T, all[s*V:(s+T)*V])
		case want == LastLogits && s+T == len(tokens):
			kernels.RMSNorm(rs.xb[:H], rs.x[(T-1)*H:T*H], m.w.norm, m.cfg.eps, m.cfg.onePlus)
			if m.obs != nil {
				m.obs.see(rs.xb[:H], 1, H, m.obs.head)
			}
			m.pool.MatVec(m.w.head, rs.xb[:H], rs.logits)
		}
	}
	switch want {
	case AllLogits:
		return all, nil
	case LastLogits:
		return rs.logits, nil
	}
	return nil, nil
}

// step runs T ≤ batch tokens at positions p0.. through every layer,
// leaving the final hidden states (before the last norm) in rs.x.
func (m *Model) step(c *Cache, toks []int, p0 int, inv []float32, ropeScale float32) {
	cfg, rs, pool := &m.cfg, &c.rs, m.pool
	T, H, I, hd := len(toks), cfg.dim, cfg.hidden, cfg.headDim
	qd, kvd := cfg.heads*hd, cfg.kvHeads*hd
	h2 := m.rope.Dim() / 2
	x, xb, xb2 := rs.x[:T*H], rs.xb[:T*H], rs.xb2[:T*H]
	q, k, v, att := rs.q[:T*qd], rs.k[:T*kvd], rs.v[:T*kvd], rs.att[:T*qd]
	hb, hb2 := rs.hb[:T*I], rs.hb2[:T*I]

	// x = embed_tokens[ids]; cos/sin for each position.
	for t, tok := range toks {
		m.w.embed.Row(tok, x[t*H:(t+1)*H])
		kernels.CosSin(inv, ropeScale, p0+t, rs.cos[t*h2:(t+1)*h2], rs.sin[t*h2:(t+1)*h2])
	}
	for l := range m.w.layers {
		ly := &m.w.layers[l]
		// xb = input_layernorm(x)
		for t := range T {
			kernels.RMSNorm(xb[t*H:(t+1)*H], x[t*H:(t+1)*H], ly.attnNorm, cfg.eps, cfg.onePlus)
		}
		var names *layerNames
		if m.obs != nil {
			names = &m.obs.layers[l]
			m.obs.see(xb, T, H, names.q, names.k, names.v)
		}
		// q, k, v = q_proj(xb), k_proj(xb), v_proj(xb)
		pool.MatMul(ly.wq, xb, T, q)
		pool.MatMul(ly.wk, xb, T, k)
		pool.MatMul(ly.wv, xb, T, v)
		addBias(q, ly.bq)
		addBias(k, ly.bk)
		addBias(v, ly.bv)
		for t := range T {
			cos, sin := rs.cos[t*h2:(t+1)*h2], rs.sin[t*h2:(t+1)*h2]
			// q = rope(q_norm(q)) per head; k likewise.
			for h := range cfg.heads {
				qh := q[t*qd+h*hd : t*qd+(h+1)*hd]
				if cfg.qkNorm {
					kernels.RMSNorm(qh, qh, ly.qNorm, cfg.eps, cfg.onePlus)
				}
				kernels.ApplyRope(qh, cos, sin)
			}
			for h := range cfg.kvHeads {
				kh := k[t*kvd+h*hd : t*kvd+(h+1)*hd]
				if cfg.qkNorm {
					kernels.RMSNorm(kh, kh, ly.kNorm, cfg.eps, cfg.onePlus)
				}
				kernels.ApplyRope(kh, cos, sin)
				// Cache K (after norm and RoPE) and V at position p0+t.
				copy(c.kv(l, h, p0+t, false), kh)
				copy(c.kv(l, h, p0+t, true), v[t*kvd+h*hd:t*kvd+(h+1)*hd])
			}
		}
		// att = softmax(q·Kᵀ/√hd + causal mask)·V, per query head.
		rs.attn = attnTask{m: m, c: c, l: l, p0: p0, q: q, out: att}
		pool.For(T*cfg.heads, T*cfg.heads*(p0+T)*hd*2, &rs.attn)
		rs.attn = attnTask{}
		// x = x + o_proj(att)
		if names != nil {
			m.obs.see(att, T, qd, names.o)
		}
		pool.MatMul(ly.wo, att, T, xb2)
		addBias(xb2, ly.bo)
		kernels.Add(x, xb2)
		// xb = post_attention_layernorm(x)
		for t := range T {
			kernels.RMSNorm(xb[t*H:(t+1)*H], x[t*H:(t+1)*H], ly.ffnNorm, cfg.eps, cfg.onePlus)
		}
		// x = x + down_proj(silu(gate_proj(xb)) * up_proj(xb))
		if names != nil {
			m.obs.see(xb, T, H, names.gate, names.up)
		}
		pool.MatMul(ly.wGate, xb, T, hb)
		pool.MatMul(ly.wUp, xb, T, hb2)
		addBias(hb, ly.bGate)
		addBias(hb2, ly.bUp)
		kernels.SiLUMul(hb, hb2)
		if names != nil {
			m.obs.see(hb, T, I, names.down)
		}
		pool.MatMul(ly.wDown, hb, T, xb2)
		addBias(xb2, ly.bDown)
		kernels.Add(x, xb2)
	}
	c.n = p0 + T
}

// addBias adds b to every row of y (rows of len(b)); nil b is no bias.
func addBias(y, b []float32) {
	if b == nil {
		return
	}
	for i := 0; i < len(y); i += len(b) {
		kernels.Add(y[i:i+len(b)], b)
	}
}

// attnTask computes causal GQA attention for T·heads (position, head)
// pairs of one layer, reading K and V from the cache.
type attnTask struct {
	m   *Model
	c   *Cache
	l   int
	p0  int
	q   []float32 // (T, heads*headDim)
	out []float32 // (T, heads*headDim)
}

func (a *attnTask) Run(lo, hi, worker int) {
	cfg := &a.m.cfg
	hd, nh := cfg.headDim, cfg.heads
	group := nh / cfg.kvHeads // query heads per kv head
	scale := float32(1 / math.Sqrt(float64(hd)))
	scores := a.c.rs.scores[worker]
	for it := lo; it < hi; it++ {
		t, h := it/nh, it%nh
		kvh := h / group
		n := a.p0 + t + 1 // positions 0..p0+t are visible
		q := a.q[t*nh*hd+h*hd : t*nh*hd+(h+1)*hd]
		K, V := a.c.head(a.l, kvh, false), a.c.head(a.l, kvh, true)
		s := scores[:n]
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

// ForwardMulti runs one step for several sequences at once: tokens[i] are
// appended to caches[i] at its current length, and the logits of each
// sequence's last new position are returned (logits[i] is caches[i]'s own
// buffer, valid until its next Forward). Decode steps of many sequences (one
// token each) and prefill chunks mix freely; the caches must be distinct
// and belong to m. On error no cache has advanced past its state before
// the call, except that caches earlier in the list may have been filled.
func (m *Model) ForwardMulti(caches []*Cache, tokens [][]int) ([][]float32, error) {
	if len(caches) != len(tokens) {
		return nil, fmt.Errorf("model: %d caches but %d token lists", len(caches), len(tokens))
	}
	seen := make(map[*Cache]bool, len(caches))
	for i, c := range caches {
		if seen[c] {
			return nil, fmt.Errorf("model: cache %d appears twice in one step", i)
		}
		seen[c] = true
		if c.m != m {
			return nil, fmt.Errorf("model: cache %d belongs to another model", i)
		}
		if len(tokens[i]) == 0 {
			return nil, fmt.Errorf("model: sequence %d has no tokens", i)
		}
		if c.n+len(tokens[i]) > c.ctx {
			return nil, fmt.Errorf("model: sequence %d: %d tokens at position %d exceed the context of %d tokens", i, len(tokens[i]), c.n, c.ctx)
		}
	}
	out := make([][]float32, len(caches))
	for i, c := range caches {
		l, err := m.Forward(c, tokens[i], c.n, LastLogits)
		if err != nil {
			return nil, fmt.Errorf("model: sequence %d: %w", i, err)
		}
		out[i] = l
	}
	return out, nil
}
