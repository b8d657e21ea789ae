package convert

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/safetensors"
)

var (
	reSkip       = regexp.MustCompile(`^(model\.visual\.|visual\.|model\.vision_tower\.|vision_tower\.|model\.multi_modal_projector\.)|rotary_emb\.inv_freq$`)
	reFusedGU    = regexp.MustCompile(`^(.*\.mlp\.experts)\.gate_up_proj(\.weight)?$`)
	reFusedDown  = regexp.MustCompile(`^(.*\.mlp\.experts)\.down_proj(\.weight)?$`)
	stDTypes     = map[safetensors.DType]quant.DType{safetensors.F32: quant.F32, safetensors.F16: quant.F16, safetensors.BF16: quant.BF16}
	errNoWeights = errors.New("no model.safetensors or model.safetensors.index.json")
)

// canonical maps a checkpoint tensor name to the CMF name ("" to skip).
func canonical(name string) string {
	if reSkip.MatchString(name) {
		return ""
	}
	if rest, ok := strings.CutPrefix(name, "model.language_model."); ok {
		return "model." + rest
	}
	if rest, ok := strings.CutPrefix(name, "language_model.model."); ok {
		return "model." + rest
	}
	if rest, ok := strings.CutPrefix(name, "language_model."); ok {
		return rest
	}
	return name
}

// FromHF converts a Hugging Face model directory to CMF at out.
func FromHF(ctx context.Context, dir, out string, opt Options) (*Result, error) {
	if err := checkOutput(out); err != nil {
		return nil, err
	}
	var top, gen hfConfig
	if err := readJSON(filepath.Join(dir, "config.json"), &top); err != nil {
		return nil, fmt.Errorf("convert: %s: %w", dir, err)
	}
	if err := readJSON(filepath.Join(dir, "generation_config.json"), &gen); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("convert: %w", err)
	}
	arch, err := archFromHF(top, gen)
	if err != nil {
		return nil, fmt.Errorf("convert: %s: %w", dir, err)
	}
	st, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}
	defer st.Close()

	// Index the checkpoint under canonical names; fused experts become
	// per-expert slices.
	src := map[string]srcTensor{}
	var skipped, unknown []string
	inputs := map[string]bool{}
	for _, name := range st.Tensors() {
		info, _ := st.Tensor(name)
		inputs[info.Path] = true
		cn := canonical(name)
		if cn == "" {
			skipped = append(skipped, name)
			continue
		}
		if m := reFusedGU.FindStringSubmatch(cn); m != nil {
			if err := addFused(src, st, info, m[1], true); err != nil {
				return nil, fmt.Errorf("convert: %w", err)
			}
			continue
		}
		if m := reFusedDown.FindStringSubmatch(cn); m != nil {
			if err := addFused(src, st, info, m[1], false); err != nil {
				return nil, fmt.Errorf("convert: %w", err)
			}
			continue
		}
		if _, dup := src[cn]; dup {
			return nil, fmt.Errorf("convert: tensor %s appears twice (as %s)", cn, name)
		}
		src[cn] = stTensor(st, info, cn)
	}

	// MTP head: kept when the checkpoint has it.
	hasMTP := false
	for n := range src {
		if strings.HasPrefix(n, "mtp.") {
			hasMTP = true
			break
		}
	}
	if hasMTP {
		arch.MTP = &cmf.MTP{NumLayers: max(mtpLayers(top), 1)}
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
			return nil, fmt.Errorf("convert: %s: missing tensor %s (shape %v) required by %s", dir, w.Name, w.Shape, arch.ArchName)
		}
		if !slices.Equal(s.shape, w.Shape) {
			return nil, fmt.Errorf("convert: %s: tensor %s has shape %v, %s config implies %v", dir, w.Name, s.shape, arch.ArchName, w.Shape)
		}
		if s.check != nil {
			if err := s.check(); err != nil { // fail before writing anything
				return nil, fmt.Errorf("convert: %s: %w", dir, err)
			}
		}
		used[w.Name] = true
		ts = append(ts, s)
	}
	for n := range src {
		if used[n] {
			continue
		}
		if n == "lm_head.weight" && arch.TieWordEmbeddings {
			continue // a tied head saved anyway: the embedding serves
		}
		if strings.HasPrefix(n, "mtp.") {
			unknown = append(unknown, n)
			continue
		}
		unknown = append(unknown, n)
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("convert: %s: %d tensors the %s layout does not use, e.g. %v (config and weights disagree?)", dir, len(unknown), arch.ArchName, unknown[:min(5, len(unknown))])
	}
	if len(skipped) > 0 {
		slog.Info("skipping tensors outside the text model", "count", len(skipped), "first", skipped[0])
	}

	hdr := &cmf.Header{Arch: arch}
	tok, tokBlob, err := hfTokenizer(dir, &arch)
	if err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}
	if tok != nil {
		if err := checkTokenizer(tok, tokBlob, &arch, "tokenizer.json"); err != nil {
			return nil, fmt.Errorf("convert: %s: %w", dir, err)
		}
	}
	var blobs []blob
	if tok != nil {
		hdr.TokenizerConfig = tok
		blobs = append(blobs, blob{tok.Blob, tokBlob})
	} else {
		slog.Warn("no tokenizer.json: the model will take token ids only", "dir", dir)
	}
	files := []string{}
	for f := range inputs {
		files = append(files, f)
	}
	for _, f := range []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "model.safetensors.index.json"} {
		if p := filepath.Join(dir, f); fileExists(p) {
			files = append(files, p)
		}
	}
	sort.Strings(files)
	if hdr.Provenance, err = provenance(dir, "hf_safetensors", files); err != nil {
		return nil, err
	}
	return write(ctx, out, hdr, ts, blobs, opt)
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func stTensor(st *safetensors.File, info safetensors.Info, cn string) srcTensor {
	name := info.Name
	qd, decodable := stDTypes[info.DType]
	return srcTensor{
		check: func() error {
			if !decodable {
				return fmt.Errorf("tensor %s has dtype %s; only F32, F16 and BF16 checkpoints are supported", name, info.DType)
			}
			return nil
		},
		name: cn, shape: info.Shape, inBytes: info.Size,
		raw: func() ([]byte, quant.DType, bool) {
			if !decodable {
				return nil, 0, false
			}
			return st.Raw(name), qd, true
		},
		load: func(dst []float32) error {
			if !decodable {
				return fmt.Errorf("tensor %s has dtype %s; only F32, F16 and BF16 checkpoints are supported", name, info.DType)
			}
			return decodeRaw(qd, st.Raw(name), dst)
		},
		loadRows: rowLoader(decodable, qd, info.Shape, func() []byte { return st.Raw(name) }),
		release:  func() { st.Release(name) },
	}
}

// rowLoader decodes rows [r0, r1) of a row-major f32/f16/bf16 tensor.
func rowLoader(ok bool, qd quant.DType, shape []int, raw func() []byte) func(r0, r1 int, dst []float32) error {
	if !ok || len(shape) < 2 {
		return nil
	}
	_, cols, _ := quant.Matrix(shape)
	es := 4
	if qd != quant.F32 {
		es = 2
	}
	return func(r0, r1 int, dst []float32) error {
		return decodeRaw(qd, raw()[r0*cols*es:r1*cols*es], dst)
	}
}

// addFused splits a fused expert tensor into per-expert tensors:
// gate_up_proj [E, 2I, H] → experts.E.gate_proj [I,H] (first I rows) and
// up_proj [I,H]; down_proj [E, H, I] → experts.E.down_proj [H, I].
func addFused(src map[string]srcTensor, st *safetensors.File, info safetensors.Info, prefix string, gateUp bool) error {
	if len(info.Shape) != 3 {
		return fmt.Errorf("fused expert tensor %s has shape %v, want 3 dimensions", info.Name, info.Shape)
	}
	qd, ok := stDTypes[info.DType]
	if !ok {
		return fmt.Errorf("tensor %s has dtype %s; only F32, F16 and BF16 checkpoints are supported", info.Name, info.DType)
	}
	E, R, C := info.Shape[0], info.Shape[1], info.Shape[2]
	if E <= 0 || R <= 0 || C <= 0 {
		return fmt.Errorf("fused expert tensor %s has an empty dimension %v", info.Name, info.Shape)
	}
	es := int64(2)
	if qd == quant.F32 {
		es = 4
	}
	slice := func(e, r0, r1 int) func() []byte {
		return func() []byte {
			b := st.Raw(info.Name)
			return b[(int64(e*R+r0))*int64(C)*es : (int64(e*R+r1))*int64(C)*es]
		}
	}
	var dupErr error
	mk := func(name string, get func() []byte, rows int) {
		if _, dup := src[name]; dup {
			dupErr = fmt.Errorf("tensor %s given twice (fused and per expert)", name)
		}
		var release func()
		if strings.HasSuffix(name, fmt.Sprintf(".%d.up_proj.weight", E-1)) || strings.HasSuffix(name, fmt.Sprintf(".%d.down_proj.weight", E-1)) {
			release = func() { st.Release(info.Name) }
		}
		src[name] = srcTensor{
			release: release,
			name:    name, shape: []int{rows, C}, inBytes: int64(rows*C) * es,
			raw:      func() ([]byte, quant.DType, bool) { return get(), qd, true },
			load:     func(dst []float32) error { return decodeRaw(qd, get(), dst) },
			loadRows: rowLoader(true, qd, []int{rows, C}, get),
		}
	}
	for e := 0; e < E; e++ {
		p := fmt.Sprintf("%s.%d.", prefix, e)
		if gateUp {
			if R%2 != 0 {
				return fmt.Errorf("fused gate_up_proj %s has odd row count %d", info.Name, R)
			}
			mk(p+"gate_proj.weight", slice(e, 0, R/2), R/2)
			mk(p+"up_proj.weight", slice(e, R/2, R), R/2)
		} else {
			mk(p+"down_proj.weight", slice(e, 0, R), R)
		}
	}
	return dupErr
}

// hfTokenizer reads tokenizer.json, tokenizer_config.json and an optional
// chat_template.jinja into the CMF tokenizer config and blob.
func hfTokenizer(dir string, arch *cmf.Arch) (*cmf.TokenizerConfig, []byte, error) {
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var tjs struct {
		AddedTokens []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
		} `json:"added_tokens"`
		Model struct {
			Type  string          `json:"type"`
			Vocab json.RawMessage `json:"vocab"`
		} `json:"model"`
	}
	if err := json.Unmarshal(tj, &tjs); err != nil {
		return nil, nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if t := tjs.Model.Type; t != "" && t != "BPE" {
		return nil, nil, fmt.Errorf("tokenizer.json: model type %q is not supported (only BPE tokenizers, byte-level or SentencePiece-style, are)", t)
	}
	var vocab map[string]int
	if len(tjs.Model.Vocab) > 0 {
		if err := json.Unmarshal(tjs.Model.Vocab, &vocab); err != nil {
			return nil, nil, fmt.Errorf("tokenizer.json: model.vocab: %w", err)
		}
	}
	idOf := func(s string) (int, bool) {
		for _, a := range tjs.AddedTokens {
			if a.Content == s {
				return a.ID, true
			}
		}
		id, ok := vocab[s]
		return id, ok
	}
	tc := &cmf.TokenizerConfig{Kind: "hf_json", Blob: "tokenizer.json"}
	var cfg hfConfig
	if err := readJSON(filepath.Join(dir, "tokenizer_config.json"), &cfg); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, err
	}
	tokStr := func(k string) string {
		switch v := cfg[k].(type) {
		case string:
			return v
		case map[string]any:
			s, _ := v["content"].(string)
			return s
		}
		return ""
	}
	tc.BOSToken, tc.EOSToken, tc.PadToken = tokStr("bos_token"), tokStr("eos_token"), tokStr("pad_token")
	var cerr error
	tc.AddBOS = cfg.boolOr("add_bos_token", false, &cerr)
	tc.AddEOS = cfg.boolOr("add_eos_token", false, &cerr)
	if cerr != nil {
		return nil, nil, fmt.Errorf("tokenizer_config.json: %s", strings.TrimPrefix(cerr.Error(), "config.json: "))
	}
	switch v := cfg["chat_template"].(type) {
	case string:
		tc.ChatTemplate = v
	case []any:
		for _, e := range v {
			m, _ := e.(map[string]any)
			n, _ := m["name"].(string)
			t, _ := m["template"].(string)
			if n == "default" {
				tc.ChatTemplate = t
			} else if n != "" {
				if tc.ChatTemplates == nil {
					tc.ChatTemplates = map[string]string{}
				}
				tc.ChatTemplates[n] = t
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		tc.ChatTemplate = string(b)
	}
	if tc.BOSToken != "" {
		if id, ok := idOf(tc.BOSToken); ok {
			tc.BOSTokenID = &id
		}
	}
	if tc.PadToken != "" {
		if id, ok := idOf(tc.PadToken); ok {
			tc.PadTokenID = &id
		}
	}
	// eos ids: the generation config's list wins (Qwen3 stops on both
	// <|im_end|> and <|endoftext|>); the tokenizer's eos token joins it.
	tc.EOSTokenIDs = append([]int(nil), arch.EOSTokenIDs...)
	if tc.EOSToken != "" {
		if id, ok := idOf(tc.EOSToken); ok && !slices.Contains(tc.EOSTokenIDs, id) {
			tc.EOSTokenIDs = append(tc.EOSTokenIDs, id)
		}
	}
	return tc, tj, nil
}
