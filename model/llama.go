package model

import (
	"fmt"

	"github.com/cortiq/cortiq/cmf"
)

// Llama (LlamaForCausalLM, architectures.md §2) is the decoder of
// decoder.go as it stands: RMSNorm, GQA attention with RoPE (any scaling
// type; Llama 3.1/3.2 use llama3), SwiGLU MLP. Optional: attention_bias
// (bias on q, k, v and o), mlp_bias (bias on gate, up, down), a tied head
// (Llama 3.2 1B/3B). No q/k norm.
func init() {
	register(family{name: "llama", features: func(a *cmf.Arch) (features, error) {
		if a.QKNorm {
			return features{}, fmt.Errorf("llama has no q/k norm, but the header sets qk_norm")
		}
		return features{qkvBias: a.AttentionBias, outBias: a.AttentionOutBias, mlpBias: a.MLPBias}, nil
	}})
}
