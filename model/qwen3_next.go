package model

import (
	"fmt"

	"github.com/cortiq/cortiq/cmf"
)

// Qwen3-Next (Qwen3NextForCausalLM, architectures.md §6) interleaves Gated
// DeltaNet layers (projections grouped by key head: in_proj_qkvz,
// in_proj_ba) with gated full attention (q_proj yields a per-head sigmoid
// gate on the attention output; partial rotary 0.25), every norm but the
// gated one zero-centred ((1+w)·x̂), and a sparse MoE with a shared expert
// behind a sigmoid gate. The mtp.* tensors stay in the file, unused here.
func init() {
	register(hybridFamily("qwen3_next", func(a *cmf.Arch) error {
		return checkNextLike(a, "qkvz_grouped", true)
	}))
}

// checkNextLike checks the parts Qwen3-Next and Qwen3.5 share.
func checkNextLike(a *cmf.Arch, projection string, moe bool) error {
	switch {
	case !a.AttnOutputGate:
		return fmt.Errorf("%s gates its attention output, but the header does not set attn_output_gate", a.ArchName)
	case a.NormStyle != "one_plus":
		return fmt.Errorf("%s uses zero-centred norms, but the header's norm_style is %q", a.ArchName, a.NormStyle)
	case a.LinearCore == nil || a.LinearCore.Projection != projection:
		return fmt.Errorf("%s needs a gated_deltanet linear_core with %s projections", a.ArchName, projection)
	case moe && a.MoE == nil:
		return fmt.Errorf("%s needs the header's moe section", a.ArchName)
	case !moe && a.MoE != nil:
		return fmt.Errorf("%s is dense, but the header has a moe section", a.ArchName)
	}
	return nil
}
