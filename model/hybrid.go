package model

import (
	"errors"
	"fmt"
	"math"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/kernels"
	"github.com/cortiq/cortiq/quant"
)

// The MoE / hybrid decoder shared by qwen3_moe, qwen3_next, qwen3_5 and
// qwen3_5_moe (architectures.md §5–§9): the Llama-lineage skeleton of
// decoder.go where each layer's mixer is either (gated) full attention or a
// Gated DeltaNet, and each FFN either dense SwiGLU or a sparse MoE (with
// an optional shared expert). The family files say which parts a model
// has; the block-level operations (kernels.GDN, kernels.MoEForward) hold
// the math.

// hyLayer is one layer of a hybrid model: exactly one mixer (attention
// weights or gdn) and one FFN (dense weights or moe).
type hyLayer struct {
	attnNorm     []float32    // (dim)
	wq           *kernels.Mat // (heads*headDim, dim), or (2*heads*headDim, dim) when gated
	wk, wv       *kernels.Mat // (kvHeads*headDim, dim)
	wo           *kernels.Mat // (dim, heads*headDim)
	qNorm, kNorm []float32    // (headDim)
	gated        bool         // q_proj rows per head are [q_j ; gate_j]; o *= σ(gate)
	gdn          *kernels.GDN // linear_attention layers
	ffnNorm      []float32    // (dim)
	moe          *kernels.MoE
	wGate, wUp   *kernels.Mat // dense FFN (hidden, dim)
	wDown        *kernels.Mat
}

// hybridRun is a cache's scratch for hybridStep, grown on first use.
type hybridRun struct {
	qg, gate []float32 // (batch, 2*qd), (batch, qd)
	gdn      kernels.GDNScratch
	moe      kernels.MoEScratch
}

// ErrNotRewindable is returned by Truncate on a hybrid model's cache when
// the recurrent state cannot be rolled back to the requested length.
var ErrNotRewindable = errors.New("model: a linear-attention state cannot be rolled back")

// newHybridConfig validates a hybrid header; the shared fields go through
// newConfig's checks.
func newHybridConfig(a *cmf.Arch, f features) (config, error) {
	b := *a
	b.MoE, b.AttnOutputGate, b.LayerTypes = nil, false, nil
	if b.IntermediateSize <= 0 {
		b.IntermediateSize = 1 // every layer is MoE: no dense width
	}
	c, err := newConfig(&b, f)
	c.hidden = max(a.IntermediateSize, 0)
	if err != nil {
		return c, err
	}
	for l := range c.layers {
		switch lt := LayerType(a, l); lt {
		case "full_attention":
		case "linear_attention":
			if a.LinearCore == nil || a.LinearCore.Kind != "gated_deltanet" {
				return c, fmt.Errorf("layer %d is linear_attention without a gated_deltanet linear_core", l)
			}
		default:
			return c, fmt.Errorf("layer %d is %s; the CPU decoder runs full and linear attention", l, lt)
		}
		if !IsMoELayer(a, l) && a.IntermediateSize <= 0 {
			return c, fmt.Errorf("layer %d has a dense FFN but intermediate_size is %d", l, a.IntermediateSize)
		}
	}
	if m := a.MoE; m != nil && (m.NumExperts <= 0 || m.NumExpertsPerTok <= 0 || m.NumExpertsPerTok > m.NumExperts || m.MoEIntermediateSize <= 0) {
		return c, fmt.Errorf("moe: %d experts, top %d, width %d", m.NumExperts, m.NumExpertsPerTok, m.MoEIntermediateSize)
	}
	return c, nil
}

// arr decodes a float tensor of the given shape (conv weights) to float32.
func (ld *loader) arr(name string, shape ...int) []float32 {
	t, data := ld.tensor(name, shape...)
	if t == nil {
		return nil
	}
	switch t.DType {
	case quant.F32, quant.F16, quant.BF16:
	default:
		ld.fail(fmt.Errorf("tensor %q is %s; it must be f32, f16 or bf16", name, t.DType))
		return nil
	}
	v, err := quant.Decode(t.DType, data, t.Shape)
	if err != nil {
		ld.fail(fmt.Errorf("tensor %q: %w", name, err))
	}
	return v
}

// loadHybrid views the weights of a hybrid model (canonical CMF names,
// per-expert MoE tensors, architectures.md §5–§8).
func loadHybrid(ld *loader, c *config, a *cmf.Arch) (weights, []hyLayer) {
	H, hd := c.dim, c.headDim
	qd, kvd := c.heads*hd, c.kvHeads*hd
	w := weights{embed: ld.mat("model.embed_tokens.weight", c.vocab, H)}
	hy := make([]hyLayer, c.layers)
	for l := range hy {
		p := fmt.Sprintf("model.layers.%d.", l)
		ly := &hy[l]
		ly.attnNorm = ld.vec(p+"input_layernorm.weight", H)
		if LayerType(a, l) == "linear_attention" {
			ly.gdn = loadGDN(ld, p+"linear_attn.", c, a)
		} else {
			ly.gated = a.AttnOutputGate
			qrows := qd
			if ly.gated {
				qrows *= 2
			}
			ly.wq = ld.mat(p+"self_attn.q_proj.weight", qrows, H)
			ly.wk = ld.mat(p+"self_attn.k_proj.weight", kvd, H)
			ly.wv = ld.mat(p+"self_attn.v_proj.weight", kvd, H)
			ly.wo = ld.mat(p+"self_attn.o_proj.weight", H, qd)
			if c.qkNorm {
				ly.qNorm = ld.vec(p+"self_attn.q_norm.weight", hd)
				ly.kNorm = ld.vec(p+"self_attn.k_norm.weight", hd)
			}
		}
		ly.ffnNorm = ld.vec(p+"post_attention_layernorm.weight", H)
		if IsMoELayer(a, l) {
			ly.moe = loadMoE(ld, p+"mlp.", c, a.MoE)
		} else {
			ly.wGate = ld.mat(p+"mlp.gate_proj.weight", c.hidden, H)
			ly.wUp = ld.mat(p+"mlp.up_proj.weight", c.hidden, H)
			ly.wDown = ld.mat(p+"mlp.down_proj.weight", H, c.hidden)
		}
	}
	w.norm = ld.vec("model.norm.weight", H)
	if c.tied {
		w.head = w.embed
	} else {
		w.head = ld.mat("lm_head.weight", c.vocab, H)
	}
	return w, hy
}

func loadGDN(ld *loader, p string, c *config, a *cmf.Arch) *kernels.GDN {
	g := &kernels.GDN{
		Rule: kernels.DeltaRule{KeyHeads: a.LinearNumKeyHeads, ValueHeads: a.LinearNumValueHeads, KeyDim: a.LinearKeyHeadDim, ValueDim: a.LinearValueHeadDim},
		Conv: a.LinearConvKernelDim, Eps: c.eps,
	}
	if d := g.Rule; d.KeyHeads <= 0 || d.ValueHeads <= 0 || d.KeyDim <= 0 || d.ValueDim <= 0 || d.ValueHeads%d.KeyHeads != 0 || g.Conv < 1 {
		ld.fail(fmt.Errorf("%s: linear attention %d key heads × %d, %d value heads × %d, conv %d", p, d.KeyHeads, d.KeyDim, d.ValueHeads, d.ValueDim, g.Conv))
		return g
	}
	kd, vd, cd := g.Dims()
	nv, H := g.Rule.ValueHeads, c.dim
	if a.LinearCore.Projection == "qkvz_grouped" {
		g.QKVZ = ld.mat(p+"in_proj_qkvz.weight", 2*kd+2*vd, H)
		g.BA = ld.mat(p+"in_proj_ba.weight", 2*nv, H)
	} else {
		g.QKV = ld.mat(p+"in_proj_qkv.weight", 2*kd+vd, H)
		g.Z = ld.mat(p+"in_proj_z.weight", vd, H)
		g.B = ld.mat(p+"in_proj_b.weight", nv, H)
		g.A = ld.mat(p+"in_proj_a.weight", nv, H)
	}
	g.ConvW = ld.arr(p+"conv1d.weight", cd, 1, g.Conv)
	g.ALog = ld.vec(p+"A_log", nv)
	g.DtBias = ld.vec(p+"dt_bias", nv)
	g.Norm = ld.vec(p+"norm.weight", g.Rule.ValueDim)
	g.Out = ld.mat(p+"out_proj.weight", H, vd)
	if ld.err == nil {
		if err := g.Check(H); err != nil {
			ld.fail(fmt.Errorf("%s: %w", p, err))
		}
	}
	return g
}

func loadMoE(ld *loader, p string, c *config, mc *cmf.MoE) *kernels.MoE {
	H, I := c.dim, mc.MoEIntermediateSize
	m := &kernels.MoE{Router: ld.mat(p+"gate.weight", mc.NumExperts, H), TopK: mc.NumExpertsPerTok, Renorm: mc.NormTopKProb,
		Experts: make([]kernels.Expert, mc.NumExperts)}
	for e := range m.Experts {
		q := fmt.Sprintf("%sexperts.%d.", p, e)
		m.Experts[e] = kernels.Expert{Gate: ld.mat(q+"gate_proj.weight", I, H), Up: ld.mat(q+"up_proj.weight", I, H), Down: ld.mat(q+"down_proj.weight", H, I)}
	}
	if s := mc.SharedExpertIntermediateSize; s > 0 {
		m.Shared = &kernels.Expert{Gate: ld.mat(p+"shared_expert.gate_proj.weight", s, H), Up: ld.mat(p+"shared_expert.up_proj.weight", s, H),
			Down: ld.mat(p+"shared_expert.down_proj.weight", H, s)}
		m.SharedGate = ld.mat(p+"shared_expert_gate.weight", 1, H)
	}
	if ld.err == nil {
		if err := m.Check(H); err != nil {
			ld.fail(fmt.Errorf("%s: %w", p, err))
		}
	}
	return m
}

// hybridStep is step (decoder.go) for hybrid models: T ≤ batch tokens at
// positions p0.. through every layer, final hidden states in rs.x.
func (m *Model) hybridStep(c *Cache, toks []int, p0 int, inv []float32, ropeScale float32) {
	cfg, rs, pool, hr := &m.cfg, &c.rs, m.pool, c.hy
	T, H, I, hd := len(toks), cfg.dim, cfg.hidden, cfg.headDim
	qd, kvd := cfg.heads*hd, cfg.kvHeads*hd
	h2 := m.rope.Dim() / 2
	x, xb, xb2 := rs.x[:T*H], rs.xb[:T*H], rs.xb2[:T*H]
	q, k, v, att := rs.q[:T*qd], rs.k[:T*kvd], rs.v[:T*kvd], rs.att[:T*qd]

	// x = embed_tokens[ids]; cos/sin for each position.
	for t, tok := range toks {
		m.w.embed.Row(tok, x[t*H:(t+1)*H])
		kernels.CosSin(inv, ropeScale, p0+t, rs.cos[t*h2:(t+1)*h2], rs.sin[t*h2:(t+1)*h2])
	}
	for l := range m.hy {
		ly := &m.hy[l]
		// xb = input_layernorm(x)
		for t := range T {
			kernels.RMSNorm(xb[t*H:(t+1)*H], x[t*H:(t+1)*H], ly.attnNorm, cfg.eps, cfg.onePlus)
		}
		if ly.gdn != nil {
			// x = x + GatedDeltaNet(xb), advancing the layer's state.
			ly.gdn.Forward(pool, xb, T, H, x, &c.gdn[l], &hr.gdn)
		} else {
			m.hybridAttention(c, l, ly, T, p0, xb, q, k, v, att)
			// x = x + o_proj(att)
			pool.MatMul(ly.wo, att, T, xb2)
			kernels.Add(x, xb2)
		}
		// xb = post_attention_layernorm(x)
		for t := range T {
			kernels.RMSNorm(xb[t*H:(t+1)*H], x[t*H:(t+1)*H], ly.ffnNorm, cfg.eps, cfg.onePlus)
		}
		if ly.moe != nil {
			// x = x + Σ_top-k w_e·expert_e(xb) (+ σ(g·xb)·shared(xb))
			kernels.MoEForward(pool, ly.moe, xb, T, x, &hr.moe)
			continue
		}
		// x = x + down_proj(silu(gate_proj(xb)) * up_proj(xb))
		hb, hb2 := rs.hb[:T*I], rs.hb2[:T*I]
		pool.MatMul(ly.wGate, xb, T, hb)
		pool.MatMul(ly.wUp, xb, T, hb2)
		kernels.SiLUMul(hb, hb2)
		pool.MatMul(ly.wDown, hb, T, xb2)
		kernels.Add(x, xb2)
	}
	c.n = p0 + T
}

// hybridAttention computes layer l's attention output for T positions
// into att (T, qd): q/k norm (zero-centred on the hybrids), partial
// RoPE, the cache, causal GQA, and for gated layers the sigmoid output
// gate taken per head from q_proj's rows [q_j ; gate_j].
func (m *Model) hybridAttention(c *Cache, l int, ly *hyLayer, T, p0 int, xb, q, k, v, att []float32) {
	cfg, rs, pool, hr := &m.cfg, &c.rs, m.pool, c.hy
	hd, qd, kvd, h2 := cfg.headDim, cfg.heads*cfg.headDim, cfg.kvHeads*cfg.headDim, m.rope.Dim()/2
	var gate []float32
	if ly.gated {
		hr.qg, hr.gate = growF(hr.qg, T*2*qd), growF(hr.gate, T*qd)
		pool.MatMul(ly.wq, xb, T, hr.qg)
		gate = hr.gate
		for t := range T {
			for h := range cfg.heads {
				src := hr.qg[t*2*qd+h*2*hd:]
				copy(q[t*qd+h*hd:t*qd+(h+1)*hd], src[:hd])
				copy(gate[t*qd+h*hd:t*qd+(h+1)*hd], src[hd:2*hd])
			}
		}
	} else {
		pool.MatMul(ly.wq, xb, T, q)
	}
	pool.MatMul(ly.wk, xb, T, k)
	pool.MatMul(ly.wv, xb, T, v)
	for t := range T {
		cos, sin := rs.cos[t*h2:(t+1)*h2], rs.sin[t*h2:(t+1)*h2]
		for h := range cfg.heads {
			qh := q[t*qd+h*hd : t*qd+(h+1)*hd]
			if ly.qNorm != nil {
				kernels.RMSNorm(qh, qh, ly.qNorm, cfg.eps, cfg.onePlus)
			}
			kernels.ApplyRope(qh, cos, sin)
		}
		for h := range cfg.kvHeads {
			kh := k[t*kvd+h*hd : t*kvd+(h+1)*hd]
			if ly.kNorm != nil {
				kernels.RMSNorm(kh, kh, ly.kNorm, cfg.eps, cfg.onePlus)
			}
			kernels.ApplyRope(kh, cos, sin)
			copy(c.kv(l, h, p0+t, false), kh)
			copy(c.kv(l, h, p0+t, true), v[t*kvd+h*hd:t*kvd+(h+1)*hd])
		}
	}
	rs.attn = attnTask{m: m, c: c, l: l, p0: p0, q: q, out: att}
	pool.For(T*cfg.heads, T*cfg.heads*(p0+T)*hd*2, &rs.attn)
	rs.attn = attnTask{}
	for i, g := range gate {
		att[i] *= float32(1 / (1 + math.Exp(-float64(g))))
	}
}

func growF(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// hybridFamily registers a hybrid architecture whose header must carry
// the q/k norm (all four do).
func hybridFamily(name string, check func(a *cmf.Arch) error) family {
	return family{name: name, hybrid: true, features: func(a *cmf.Arch) (features, error) {
		if !a.QKNorm {
			return features{}, fmt.Errorf("%s normalises q and k, but the header does not set qk_norm", name)
		}
		if a.AttentionBias || a.AttentionOutBias || a.MLPBias {
			return features{}, fmt.Errorf("%s has no biases, but the header sets one", name)
		}
		if err := check(a); err != nil {
			return features{}, err
		}
		return features{qkNorm: true}, nil
	}}
}
