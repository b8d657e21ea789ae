package model

import "github.com/cortiq/cortiq/cmf"

// Qwen3.5 (qwen3_5, dense) and Qwen3.5-MoE (qwen3_5_moe), architectures.md
// §8: Qwen3-Next's hybrid stack with split, not grouped, DeltaNet
// projections (in_proj_qkv | in_proj_z | in_proj_b | in_proj_a). The
// interleaved MRoPE of the VLM equals plain partial RoPE for text (all
// three position streams are the token position). The dense model has a
// SwiGLU FFN in every layer; the MoE model a routed MoE that always
// renormalises, plus a gated shared expert. Converted checkpoints carry
// only the text model (model.visual.* is not converted; mtp.* unused).
func init() {
	register(hybridFamily("qwen3_5", func(a *cmf.Arch) error { return checkNextLike(a, "split", false) }))
	register(hybridFamily("qwen3_5_moe", func(a *cmf.Arch) error { return checkNextLike(a, "split", true) }))
}
