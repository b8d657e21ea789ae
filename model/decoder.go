package model

import (
	"fmt"
	"github.com/cortiq/cortiq/sample"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/cmf"
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
			return c, fmt.Errorf("layer %d is %s; the decoder runs full attention only", l, lt)
		}
	}
	return c, nil
}

// widest is the widest activation row of a step, in floats.
func (c *config) widest() int {
	qkv := (c.heads + 2*c.kvHeads) * c.headDim
	return max(c.dim, qkv, 2*c.hidden, c.vocab)
}

// seqSpec is the per-sequence state of the network: a K/V cache in every
// layer.
func (c *config) seqSpec() backend.SeqSpec {
	s := backend.SeqSpec{Layers: c.layers, KVHeads: c.kvHeads, HeadDim: c.headDim}
	for l := range c.layers {
		s.Attention = append(s.Attention, l)
	}
	return s
}

// weights are the network's resident weights.
type weights struct {
	embed  backend.Mat // (vocab, dim)
	layers []layer
	head   backend.Head // final norm and (vocab, dim) projection; embed when tied
}

type layer struct {
	attn backend.Attention
	mlp  backend.MLP
}

func loadWeights(ld *loader, c *config, rope backend.Rope) weights {
	H, I, hd := c.dim, c.hidden, c.headDim
	qd, kvd := c.heads*hd, c.kvHeads*hd
	norm := func(name string, n int) backend.Norm {
		return backend.Norm{W: ld.vec(name, n), Eps: c.eps, OnePlus: c.onePlus}
	}
	w := weights{embed: ld.mat("model.embed_tokens.weight", c.vocab, H), layers: make([]layer, c.layers)}
	for l := range w.layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		a := &w.layers[l].attn
		*a = backend.Attention{
			Norm: norm(p+"input_layernorm.weight", H),
			Q:    ld.mat(p+"self_attn.q_proj.weight", qd, H),
			K:    ld.mat(p+"self_attn.k_proj.weight", kvd, H),
			V:    ld.mat(p+"self_attn.v_proj.weight", kvd, H),
			O:    ld.mat(p+"self_attn.o_proj.weight", H, qd),
			Rope: rope, Heads: c.heads, KVHeads: c.kvHeads, HeadDim: hd,
		}
		if c.qkvBias {
			a.BQ = ld.vec(p+"self_attn.q_proj.bias", qd)
			a.BK = ld.vec(p+"self_attn.k_proj.bias", kvd)
			a.BV = ld.vec(p+"self_attn.v_proj.bias", kvd)
		}
		if c.outBias {
			a.BO = ld.vec(p+"self_attn.o_proj.bias", H)
		}
		if c.qkNorm {
			qn, kn := norm(p+"self_attn.q_norm.weight", hd), norm(p+"self_attn.k_norm.weight", hd)
			a.QNorm, a.KNorm = &qn, &kn
		}
		m := &w.layers[l].mlp
		*m = backend.MLP{
			Norm: norm(p+"post_attention_layernorm.weight", H),
			Gate: ld.mat(p+"mlp.gate_proj.weight", I, H),
			Up:   ld.mat(p+"mlp.up_proj.weight", I, H),
			Down: ld.mat(p+"mlp.down_proj.weight", H, I),
		}
		if c.mlpBias {
			m.BGate = ld.vec(p+"mlp.gate_proj.bias", I)
			m.BUp = ld.vec(p+"mlp.up_proj.bias", I)
			m.BDown = ld.vec(p+"mlp.down_proj.bias", H)
		}
	}
	w.head.Norm = norm("model.norm.weight", H)
	if c.tied {
		w.head.W = w.embed
	} else {
		w.head.W = ld.mat("lm_head.weight", c.vocab, H)
	}
	return w
}

// decoderStep is one step of the Llama-lineage decoder over a batch's rows:
//
//	x = embed_tokens[ids]
//	for each layer: x += attn(input_layernorm(x)); x += mlp(post_attention_layernorm(x))
//	logits = lm_head(norm(x))
func (m *Model) decoderStep(ops backend.Ops) {
	ops.Embed(m.w.embed)
	for l := range m.w.layers {
		ops.Attention(&m.w.layers[l].attn, l)
		ops.MLP(&m.w.layers[l].mlp)
	}
	ops.Head(&m.w.head)
}

// Observer sees the input of every linear layer during Forward, for
// calibration: Observe gets the weight's tensor name and the rows×cols
// row-major inputs (one row per position) that the weight multiplies. x is
// the device's own buffer, valid only during the call. Weights that share
// an input (q/k/v, gate/up) are each called with it. The output head is
// observed on the positions whose logits Forward computes.
type Observer = backend.Observer

// SetObserver installs o, called from the goroutine that runs Forward (so
// concurrently when several caches run at once); nil removes it. Not to be
// called during a Forward. Devices that cannot observe return an error.
func (m *Model) SetObserver(o Observer) error {
	d, ok := m.dev.(backend.Observable)
	if !ok {
		return fmt.Errorf("model: device %s cannot observe layer inputs", m.dev.Name())
	}
	d.SetObserver(o)
	return nil
}

// Forward runs tokens at positions pos, pos+1, … through the network,
// appending their keys and values to the cache, which must hold exactly
// pos tokens. It returns the logits selected by want: LastLogits returns
// the cache's own buffer, valid until the next Forward on that cache;
// AllLogits returns a new [len(tokens)×vocab] slice. A prompt that does
// not fit the cache's context is an error, never truncated.
func (m *Model) Forward(c *Cache, tokens []int, pos int, want Logits) ([]float32, error) {
	return m.forward(c, tokens, pos, want, nil)
}

// ForwardGreedy is Forward of tokens followed by greedy selection of the
// next token (argmax of the last logits, ties to the lowest id, as
// sample.Greedy). On a device that picks it itself (backend.Argmaxer)
// only the id leaves the device; elsewhere the logits are reduced here.
func (m *Model) ForwardGreedy(c *Cache, tokens []int, pos int) (int, error) {
	if a, ok := m.dev.(backend.Argmaxer); ok && a.Argmaxes() {
		var next [1]int32
		if _, err := m.forward(c, tokens, pos, LastLogits, next[:]); err != nil {
			return 0, err
		}
		return int(next[0]), nil
	}
	logits, err := m.Forward(c, tokens, pos, LastLogits)
	if err != nil {
		return 0, err
	}
	id, err := sample.Greedy(logits)
	if err != nil {
		return 0, fmt.Errorf("model: %w", err)
	}
	return int(id), nil
}

func (m *Model) forward(c *Cache, tokens []int, pos int, want Logits, next []int32) ([]float32, error) {
	if c.m != m {
		return nil, fmt.Errorf("model: the cache belongs to another model")
	}
	if pos != c.Len() {
		return nil, fmt.Errorf("model: forward at position %d but the cache holds %d tokens (Truncate it first)", pos, c.Len())
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("model: no tokens")
	}
	if pos+len(tokens) > c.Cap() {
		return nil, fmt.Errorf("model: %d tokens at position %d exceed the context of %d tokens", len(tokens), pos, c.Cap())
	}
	if err := m.checkTokens(tokens); err != nil {
		return nil, err
	}
	V := m.cfg.vocab
	var all []float32
	if want == AllLogits {
		all = make([]float32, len(tokens)*V)
	}
	b := &c.b
	b.Seqs, b.Tokens, b.RopeLen, b.Step = c.seqs[:], c.toks[:], c.ropeLen[:], m.id
	// Dynamic RoPE frequencies depend on the call's last position, as in
	// transformers.
	c.ropeLen[0] = pos + len(tokens)
	for s := 0; s < len(tokens); s += m.batch {
		T := min(m.batch, len(tokens)-s)
		c.toks[0] = tokens[s : s+T]
		b.Logits, b.Out = backend.NoLogits, nil
		switch {
		case want == AllLogits:
			b.Logits, b.Out = backend.AllLogits, all[s*V:(s+T)*V]
		case want == LastLogits && s+T == len(tokens):
			b.Logits, b.Out = backend.LastLogits, c.logits
		}
		b.Next = nil
		if next != nil && b.Logits == backend.LastLogits {
			b.Out, b.Next = nil, next
		}
		if err := m.dev.Run(b, m.step); err != nil {
			return nil, fmt.Errorf("model: %w", err)
		}
	}
	c.toks[0] = nil
	b.Next = nil
	switch {
	case want == AllLogits:
		return all, nil
	case want == LastLogits && next == nil:
		return c.logits, nil
	}
	return nil, nil
}

func (m *Model) checkTokens(tokens []int) error {
	for i, t := range tokens {
		if t < 0 || t >= m.cfg.vocab {
			return fmt.Errorf("model: token %d at index %d is outside the vocabulary of %d", t, i, m.cfg.vocab)
		}
	}
	return nil
}

// ForwardMulti runs one step for several sequences at once: tokens[i] are
// appended to caches[i] at its current length, and the logits of each
// sequence's last new position are returned (logits[i] is caches[i]'s own
// buffer, valid until its next Forward). Decode steps of many sequences (one
// token each) and prefill chunks mix freely and run as one batch: each
// weight is read once for all rows. The caches must be distinct and belong
// to m; the caller bounds the rows of one step (they size the run state).
// On error no cache has advanced.
func (m *Model) ForwardMulti(caches []*Cache, tokens [][]int) ([][]float32, error) {
	b, err := m.multiBatch(caches, tokens)
	if err != nil {
		return nil, err
	}
	out := make([][]float32, len(caches))
	for i, c := range caches {
		out[i] = c.logits
	}
	b.OutRows = out // each sequence's logits straight into its cache's buffer
	if err := m.dev.Run(&b, m.step); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	return out, nil
}

// ForwardMultiNext runs ForwardMulti's step and writes each sequence's
// greedy next token to next[i] (argmax of its last logits, ties to the
// lowest id, as sample.Greedy). Logits come back only for the sequences
// with want[i] (want nil: none): logits[i] is then caches[i]'s buffer, as
// ForwardMulti's, and nil for the others. On a device that picks tokens
// itself (backend.Argmaxer) only the ids and the wanted rows leave the
// device; elsewhere every row's logits are reduced here. A failed step
// advances no cache; a NaN logit found here (sample.Greedy's error, as
// ForwardGreedy's) is reported after the step, the caches advanced.
func (m *Model) ForwardMultiNext(caches []*Cache, tokens [][]int, want []bool, next []int) ([][]float32, error) {
	if len(next) != len(caches) || (want != nil && len(want) != len(caches)) {
		return nil, fmt.Errorf("model: %d caches, %d ids, %d logits flags", len(caches), len(next), len(want))
	}
	b, err := m.multiBatch(caches, tokens)
	if err != nil {
		return nil, err
	}
	out := make([][]float32, len(caches))
	if a, ok := m.dev.(backend.Argmaxer); ok && a.Argmaxes() {
		ids := make([]int32, len(caches))
		for i, w := range want {
			if w {
				b.LogitsOf = append(b.LogitsOf, i)
				b.OutRows = append(b.OutRows, caches[i].logits)
			}
		}
		b.Next = ids
		if err := m.dev.Run(&b, m.step); err != nil {
			return nil, fmt.Errorf("model: %w", err)
		}
		for i, id := range ids {
			next[i] = int(id)
		}
		for _, i := range b.LogitsOf {
			out[i] = caches[i].logits
		}
		return out, nil
	}
	// Every row's logits to its cache's buffer, reduced here.
	b.OutRows = make([][]float32, len(caches))
	for i, c := range caches {
		b.OutRows[i] = c.logits
	}
	if err := m.dev.Run(&b, m.step); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	for i, c := range caches {
		id, err := sample.Greedy(c.logits)
		if err != nil {
			// The caches have advanced; the step's ids are unusable.
			return nil, fmt.Errorf("model: sequence %d: %w", i, err)
		}
		next[i] = int(id)
		if want != nil && want[i] {
			out[i] = c.logits
		}
	}
	return out, nil
}

// multiBatch checks a multi-sequence step and builds its batch.
func (m *Model) multiBatch(caches []*Cache, tokens [][]int) (backend.Batch, error) {
	if len(caches) != len(tokens) {
		return backend.Batch{}, fmt.Errorf("model: %d caches but %d token lists", len(caches), len(tokens))
	}
	b := backend.Batch{Seqs: make([]backend.Seq, len(caches)), Tokens: tokens, Logits: backend.LastLogits, Step: m.id}
	for i, c := range caches {
		for _, d := range caches[:i] {
			if d == c {
				return backend.Batch{}, fmt.Errorf("model: cache %d appears twice in one step", i)
			}
		}
		if c.m != m {
			return backend.Batch{}, fmt.Errorf("model: cache %d belongs to another model", i)
		}
		if len(tokens[i]) == 0 {
			return backend.Batch{}, fmt.Errorf("model: sequence %d has no tokens", i)
		}
		if c.Len()+len(tokens[i]) > c.Cap() {
			return backend.Batch{}, fmt.Errorf("model: sequence %d: %d tokens at position %d exceed the context of %d tokens", i, len(tokens[i]), c.Len(), c.Cap())
		}
		if err := m.checkTokens(tokens[i]); err != nil {
			return backend.Batch{}, fmt.Errorf("model: sequence %d: %w", i, err)
		}
		b.Seqs[i] = c.seq
	}
	return b, nil
}
