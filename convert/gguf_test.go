package convert

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/gguf"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/safetensors"
	"github.com/cortiq/cortiq/tokenizer"
)

// hfToGGUF maps a Hugging Face tensor name to llama.cpp's.
func hfToGGUF(n string) string {
	switch n {
	case "model.embed_tokens.weight":
		return "token_embd.weight"
	case "model.norm.weight":
		return "output_norm.weight"
	case "lm_head.weight":
		return "output.weight"
	}
	rest := strings.TrimPrefix(n, "model.layers.")
	i := strings.IndexByte(rest, '.')
	l, suffix := rest[:i], rest[i+1:]
	for g, h := range ggufNames {
		if h == suffix {
			return "blk." + l + "." + g
		}
	}
	return ""
}

// writeGGUF writes the same model as writeHF produced, the way llama.cpp's
// converter does: metadata, llama Q/K rows permuted, experts stacked.
func writeGGUF(t *testing.T, path, ga string, arch cmf.Arch, vals map[string][]float32, typ gguf.Type, tok func(*gguf.Writer)) {
	t.Helper()
	w := gguf.NewWriter()
	kv := func(k string, v gguf.Value) {
		if err := w.AddKV(k, v); err != nil {
			t.Fatal(err)
		}
	}
	kv("general.architecture", gguf.String(ga))
	kv(ga+".embedding_length", gguf.Uint32(uint32(arch.HiddenSize)))
	kv(ga+".block_count", gguf.Uint32(uint32(arch.NumLayers)))
	kv(ga+".feed_forward_length", gguf.Uint32(uint32(arch.IntermediateSize)))
	kv(ga+".attention.head_count", gguf.Uint32(uint32(arch.NumAttentionHeads)))
	kv(ga+".attention.head_count_kv", gguf.Uint32(uint32(arch.NumKVHeads)))
	kv(ga+".attention.key_length", gguf.Uint32(uint32(arch.HeadDim)))
	kv(ga+".attention.layer_norm_rms_epsilon", gguf.Float32(float32(arch.RMSNormEps)))
	kv(ga+".rope.freq_base", gguf.Float32(float32(arch.RopeTheta)))
	kv(ga+".context_length", gguf.Uint32(uint32(arch.MaxPositionEmbeddings)))
	if m := arch.MoE; m != nil {
		kv(ga+".expert_count", gguf.Uint32(uint32(m.NumExperts)))
		kv(ga+".expert_used_count", gguf.Uint32(uint32(m.NumExpertsPerTok)))
		kv(ga+".expert_feed_forward_length", gguf.Uint32(uint32(m.MoEIntermediateSize)))
	}
	if tok != nil {
		tok(w)
	}
	names := make([]string, 0, len(vals))
	for n := range vals {
		names = append(names, n)
	}
	sort.Strings(names)
	stacks := map[string][][]float32{}
	shapes := map[string][]int{}
	for _, n := range names {
		v := append([]float32(nil), vals[n]...)
		var shape []int
		switch {
		case strings.HasSuffix(n, "norm.weight") || strings.HasSuffix(n, ".bias"):
			shape = []int{len(v)}
		}
		if strings.Contains(n, ".mlp.experts.") {
			// model.layers.L.mlp.experts.E.KIND_proj.weight
			parts := strings.Split(n, ".")
			kind := strings.TrimSuffix(parts[6], "_proj")
			key := "blk." + parts[2] + ".ffn_" + kind + "_exps.weight"
			stacks[key] = append(stacks[key], v)
			rows := arch.MoE.MoEIntermediateSize
			if kind == "down" {
				rows = arch.HiddenSize
			}
			shapes[key] = []int{0, rows, len(v) / rows}
			continue
		}
		g := hfToGGUF(n)
		if g == "" {
			t.Fatalf("no GGUF name for %s", n)
		}
		if shape == nil {
			rows := arch.HiddenSize
			switch {
			case strings.Contains(n, "q_proj"):
				rows = arch.NumAttentionHeads * arch.HeadDim
			case strings.Contains(n, "k_proj"), strings.Contains(n, "v_proj"):
				rows = arch.NumKVHeads * arch.HeadDim
			case strings.Contains(n, "gate_proj"), strings.Contains(n, "up_proj"):
				rows = arch.IntermediateSize
			case strings.Contains(n, "embed_tokens"), strings.Contains(n, "lm_head"):
				rows = arch.VocabSize
			case strings.HasSuffix(n, "mlp.gate.weight"):
				rows = arch.MoE.NumExperts
			}
			shape = []int{rows, len(v) / rows}
		}
		if ga == "llama" && (strings.Contains(n, "q_proj") || strings.Contains(n, "k_proj")) {
			heads := arch.NumAttentionHeads
			if strings.Contains(n, "k_proj") {
				heads = arch.NumKVHeads
			}
			if err := gguf.PermuteQK(v, shape[0], len(v)/shape[0], heads); err != nil {
				t.Fatal(err)
			}
		}
		tt := typ
		if len(shape) == 1 {
			tt = gguf.TypeF32
		}
		if err := w.AddTensor(g, tt, shape, v); err != nil {
			t.Fatal(err)
		}
	}
	for key, st := range stacks {
		sh := shapes[key]
		sh[0] = len(st)
		if err := w.AddTensor(key, typ, sh, slices.Concat(st...)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
}

// qwen3Vocab returns the real Qwen3 tokenizer.json (committed test data)
// and its vocabulary in GGUF form, as llama.cpp's converter lays it out.
func qwen3Vocab(t *testing.T) ([]byte, []string, []string, []int32) {
	f, err := os.Open("../tokenizer/testdata/qwen3/tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tj, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Added []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
		Model struct {
			Vocab  map[string]int    `json:"vocab"`
			Merges []json.RawMessage `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(tj, &doc); err != nil {
		t.Fatal(err)
	}
	n := len(doc.Model.Vocab) + len(doc.Added)
	tokens := make([]string, n)
	types := make([]int32, n)
	for s, id := range doc.Model.Vocab {
		tokens[id], types[id] = s, 1
	}
	for _, a := range doc.Added {
		tokens[a.ID], types[a.ID] = a.Content, 4
		if a.Special {
			types[a.ID] = 3
		}
	}
	var merges []string
	for _, m := range doc.Model.Merges {
		var s string
		if json.Unmarshal(m, &s) == nil {
			merges = append(merges, s)
			continue
		}
		var p []string
		if err := json.Unmarshal(m, &p); err != nil || len(p) != 2 {
			t.Fatalf("merge %s", m)
		}
		merges = append(merges, p[0]+" "+p[1])
	}
	return tj, tokens, merges, types
}

func TestConvertGGUF(t *testing.T) {
	for _, c := range []struct {
		ga, arch string
		typ      gguf.Type
	}{
		{"llama", "llama", gguf.TypeF32},
		{"qwen2", "qwen2", gguf.TypeF32},
		{"qwen3", "qwen3", gguf.TypeF32},
		{"qwen3moe", "qwen3_moe", gguf.TypeF32},
		{"llama", "llama", gguf.TypeQ8_0},
	} {
		t.Run(c.ga+"_"+c.typ.String(), func(t *testing.T) {
			dir := t.TempDir()
			hfDir := filepath.Join(dir, "hf")
			cfg := tinyConfig(c.arch)
			if c.arch == "qwen3_moe" {
				delete(cfg, "mlp_only_layers") // llama.cpp's qwen3moe has no dense layers
			}
			vals := writeHF(t, hfDir, cfg, safetensors.F32, false, false)
			var top hfConfig
			b, _ := json.Marshal(cfg)
			json.Unmarshal(b, &top)
			arch, _ := archFromHF(top, nil)
			gp := filepath.Join(dir, "m.gguf")
			const tmpl = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
			var tokFn func(*gguf.Writer)
			var tj, tokBlob []byte
			var tokTC *cmf.TokenizerConfig
			if c.arch == "qwen3" {
				var tokens, merges []string
				var types []int32
				tj, tokens, merges, types = qwen3Vocab(t)
				tokFn = func(w *gguf.Writer) {
					w.AddKV("tokenizer.ggml.model", gguf.String("gpt2"))
					w.AddKV("tokenizer.ggml.pre", gguf.String("qwen2"))
					w.AddKV("tokenizer.ggml.tokens", gguf.Strings(tokens))
					w.AddKV("tokenizer.ggml.merges", gguf.Strings(merges))
					w.AddKV("tokenizer.ggml.token_type", gguf.Int32s(types))
					w.AddKV("tokenizer.ggml.eos_token_id", gguf.Uint32(151645))
					w.AddKV("tokenizer.ggml.padding_token_id", gguf.Uint32(151643))
					w.AddKV("tokenizer.ggml.add_bos_token", gguf.Bool(false))
					w.AddKV("tokenizer.chat_template", gguf.String(tmpl))
				}
			}
			if tokFn != nil {
				// The real Qwen3 vocabulary on a 48-row model: the file
				// could not run, so convert refuses it (issue 8), and the
				// tokenizer is checked below straight from the GGUF's
				// vocabulary; the tensors are compared on a copy without it.
				tp := filepath.Join(dir, "vocab.gguf")
				writeGGUF(t, tp, c.ga, arch, vals, c.typ, tokFn)
				if _, err := Run(context.Background(), tp, filepath.Join(dir, "vocab.cmf"), Options{Quant: quant.F32}); err == nil || !strings.Contains(err.Error(), "beyond the model's vocab_size 48") {
					t.Fatalf("a vocabulary larger than the model: %v", err)
				}
				gf, err := gguf.Open(tp)
				if err != nil {
					t.Fatal(err)
				}
				defer gf.Close()
				if tokTC, tokBlob, err = ggufTokenizer(gf, &arch); err != nil {
					t.Fatal(err)
				}
			}
			writeGGUF(t, gp, c.ga, arch, vals, c.typ, nil)
			ho, gO := filepath.Join(dir, "hf.cmf"), filepath.Join(dir, "gguf.cmf")
			if _, err := FromHF(context.Background(), hfDir, ho, Options{Quant: quant.F32}); err != nil {
				t.Fatal(err)
			}
			if _, err := Run(context.Background(), gp, gO, Options{Quant: quant.F32}); err != nil {
				t.Fatal(err)
			}
			hm, _ := cmf.Open(ho)
			gm, err := cmf.Open(gO)
			if err != nil {
				t.Fatal(err)
			}
			defer hm.Close()
			defer gm.Close()
			if gm.Header.Arch.ArchName != c.arch || gm.Header.Provenance.SourceFormat != "gguf" {
				t.Fatalf("arch %q from %q", gm.Header.Arch.ArchName, gm.Header.Provenance.SourceFormat)
			}
			for name := range vals {
				a, ab, err := hm.TensorData(name)
				if err != nil {
					t.Fatal(err)
				}
				_, bb, err := gm.TensorData(name)
				if err != nil {
					t.Fatal(err)
				}
				x, _ := quant.Decode(a.DType, ab, a.Shape)
				y, _ := quant.Decode(a.DType, bb, a.Shape)
				var amax float32
				for _, v := range x {
					amax = max(amax, abs32(v))
				}
				for i := range x {
					tol := float32(0)
					if c.typ == gguf.TypeQ8_0 && len(a.Shape) == 2 {
						tol = amax / 100 // Q8_0 blocks of 32: error ≤ block absmax/254
					}
					if abs32(x[i]-y[i]) > tol {
						t.Fatalf("%s[%d]: hf %v gguf %v", name, i, x[i], y[i])
					}
				}
			}
			if tj == nil {
				return
			}
			// The GGUF vocabulary tokenizes exactly like tokenizer.json.
			tc := tokTC
			if tc == nil || tc.ChatTemplate != tmpl || !slices.Contains(tc.EOSTokenIDs, 151645) {
				t.Fatalf("tokenizer config %+v", tc)
			}
			gt, err := engine.TokenizerFrom(tc, tokBlob)
			if err != nil {
				t.Fatal(err)
			}
			ht, err := tokenizer.FromHFJSON(tj, tokenizer.Config{})
			if err != nil {
				t.Fatal(err)
			}
			var strs []string
			sb, _ := os.ReadFile("../tokenizer/testdata/golden_strings.json")
			if err := json.Unmarshal(sb, &strs); err != nil {
				var wrapped struct {
					Strings []string `json:"strings"`
				}
				if err := json.Unmarshal(sb, &wrapped); err != nil {
					t.Fatal(err)
				}
				strs = wrapped.Strings
			}
			if len(strs) < 100 {
				t.Fatalf("%d golden strings", len(strs))
			}
			for _, s := range strs {
				for _, special := range []bool{false, true} {
					a, b := ht.Encode(s, false, special), gt.Encode(s, false, special)
					if !slices.Equal(a, b) {
						t.Fatalf("%q (special=%v): tokenizer.json %v, GGUF %v", s, special, a, b)
					}
				}
			}
		})
	}
}

func abs32(x float32) float32 {
	if x < 0 {
		return -x
	}
	return x
}

// TestGGUFRopeFreqs: Llama-3.x GGUF files carry llama3 RoPE scaling as a
// rope_freqs tensor of per-pair divisors (computed by llama.cpp's
// converter). Imported as rope scaling "freq_factors", the model must
// compute the same logits as the Hugging Face checkpoint with llama3 scaling.
func TestGGUFRopeFreqs(t *testing.T) {
	dir := t.TempDir()
	cfg := tinyConfig("llama")
	cfg["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
	hfDir := filepath.Join(dir, "hf")
	vals := writeHF(t, hfDir, cfg, safetensors.F32, false, false)
	var top hfConfig
	b, _ := json.Marshal(cfg)
	json.Unmarshal(b, &top)
	arch, err := archFromHF(top, nil)
	if err != nil {
		t.Fatal(err)
	}
	// llama.cpp's generate_extra_tensors for LlamaModel, in float64.
	hd := arch.HeadDim
	factors := make([]float32, hd/2)
	bands := 0
	for i := range factors {
		freq := 1 / math.Pow(arch.RopeTheta, float64(2*i)/float64(hd))
		wave := 2 * math.Pi / freq
		switch lo, hi := 64/1.0, 64/4.0; {
		case wave < hi:
			factors[i] = 1
		case wave > lo:
			factors[i] = 8
		default:
			s := (64/wave - 1) / (4 - 1)
			factors[i] = float32(1 / ((1-s)/8 + s))
			bands++
		}
	}
	if bands == 0 {
		t.Fatal("test setup: no frequency inside the smoothing band")
	}
	gp := filepath.Join(dir, "m.gguf")
	writeGGUF(t, gp, "llama", arch, vals, gguf.TypeF32, func(w *gguf.Writer) {
		if err := w.AddTensor("rope_freqs.weight", gguf.TypeF32, []int{len(factors)}, factors); err != nil {
			t.Fatal(err)
		}
	})
	ho, gO := filepath.Join(dir, "hf.cmf"), filepath.Join(dir, "gguf.cmf")
	if _, err := FromHF(context.Background(), hfDir, ho, Options{Quant: quant.F32}); err != nil {
		t.Fatal(err)
	}
	if _, err := FromGGUF(context.Background(), gp, gO, Options{Quant: quant.F32}); err != nil {
		t.Fatal(err)
	}
	ids := make([]int, 48)
	for i := range ids {
		ids[i] = (i*7 + 3) % arch.VocabSize
	}
	logits := func(p string) ([]float32, string) {
		e, err := engine.Open(p, engine.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		s, _ := e.NewSession(64)
		l, _, err := s.Prefill(ids)
		if err != nil {
			t.Fatal(err)
		}
		return append([]float32(nil), l...), e.File.Header.Arch.RopeScaling.Type
	}
	want, wt := logits(ho)
	got, gt := logits(gO)
	if wt != "llama3" || gt != "freq_factors" {
		t.Fatalf("rope scaling types %q / %q", wt, gt)
	}
	var ss, worst float64
	for _, v := range want {
		ss += float64(v) * float64(v)
	}
	rms := math.Sqrt(ss / float64(len(want)))
	for i := range want {
		worst = max(worst, math.Abs(float64(got[i]-want[i]))/rms)
	}
	t.Logf("GGUF (rope_freqs) vs HF (llama3): max |Δlogit|/rms %.2e", worst)
	// Measured 1.91e-7 with every kernel set (-args -isa=...): allowed 3×.
	if worst > 6e-7 {
		t.Fatalf("GGUF (rope_freqs) logits differ from HF (llama3) by %.2e of RMS", worst)
	}
}
