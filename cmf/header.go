package cmf

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
)

// Header is the JSON header of a CMF file: everything about the model that is
// not tensor data. Field names are normative (docs/cmf.md); readers ignore
// fields they do not know, so minor versions can add fields.
type Header struct {
	Format          string           `json:"format"`  // always "cmf"
	Version         int              `json:"version"` // major version the file follows (1)
	Arch            Arch             `json:"arch"`
	QuantType       string           `json:"quant_type"` // the default weight format, e.g. "q4tp"
	QuantPolicy     *QuantPolicy     `json:"quant_policy,omitempty"`
	Provenance      *Provenance      `json:"provenance,omitempty"`
	TokenizerConfig *TokenizerConfig `json:"tokenizer_config,omitempty"`
	SectionHashes   *SectionHashes   `json:"section_hashes,omitempty"`
	Skills          []Skill          `json:"skills"`
	Shard           *Shard           `json:"shard,omitempty"`
	Calibration     *Calibration     `json:"calibration,omitempty"`
}

// Arch describes the network: enough to build the forward pass without any
// file but this one. Zero-valued optional fields mean "not used".
type Arch struct {
	ArchName              string         `json:"arch_name"` // llama, qwen2, qwen3, qwen3_moe, qwen3_next, qwen3_5, qwen3_5_moe
	HiddenSize            int            `json:"hidden_size"`
	IntermediateSize      int            `json:"intermediate_size"` // dense FFN width (0 if every layer is MoE)
	NumLayers             int            `json:"num_layers"`
	NumAttentionHeads     int            `json:"num_attention_heads"`
	NumKVHeads            int            `json:"num_kv_heads"`
	HeadDim               int            `json:"head_dim"`
	VocabSize             int            `json:"vocab_size"`
	LayerTypes            []string       `json:"layer_types"` // per layer: full_attention, linear_attention, sliding_attention
	RMSNormEps            float64        `json:"rms_norm_eps"`
	NormStyle             string         `json:"norm_style"` // "standard": w·x̂; "one_plus": (1+w)·x̂ (Qwen3-Next, Qwen3.5)
	RopeTheta             float64        `json:"rope_theta"`
	RopeScaling           *RopeScaling   `json:"rope_scaling,omitempty"`
	TieWordEmbeddings     bool           `json:"tie_word_embeddings"`
	PartialRotaryFactor   float64        `json:"partial_rotary_factor"` // fraction of head_dim that is rotated (1 = all)
	MTP                   *MTP           `json:"mtp,omitempty"`
	MoE                   *MoE           `json:"moe,omitempty"`
	LinearCore            *LinearCore    `json:"linear_core,omitempty"`
	MaxPositionEmbeddings int            `json:"max_position_embeddings"`
	LinearConvKernelDim   int            `json:"linear_conv_kernel_dim,omitempty"`
	LinearNumKeyHeads     int            `json:"linear_num_key_heads,omitempty"`
	LinearNumValueHeads   int            `json:"linear_num_value_heads,omitempty"`
	LinearKeyHeadDim      int            `json:"linear_key_head_dim,omitempty"`
	LinearValueHeadDim    int            `json:"linear_value_head_dim,omitempty"`
	HiddenAct             string         `json:"hidden_act"`               // "silu"
	AttentionBias         bool           `json:"attention_bias"`           // q, k, v projections carry a bias (qwen2; llama attention_bias)
	AttentionOutBias      bool           `json:"attention_out_bias"`       // o_proj carries a bias (llama attention_bias)
	MLPBias               bool           `json:"mlp_bias"`                 // gate/up/down carry biases (llama mlp_bias)
	QKNorm                bool           `json:"qk_norm"`                  // RMSNorm over head_dim on q and k (qwen3 family)
	AttnOutputGate        bool           `json:"attn_output_gate"`         // q_proj also yields a sigmoid gate per head (qwen3_next, qwen3_5)
	SlidingWindow         int            `json:"sliding_window,omitempty"` // window of sliding_attention layers
	BOSTokenID            *int           `json:"bos_token_id,omitempty"`   // from the model config, informational
	EOSTokenIDs           []int          `json:"eos_token_ids,omitempty"`  // generation_config eos ids
	Extra                 map[string]any `json:"extra,omitempty"`          // source config keys kept for reference
}

// RopeScaling is rope_scaling / rope_parameters of a Hugging Face config.
type RopeScaling struct {
	Type                          string    `json:"type"` // linear, dynamic, yarn, llama3, longrope, freq_factors, default
	Factor                        float64   `json:"factor,omitempty"`
	OriginalMaxPositionEmbeddings int       `json:"original_max_position_embeddings,omitempty"`
	LowFreqFactor                 float64   `json:"low_freq_factor,omitempty"`
	HighFreqFactor                float64   `json:"high_freq_factor,omitempty"`
	BetaFast                      float64   `json:"beta_fast,omitempty"`
	BetaSlow                      float64   `json:"beta_slow,omitempty"`
	AttentionFactor               float64   `json:"attention_factor,omitempty"`
	MScale                        float64   `json:"mscale,omitempty"`
	MScaleAllDim                  float64   `json:"mscale_all_dim,omitempty"`
	Truncate                      *bool     `json:"truncate,omitempty"`
	LongFactor                    []float64 `json:"long_factor,omitempty"`
	ShortFactor                   []float64 `json:"short_factor,omitempty"`
	FreqFactors                   []float64 `json:"freq_factors,omitempty"` // type freq_factors: per-pair divisors of the inverse frequencies (GGUF rope_freqs)
	MRopeSection                  []int     `json:"mrope_section,omitempty"`
	MRopeInterleaved              bool      `json:"mrope_interleaved,omitempty"`
}

// MoE describes sparse mixture-of-experts FFN layers.
type MoE struct {
	NumExperts                   int   `json:"num_experts"`
	NumExpertsPerTok             int   `json:"num_experts_per_tok"`
	MoEIntermediateSize          int   `json:"moe_intermediate_size"`
	SharedExpertIntermediateSize int   `json:"shared_expert_intermediate_size,omitempty"` // 0: no shared expert
	NormTopKProb                 bool  `json:"norm_topk_prob"`
	DecoderSparseStep            int   `json:"decoder_sparse_step,omitempty"` // layer l is MoE iff (l+1)%step==0 (1 if 0)
	MLPOnlyLayers                []int `json:"mlp_only_layers,omitempty"`     // layers with a dense FFN instead
}

// MTP describes the multi-token-prediction head(s) carried as mtp.* tensors.
type MTP struct {
	NumLayers int `json:"num_layers"`
}

// LinearCore describes the linear-attention mixer of linear_attention layers.
type LinearCore struct {
	Kind       string `json:"kind"`       // "gated_deltanet"
	Projection string `json:"projection"` // "qkvz_grouped" (qwen3_next) or "split" (qwen3_5)
}

// QuantPolicy records how the converter chose each tensor's format.
type QuantPolicy struct {
	Default string       `json:"default"`
	Rules   []PolicyRule `json:"rules"`
}

// PolicyRule maps tensors whose name matches Pattern (a Go regexp) to DType.
type PolicyRule struct {
	Pattern string `json:"pattern"`
	DType   string `json:"dtype"`
	Reason  string `json:"reason,omitempty"`
}

// Provenance says where the weights came from.
type Provenance struct {
	Source           string      `json:"source"`        // path or name given to the converter
	SourceFormat     string      `json:"source_format"` // hf_safetensors, gguf, synthetic
	Inputs           []InputFile `json:"inputs,omitempty"`
	Converter        string      `json:"converter"` // "cortiq"
	ConverterVersion string      `json:"converter_version"`
	CreatedAt        time.Time   `json:"created_at"`
	Notes            string      `json:"notes,omitempty"`
}

// InputFile is one file the converter read, with its digest.
type InputFile struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// TokenizerConfig carries the tokenizer: small fields inline, the vocabulary
// in a blob tensor (dtype u8) of the directory named by Blob.
type TokenizerConfig struct {
	Kind          string            `json:"kind"`          // "hf_json" (tokenizer.json), "sentencepiece", "gguf_bpe"
	Blob          string            `json:"blob"`          // directory entry with the tokenizer data
	Pre           string            `json:"pre,omitempty"` // GGUF tokenizer.ggml.pre
	ChatTemplate  string            `json:"chat_template,omitempty"`
	ChatTemplates map[string]string `json:"chat_templates,omitempty"` // named extra templates (e.g. tool_use)
	BOSToken      string            `json:"bos_token,omitempty"`
	EOSToken      string            `json:"eos_token,omitempty"`
	PadToken      string            `json:"pad_token,omitempty"`
	BOSTokenID    *int              `json:"bos_token_id,omitempty"`
	EOSTokenIDs   []int             `json:"eos_token_ids,omitempty"`
	PadTokenID    *int              `json:"pad_token_id,omitempty"`
	AddBOS        bool              `json:"add_bos"`
	AddEOS        bool              `json:"add_eos"`
}

// SectionHashes holds digests of the data sections, one per shard. The
// header's and the directory's own digests sit in each file's preamble.
type SectionHashes struct {
	Algo string   `json:"algo"` // "xxh3-64"
	Data []string `json:"data"` // per shard, 16 lowercase hex digits
}

// Skill is a named bundle carried with a model: a system-prompt preset, a
// sampling preset, or adapter tensors stored in the directory.
type Skill struct {
	Name         string         `json:"name"`
	Kind         string         `json:"kind"` // system_prompt, sampling_preset, adapter
	Description  string         `json:"description,omitempty"`
	SystemPrompt string         `json:"system_prompt,omitempty"`
	Tensors      []string       `json:"tensors,omitempty"` // adapter tensors (directory names)
	Params       map[string]any `json:"params,omitempty"`  // e.g. temperature, adapter rank/alpha
}

// Shard places a file in a set of files that together hold one model.
type Shard struct {
	Index int      `json:"index"` // 0-based
	Count int      `json:"count"`
	SetID string   `json:"set_id"` // identical in every file of the set
	Files []string `json:"files"`  // file names of all shards, by index, relative to this file's folder
}

// Calibration records the activation statistics a converter used.
type Calibration struct {
	Method    string            `json:"method"`              // e.g. "rms"
	Dataset   string            `json:"dataset,omitempty"`   // text the statistics came from
	Samples   int               `json:"samples,omitempty"`   // sequences
	Tokens    int               `json:"tokens,omitempty"`    // tokens seen
	Statistic string            `json:"statistic,omitempty"` // what each vector holds: per-input-column RMS
	Tensors   map[string]string `json:"tensors,omitempty"`   // weight name → f32 [cols] statistics tensor in the directory
}

const maxHeaderBytes = 64 << 20

// ErrCorrupt marks every error about a malformed file.
var ErrCorrupt = errors.New("cmf: corrupt file")

func parseHeader(b []byte) (*Header, error) {
	var h Header
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("%w: header JSON: %v", ErrCorrupt, err)
	}
	if h.Format != "cmf" {
		return nil, fmt.Errorf("%w: header format is %q, want \"cmf\"", ErrCorrupt, h.Format)
	}
	return &h, nil
}

// Validate checks an architecture for values no model can have.
func (a *Arch) Validate() error {
	bad := func(f string, args ...any) error { return fmt.Errorf("cmf: arch: "+f, args...) }
	if a.ArchName == "" {
		return bad("arch_name is empty")
	}
	for _, v := range []struct {
		n string
		x int
	}{{"hidden_size", a.HiddenSize}, {"num_layers", a.NumLayers}, {"vocab_size", a.VocabSize}} {
		if v.x <= 0 || v.x > 1<<24 {
			return bad("%s = %d", v.n, v.x)
		}
	}
	if a.NumAttentionHeads < 0 || a.NumKVHeads < 0 || a.HeadDim < 0 || a.IntermediateSize < 0 {
		return bad("negative dimension")
	}
	if a.NumLayers > 4096 || a.NumAttentionHeads > 4096 || a.NumKVHeads > 4096 || a.HeadDim > 1<<16 || a.IntermediateSize > 1<<24 {
		return bad("dimensions beyond any supported model (layers %d, heads %d/%d, head_dim %d, ffn %d)", a.NumLayers, a.NumAttentionHeads, a.NumKVHeads, a.HeadDim, a.IntermediateSize)
	}
	for _, f := range []struct {
		n string
		v float64
	}{{"rms_norm_eps", a.RMSNormEps}, {"rope_theta", a.RopeTheta}, {"partial_rotary_factor", a.PartialRotaryFactor}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			return bad("%s is %v", f.n, f.v)
		}
	}
	if r := a.RopeScaling; r != nil {
		for _, v := range append([]float64{r.Factor, r.LowFreqFactor, r.HighFreqFactor, r.BetaFast, r.BetaSlow, r.AttentionFactor, r.MScale, r.MScaleAllDim}, r.FreqFactors...) {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return bad("rope_scaling has a non-finite value")
			}
		}
	}
	if a.NumKVHeads > 0 && a.NumAttentionHeads%a.NumKVHeads != 0 {
		return bad("num_attention_heads %d not a multiple of num_kv_heads %d", a.NumAttentionHeads, a.NumKVHeads)
	}
	if len(a.LayerTypes) != 0 && len(a.LayerTypes) != a.NumLayers {
		return bad("%d layer_types for %d layers", len(a.LayerTypes), a.NumLayers)
	}
	for i, t := range a.LayerTypes {
		switch t {
		case "full_attention", "linear_attention", "sliding_attention":
		default:
			return bad("layer %d: unknown layer type %q", i, t)
		}
	}
	switch a.NormStyle {
	case "", "standard", "one_plus":
	default:
		return bad("unknown norm_style %q", a.NormStyle)
	}
	for _, v := range []int{a.LinearConvKernelDim, a.LinearNumKeyHeads, a.LinearNumValueHeads, a.LinearKeyHeadDim, a.LinearValueHeadDim} {
		if v < 0 || v > 1<<16 {
			return bad("linear attention dimension %d out of range", v)
		}
	}
	if a.PartialRotaryFactor < 0 || a.PartialRotaryFactor > 1 {
		return bad("partial_rotary_factor %g outside [0,1]", a.PartialRotaryFactor)
	}
	if m := a.MoE; m != nil && int64(a.NumLayers)*int64(3*m.NumExperts+32) > maxTensors {
		return bad("%d layers of %d experts exceed %d tensors", a.NumLayers, m.NumExperts, maxTensors)
	}
	if m := a.MoE; m != nil {
		if m.NumExperts <= 0 || m.NumExperts > 1<<16 || m.NumExpertsPerTok <= 0 || m.NumExpertsPerTok > m.NumExperts || m.MoEIntermediateSize < 0 || m.MoEIntermediateSize > 1<<24 || m.SharedExpertIntermediateSize < 0 || m.SharedExpertIntermediateSize > 1<<24 {
			return bad("moe: %d experts, %d per token", m.NumExperts, m.NumExpertsPerTok)
		}
	}
	return nil
}
