package model

import (
	"fmt"

	"github.com/cortiq/cortiq/cmf"
)

// Qwen3 dense (Qwen3ForCausalLM, architectures.md §4) adds to Llama an
// RMSNorm over head_dim on every query and key head (q_norm, k_norm: one
// [head_dim] weight shared by all heads, applied before RoPE, so the cache
// holds normed keys), and takes head_dim from the config, independent of
// hidden_size (Qwen3-0.6B: 16 heads × 128 = 2048 ≠ 1024). No biases unless
// attention_bias; small checkpoints tie the head.
func init() {
	register(family{name: "qwen3", features: func(a *cmf.Arch) (features, error) {
		if !a.QKNorm {
			return features{}, fmt.Errorf("qwen3 normalises q and k, but the header does not set qk_norm")
		}
		return features{qkvBias: a.AttentionBias, outBias: a.AttentionOutBias, qkNorm: true}, nil
	}})
}
