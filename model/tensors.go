// Package model holds the architectures cortiq runs: for each, the tensors
// it needs (name and shape) and its forward pass.
package model

import (
	"fmt"
	"slices"

	"github.com/cortiq/cortiq/cmf"
)

// Supported lists the architecture names cortiq can convert and run.
var Supported = []string{"llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe"}

// CheckSupported returns an error naming the architecture and listing the
// supported ones when arch is not among them.
func CheckSupported(arch string) error {
	if slices.Contains(Supported, arch) {
		return nil
	}
	return fmt.Errorf("model: architecture %q is not supported (supported: %v)", arch, Supported)
}

// TensorShape is a tensor an architecture expects.
type TensorShape struct {
	Name  string
	Shape []int
}

// IsMoELayer reports whether layer l has a sparse MoE FFN.
func IsMoELayer(a *cmf.Arch, l int) bool {
	m := a.MoE
	if m == nil || m.NumExperts == 0 || slices.Contains(m.MLPOnlyLayers, l) {
		return false
	}
	step := max(m.DecoderSparseStep, 1)
	return (l+1)%step == 0
}

// LayerType returns the mixer type of layer l (full_attention when unset).
func LayerType(a *cmf.Arch, l int) string {
	if l < len(a.LayerTypes) {
		return a.LayerTypes[l]
	}
	return "full_attention"
}

// Tensors returns every tensor of the main network (MTP excluded) with its
// shape, in the order a converter writes them.
func Tensors(a *cmf.Arch) ([]TensorShape, error) {
	if err := CheckSupported(a.ArchName); err != nil {
		return nil, err
	}
	H, V := a.HiddenSize, a.VocabSize
	var ts []TensorShape
	add := func(name string, shape ...int) { ts = append(ts, TensorShape{name, shape}) }
	add("model.embed_tokens.weight", V, H)
	for l := 0; l < a.NumLayers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		if err := layerTensors(a, p, l, add); err != nil {
			return nil, err
		}
	}
	add("model.norm.weight", H)
	if !a.TieWordEmbeddings {
		add("lm_head.weight", V, H)
	}
	return ts, nil
}

// MTPTensors returns the tensors of the multi-token-prediction head.
func MTPTensors(a *cmf.Arch) []TensorShape {
	if a.MTP == nil || a.MTP.NumLayers == 0 {
		return nil
	}
	H := a.HiddenSize
	var ts []TensorShape
	add := func(name string, shape ...int) { ts = append(ts, TensorShape{name, shape}) }
	add("mtp.fc.weight", H, 2*H)
	add("mtp.pre_fc_norm_embedding.weight", H)
	add("mtp.pre_fc_norm_hidden.weight", H)
	add("mtp.norm.weight", H)
	for l := 0; l < a.MTP.NumLayers; l++ {
		p := fmt.Sprintf("mtp.layers.%d.", l)
		ac := *a
		ac.LayerTypes = nil // MTP layers are full-attention layers
		_ = layerTensors(&ac, p, -1, add)
	}
	return ts
}

func layerTensors(a *cmf.Arch, p string, l int, add func(string, ...int)) error {
	H, hd := a.HiddenSize, a.HeadDim
	add(p+"input_layernorm.weight", H)
	switch lt := LayerType(a, max(l, 0)); {
	case l < 0 || lt == "full_attention" || lt == "sliding_attention":
		qrows := a.NumAttentionHeads * hd
		if a.AttnOutputGate {
			qrows *= 2
		}
		kv := a.NumKVHeads * hd
		add(p+"self_attn.q_proj.weight", qrows, H)
		add(p+"self_attn.k_proj.weight", kv, H)
		add(p+"self_attn.v_proj.weight", kv, H)
		add(p+"self_attn.o_proj.weight", H, a.NumAttentionHeads*hd)
		if a.AttentionBias {
			add(p+"self_attn.q_proj.bias", qrows)
			add(p+"self_attn.k_proj.bias", kv)
			add(p+"self_attn.v_proj.bias", kv)
		}
		if a.AttentionOutBias {
			add(p+"self_attn.o_proj.bias", H)
		}
		if a.QKNorm {
			add(p+"self_attn.q_norm.weight", hd)
			add(p+"self_attn.k_norm.weight", hd)
		}
	case lt == "linear_attention":
		if a.LinearCore == nil {
			return fmt.Errorf("model: layer %d is linear_attention but arch has no linear_core", l)
		}
		nk, nv, dk, dv := a.LinearNumKeyHeads, a.LinearNumValueHeads, a.LinearKeyHeadDim, a.LinearValueHeadDim
		kd, vd := nk*dk, nv*dv
		switch a.LinearCore.Projection {
		case "qkvz_grouped":
			add(p+"linear_attn.in_proj_qkvz.weight", 2*kd+2*vd, H)
			add(p+"linear_attn.in_proj_ba.weight", 2*nv, H)
		case "split":
			add(p+"linear_attn.in_proj_qkv.weight", 2*kd+vd, H)
			add(p+"linear_attn.in_proj_z.weight", vd, H)
			add(p+"linear_attn.in_proj_b.weight", nv, H)
			add(p+"linear_attn.in_proj_a.weight", nv, H)
		default:
			return fmt.Errorf("model: unknown linear_core projection %q", a.LinearCore.Projection)
		}
		add(p+"linear_attn.conv1d.weight", 2*kd+vd, 1, a.LinearConvKernelDim)
		add(p+"linear_attn.A_log", nv)
		add(p+"linear_attn.dt_bias", nv)
		add(p+"linear_attn.norm.weight", dv)
		add(p+"linear_attn.out_proj.weight", H, vd)
	default:
		return fmt.Errorf("model: layer %d has unknown type %q", l, lt)
	}
	add(p+"post_attention_layernorm.weight", H)
	if (l >= 0 && IsMoELayer(a, l)) || (l < 0 && a.MoE != nil) {
		m := a.MoE
		add(p+"mlp.gate.weight", m.NumExperts, H)
		for e := 0; e < m.NumExperts; e++ {
			q := fmt.Sprintf("%smlp.experts.%d.", p, e)
			add(q+"gate_proj.weight", m.MoEIntermediateSize, H)
			add(q+"up_proj.weight", m.MoEIntermediateSize, H)
			add(q+"down_proj.weight", H, m.MoEIntermediateSize)
		}
		if s := m.SharedExpertIntermediateSize; s > 0 {
			add(p+"mlp.shared_expert.gate_proj.weight", s, H)
			add(p+"mlp.shared_expert.up_proj.weight", s, H)
			add(p+"mlp.shared_expert.down_proj.weight", H, s)
			add(p+"mlp.shared_expert_gate.weight", 1, H)
		}
		return nil
	}
	I := a.IntermediateSize
	add(p+"mlp.gate_proj.weight", I, H)
	add(p+"mlp.up_proj.weight", I, H)
	add(p+"mlp.down_proj.weight", H, I)
	if a.MLPBias {
		add(p+"mlp.gate_proj.bias", I)
		add(p+"mlp.up_proj.bias", I)
		add(p+"mlp.down_proj.bias", H)
	}
	return nil
}
