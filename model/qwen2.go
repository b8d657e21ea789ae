package model

import (
	"fmt"

	"github.com/cortiq/cortiq/cmf"
)

// Qwen2 and Qwen2.5 (Qwen2ForCausalLM, architectures.md §3) differ from
// Llama in one place: q_proj, k_proj and v_proj always carry a bias (hard
// coded in transformers, no config flag); o_proj and the MLP do not.
// head_dim is hidden_size/num_attention_heads. Sliding-window layers
// (use_sliding_window) are refused by the shared decoder; released
// checkpoints do not use them.
func init() {
	register(family{name: "qwen2", features: func(a *cmf.Arch) (features, error) {
		if !a.AttentionBias || a.AttentionOutBias || a.MLPBias || a.QKNorm {
			return features{}, fmt.Errorf("qwen2 has q/k/v biases only (header: attention_bias %v, attention_out_bias %v, mlp_bias %v, qk_norm %v)",
				a.AttentionBias, a.AttentionOutBias, a.MLPBias, a.QKNorm)
		}
		return features{qkvBias: true}, nil
	}})
}
