package convert

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

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
		var se *json.SyntaxError
		if errors.As(err, &se) {
			// Python's json writes NaN and Infinity, which are not JSON:
			// show where, so the key is visible.
			lo, hi := max(0, int(se.Offset)-40), min(len(b), int(se.Offset)+20)
			return fmt.Errorf("%s: invalid JSON at byte %d, near `%s` (NaN and Infinity are not JSON numbers): %w", filepath.Base(path), se.Offset, strings.ReplaceAll(string(b[lo:hi]), "\n", " "), err)
		}
		return fmt.Errorf("%s: invalid JSON: %w", filepath.Base(path), err)
	}
	return nil
}

// kind names a decoded JSON value's type for error messages.
func kind(v any) string {
	switch x := v.(type) {
	case string:
		return fmt.Sprintf("the string %q", x)
	case bool:
		return "a boolean"
	case float64:
		return "a number"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

func (c hfConfig) has(k string) bool { v, ok := c[k]; return ok && v != nil }

func (c hfConfig) num(k string) (float64, bool, error) {
	v, ok := c[k]
	if !ok || v == nil {
		return 0, false, nil
	}
	f, isNum := v.(float64)
	if !isNum {
		return 0, true, fmt.Errorf("config.json: %s is %s, want a number", k, kind(v))
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

// boolOr returns the boolean at k, def if absent or null; another type is
// an error.
func (c hfConfig) boolOr(k string, def bool, errp *error) bool {
	v, ok := c[k]
	if !ok || v == nil {
		return def
	}
	b, isBool := v.(bool)
	if !isBool {
		setErr(errp, fmt.Errorf("config.json: %s is %s, want true or false", k, kind(v)))
		return def
	}
	return b
}

// str returns the string at k, "" if absent or null; another type is an
// error.
func (c hfConfig) str(k string, errp *error) string {
	v, ok := c[k]
	if !ok || v == nil {
		return ""
	}
	s, isStr := v.(string)
	if !isStr {
		setErr(errp, fmt.Errorf("config.json: %s is %s, want a string", k, kind(v)))
	}
	return s
}

// sub returns the object at k, nil if absent or null; another type is an
// error.
func (c hfConfig) sub(k string, errp *error) hfConfig {
	v, ok := c[k]
	if !ok || v == nil {
		return nil
	}
	m, isObj := v.(map[string]any)
	if !isObj {
		setErr(errp, fmt.Errorf("config.json: %s is %s, want an object", k, kind(v)))
	}
	return m
}

// prefixed returns a view of the sub-object at k whose error messages name
// keys as k.key (rope_scaling.factor).
func (c hfConfig) prefixed(k string, sub hfConfig) hfConfig {
	if sub == nil {
		return nil
	}
	out := make(hfConfig, len(sub))
	for kk, v := range sub {
		out[k+"."+kk] = v
	}
	return out
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
	var err error
	mt := top.str("model_type", &err)
	if err != nil {
		return cmf.Arch{}, err
	}
	name, ok := archNames[mt]
	if !ok {
		if mt == "" {
			return cmf.Arch{}, fmt.Errorf("config.json has no model_type (supported: %v)", model.Supported)
		}
		return cmf.Arch{}, fmt.Errorf("architecture %q (%v) is not supported (supported: %v)", mt, top["architectures"], model.Supported)
	}
	c := top
	if tc := top.sub("text_config", &err); tc != nil {
		c = tc
	}
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
	if act := c.str("hidden_act", &err); act != "" && act != "silu" {
		return a, fmt.Errorf("hidden_act %q is not supported (only silu)", act)
	}
	// tie_word_embeddings may sit at either level of a VLM config; the text
	// level wins when both are present.
	a.TieWordEmbeddings = top.boolOr("tie_word_embeddings", false, &err)
	if c.has("tie_word_embeddings") {
		a.TieWordEmbeddings = c.boolOr("tie_word_embeddings", a.TieWordEmbeddings, &err)
	}

	// RoPE: rope_parameters (transformers 5) or rope_theta + rope_scaling.
	rp := c.prefixed("rope_parameters", c.sub("rope_parameters", &err))
	a.RopeTheta = c.floatOr("rope_theta", 10000, &err)
	if rp != nil {
		a.RopeTheta = rp.floatOr("rope_parameters.rope_theta", a.RopeTheta, &err)
	}
	if err == nil && !(a.RopeTheta > 0) {
		return a, fmt.Errorf("config.json: rope_theta = %v: the RoPE base must be positive", a.RopeTheta)
	}
	switch name {
	case "qwen3_next":
		a.PartialRotaryFactor = 0.25 // transformers sets this default for qwen3_next
	}
	a.PartialRotaryFactor = c.floatOr("partial_rotary_factor", a.PartialRotaryFactor, &err)
	if rp != nil {
		a.PartialRotaryFactor = rp.floatOr("rope_parameters.partial_rotary_factor", a.PartialRotaryFactor, &err)
	}
	rk := "rope_scaling"
	scal := c.prefixed(rk, c.sub(rk, &err))
	if scal == nil && rp != nil {
		scal, rk = rp, "rope_parameters"
	}
	if scal != nil && err == nil {
		if rs, e := ropeScaling(scal, rk); e != nil {
			return a, e
		} else if rs != nil {
			a.RopeScaling = rs
		}
	}

	// Layer types.
	if c.has("layer_types") {
		lt, ok := c["layer_types"].([]any)
		if !ok {
			return a, fmt.Errorf("config.json: layer_types is %s, want a list of strings", kind(c["layer_types"]))
		}
		for i, v := range lt {
			s, ok := v.(string)
			if !ok {
				return a, fmt.Errorf("config.json: layer_types[%d] is %s, want a string", i, kind(v))
			}
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
	if c.boolOr("use_sliding_window", false, &err) {
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
		a.AttentionBias = c.boolOr("attention_bias", false, &err)
		a.AttentionOutBias = a.AttentionBias
		a.MLPBias = c.boolOr("mlp_bias", false, &err)
	case "qwen2":
		a.AttentionBias = true
	case "qwen3", "qwen3_moe":
		a.QKNorm = true
		a.AttentionBias = c.boolOr("attention_bias", false, &err)
		a.AttentionOutBias = a.AttentionBias
	case "qwen3_next", "qwen3_5", "qwen3_5_moe":
		a.QKNorm, a.AttnOutputGate, a.NormStyle = true, true, "one_plus"
		a.AttentionBias = c.boolOr("attention_bias", false, &err)
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
			m.NormTopKProb = c.boolOr("norm_topk_prob", false, &err) // class default is false
		case "qwen3_next":
			m.NormTopKProb = c.boolOr("norm_topk_prob", true, &err)
		default:
			m.NormTopKProb = true // qwen3_5_moe always renormalises
		}
		m.MLPOnlyLayers = ints(c, "mlp_only_layers", &err)
		if m.NumExperts > 0 {
			a.MoE = m
		}
	}
	if c.has("bos_token_id") {
		id := c.intOr("bos_token_id", 0, &err)
		a.BOSTokenID = &id
	}
	a.EOSTokenIDs = ints(c, "eos_token_id", &err)
	if gen != nil {
		var gerr error
		if ids := ints(gen, "eos_token_id", &gerr); len(ids) > 0 {
			a.EOSTokenIDs = ids
		}
		if gerr != nil {
			return a, fmt.Errorf("generation_config.json: %s", strings.TrimPrefix(gerr.Error(), "config.json: "))
		}
	}
	if err != nil {
		return a, err
	}
	for _, d := range []struct {
		key string
		v   int
	}{{"num_attention_heads", a.NumAttentionHeads}, {"head_dim", a.HeadDim}, {"hidden_size", a.HiddenSize}, {"num_hidden_layers", a.NumLayers}, {"vocab_size", a.VocabSize}} {
		if d.v > 0 {
			continue
		}
		if c.has(d.key) {
			return a, fmt.Errorf("config.json: %s is %d; it must be at least 1", d.key, d.v)
		}
		return a, fmt.Errorf("config.json: %s is missing", d.key)
	}
	if a.NumKVHeads == 0 {
		return a, fmt.Errorf("config.json: num_key_value_heads is 0; it must be at least 1")
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
	var err error
	if tc := top.sub("text_config", &err); tc != nil {
		c = tc
	}
	if c.has("mtp_num_hidden_layers") {
		return c.intOr("mtp_num_hidden_layers", 0, &err)
	}
	return c.intOr("num_nextn_predict_layers", 1, &err)
}

// floats returns the list of numbers at k (nil if absent or null); any
// other type is an error.
func floats(c hfConfig, k string, errp *error) []float64 {
	v, ok := c[k]
	if !ok || v == nil {
		return nil
	}
	l, isList := v.([]any)
	if !isList {
		setErr(errp, fmt.Errorf("config.json: %s is %s, want a list of numbers", k, kind(v)))
		return nil
	}
	out := make([]float64, 0, len(l))
	for i, x := range l {
		f, ok := x.(float64)
		if !ok {
			setErr(errp, fmt.Errorf("config.json: %s[%d] is %s, want a number", k, i, kind(x)))
			return nil
		}
		out = append(out, f)
	}
	return out
}

// ints returns a non-negative integer or a list of them at k (nil if
// absent or null); anything else is an error.
func ints(c hfConfig, k string, errp *error) []int {
	v, ok := c[k]
	if !ok || v == nil {
		return nil
	}
	one := func(x any, name string) (int, bool) {
		f, ok := x.(float64)
		if !ok || f != math.Trunc(f) || f < 0 || f > 1<<31 {
			what := kind(x)
			if ok {
				what = fmt.Sprint(f)
			}
			setErr(errp, fmt.Errorf("config.json: %s is %s, want a token id (a non-negative integer)", name, what))
			return 0, false
		}
		return int(f), true
	}
	if l, isList := v.([]any); isList {
		out := make([]int, 0, len(l))
		for i, x := range l {
			id, ok := one(x, fmt.Sprintf("%s[%d]", k, i))
			if !ok {
				return nil
			}
			out = append(out, id)
		}
		return out
	}
	if id, ok := one(v, k); ok {
		return []int{id}
	}
	return nil
}

// ropeRequired lists the keys each RoPE scaling type cannot do without
// (as transformers' rope validation requires them).
var ropeRequired = map[string][]string{
	"linear":   {"factor"},
	"dynamic":  {"factor"},
	"yarn":     {"factor"},
	"llama3":   {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
	"longrope": {"long_factor", "short_factor"},
}

// ropeScaling reads a rope_scaling (or rope_parameters) object whose keys
// carry the prefix rk; nil without scaling.
func ropeScaling(scal hfConfig, rk string) (*cmf.RopeScaling, error) {
	var err error
	key := func(k string) string { return rk + "." + k }
	typ := scal.str(key("rope_type"), &err)
	if typ == "" {
		typ = scal.str(key("type"), &err)
	}
	var rs *cmf.RopeScaling
	if typ != "" && typ != "default" {
		req, known := ropeRequired[typ]
		if !known {
			return nil, fmt.Errorf("config.json: %s: RoPE scaling type %q is not supported (linear, dynamic, yarn, llama3, longrope)", rk, typ)
		}
		for _, k := range req {
			if !scal.has(key(k)) {
				return nil, fmt.Errorf("config.json: %s of type %s lacks %s (required: %s)", rk, typ, key(k), strings.Join(req, ", "))
			}
		}
		rs = &cmf.RopeScaling{Type: typ}
		rs.Factor = scal.floatOr(key("factor"), 1, &err)
		rs.OriginalMaxPositionEmbeddings = scal.intOr(key("original_max_position_embeddings"), 0, &err)
		rs.LowFreqFactor = scal.floatOr(key("low_freq_factor"), 0, &err)
		rs.HighFreqFactor = scal.floatOr(key("high_freq_factor"), 0, &err)
		rs.BetaFast = scal.floatOr(key("beta_fast"), 0, &err)
		rs.BetaSlow = scal.floatOr(key("beta_slow"), 0, &err)
		rs.AttentionFactor = scal.floatOr(key("attention_factor"), 0, &err)
		rs.MScale = scal.floatOr(key("mscale"), 0, &err)
		rs.MScaleAllDim = scal.floatOr(key("mscale_all_dim"), 0, &err)
		if scal.has(key("truncate")) {
			b := scal.boolOr(key("truncate"), true, &err)
			rs.Truncate = &b
		}
		rs.LongFactor = floats(scal, key("long_factor"), &err)
		rs.ShortFactor = floats(scal, key("short_factor"), &err)
		if err != nil {
			return nil, err
		}
		if slices.Contains(req, "factor") && !(rs.Factor > 0) {
			return nil, fmt.Errorf("config.json: %s = %v: the scaling factor must be positive", key("factor"), rs.Factor)
		}
		if typ == "llama3" {
			if !(rs.LowFreqFactor > 0) || !(rs.HighFreqFactor > rs.LowFreqFactor) || rs.OriginalMaxPositionEmbeddings < 1 {
				return nil, fmt.Errorf("config.json: %s: llama3 scaling needs 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings ≥ 1 (have %v, %v, %d)", rk, rs.LowFreqFactor, rs.HighFreqFactor, rs.OriginalMaxPositionEmbeddings)
			}
		}
	}
	if scal.has(key("mrope_section")) {
		if rs == nil {
			rs = &cmf.RopeScaling{Type: "default"}
		}
		for _, f := range floats(scal, key("mrope_section"), &err) {
			rs.MRopeSection = append(rs.MRopeSection, int(f))
		}
		rs.MRopeInterleaved = scal.boolOr(key("mrope_interleaved"), false, &err)
	}
	return rs, err
}
