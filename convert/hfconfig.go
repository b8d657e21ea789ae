package convert

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/model"
)

// hfConfig is a Hugging Face config.json as a generic map, with typed getters.
type hfConfig map[string]any

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: invalid JSON: %w", filepath.Base(path), err)
	}
	return nil
}

func (c hfConfig) has(k string) bool { v, ok := c[k]; return ok && v != nil }

func (c hfConfig) num(k string) (float64, bool, error) {
	v, ok := c[k]
	if !ok || v == nil {
		return 0, false, nil
	}
	f, isNum := v.(float64)
	if !isNum {
		return 0, true, fmt.Errorf("config.json: %s is %T, want a number", k, v)
	}
	return f, true, nil
}

// intOr returns the integer at k, def if absent; errors on a non-integer.
func (c hfConfig) intOr(k string, def int, errp *error) int {
	f, ok, err := c.num(k)
	if err != nil {
		setErr(errp, err)
		return def
	}
	if !ok {
		return def
	}
	if f != math.Trunc(f) || f < 0 || f > 1<<31 {
		setErr(errp, fmt.Errorf("config.json: %s = %v is not a valid count", k, f))
		return def
	}
	return int(f)
}

func (c hfConfig) floatOr(k string, def float64, errp *error) float64 {
	f, ok, err := c.num(k)
	if err != nil {
		setErr(errp, err)
		return def
	}
	if !ok {
		return def
	}
	return f
}

func (c hfConfig) boolOr(k string, def bool) bool {
	if b, ok := c[k].(bool); ok {
		return b
	}
	return def
}

func (c hfConfig) str(k string) string {
	s, _ := c[k].(string)
	return s
}

func (c hfConfig) sub(k string) hfConfig {
	m, _ := c[k].(map[string]any)
	return m
}

func setErr(errp *error, err error) {
	if *errp == nil {
		*errp = err
	}
}

// archNames maps config model_type values to cortiq architecture names.
var archNames = map[string]string{
	"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "qwen3_next": "qwen3_next",
	"qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5", "qwen3_5_moe": "qwen3_5_moe", "qwen3_5_moe_text": "qwen3_5_moe",
}

// archFromHF maps a Hugging Face config (and generation config) to cmf.Arch.
// It reads both the transformers-5 rope_parameters spelling and the older
// rope_theta / rope_scaling / partial_rotary_factor keys.
func archFromHF(top hfConfig, gen hfConfig) (cmf.Arch, error) {
	mt := top.str("model_type")
	name, ok := archNames[mt]
	if !ok {
		if mt == "" {
			return cmf.Arch{}, fmt.Errorf("config.json has no model_type (supported: %v)", model.Supported)
		}
		return cmf.Arch{}, fmt.Errorf("architecture %q (%v) is not supported (supported: %v)", mt, top["architectures"], model.Supported)
	}
	c := top
	if tc := top.sub("text_config"); tc != nil {
		c = tc
	}
	var err error
	a := cmf.Arch{ArchName: name, HiddenAct: "silu", NormStyle: "standard", PartialRotaryFactor: 1}
	a.HiddenSize = c.intOr("hidden_size", 0, &err)
	a.IntermediateSize = c.intOr("intermediate_size", 0, &err)
	a.NumLayers = c.intOr("num_hidden_layers", 0, &err)
	a.NumAttentionHeads = c.intOr("num_attention_heads", 0, &err)
	a.NumKVHeads = c.intOr("num_key_value_heads", a.NumAttentionHeads, &err)
	if a.NumAttentionHeads > 0 {
		a.HeadDim = c.intOr("head_dim", a.HiddenSize/a.NumAttentionHeads, &err)
	}
	a.VocabSize = c.intOr("vocab_size", 0, &err)
	a.RMSNormEps = c.floatOr("rms_norm_eps", 1e-6, &err)
	a.MaxPositionEmbeddings = c.intOr("max_position_embeddings", 0, &err)
	if err == nil {
		err = boundArch(&a)
	}
	if err != nil {
		return a, err
	}
	if act := c.str("hidden_act"); act != "" && act != "silu" {
		return a, fmt.Errorf("hidden_act %q is not supported (only silu)", act)
	}
	// tie_word_embeddings may sit at either level of a VLM config; the text
	// level wins when both are present.
	a.TieWordEmbeddings = top.boolOr("tie_word_embeddings", false)
	if c.has("tie_word_embeddings") {
		a.TieWordEmbeddings = c.boolOr("tie_word_embeddings", a.TieWordEmbeddings)
	}

	// RoPE: rope_parameters (transformers 5) or rope_theta + rope_scaling.
	rp := c.sub("rope_parameters")
	a.RopeTheta = c.floatOr("rope_theta", 10000, &err)
	if rp != nil {
		a.RopeTheta = rp.floatOr("rope_theta", a.RopeTheta, &err)
	}
	switch name {
	case "qwen3_next":
		a.PartialRotaryFactor = 0.25 // transformers sets this default for qwen3_next
	}
	a.PartialRotaryFactor = c.floatOr("partial_rotary_factor", a.PartialRotaryFactor, &err)
	if rp != nil {
		a.PartialRotaryFactor = rp.floatOr("partial_rotary_factor", a.PartialRotaryFactor, &err)
	}
	scal := c.sub("rope_scaling")
	if scal == nil && rp != nil {
		scal = rp
	}
	if scal != nil {
		typ := scal.str("rope_type")
		if typ == "" {
			typ = scal.str("type")
		}
		if typ != "" && typ != "default" {
			rs := &cmf.RopeScaling{Type: typ}
			rs.Factor = scal.floatOr("factor", 1, &err)
			rs.OriginalMaxPositionEmbeddings = scal.intOr("original_max_position_embeddings", 0, &err)
			rs.LowFreqFactor = scal.floatOr("low_freq_factor", 0, &err)
			rs.HighFreqFactor = scal.floatOr("high_freq_factor", 0, &err)
			rs.BetaFast = scal.floatOr("beta_fast", 0, &err)
			rs.BetaSlow = scal.floatOr("beta_slow", 0, &err)
			rs.AttentionFactor = scal.floatOr("attention_factor", 0, &err)
			rs.MScale = scal.floatOr("mscale", 0, &err)
			rs.MScaleAllDim = scal.floatOr("mscale_all_dim", 0, &err)
			if b, ok := scal["truncate"].(bool); ok {
				rs.Truncate = &b
			}
			rs.LongFactor = floats(scal["long_factor"])
			rs.ShortFactor = floats(scal["short_factor"])
			switch typ {
			case "linear", "dynamic", "yarn", "llama3", "longrope":
			default:
				return a, fmt.Errorf("rope scaling type %q is not supported (linear, dynamic, yarn, llama3, longrope)", typ)
			}
			a.RopeScaling = rs
		}
		if ms, ok := scal["mrope_section"]; ok {
			if a.RopeScaling == nil {
				a.RopeScaling = &cmf.RopeScaling{Type: "default"}
			}
			for _, f := range floats(ms) {
				a.RopeScaling.MRopeSection = append(a.RopeScaling.MRopeSection, int(f))
			}
			a.RopeScaling.MRopeInterleaved = scal.boolOr("mrope_interleaved", false)
		}
	}

	// Layer types.
	if lt, ok := c["layer_types"].([]any); ok {
		for _, v := range lt {
			s, _ := v.(string)
			a.LayerTypes = append(a.LayerTypes, s)
		}
	} else {
		interval := 0
		if name == "qwen3_next" || name == "qwen3_5" || name == "qwen3_5_moe" {
			interval = c.intOr("full_attention_interval", 4, &err)
		}
		for l := 0; l < a.NumLayers; l++ {
			t := "full_attention"
			if interval > 0 && (l+1)%interval != 0 {
				t = "linear_attention"
			}
			a.LayerTypes = append(a.LayerTypes, t)
		}
	}
	if c.boolOr("use_sliding_window", false) {
		a.SlidingWindow = c.intOr("sliding_window", 0, &err)
		mw := c.intOr("max_window_layers", a.NumLayers, &err)
		if _, explicit := c["layer_types"]; !explicit && a.SlidingWindow > 0 {
			for l := mw; l < a.NumLayers; l++ {
				a.LayerTypes[l] = "sliding_attention"
			}
		}
	}

	// Per-family attention and FFN features.
	switch name {
	case "llama":
		a.AttentionBias = c.boolOr("attention_bias", false)
		a.AttentionOutBias = a.AttentionBias
		a.MLPBias = c.boolOr("mlp_bias", false)
	case "qwen2":
		a.AttentionBias = true
	case "qwen3", "qwen3_moe":
		a.QKNorm = true
		a.AttentionBias = c.boolOr("attention_bias", false)
		a.AttentionOutBias = a.AttentionBias
	case "qwen3_next", "qwen3_5", "qwen3_5_moe":
		a.QKNorm, a.AttnOutputGate, a.NormStyle = true, true, "one_plus"
		a.AttentionBias = c.boolOr("attention_bias", false)
		a.AttentionOutBias = a.AttentionBias
		a.LinearCore = &cmf.LinearCore{Kind: "gated_deltanet", Projection: "qkvz_grouped"}
		if name != "qwen3_next" {
			a.LinearCore.Projection = "split"
		}
		a.LinearConvKernelDim = c.intOr("linear_conv_kernel_dim", 4, &err)
		a.LinearNumKeyHeads = c.intOr("linear_num_key_heads", 16, &err)
		a.LinearNumValueHeads = c.intOr("linear_num_value_heads", 32, &err)
		a.LinearKeyHeadDim = c.intOr("linear_key_head_dim", 128, &err)
		a.LinearValueHeadDim = c.intOr("linear_value_head_dim", 128, &err)
	}
	switch name {
	case "qwen3_moe", "qwen3_next", "qwen3_5_moe":
		m := &cmf.MoE{}
		m.NumExperts = c.intOr("num_experts", c.intOr("num_local_experts", 0, &err), &err) // transformers 5 saves num_local_experts
		m.NumExpertsPerTok = c.intOr("num_experts_per_tok", 0, &err)
		m.MoEIntermediateSize = c.intOr("moe_intermediate_size", 0, &err)
		m.SharedExpertIntermediateSize = c.intOr("shared_expert_intermediate_size", 0, &err)
		m.DecoderSparseStep = c.intOr("decoder_sparse_step", 1, &err)
		switch name {
		case "qwen3_moe":
			m.NormTopKProb = c.boolOr("norm_topk_prob", false) // class default is false
		case "qwen3_next":
			m.NormTopKProb = c.boolOr("norm_topk_prob", true)
		default:
			m.NormTopKProb = true // qwen3_5_moe always renormalises
		}
		if ml, ok := c["mlp_only_layers"].([]any); ok {
			for _, v := range ml {
				if f, ok := v.(float64); ok {
					m.MLPOnlyLayers = append(m.MLPOnlyLayers, int(f))
				}
			}
		}
		if m.NumExperts > 0 {
			a.MoE = m
		}
	}
	if b, ok, _ := c.num("bos_token_id"); ok {
		id := int(b)
		a.BOSTokenID = &id
	}
	a.EOSTokenIDs = ints(c["eos_token_id"])
	if gen != nil {
		if ids := ints(gen["eos_token_id"]); len(ids) > 0 {
			a.EOSTokenIDs = ids
		}
	}
	if err != nil {
		return a, err
	}
	if a.HeadDim == 0 || a.NumAttentionHeads == 0 {
		return a, fmt.Errorf("config.json: num_attention_heads/head_dim missing")
	}
	return a, a.Validate()
}

// Limits far above any published model; they keep loops and allocations
// driven by an untrusted config bounded.
const (
	maxLayers  = 4096
	maxHeads   = 4096
	maxHeadDim = 1 << 16
	maxHidden  = 1 << 20
	maxVocab   = 1 << 24
)

// boundArch rejects dimensions beyond the limits above.
func boundArch(a *cmf.Arch) error {
	for _, v := range []struct {
		name   string
		x, max int
	}{
		{"num_hidden_layers", a.NumLayers, maxLayers}, {"num_attention_heads", a.NumAttentionHeads, maxHeads},
		{"num_key_value_heads", a.NumKVHeads, maxHeads}, {"head_dim", a.HeadDim, maxHeadDim},
		{"hidden_size", a.HiddenSize, maxHidden}, {"intermediate_size", a.IntermediateSize, 1 << 24},
		{"vocab_size", a.VocabSize, maxVocab},
	} {
		if v.x > v.max {
			return fmt.Errorf("%s = %d is beyond any supported model (max %d)", v.name, v.x, v.max)
		}
	}
	return nil
}

// mtpLayers returns the MTP layer count a config declares (0 if none).
func mtpLayers(top hfConfig) int {
	c := top
	if tc := top.sub("text_config"); tc != nil {
		c = tc
	}
	var err error
	if c.has("mtp_num_hidden_layers") {
		return c.intOr("mtp_num_hidden_layers", 0, &err)
	}
	return c.intOr("num_nextn_predict_layers", 1, &err)
}

func floats(v any) []float64 {
	l, _ := v.([]any)
	var out []float64
	for _, x := range l {
		if f, ok := x.(float64); ok {
			out = append(out, f)
		}
	}
	return out
}

// ints accepts a number or a list of numbers.
func ints(v any) []int {
	switch x := v.(type) {
	case float64:
		return []int{int(x)}
	case []any:
		var out []int
		for _, e := range x {
			if f, ok := e.(float64); ok {
				out = append(out, int(f))
			}
		}
		return out
	}
	return nil
}
