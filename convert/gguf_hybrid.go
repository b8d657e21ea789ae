package convert

// GGUF import of the hybrid Gated-DeltaNet architectures: llama.cpp's
// "qwen3next" (Qwen3-Next), "qwen35" (Qwen3.5 dense) and "qwen35moe"
// (Qwen3.5 MoE). Every function here inverts one step of llama.cpp's
// converter so that importing a GGUF yields the tensors (Hugging Face
// names, shapes and values) that converting the original checkpoint does.
//
// What llama.cpp does, and where it says so (repository ggml-org/llama.cpp;
// convert_hf_to_gguf.py as of commit 0024aa74, whose classes later moved
// unchanged to conversion/qwen.py; gguf-py/gguf/constants.py and
// tensor_mapping.py of the same commit; src/llama-arch.cpp;
// src/models/qwen3next.cpp):
//
// Metadata ({arch} = qwen3next | qwen35 | qwen35moe)
//
//	GGUF key                              written from (function)                                  import
//	{arch}.block_count                    num_hidden_layers (+ mtp_num_hidden_layers,             NumLayers = block_count − nextn_predict_layers
//	                                      _Qwen35MtpMixin.__init__)
//	{arch}.nextn_predict_layers           mtp_num_hidden_layers (_Qwen35MtpMixin.set_gguf_params)  MTP.NumLayers (absent: no MTP)
//	{arch}.embedding_length               hidden_size (TextModel.set_gguf_parameters)              HiddenSize
//	{arch}.feed_forward_length            intermediate_size when present (TextModel)               IntermediateSize (absent: 0)
//	{arch}.attention.head_count[_kv]      num_attention_heads / num_key_value_heads (TextModel)    NumAttentionHeads / NumKVHeads
//	{arch}.attention.key_length           head_dim (TextModel)                                     HeadDim
//	{arch}.attention.layer_norm_rms_eps   rms_norm_eps (TextModel), float32                        RMSNormEps (shortest decimal of the f32)
//	{arch}.rope.freq_base                 rope_theta (TextModel)                                   RopeTheta
//	{arch}.rope.dimension_count           int(head_dim · partial_rotary_factor(0.25))             PartialRotaryFactor = count / key_length
//	                                      (Qwen3NextModel.set_gguf_parameters)
//	{arch}.rope.dimension_sections        mrope_section padded to 4 with 0 (TextModel); default    qwen35*: RopeScaling{default, first 3, interleaved}
//	                                      [11,11,10,0] (_Qwen35MRopeMixin)
//	{arch}.ssm.conv_kernel                linear_conv_kernel_dim (Qwen3NextModel)                  LinearConvKernelDim
//	{arch}.ssm.state_size                 linear_key_head_dim (Qwen3NextModel)                     LinearKeyHeadDim
//	{arch}.ssm.group_count                linear_num_key_heads (Qwen3NextModel)                    LinearNumKeyHeads
//	{arch}.ssm.time_step_rank             linear_num_value_heads (Qwen3NextModel)                  LinearNumValueHeads
//	{arch}.ssm.inner_size                 linear_value_head_dim · linear_num_value_heads           LinearValueHeadDim = inner_size / time_step_rank
//	{arch}.full_attention_interval        full_attention_interval, default 4 (Qwen3NextModel)      LayerTypes: full iff (l+1) % interval == 0
//	{arch}.expert_count / _used_count     num_experts / num_experts_per_tok (TextModel)            MoE.NumExperts / NumExpertsPerTok
//	{arch}.expert_feed_forward_length     moe_intermediate_size (Qwen2MoeModel)                    MoE.MoEIntermediateSize
//	{arch}.expert_shared_feed_forward_len shared_expert_intermediate_size (Qwen2MoeModel)          MoE.SharedExpertIntermediateSize
//	(none)                                llama.cpp always renormalises top-k (qwen3next.cpp         MoE.NormTopKProb = true, DecoderSparseStep = 1
//	                                      build_layer_ffn passes norm_w = true)
//
// Tensors (per layer "blk.N."; HF "model.layers.N."; N ≥ NumLayers is MTP
// layer N−NumLayers, HF "mtp.layers.i.", renamed by _Qwen35MtpMixin)
//
//	HF name                              GGUF name                      forward transformation (function)               inverse here
//	input_layernorm.weight               attn_norm.weight               + 1 (Qwen3NextModel.modify_tensors: every       − 1 (f32)
//	post_attention_layernorm.weight      post_attention_norm.weight       name ending "norm.weight" except              − 1
//	self_attn.q_norm / k_norm.weight     attn_q_norm / attn_k_norm        linear_attn.norm.weight)                      − 1
//	model.norm.weight                    output_norm.weight             + 1                                             − 1
//	self_attn.q_proj.weight              attn_q.weight                  none: rows stay per-head [q_h; gate_h]          none
//	                                                                    (qwen3next.cpp build_layer_attn views them so)
//	self_attn.{k,v,o}_proj.weight        attn_{k,v,output}.weight       none                                            none
//	linear_attn.in_proj_qkvz.weight      attn_qkv.weight +              qwen3next: rows grouped by key head             regroup (qkvzFromSplit)
//	  [nk·(2dk+2r·dv), H], r = nv/nk     attn_gate.weight               [q_g k_g v_g z_g] are split into
//	                                                                    qkv = [q_0..q_nk | k_0.. | v_0..] and z
//	                                                                    (Qwen3NextModel.modify_tensors)
//	  (legacy GGUFs)                     ssm_in.weight                  none (tensor_mapping SSM_IN ← in_proj_qkvz;     none
//	                                                                    qwen3next.cpp "ssm_in is used by legacy GGUF")
//	linear_attn.in_proj_ba.weight        ssm_ba.weight                  none: stays grouped [b_g a_g] per key head      none
//	linear_attn.in_proj_qkv.weight       attn_qkv.weight                qwen35: V rows grouped→tiled (see below)        untile V rows
//	linear_attn.in_proj_z.weight         attn_gate.weight               qwen35: grouped→tiled                           untile
//	linear_attn.in_proj_b.weight         ssm_beta.weight                qwen35: grouped→tiled (head_dim 1)              untile
//	linear_attn.in_proj_a.weight         ssm_alpha.weight               qwen35: grouped→tiled (head_dim 1)              untile
//	linear_attn.conv1d.weight [C,1,K]    ssm_conv1d.weight [C,K]        squeeze(); qwen35: V channels grouped→tiled     reshape; untile
//	linear_attn.A_log [nv]               ssm_a [nv] (no .weight suffix; −exp(A_log) in f32; qwen35: tiled              log(−x) in f64 (lossy, below)
//	                                     llama-arch.cpp SSM_A_NOSCAN)
//	linear_attn.dt_bias [nv]             ssm_dt.bias                    renamed dt_proj.bias; qwen35: tiled             untile
//	linear_attn.norm.weight [dv]         ssm_norm.weight                none (ones-centred, no + 1)                     none
//	linear_attn.out_proj.weight [H,vd]   ssm_out.weight                 qwen35: V columns grouped→tiled                 untile columns
//	mlp.gate.weight                      ffn_gate_inp.weight            none                                            none
//	mlp.experts.E.{gate,up,down}_proj    ffn_{gate,up,down}_exps        stacked [E,R,C] (Qwen2MoeModel.modify_tensors;  split per expert
//	  (HF fused gate_up_proj [E,2I,H])                                  fused ones split on dim −2 first)
//	                                     ffn_gate_up_exps [E,2I,H]      --fuse-gate-up-exps: cat(gate, up, dim=1)        split per expert and half
//	                                                                    (ModelBase.modify_tensors)
//	mlp.shared_expert.{gate,up,down}_proj ffn_{gate,up,down}_shexp      none                                            none
//	mlp.shared_expert_gate.weight [1,H]  ffn_gate_inp_shexp.weight      none (loaded as {n_embd})                       reshape to [1,H]
//	mlp.{gate,up,down}_proj (qwen35)     ffn_{gate,up,down}.weight      none                                            none
//	mtp.fc.weight [H,2H]                 blk.{n}.nextn.eh_proj.weight   renamed (_Qwen35MtpMixin: written once per      first MTP block's copy
//	mtp.pre_fc_norm_embedding.weight     blk.{n}.nextn.enorm.weight       MTP block n ≥ NumLayers), and the norms       − 1
//	mtp.pre_fc_norm_hidden.weight        blk.{n}.nextn.hnorm.weight       get + 1 like every "norm.weight"              − 1
//	mtp.norm.weight                      blk.{n}.nextn.shared_head_norm                                                 − 1
//
// The qwen35 V-head reorder (_LinearAttentionVReorderBase._reorder_v_heads,
// applied when linear_num_key_heads ≠ linear_num_value_heads, added in
// llama.cpp PR #19468 before it merged, so every qwen35 GGUF has it): a
// block of value-head slices laid out [nk, r, hd] (HF head g·r+i at g·r+i)
// is permuted to [r, nk, hd], i.e. GGUF slot i·nk+g holds HF head g·r+i.
// qwen3next is NOT reordered (qwen3next.cpp repeat-interleaves q/k).
//
// Exactness. Pure renames, reshapes, splits and permutations are exact (a
// quantized GGUF tensor is dequantized first, then rearranged). Two steps
// lose bits and cannot be undone exactly:
//   - the + 1 on zero-centred norms is done in float32: (w+1)−1 differs from
//     w by at most half an ulp of w+1 (2⁻²⁴ for |w+1| < 1, 2⁻²³ below 2).
//   - A_log → −exp(A_log) in float32, inverted here as log(−x) in float64:
//     |error| ≤ ~6e−8 + half an ulp of A_log, i.e. about 1e−7·max(1,|A_log|).
//
// Robustness: block_count must match the blocks the tensors fill and
// expert_count the router's rows, so a corrupt count cannot inflate the
// expected tensor list; every reshaped or permuted tensor's shape is
// checked against the metadata before its data is touched.
//
// Not covered: a {arch}.attention.recurrent_layers-style per-layer array
// (newer llama.cpp can read one; the converters above write the interval),
// nextn.embed_tokens / nextn.shared_head_head (never written for Qwen, whose
// MTP shares the embedding and head: skipped with a warning), and Ollama's
// own qwen3next GGUFs (different tensor names).

import (
	"fmt"
	"log/slog"
	"math"
	"strconv"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/gguf"
	"github.com/cortiq/cortiq/quant"
)

// maxHybridCount bounds the counts read from metadata (layers, heads,
// experts, sizes), so that a corrupt file fails cleanly instead of asking
// for absurd tensor lists.
const maxHybridCount = 1 << 20

// isHybridArch reports whether a cortiq architecture imports through this file.
func isHybridArch(name string) bool {
	return name == "qwen3_next" || name == "qwen3_5" || name == "qwen3_5_moe"
}

// hybridArchFromGGUF completes a, filled by archFromGGUF, with what the
// hybrid architectures add: layer types, the Gated-DeltaNet sizes, MoE, MTP
// and MRoPE sections.
func hybridArchFromGGUF(f *gguf.File, ga string, a *cmf.Arch) error {
	u := func(k string) (int, bool) {
		v, ok := f.KV(ga + "." + k)
		if !ok {
			return 0, false
		}
		if x, ok := v.Uint(); ok && x <= math.MaxInt32 {
			return int(x), true
		}
		if x, ok := v.Int(); ok && x >= 0 && x <= math.MaxInt32 {
			return int(x), true
		}
		return 0, false
	}
	need := func(k string) (int, error) {
		x, ok := u(k)
		if !ok || x <= 0 || x > maxHybridCount {
			return 0, fmt.Errorf("GGUF metadata lacks a positive %s.%s (at most %d)", ga, k, maxHybridCount)
		}
		return x, nil
	}
	// Counts that size the expected tensor list must agree with the tensors
	// present, so a corrupt count cannot ask for millions of names.
	blocks := 0
	for _, ti := range f.Tensors() {
		if m := reBlk.FindStringSubmatch(ti.Name); m != nil {
			if n, err := strconv.Atoi(m[1]); err == nil && n >= blocks {
				blocks = n + 1
			}
		}
	}
	if a.NumLayers != blocks {
		return fmt.Errorf("GGUF metadata: %s.block_count is %d but the tensors fill %d blocks", ga, a.NumLayers, blocks)
	}
	var err error
	if a.LinearConvKernelDim, err = need("ssm.conv_kernel"); err != nil {
		return err
	}
	if a.LinearKeyHeadDim, err = need("ssm.state_size"); err != nil {
		return err
	}
	if a.LinearNumKeyHeads, err = need("ssm.group_count"); err != nil {
		return err
	}
	if a.LinearNumValueHeads, err = need("ssm.time_step_rank"); err != nil {
		return err
	}
	inner, err := need("ssm.inner_size")
	if err != nil {
		return err
	}
	nk, nv := a.LinearNumKeyHeads, a.LinearNumValueHeads
	if inner%nv != 0 || nv%nk != 0 {
		return fmt.Errorf("GGUF metadata: ssm.inner_size %d / time_step_rank %d / group_count %d do not divide into heads", inner, nv, nk)
	}
	a.LinearValueHeadDim = inner / nv

	// MTP blocks are appended after the main stack.
	if n, ok := u("nextn_predict_layers"); ok && n > 0 {
		if n >= a.NumLayers {
			return fmt.Errorf("GGUF metadata: nextn_predict_layers %d leaves no main layers of block_count %d", n, a.NumLayers)
		}
		a.NumLayers -= n
		a.MTP = &cmf.MTP{NumLayers: n}
	}
	interval := 4
	if x, ok := u("full_attention_interval"); ok {
		if x == 0 {
			return fmt.Errorf("GGUF metadata: %s.full_attention_interval is 0", ga)
		}
		interval = x
	}
	a.LayerTypes = a.LayerTypes[:0]
	for l := 0; l < a.NumLayers; l++ {
		t := "full_attention"
		if (l+1)%interval != 0 {
			t = "linear_attention"
		}
		a.LayerTypes = append(a.LayerTypes, t)
	}

	a.QKNorm, a.AttnOutputGate, a.NormStyle = true, true, "one_plus"
	a.LinearCore = &cmf.LinearCore{Kind: "gated_deltanet", Projection: "qkvz_grouped"}
	if a.ArchName != "qwen3_next" {
		a.LinearCore.Projection = "split"
	}
	if a.HeadDim > 0 {
		if rd, ok := u("rope.dimension_count"); ok && rd > 0 {
			a.PartialRotaryFactor = float64(rd) / float64(a.HeadDim)
		} else {
			a.PartialRotaryFactor = 0.25 // the converter's default
		}
	}
	if a.ArchName != "qwen3_5" {
		m := &cmf.MoE{NormTopKProb: true, DecoderSparseStep: 1}
		if m.NumExperts, err = need("expert_count"); err != nil {
			return err
		}
		if m.NumExpertsPerTok, err = need("expert_used_count"); err != nil {
			return err
		}
		if m.MoEIntermediateSize, err = need("expert_feed_forward_length"); err != nil {
			return err
		}
		m.SharedExpertIntermediateSize, _ = u("expert_shared_feed_forward_length")
		for l := 0; l < a.NumLayers; l++ {
			if ti, ok := f.Tensor(fmt.Sprintf("blk.%d.ffn_gate_inp.weight", l)); ok {
				if sh := ti.Shape(); len(sh) != 2 || sh[0] != m.NumExperts {
					return fmt.Errorf("GGUF metadata: %s.expert_count is %d but %s has shape %v", ga, m.NumExperts, ti.Name, sh)
				}
				break
			}
		}
		a.MoE = m
		if a.ArchName == "qwen3_next" {
			// llama.cpp runs a dense FFN where a layer has no router.
			for l := 0; l < a.NumLayers; l++ {
				if _, ok := f.Tensor(fmt.Sprintf("blk.%d.ffn_gate_inp.weight", l)); !ok {
					m.MLPOnlyLayers = append(m.MLPOnlyLayers, l)
				}
			}
		}
	}
	if a.ArchName != "qwen3_next" {
		if v, ok := f.KV(ga + ".rope.dimension_sections"); ok {
			xs, ok := v.Int64s()
			if !ok || len(xs) > 4 {
				return fmt.Errorf("GGUF metadata: %s.rope.dimension_sections is not an array of at most 4 integers", ga)
			}
			var secs []int
			for _, x := range xs {
				if x < 0 || x > maxHybridCount {
					return fmt.Errorf("GGUF metadata: %s.rope.dimension_sections %v out of range", ga, xs)
				}
				secs = append(secs, int(x))
			}
			// The converter pads [t, h, w] with a zero "extra" section.
			if len(secs) == 4 && secs[3] == 0 {
				secs = secs[:3]
			}
			a.RopeScaling = &cmf.RopeScaling{Type: "default", MRopeSection: secs, MRopeInterleaved: true}
		}
	}
	if v, ok := f.KV(ga + ".attention.layer_norm_rms_epsilon"); ok && v.Type() == gguf.ValueFloat32 {
		// Stored as float32: take the shortest decimal that rounds to it
		// (1e-6, not 9.99999997e-07), as the source config had it.
		if x, ok := v.Float(); ok {
			if y, err := strconv.ParseFloat(strconv.FormatFloat(x, 'g', -1, 32), 64); err == nil {
				a.RMSNormEps = y
			}
		}
	}
	return nil
}

// hybridDims are the Gated-DeltaNet sizes the tensor transformations need.
type hybridDims struct {
	H, nk, nv, dk, dv, r, kd, vd, conv, K int
	tiled                                 bool // qwen35: value heads stored tiled
	grouped                               bool // qwen3next: in_proj_qkvz grouped by key head
}

func newHybridDims(a *cmf.Arch) hybridDims {
	d := hybridDims{H: a.HiddenSize, nk: a.LinearNumKeyHeads, nv: a.LinearNumValueHeads,
		dk: a.LinearKeyHeadDim, dv: a.LinearValueHeadDim, K: a.LinearConvKernelDim}
	d.r = d.nv / d.nk
	d.kd, d.vd = d.nk*d.dk, d.nv*d.dv
	d.conv = 2*d.kd + d.vd
	d.grouped = a.ArchName == "qwen3_next"
	d.tiled = !d.grouped
	return d
}

// oneCentred lists the GGUF tensors that carry 1 + w (zero-centred norms).
var oneCentred = map[string]bool{
	"attn_norm.weight": true, "post_attention_norm.weight": true,
	"attn_q_norm.weight": true, "attn_k_norm.weight": true,
	"nextn.enorm.weight": true, "nextn.hnorm.weight": true, "nextn.shared_head_norm.weight": true,
}

// hybridPlain maps per-layer GGUF names that need no arithmetic to HF
// suffixes (the norms here are undone by oneCentred).
var hybridPlain = map[string]string{
	"attn_norm.weight":           "input_layernorm.weight",
	"post_attention_norm.weight": "post_attention_layernorm.weight",
	"attn_q.weight":              "self_attn.q_proj.weight",
	"attn_k.weight":              "self_attn.k_proj.weight",
	"attn_v.weight":              "self_attn.v_proj.weight",
	"attn_output.weight":         "self_attn.o_proj.weight",
	"attn_q_norm.weight":         "self_attn.q_norm.weight",
	"attn_k_norm.weight":         "self_attn.k_norm.weight",
	"ssm_norm.weight":            "linear_attn.norm.weight",
	"ffn_gate_inp.weight":        "mlp.gate.weight",
	"ffn_gate_shexp.weight":      "mlp.shared_expert.gate_proj.weight",
	"ffn_up_shexp.weight":        "mlp.shared_expert.up_proj.weight",
	"ffn_down_shexp.weight":      "mlp.shared_expert.down_proj.weight",
	"ffn_gate.weight":            "mlp.gate_proj.weight",
	"ffn_up.weight":              "mlp.up_proj.weight",
	"ffn_down.weight":            "mlp.down_proj.weight",
}

// hybridNextN maps the MTP block's own tensors to the HF mtp.* names.
var hybridNextN = map[string]string{
	"nextn.eh_proj.weight":          "mtp.fc.weight",
	"nextn.enorm.weight":            "mtp.pre_fc_norm_embedding.weight",
	"nextn.hnorm.weight":            "mtp.pre_fc_norm_hidden.weight",
	"nextn.shared_head_norm.weight": "mtp.norm.weight",
}

// hybridTensors maps every tensor of a hybrid GGUF to the HF-named source
// tensors of the CMF layout, undoing the converter's transformations.
func hybridTensors(f *gguf.File, a *cmf.Arch) (map[string]srcTensor, error) {
	d := newHybridDims(a)
	mtp := 0
	if a.MTP != nil {
		mtp = a.MTP.NumLayers
	}
	src := map[string]srcTensor{}
	add := func(s srcTensor) error {
		if _, dup := src[s.name]; dup {
			return fmt.Errorf("tensor %s is produced twice", s.name)
		}
		src[s.name] = s
		return nil
	}
	for _, ti := range f.Tensors() {
		switch ti.Name {
		case "token_embd.weight":
			if err := add(ggufTensor(f, ti, "model.embed_tokens.weight", ti.Shape(), 0)); err != nil {
				return nil, err
			}
			continue
		case "output.weight":
			if err := add(ggufTensor(f, ti, "lm_head.weight", ti.Shape(), 0)); err != nil {
				return nil, err
			}
			continue
		case "output_norm.weight":
			if err := add(minusOne(f, ti, "model.norm.weight")); err != nil {
				return nil, err
			}
			continue
		}
		m := reBlk.FindStringSubmatch(ti.Name)
		if m == nil {
			return nil, fmt.Errorf("unknown tensor %q", ti.Name)
		}
		blk, err := strconv.Atoi(m[1])
		if err != nil || blk >= a.NumLayers+mtp {
			return nil, fmt.Errorf("tensor %q: block %s is beyond block_count %d", ti.Name, m[1], a.NumLayers+mtp)
		}
		prefix := fmt.Sprintf("model.layers.%d.", blk)
		if blk >= a.NumLayers {
			prefix = fmt.Sprintf("mtp.layers.%d.", blk-a.NumLayers)
		}
		s, skip, err := hybridLayerTensor(f, ti, m[2], prefix, blk, a.NumLayers, d)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", ti.Name, err)
		}
		if skip {
			continue
		}
		for _, t := range s {
			if err := add(t); err != nil {
				return nil, err
			}
		}
	}
	return src, nil
}

// hybridLayerTensor maps one per-block GGUF tensor (suffix after "blk.N.").
func hybridLayerTensor(f *gguf.File, ti gguf.TensorInfo, suffix, prefix string, blk, nLayers int, d hybridDims) ([]srcTensor, bool, error) {
	one := func(s srcTensor, err error) ([]srcTensor, bool, error) {
		if err != nil {
			return nil, false, err
		}
		return []srcTensor{s}, false, nil
	}
	if hf, ok := hybridNextN[suffix]; ok {
		if blk < nLayers {
			return nil, false, fmt.Errorf("MTP tensor in main layer %d", blk)
		}
		if blk > nLayers {
			return nil, true, nil // the converter repeats these per MTP block; the first serves
		}
		if oneCentred[suffix] {
			return one(minusOne(f, ti, hf), nil)
		}
		return one(ggufTensor(f, ti, hf, ti.Shape(), 0), nil)
	}
	switch suffix {
	case "nextn.embed_tokens.weight", "nextn.shared_head_head.weight":
		slog.Warn("skipping MTP tensor: cortiq's MTP head shares the model's embedding and lm_head", "tensor", ti.Name)
		return nil, true, nil
	}
	if hf, ok := hybridPlain[suffix]; ok {
		if oneCentred[suffix] {
			return one(minusOne(f, ti, prefix+hf), nil)
		}
		return one(ggufTensor(f, ti, prefix+hf, ti.Shape(), 0), nil)
	}
	la := prefix + "linear_attn."
	switch suffix {
	case "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight":
		tmp := map[string]srcTensor{}
		if err := addGGUFExperts(tmp, f, ti, prefix+suffix); err != nil {
			return nil, false, err
		}
		return values(tmp), false, nil
	case "ffn_gate_up_exps.weight":
		s, err := gateUpExperts(f, ti, prefix)
		return s, false, err
	case "ffn_gate_inp_shexp.weight":
		if ti.Elements() != int64(d.H) {
			return nil, false, fmt.Errorf("shape %v, want [1 %d]", ti.Shape(), d.H)
		}
		return one(ggufTensor(f, ti, prefix+"mlp.shared_expert_gate.weight", []int{1, d.H}, 0), nil)
	case "ssm_in.weight": // legacy qwen3next: in_proj_qkvz as stored by HF
		if !d.grouped {
			return nil, false, fmt.Errorf("ssm_in is a qwen3next tensor")
		}
		return one(ggufTensor(f, ti, la+"in_proj_qkvz.weight", ti.Shape(), 0), nil)
	case "ssm_ba.weight":
		if !d.grouped {
			return nil, false, fmt.Errorf("ssm_ba is a qwen3next tensor")
		}
		return one(ggufTensor(f, ti, la+"in_proj_ba.weight", ti.Shape(), 0), nil)
	case "attn_qkv.weight":
		if err := wantShape(ti, 2*d.kd+d.vd, d.H); err != nil {
			return nil, false, err
		}
		if d.grouped {
			gname := fmt.Sprintf("blk.%d.attn_gate.weight", blk)
			gi, ok := f.Tensor(gname)
			if !ok {
				return nil, false, fmt.Errorf("no %s to rebuild in_proj_qkvz with", gname)
			}
			if err := wantShape(gi, d.vd, d.H); err != nil {
				return nil, false, err
			}
			return one(derived(f, la+"in_proj_qkvz.weight", []int{2*d.kd + 2*d.vd, d.H}, []gguf.TensorInfo{ti, gi},
				func(in [][]float32, dst []float32) error { d.qkvzFromSplit(dst, in[0], in[1]); return nil }), nil)
		}
		return one(derived(f, la+"in_proj_qkv.weight", []int{2*d.kd + d.vd, d.H}, []gguf.TensorInfo{ti},
			func(in [][]float32, dst []float32) error {
				off := 2 * d.kd * d.H
				copy(dst[:off], in[0][:off])
				d.untileRows(dst[off:], in[0][off:], d.dv, d.H)
				return nil
			}), nil)
	case "attn_gate.weight":
		if d.grouped {
			return nil, true, nil // consumed with attn_qkv
		}
		return one(d.untiled(f, ti, la+"in_proj_z.weight", []int{d.vd, d.H}, d.dv))
	case "ssm_beta.weight":
		return one(d.untiled(f, ti, la+"in_proj_b.weight", []int{d.nv, d.H}, 1))
	case "ssm_alpha.weight":
		return one(d.untiled(f, ti, la+"in_proj_a.weight", []int{d.nv, d.H}, 1))
	case "ssm_dt.bias":
		return one(d.untiled(f, ti, la+"dt_bias", []int{d.nv}, 1))
	case "ssm_conv1d.weight":
		if err := wantShape(ti, d.conv, d.K); err != nil {
			return nil, false, err
		}
		shape := []int{d.conv, 1, d.K}
		if !d.tiled {
			return one(ggufTensor(f, ti, la+"conv1d.weight", shape, 0), nil)
		}
		return one(derived(f, la+"conv1d.weight", shape, []gguf.TensorInfo{ti},
			func(in [][]float32, dst []float32) error {
				off := 2 * d.kd * d.K
				copy(dst[:off], in[0][:off])
				d.untileRows(dst[off:], in[0][off:], d.dv, d.K)
				return nil
			}), nil)
	case "ssm_a":
		if err := wantShape(ti, d.nv); err != nil {
			return nil, false, err
		}
		return one(derived(f, la+"A_log", []int{d.nv}, []gguf.TensorInfo{ti},
			func(in [][]float32, dst []float32) error {
				x := in[0]
				if d.tiled {
					x = make([]float32, len(in[0]))
					d.untileRows(x, in[0], 1, 1)
				}
				return aLogFromSSMA(dst, x)
			}), nil)
	case "ssm_out.weight":
		if err := wantShape(ti, d.H, d.vd); err != nil {
			return nil, false, err
		}
		if !d.tiled {
			return one(ggufTensor(f, ti, la+"out_proj.weight", ti.Shape(), 0), nil)
		}
		return one(derived(f, la+"out_proj.weight", []int{d.H, d.vd}, []gguf.TensorInfo{ti},
			func(in [][]float32, dst []float32) error {
				for row := 0; row < d.H; row++ {
					d.untileRows(dst[row*d.vd:(row+1)*d.vd], in[0][row*d.vd:(row+1)*d.vd], d.dv, 1)
				}
				return nil
			}), nil)
	}
	return nil, false, fmt.Errorf("unknown tensor")
}

func values(m map[string]srcTensor) []srcTensor {
	out := make([]srcTensor, 0, len(m))
	for _, s := range m {
		out = append(out, s)
	}
	return out
}

// wantShape checks a GGUF tensor's PyTorch-order shape.
func wantShape(ti gguf.TensorInfo, shape ...int) error {
	if !equalShape(ti.Shape(), shape) {
		return fmt.Errorf("%s has shape %v, metadata implies %v", ti.Name, ti.Shape(), shape)
	}
	return nil
}

// derived is a tensor computed from whole GGUF tensors by fn (dst has the
// element count of shape; in holds each input dequantized).
func derived(f *gguf.File, hf string, shape []int, in []gguf.TensorInfo, fn func(in [][]float32, dst []float32) error) srcTensor {
	var size int64
	for _, ti := range in {
		size += ti.Size
	}
	return srcTensor{
		name: hf, shape: shape, inBytes: size,
		raw: func() ([]byte, quant.DType, bool) { return nil, 0, false },
		load: func(dst []float32) error {
			bufs := make([][]float32, len(in))
			for i, ti := range in {
				bufs[i] = make([]float32, ti.Elements())
				if err := f.ReadFloat32Into(ti.Name, bufs[i]); err != nil {
					return err
				}
			}
			if err := fn(bufs, dst); err != nil {
				return fmt.Errorf("tensor %s: %w", hf, err)
			}
			return nil
		},
		release: func() {
			for _, ti := range in {
				f.Release(ti.Name)
			}
		},
	}
}

// minusOne undoes the + 1 the converter adds to zero-centred norm weights.
func minusOne(f *gguf.File, ti gguf.TensorInfo, hf string) srcTensor {
	return derived(f, hf, ti.Shape(), []gguf.TensorInfo{ti}, func(in [][]float32, dst []float32) error {
		for i, v := range in[0] {
			dst[i] = v - 1
		}
		return nil
	})
}

// aLogFromSSMA inverts ssm_a = −exp(A_log): A_log = log(−ssm_a), computed
// in float64 and rounded once.
func aLogFromSSMA(dst, a []float32) error {
	for i, v := range a {
		if !(v < 0) || math.IsInf(float64(v), -1) {
			return fmt.Errorf("ssm_a[%d] = %v: −exp(A_log) must be negative and finite", i, v)
		}
		dst[i] = float32(math.Log(-float64(v)))
	}
	return nil
}

// untiled is a rows×cols tensor whose value-head blocks (hd rows each)
// llama.cpp stored tiled (qwen35), restored to HF order; for qwen3next it is
// the tensor as stored.
func (d hybridDims) untiled(f *gguf.File, ti gguf.TensorInfo, hf string, shape []int, hd int) (srcTensor, error) {
	if err := wantShape(ti, shape...); err != nil {
		return srcTensor{}, err
	}
	if !d.tiled {
		return ggufTensor(f, ti, hf, shape, 0), nil
	}
	cols := 1
	if len(shape) == 2 {
		cols = shape[1]
	}
	return derived(f, hf, shape, []gguf.TensorInfo{ti}, func(in [][]float32, dst []float32) error {
		d.untileRows(dst, in[0], hd, cols)
		return nil
	}), nil
}

// untileRows copies nv blocks of hd rows (cols wide) from the tiled order
// llama.cpp's _reorder_v_heads writes (slot i·nk+g holds head g·r+i) to
// Hugging Face's grouped order (head g·r+i at g·r+i).
func (d hybridDims) untileRows(dst, src []float32, hd, cols int) {
	blk := hd * cols
	for g := 0; g < d.nk; g++ {
		for i := 0; i < d.r; i++ {
			h, p := g*d.r+i, i*d.nk+g
			copy(dst[h*blk:(h+1)*blk], src[p*blk:(p+1)*blk])
		}
	}
}

// qkvzFromSplit rebuilds Qwen3-Next's in_proj_qkvz, whose rows are grouped
// by key head g as [q_g (dk) | k_g (dk) | v_g (r·dv) | z_g (r·dv)], from
// llama.cpp's attn_qkv = [q_0..q_nk | k_0..k_nk | v_0..v_nk] and attn_gate =
// [z_0..z_nk] (all H columns wide).
func (d hybridDims) qkvzFromSplit(dst, qkv, z []float32) {
	H, rv := d.H, d.r*d.dv
	per := 2*d.dk + 2*rv
	for g := 0; g < d.nk; g++ {
		out := dst[g*per*H:]
		copy(out[:d.dk*H], qkv[g*d.dk*H:(g+1)*d.dk*H])
		copy(out[d.dk*H:2*d.dk*H], qkv[(d.kd+g*d.dk)*H:(d.kd+(g+1)*d.dk)*H])
		copy(out[2*d.dk*H:(2*d.dk+rv)*H], qkv[(2*d.kd+g*rv)*H:(2*d.kd+(g+1)*rv)*H])
		copy(out[(2*d.dk+rv)*H:per*H], z[g*rv*H:(g+1)*rv*H])
	}
}

// gateUpExperts splits a fused ffn_gate_up_exps [E, 2I, C] (each expert's
// gate rows, then its up rows) into per-expert gate_proj and up_proj.
func gateUpExperts(f *gguf.File, ti gguf.TensorInfo, prefix string) ([]srcTensor, error) {
	sh := ti.Shape()
	if len(sh) != 3 || sh[1]%2 != 0 {
		return nil, fmt.Errorf("fused expert tensor has shape %v, want [experts, 2·ff, embd]", sh)
	}
	E, I, C := sh[0], sh[1]/2, sh[2]
	half := ti.Size / int64(2*E)
	if half*int64(2*E) != ti.Size {
		return nil, fmt.Errorf("%d bytes do not split into %d expert halves", ti.Size, 2*E)
	}
	qd, plain := ggufQD[ti.Type]
	var out []srcTensor
	for e := 0; e < E; e++ {
		for k, kind := range []string{"gate", "up"} {
			off := int64(2*e+k) * half
			get := func() []byte { return f.Raw(ti.Name)[off : off+half] }
			name := fmt.Sprintf("%smlp.experts.%d.%s_proj.weight", prefix, e, kind)
			out = append(out, srcTensor{
				name: name, shape: []int{I, C}, inBytes: half,
				raw: func() ([]byte, quant.DType, bool) { return get(), qd, plain },
				load: func(dst []float32) error {
					if err := gguf.Dequantize(ti.Type, get(), dst); err != nil {
						return fmt.Errorf("tensor %s: %w", name, err)
					}
					return nil
				},
			})
		}
	}
	return out, nil
}
