package convert

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"strings"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/gguf"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
)

// ggufArchs maps GGUF general.architecture to cortiq architecture names.
var ggufArchs = map[string]string{"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe",
	"qwen3next": "qwen3_next", "qwen35": "qwen3_5", "qwen35moe": "qwen3_5_moe"} // hybrids: gguf_hybrid.go

// ggufNames maps llama.cpp tensor names to Hugging Face names (per layer
// names take "blk.N." → "model.layers.N.").
var ggufNames = map[string]string{
	"attn_norm.weight":    "input_layernorm.weight",
	"attn_q.weight":       "self_attn.q_proj.weight",
	"attn_k.weight":       "self_attn.k_proj.weight",
	"attn_v.weight":       "self_attn.v_proj.weight",
	"attn_output.weight":  "self_attn.o_proj.weight",
	"attn_q.bias":         "self_attn.q_proj.bias",
	"attn_k.bias":         "self_attn.k_proj.bias",
	"attn_v.bias":         "self_attn.v_proj.bias",
	"attn_output.bias":    "self_attn.o_proj.bias",
	"attn_q_norm.weight":  "self_attn.q_norm.weight",
	"attn_k_norm.weight":  "self_attn.k_norm.weight",
	"ffn_norm.weight":     "post_attention_layernorm.weight",
	"ffn_gate.weight":     "mlp.gate_proj.weight",
	"ffn_up.weight":       "mlp.up_proj.weight",
	"ffn_down.weight":     "mlp.down_proj.weight",
	"ffn_gate_inp.weight": "mlp.gate.weight",
}

var reBlk = regexp.MustCompile(`^blk\.(\d+)\.(.+)$`)

// FromGGUF converts a GGUF file to CMF: metadata to cmf.Arch, tensors
// dequantized (F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q5_*/Q*_K...) and re-encoded,
// llama's permuted Q/K rows restored to Hugging Face order, stacked experts
// split per expert, and the GGUF vocabulary carried as the tokenizer.
func FromGGUF(ctx context.Context, path, out string, opt Options) (*Result, error) {
	if err := checkOutput(out); err != nil {
		return nil, err
	}
	f, err := gguf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}
	defer f.Close()
	ga := f.Architecture()
	name, ok := ggufArchs[ga]
	if !ok {
		return nil, fmt.Errorf("convert: %s: GGUF architecture %q is not supported for import (supported: llama, qwen2, qwen3, qwen3moe, qwen3next, qwen35, qwen35moe; convert other architectures from their Hugging Face checkpoint)", path, ga)
	}
	arch, err := archFromGGUF(f, ga, name)
	if err != nil {
		return nil, fmt.Errorf("convert: %s: %w", path, err)
	}

	src := map[string]srcTensor{}
	tensors := f.Tensors()
	if isHybridArch(name) { // the Gated-DeltaNet hybrids map their own tensors
		if err := hybridArchFromGGUF(f, ga, &arch); err != nil {
			return nil, fmt.Errorf("convert: %s: %w", path, err)
		}
		if src, err = hybridTensors(f, &arch); err != nil {
			return nil, fmt.Errorf("convert: %s: %w", path, err)
		}
		tensors = nil
	}
	for _, ti := range tensors {
		ti := ti
		hf, err := ggufToHF(ti.Name)
		if err != nil {
			return nil, fmt.Errorf("convert: %s: %w", path, err)
		}
		if hf == "" {
			continue
		}
		if strings.HasSuffix(hf, "_exps.weight") {
			if err := addGGUFExperts(src, f, ti, hf); err != nil {
				return nil, fmt.Errorf("convert: %s: %w", path, err)
			}
			continue
		}
		heads := 0
		if name == "llama" {
			switch {
			case strings.HasSuffix(hf, "self_attn.q_proj.weight"), strings.HasSuffix(hf, "self_attn.q_proj.bias"):
				heads = arch.NumAttentionHeads
			case strings.HasSuffix(hf, "self_attn.k_proj.weight"), strings.HasSuffix(hf, "self_attn.k_proj.bias"):
				heads = arch.NumKVHeads
			}
		}
		src[hf] = ggufTensor(f, ti, hf, ti.Shape(), heads)
	}
	if _, ok := src["lm_head.weight"]; !ok {
		arch.TieWordEmbeddings = true
	}
	if e, ok := src["model.embed_tokens.weight"]; ok && arch.VocabSize == 0 {
		arch.VocabSize = e.shape[0]
	}
	if err := arch.Validate(); err != nil {
		return nil, fmt.Errorf("convert: %s: %w", path, err)
	}
	want, err := model.Tensors(&arch)
	if err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}
	want = append(want, model.MTPTensors(&arch)...)
	var ts []srcTensor
	used := map[string]bool{}
	for _, w := range want {
		s, ok := src[w.Name]
		if !ok {
			return nil, fmt.Errorf("convert: %s: missing tensor %s (shape %v) required by %s", path, w.Name, w.Shape, arch.ArchName)
		}
		if !equalShape(s.shape, w.Shape) {
			return nil, fmt.Errorf("convert: %s: tensor %s has shape %v, metadata implies %v", path, w.Name, s.shape, w.Shape)
		}
		used[w.Name] = true
		ts = append(ts, s)
	}
	for n := range src {
		if !used[n] {
			return nil, fmt.Errorf("convert: %s: tensor %s is not part of the %s layout", path, n, arch.ArchName)
		}
	}
	hdr := &cmf.Header{Arch: arch}
	var blobs []blob
	tc, tb, err := ggufTokenizer(f, &arch)
	if err != nil {
		return nil, fmt.Errorf("convert: %s: %w", path, err)
	}
	if tc != nil {
		if err := checkTokenizer(tc, tb, &arch, "the GGUF vocabulary"); err != nil {
			return nil, fmt.Errorf("convert: %s: %w", path, err)
		}
		hdr.TokenizerConfig = tc
		blobs = append(blobs, blob{tc.Blob, tb})
	} else {
		slog.Warn("GGUF file carries no tokenizer: the model will take token ids only", "file", path)
	}
	if hdr.Provenance, err = provenance(path, "gguf", []string{path}); err != nil {
		return nil, err
	}
	return write(ctx, out, hdr, ts, blobs, opt)
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// ggufToHF maps a llama.cpp tensor name; "" means skip.
func ggufToHF(n string) (string, error) {
	switch n {
	case "token_embd.weight":
		return "model.embed_tokens.weight", nil
	case "output_norm.weight":
		return "model.norm.weight", nil
	case "output.weight":
		return "lm_head.weight", nil
	case "rope_freqs.weight":
		return "", nil // handled through the metadata (see archFromGGUF)
	}
	m := reBlk.FindStringSubmatch(n)
	if m == nil {
		return "", fmt.Errorf("unknown tensor %q", n)
	}
	p := "model.layers." + m[1] + "."
	if hf, ok := ggufNames[m[2]]; ok {
		return p + hf, nil
	}
	switch m[2] {
	case "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight":
		return p + m[2], nil
	}
	return "", fmt.Errorf("unknown tensor %q", n)
}

var ggufQD = map[gguf.Type]quant.DType{gguf.TypeF32: quant.F32, gguf.TypeF16: quant.F16, gguf.TypeBF16: quant.BF16}

func ggufTensor(f *gguf.File, ti gguf.TensorInfo, hf string, shape []int, permHeads int) srcTensor {
	name := ti.Name
	qd, plain := ggufQD[ti.Type]
	rows, cols, _ := quant.Matrix(shape)
	var loadRows func(r0, r1 int, dst []float32) error
	if permHeads == 0 && len(shape) >= 2 && rows > 0 && ti.Size%int64(rows) == 0 {
		rb := ti.Size / int64(rows)
		loadRows = func(r0, r1 int, dst []float32) error {
			return gguf.Dequantize(ti.Type, f.Raw(name)[int64(r0)*rb:int64(r1)*rb], dst)
		}
	}
	return srcTensor{
		release:  func() { f.Release(name) },
		loadRows: loadRows,
		name:     hf, shape: shape, inBytes: ti.Size,
		raw: func() ([]byte, quant.DType, bool) {
			if !plain || permHeads > 0 {
				return nil, 0, false
			}
			return f.Raw(name), qd, true
		},
		load: func(dst []float32) error {
			if err := gguf.Dequantize(ti.Type, f.Raw(name), dst); err != nil {
				return fmt.Errorf("tensor %s: %w", name, err)
			}
			if permHeads > 0 {
				return gguf.UnpermuteQK(dst, rows, cols, permHeads)
			}
			return nil
		},
	}
}

// addGGUFExperts splits a stacked expert tensor [E, R, C] (ggml ne =
// [C, R, E]) into per-expert [R, C] tensors. Each expert's rows are whole
// quantization blocks, so its bytes are a contiguous slice.
func addGGUFExperts(src map[string]srcTensor, f *gguf.File, ti gguf.TensorInfo, hf string) error {
	sh := ti.Shape()
	if len(sh) != 3 {
		return fmt.Errorf("expert tensor %s has shape %v, want 3 dimensions", ti.Name, sh)
	}
	E, R, C := sh[0], sh[1], sh[2]
	if E <= 0 || R <= 0 || C <= 0 {
		return fmt.Errorf("expert tensor %s has an empty dimension %v", ti.Name, sh)
	}
	per := ti.Size / int64(E)
	if per*int64(E) != ti.Size {
		return fmt.Errorf("expert tensor %s: %d bytes do not split over %d experts", ti.Name, ti.Size, E)
	}
	kind := strings.TrimSuffix(hf[strings.LastIndex(hf, ".ffn_")+5:], "_exps.weight") // gate, up, down
	prefix := hf[:strings.LastIndex(hf, ".ffn_")]
	qd, plain := ggufQD[ti.Type]
	for e := 0; e < E; e++ {
		e := e
		get := func() []byte { b := f.Raw(ti.Name); return b[int64(e)*per : int64(e+1)*per] }
		n := fmt.Sprintf("%s.mlp.experts.%d.%s_proj.weight", prefix, e, kind)
		if _, dup := src[n]; dup {
			return fmt.Errorf("tensor %s given twice (stacked and per expert)", n)
		}
		var release func()
		if e == E-1 {
			release = func() { f.Release(ti.Name) }
		}
		src[n] = srcTensor{
			release: release,
			name:    n, shape: []int{R, C}, inBytes: per,
			raw: func() ([]byte, quant.DType, bool) { return get(), qd, plain },
			load: func(dst []float32) error {
				if err := gguf.Dequantize(ti.Type, get(), dst); err != nil {
					return fmt.Errorf("tensor %s expert %d: %w", ti.Name, e, err)
				}
				return nil
			},
		}
	}
	return nil
}

func archFromGGUF(f *gguf.File, ga, name string) (cmf.Arch, error) {
	u := func(k string, def int) int {
		if v, ok := f.KV(ga + "." + k); ok {
			if x, ok := v.Uint(); ok {
				return int(x)
			}
			if x, ok := v.Int(); ok {
				return int(x)
			}
		}
		return def
	}
	fl := func(k string, def float64) float64 {
		if v, ok := f.KV(ga + "." + k); ok {
			if x, ok := v.Float(); ok {
				return x
			}
		}
		return def
	}
	a := cmf.Arch{ArchName: name, HiddenAct: "silu", NormStyle: "standard", PartialRotaryFactor: 1}
	a.HiddenSize = u("embedding_length", 0)
	a.NumLayers = u("block_count", 0)
	a.IntermediateSize = u("feed_forward_length", 0)
	a.NumAttentionHeads = u("attention.head_count", 0)
	a.NumKVHeads = u("attention.head_count_kv", a.NumAttentionHeads)
	if a.NumAttentionHeads > 0 {
		a.HeadDim = u("attention.key_length", a.HiddenSize/a.NumAttentionHeads)
	}
	a.VocabSize = u("vocab_size", 0)
	a.RMSNormEps = fl("attention.layer_norm_rms_epsilon", 1e-6)
	a.RopeTheta = fl("rope.freq_base", 10000)
	a.MaxPositionEmbeddings = u("context_length", 0)
	if err := boundArch(&a); err != nil {
		return a, err
	}
	if rd := u("rope.dimension_count", a.HeadDim); a.HeadDim > 0 && rd != a.HeadDim {
		a.PartialRotaryFactor = float64(rd) / float64(a.HeadDim)
	}
	if v, ok := f.KV(ga + ".rope.scaling.type"); ok {
		if s, _ := v.String(); s != "" && s != "none" {
			a.RopeScaling = &cmf.RopeScaling{Type: s, Factor: fl("rope.scaling.factor", 1), OriginalMaxPositionEmbeddings: u("rope.scaling.original_context_length", 0)}
			if s == "yarn" {
				a.RopeScaling.BetaFast, a.RopeScaling.BetaSlow = fl("rope.scaling.yarn_beta_fast", 32), fl("rope.scaling.yarn_beta_slow", 1)
			}
		}
	}
	if ti, ok := f.Tensor("rope_freqs.weight"); ok {
		// Llama-3.1-style GGUFs store llama3 scaling as the per-pair
		// divisors of the inverse frequencies, without the parameters that
		// made them: carry the divisors themselves.
		ff, err := f.Float32("rope_freqs.weight")
		if err != nil || len(ff) == 0 || len(ff) > 1<<15 {
			return a, fmt.Errorf("rope_freqs.weight (%v): unreadable: %v", ti.Shape(), err)
		}
		rs := &cmf.RopeScaling{Type: "freq_factors"}
		for _, v := range ff {
			rs.FreqFactors = append(rs.FreqFactors, float64(v))
		}
		a.RopeScaling = rs
	}
	for l := 0; l < a.NumLayers; l++ {
		a.LayerTypes = append(a.LayerTypes, "full_attention")
	}
	switch name {
	case "llama":
	case "qwen2":
		a.AttentionBias = true
	case "qwen3", "qwen3_moe":
		a.QKNorm = true
	}
	if name == "qwen3_moe" {
		a.MoE = &cmf.MoE{NumExperts: u("expert_count", 0), NumExpertsPerTok: u("expert_used_count", 0),
			MoEIntermediateSize: u("expert_feed_forward_length", 0), NormTopKProb: true, DecoderSparseStep: 1}
	}
	for _, d := range []struct {
		key string
		v   int
	}{{"embedding_length", a.HiddenSize}, {"block_count", a.NumLayers}, {"attention.head_count", a.NumAttentionHeads}, {"attention.head_count_kv", a.NumKVHeads}} {
		if d.v > 0 {
			continue
		}
		k := ga + "." + d.key
		v, ok := f.KV(k)
		switch {
		case !ok:
			return a, fmt.Errorf("GGUF metadata lacks %s", k)
		case d.v == 0 && isGGUFInt(v):
			return a, fmt.Errorf("GGUF metadata: %s is 0; it must be at least 1", k)
		default:
			return a, fmt.Errorf("GGUF metadata: %s is not a single positive integer (per-layer values are not supported)", k)
		}
	}
	if !(a.RopeTheta > 0) {
		return a, fmt.Errorf("GGUF metadata: %s.rope.freq_base = %v: the RoPE base must be positive", ga, a.RopeTheta)
	}
	return a, nil
}

// ggufVocab is the tokenizer blob of a GGUF import.
type ggufVocab struct {
	Model  string    `json:"model"` // gpt2 or llama
	Pre    string    `json:"pre,omitempty"`
	Tokens []string  `json:"tokens"`
	Merges []string  `json:"merges,omitempty"`
	Scores []float32 `json:"scores,omitempty"`
	Types  []int32   `json:"types,omitempty"`
}

func ggufTokenizer(f *gguf.File, arch *cmf.Arch) (*cmf.TokenizerConfig, []byte, error) {
	mv, ok := f.KV("tokenizer.ggml.model")
	if !ok {
		return nil, nil, nil
	}
	v := ggufVocab{}
	v.Model, _ = mv.String()
	if p, ok := f.KV("tokenizer.ggml.pre"); ok {
		v.Pre, _ = p.String()
	}
	if t, ok := f.KV("tokenizer.ggml.tokens"); ok {
		v.Tokens, _ = t.Strings()
	}
	if len(v.Tokens) == 0 {
		return nil, nil, fmt.Errorf("tokenizer.ggml.tokens is missing or empty")
	}
	if m, ok := f.KV("tokenizer.ggml.merges"); ok {
		v.Merges, _ = m.Strings()
	}
	if s, ok := f.KV("tokenizer.ggml.scores"); ok {
		v.Scores, _ = s.Float32s()
	}
	if t, ok := f.KV("tokenizer.ggml.token_type"); ok {
		v.Types, _ = t.Int32s()
	}
	tc := &cmf.TokenizerConfig{Blob: "tokenizer.gguf.json", Pre: v.Pre}
	switch v.Model {
	case "gpt2":
		tc.Kind = "gguf_bpe"
	case "llama":
		tc.Kind = "sentencepiece"
		tc.AddBOS = true
	default:
		return nil, nil, fmt.Errorf("GGUF tokenizer model %q is not supported (gpt2, llama)", v.Model)
	}
	id := func(k string) *int {
		if x, ok := f.KV(k); ok {
			if n, ok := x.Uint(); ok && n < uint64(len(v.Tokens)) {
				i := int(n)
				return &i
			}
			slog.Warn("GGUF special-token id out of the vocabulary: ignored", "key", k, "vocab", len(v.Tokens))
		}
		return nil
	}
	tc.BOSTokenID, tc.PadTokenID = id("tokenizer.ggml.bos_token_id"), id("tokenizer.ggml.padding_token_id")
	if tc.BOSTokenID != nil {
		tc.BOSToken = v.Tokens[*tc.BOSTokenID]
	}
	if e := id("tokenizer.ggml.eos_token_id"); e != nil {
		tc.EOSTokenIDs = []int{*e}
		tc.EOSToken = v.Tokens[*e]
	}
	if e := id("tokenizer.ggml.eot_token_id"); e != nil && (len(tc.EOSTokenIDs) == 0 || tc.EOSTokenIDs[0] != *e) {
		tc.EOSTokenIDs = append(tc.EOSTokenIDs, *e)
	}
	if b, ok := f.KV("tokenizer.ggml.add_bos_token"); ok {
		tc.AddBOS, _ = b.Bool()
	}
	if b, ok := f.KV("tokenizer.ggml.add_eos_token"); ok {
		tc.AddEOS, _ = b.Bool()
	}
	if t, ok := f.KV("tokenizer.chat_template"); ok {
		tc.ChatTemplate, _ = t.String()
	}
	if tc.PadTokenID != nil {
		tc.PadToken = v.Tokens[*tc.PadTokenID]
	}
	arch.EOSTokenIDs = tc.EOSTokenIDs
	arch.BOSTokenID = tc.BOSTokenID
	b, err := json.Marshal(&v)
	return tc, b, err
}

// isGGUFInt reports whether a metadata value is one integer.
func isGGUFInt(v gguf.Value) bool {
	if _, ok := v.Uint(); ok {
		return true
	}
	_, ok := v.Int()
	return ok
}
