package model

import (
	"fmt"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/cmf"
)

// The MoE / hybrid decoder shared by qwen3_moe, qwen3_next, qwen3_5 and
// qwen3_5_moe (architectures.md §5–§9): the Llama-lineage skeleton of
// decoder.go where each layer's mixer is either (gated) full attention or a
// Gated DeltaNet, and each FFN either a dense SwiGLU or a sparse MoE (with
// an optional shared expert). The family files say which parts a model
// has.

// hyLayer is one layer: exactly one mixer (attn or gdn) and one FFN (mlp
// or moe).
type hyLayer struct {
	attn *backend.Attention
	gdn  *backend.DeltaNet
	mlp  *backend.MLP
	moe  *backend.MoE
}

// ErrNotRewindable is returned (wrapped) by Truncate on a hybrid model's
// cache when the linear-attention state cannot be rolled back to the
// requested length.
var ErrNotRewindable = backend.ErrNotRewindable

// hybridStep is one step of a hybrid model over a batch's rows:
//
//	x = embed_tokens[ids]
//	for each layer: x += attn(norm(x)) or deltanet(norm(x)); x += mlp(norm(x)) or moe(norm(x))
//	logits = lm_head(norm(x))
func (m *Model) hybridStep(ops backend.Ops) {
	ops.Embed(m.w.embed)
	for l := range m.hy {
		ly := &m.hy[l]
		if ly.gdn != nil {
			ops.DeltaNet(ly.gdn, l)
		} else {
			ops.Attention(ly.attn, l)
		}
		if ly.moe != nil {
			ops.MoE(ly.moe)
		} else {
			ops.MLP(ly.mlp)
		}
	}
	ops.Head(&m.w.head)
}

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
			d := deltaNetShape(a)
			if d.KeyHeads <= 0 || d.ValueHeads <= 0 || d.KeyDim <= 0 || d.ValueDim <= 0 || d.ValueHeads%d.KeyHeads != 0 || d.ConvKernel < 1 {
				return c, fmt.Errorf("linear attention: %d key heads × %d, %d value heads × %d, conv %d", d.KeyHeads, d.KeyDim, d.ValueHeads, d.ValueDim, d.ConvKernel)
			}
		default:
			return c, fmt.Errorf("layer %d is %s; the decoder runs full and linear attention", l, lt)
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

func deltaNetShape(a *cmf.Arch) backend.DeltaNetShape {
	return backend.DeltaNetShape{KeyHeads: a.LinearNumKeyHeads, ValueHeads: a.LinearNumValueHeads, KeyDim: a.LinearKeyHeadDim,
		ValueDim: a.LinearValueHeadDim, ConvKernel: a.LinearConvKernelDim}
}

// hybridSpec is the per-sequence state: K/V in the attention layers, a
// DeltaNet state in the linear-attention layers.
func hybridSpec(c *config, a *cmf.Arch) backend.SeqSpec {
	s := backend.SeqSpec{Layers: c.layers, KVHeads: c.kvHeads, HeadDim: c.headDim, DeltaNetShape: deltaNetShape(a)}
	if m := a.MoE; m != nil {
		s.MoE = backend.MoEShape{Experts: m.NumExperts, TopK: m.NumExpertsPerTok, Inter: m.MoEIntermediateSize, SharedInter: m.SharedExpertIntermediateSize}
	}
	for l := range c.layers {
		if LayerType(a, l) == "linear_attention" {
			s.DeltaNet = append(s.DeltaNet, l)
		} else {
			s.Attention = append(s.Attention, l)
		}
	}
	return s
}

// loadHybrid makes the weights of a hybrid model resident (canonical CMF
// names, per-expert MoE tensors; architectures.md §5–§8).
func loadHybrid(ld *loader, c *config, a *cmf.Arch, rope backend.Rope) (weights, []hyLayer) {
	H, hd := c.dim, c.headDim
	qd, kvd := c.heads*hd, c.kvHeads*hd
	norm := func(name string, n int) backend.Norm {
		return backend.Norm{W: ld.vec(name, n), Eps: c.eps, OnePlus: c.onePlus}
	}
	w := weights{embed: ld.mat("model.embed_tokens.weight", c.vocab, H)}
	hy := make([]hyLayer, c.layers)
	for l := range hy {
		p := fmt.Sprintf("model.layers.%d.", l)
		ly := &hy[l]
		inNorm := norm(p+"input_layernorm.weight", H)
		if LayerType(a, l) == "linear_attention" {
			ly.gdn = loadDeltaNet(ld, p+"linear_attn.", c, a)
			ly.gdn.Norm = inNorm
		} else {
			qrows := qd
			if a.AttnOutputGate {
				qrows *= 2 // per head [q_j ; gate_j]
			}
			ly.attn = &backend.Attention{
				Norm: inNorm,
				Q:    ld.mat(p+"self_attn.q_proj.weight", qrows, H),
				K:    ld.mat(p+"self_attn.k_proj.weight", kvd, H),
				V:    ld.mat(p+"self_attn.v_proj.weight", kvd, H),
				O:    ld.mat(p+"self_attn.o_proj.weight", H, qd),
				Rope: rope, Heads: c.heads, KVHeads: c.kvHeads, HeadDim: hd, Gated: a.AttnOutputGate,
			}
			if c.qkNorm {
				qn, kn := norm(p+"self_attn.q_norm.weight", hd), norm(p+"self_attn.k_norm.weight", hd)
				ly.attn.QNorm, ly.attn.KNorm = &qn, &kn
			}
		}
		postNorm := norm(p+"post_attention_layernorm.weight", H)
		if IsMoELayer(a, l) {
			ly.moe = loadMoE(ld, p+"mlp.", c, a.MoE)
			ly.moe.Norm = postNorm
		} else {
			ly.mlp = &backend.MLP{
				Norm: postNorm,
				Gate: ld.mat(p+"mlp.gate_proj.weight", c.hidden, H),
				Up:   ld.mat(p+"mlp.up_proj.weight", c.hidden, H),
				Down: ld.mat(p+"mlp.down_proj.weight", H, c.hidden),
			}
		}
	}
	w.head.Norm = norm("model.norm.weight", H)
	if c.tied {
		w.head.W = w.embed
	} else {
		w.head.W = ld.mat("lm_head.weight", c.vocab, H)
	}
	return w, hy
}

func loadDeltaNet(ld *loader, p string, c *config, a *cmf.Arch) *backend.DeltaNet {
	d := deltaNetShape(a)
	kd, vd, cd := d.Dims()
	nv, H := d.ValueHeads, c.dim
	g := &backend.DeltaNet{Shape: d}
	if a.LinearCore.Projection == "qkvz_grouped" {
		g.QKVZ = ld.mat(p+"in_proj_qkvz.weight", 2*kd+2*vd, H)
		g.BA = ld.mat(p+"in_proj_ba.weight", 2*nv, H)
	} else {
		g.QKV = ld.mat(p+"in_proj_qkv.weight", 2*kd+vd, H)
		g.Z = ld.mat(p+"in_proj_z.weight", vd, H)
		g.B = ld.mat(p+"in_proj_b.weight", nv, H)
		g.A = ld.mat(p+"in_proj_a.weight", nv, H)
	}
	g.Conv = ld.arr(p+"conv1d.weight", cd, 1, d.ConvKernel)
	g.ALog = ld.vec(p+"A_log", nv)
	g.DtBias = ld.vec(p+"dt_bias", nv)
	// The gated norm has standard (not zero-centred) weights.
	g.GateNorm = backend.Norm{W: ld.vec(p+"norm.weight", d.ValueDim), Eps: c.eps}
	g.Out = ld.mat(p+"out_proj.weight", H, vd)
	return g
}

func loadMoE(ld *loader, p string, c *config, mc *cmf.MoE) *backend.MoE {
	H, I := c.dim, mc.MoEIntermediateSize
	m := &backend.MoE{Router: ld.mat(p+"gate.weight", mc.NumExperts, H), TopK: mc.NumExpertsPerTok, Renorm: mc.NormTopKProb,
		Experts: make([]backend.Expert, mc.NumExperts)}
	for e := range m.Experts {
		q := fmt.Sprintf("%sexperts.%d.", p, e)
		m.Experts[e] = backend.Expert{Gate: ld.mat(q+"gate_proj.weight", I, H), Up: ld.mat(q+"up_proj.weight", I, H), Down: ld.mat(q+"down_proj.weight", H, I)}
	}
	if s := mc.SharedExpertIntermediateSize; s > 0 {
		m.Shared = &backend.Expert{Gate: ld.mat(p+"shared_expert.gate_proj.weight", s, H), Up: ld.mat(p+"shared_expert.up_proj.weight", s, H),
			Down: ld.mat(p+"shared_expert.down_proj.weight", H, s)}
		m.SharedGate = ld.mat(p+"shared_expert_gate.weight", 1, H)
	}
	return m
}

// hybridFamily registers a hybrid architecture whose header must carry
// the q/k norm (all four do) and no biases.
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
