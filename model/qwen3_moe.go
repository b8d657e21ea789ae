package model

import (
	"fmt"

	"github.com/cortiq/cortiq/cmf"
)

// Qwen3-MoE (Qwen3MoeForCausalLM, architectures.md §5) is Qwen3 attention
// (q/k norm, standard RMSNorm) with a sparse MoE FFN in the layers that
// decoder_sparse_step selects and mlp_only_layers does not: router softmax
// over all experts, top-k, renormalised iff norm_topk_prob (the class
// default is false, released checkpoints set true). No shared expert.
func init() {
	register(hybridFamily("qwen3_moe", func(a *cmf.Arch) error {
		switch {
		case a.MoE == nil:
			return fmt.Errorf("qwen3_moe needs the header's moe section")
		case a.MoE.SharedExpertIntermediateSize != 0:
			return fmt.Errorf("qwen3_moe has no shared expert, but the header gives it width %d", a.MoE.SharedExpertIntermediateSize)
		case a.AttnOutputGate || a.NormStyle == "one_plus" || a.LinearCore != nil:
			return fmt.Errorf("qwen3_moe has plain attention and standard norms, but the header sets a gate, zero-centred norms or a linear core")
		}
		return nil
	}))
}
