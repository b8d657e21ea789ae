package convert

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/gguf"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/safetensors"
)

// TestConfigRefused: config.json values that used to convert into files
// that run wrong or are rejected later (issue 8) are refused at convert
// time with the key named.
func TestConfigRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(c map[string]any)
		gen  map[string]any // generation_config.json, when set
		want string
	}{
		{"negative rope_theta", func(c map[string]any) { c["rope_theta"] = -10000.0 }, nil, "rope_theta = -10000"},
		{"zero rope_theta", func(c map[string]any) { c["rope_theta"] = 0.0 }, nil, "rope_theta = 0"},
		{"rope_theta a string", func(c map[string]any) { c["rope_theta"] = "1e4" }, nil, `rope_theta is the string "1e4", want a number`},
		{"negative rope_parameters.rope_theta", func(c map[string]any) {
			delete(c, "rope_theta")
			c["rope_parameters"] = map[string]any{"rope_type": "default", "rope_theta": -1.0}
		}, nil, "rope_theta = -1"},
		{"llama3 without its factors", func(c map[string]any) {
			c["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 8.0}
		}, nil, "rope_scaling of type llama3 lacks rope_scaling.low_freq_factor"},
		{"llama3 without original_max_position_embeddings", func(c map[string]any) {
			c["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
		}, nil, "lacks rope_scaling.original_max_position_embeddings"},
		{"llama3 factors out of order", func(c map[string]any) {
			c["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}
		}, nil, "low_freq_factor < high_freq_factor"},
		{"linear without factor", func(c map[string]any) { c["rope_scaling"] = map[string]any{"type": "linear"} }, nil, "rope_scaling of type linear lacks rope_scaling.factor"},
		{"dynamic without factor", func(c map[string]any) { c["rope_scaling"] = map[string]any{"rope_type": "dynamic"} }, nil, "lacks rope_scaling.factor"},
		{"yarn without factor", func(c map[string]any) { c["rope_scaling"] = map[string]any{"rope_type": "yarn", "beta_fast": 32.0} }, nil, "lacks rope_scaling.factor"},
		{"yarn factor zero", func(c map[string]any) { c["rope_scaling"] = map[string]any{"rope_type": "yarn", "factor": 0.0} }, nil, "rope_scaling.factor = 0"},
		{"longrope without short_factor", func(c map[string]any) {
			c["rope_scaling"] = map[string]any{"rope_type": "longrope", "long_factor": []float64{1, 1}}
		}, nil, "lacks rope_scaling.short_factor"},
		{"longrope factor not a list", func(c map[string]any) {
			c["rope_scaling"] = map[string]any{"rope_type": "longrope", "long_factor": 1.0, "short_factor": []float64{1}}
		}, nil, "rope_scaling.long_factor is a number, want a list of numbers"},
		{"unknown rope type", func(c map[string]any) { c["rope_scaling"] = map[string]any{"rope_type": "ntk-magic", "factor": 2.0} }, nil, `RoPE scaling type "ntk-magic" is not supported`},
		{"rope_scaling a string", func(c map[string]any) { c["rope_scaling"] = "llama3" }, nil, `rope_scaling is the string "llama3", want an object`},
		{"rope_scaling factor a string", func(c map[string]any) { c["rope_scaling"] = map[string]any{"type": "linear", "factor": "8"} }, nil, `rope_scaling.factor is the string "8", want a number`},
		{"rope_type a number", func(c map[string]any) { c["rope_scaling"] = map[string]any{"rope_type": 3.0, "factor": 2.0} }, nil, "rope_scaling.rope_type is a number, want a string"},
		{"eos_token_id a string", func(c map[string]any) { c["eos_token_id"] = "x" }, nil, `eos_token_id is the string "x", want a token id`},
		{"eos_token_id list with a string", func(c map[string]any) { c["eos_token_id"] = []any{1, "x"} }, nil, `eos_token_id[1] is the string "x"`},
		{"eos_token_id negative", func(c map[string]any) { c["eos_token_id"] = -1 }, nil, "eos_token_id is -1"},
		{"generation eos_token_id a string", func(c map[string]any) {}, map[string]any{"eos_token_id": "x"}, `generation_config.json: eos_token_id is the string "x"`},
		{"bos_token_id a string", func(c map[string]any) { c["bos_token_id"] = "<s>" }, nil, `bos_token_id is the string "<s>", want a number`},
		{"num_attention_heads 0", func(c map[string]any) { c["num_attention_heads"] = 0 }, nil, "num_attention_heads is 0; it must be at least 1"},
		{"num_attention_heads missing", func(c map[string]any) { delete(c, "num_attention_heads") }, nil, "num_attention_heads is missing"},
		{"num_key_value_heads 0", func(c map[string]any) { c["num_key_value_heads"] = 0 }, nil, "num_key_value_heads is 0"},
		{"head_dim 0", func(c map[string]any) { c["head_dim"] = 0 }, nil, "head_dim is 0"},
		{"vocab_size 0", func(c map[string]any) { c["vocab_size"] = 0 }, nil, "vocab_size is 0"},
		{"hidden_act a number", func(c map[string]any) { c["hidden_act"] = 5 }, nil, "hidden_act is a number, want a string"},
		{"tie_word_embeddings a string", func(c map[string]any) { c["tie_word_embeddings"] = "yes" }, nil, `tie_word_embeddings is the string "yes", want true or false`},
		{"text_config a list", func(c map[string]any) { c["text_config"] = []any{} }, nil, "text_config is a list, want an object"},
		{"layer_types with a number", func(c map[string]any) { c["layer_types"] = []any{"full_attention", 1} }, nil, "layer_types[1] is a number"},
		{"model_type a number", func(c map[string]any) { c["model_type"] = 7 }, nil, "model_type is a number, want a string"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := maps.Clone(tinyConfig("llama"))
			c.edit(cfg)
			var top, gen hfConfig
			b, _ := json.Marshal(cfg)
			if err := json.Unmarshal(b, &top); err != nil {
				t.Fatal(err)
			}
			if c.gen != nil {
				b, _ := json.Marshal(c.gen)
				json.Unmarshal(b, &gen)
			}
			_, err := archFromHF(top, gen)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
	// The unedited config converts (the cases above fail for their edit).
	var top hfConfig
	b, _ := json.Marshal(tinyConfig("llama"))
	json.Unmarshal(b, &top)
	if _, err := archFromHF(top, nil); err != nil {
		t.Fatal(err)
	}
}

// TestConfigNaN: Python writes NaN into JSON; the error shows where.
func TestConfigNaN(t *testing.T) {
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, []byte(`{"model_type": "llama", "rope_theta": NaN, "hidden_size": 64}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var c hfConfig
	err := readJSON(p, &c)
	if err == nil || !strings.Contains(err.Error(), `"rope_theta": NaN`) || !strings.Contains(err.Error(), "NaN and Infinity are not JSON") {
		t.Fatalf("NaN: %v", err)
	}
}

// hfDirWith writes the tiny llama checkpoint with the given tokenizer.json.
func hfDirWith(t *testing.T, tokenizerJSON string) string {
	t.Helper()
	dir := t.TempDir()
	writeHF(t, dir, tinyConfig("llama"), safetensors.F32, false, false)
	if tokenizerJSON != "" {
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(tokenizerJSON), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// bpeJSON is a tokenizer.json of a byte-level BPE with vocab entries and
// added tokens as given.
func bpeJSON(vocab map[string]int, added map[string]int) string {
	type at struct {
		ID      int    `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	}
	var ats []at
	for s, id := range added {
		ats = append(ats, at{id, s, true})
	}
	b, _ := json.Marshal(map[string]any{
		"added_tokens":   ats,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"decoder":        map[string]any{"type": "ByteLevel"},
		"model":          map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}},
		"normalizer":     nil,
		"post_processor": nil,
	})
	return string(b)
}

// TestTokenizerRefused: tokenizers the engine could not use, and token ids
// beyond the model's embedding, are refused at convert time.
func TestTokenizerRefused(t *testing.T) {
	small := map[string]int{"a": 0, "b": 1, "c": 2}
	for _, c := range []struct {
		name, tj, want string
	}{
		{"unigram", `{"model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["a", -1.0]]}}`, `model type "Unigram" is not supported`},
		{"empty vocabulary", bpeJSON(map[string]int{}, nil), "vocabulary is empty"},
		{"added token beyond the vocabulary", bpeJSON(small, map[string]int{"<|end|>": 99}), `added token "<|end|>" has id 99, beyond the model's vocab_size 48`},
		{"vocabulary beyond the model", bpeJSON(map[string]int{"a": 0, "b": 60}, nil), "beyond the model's vocab_size 48"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := hfDirWith(t, c.tj)
			out := filepath.Join(t.TempDir(), "m.cmf")
			_, err := FromHF(context.Background(), dir, out, Options{Quant: quant.F32})
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "tokenizer.json") {
				t.Fatalf("error %v, want %q", err, c.want)
			}
			if _, err := os.Stat(out); err == nil {
				t.Fatal("an output was written")
			}
		})
	}
	// A small vocabulary within the model converts.
	dir := hfDirWith(t, bpeJSON(small, map[string]int{"<|end|>": 3}))
	if _, err := FromHF(context.Background(), dir, filepath.Join(t.TempDir(), "m.cmf"), Options{Quant: quant.F32}); err != nil {
		t.Fatal(err)
	}
}

// TestOutputIsDirectory: -o naming an existing directory fails before any
// conversion (the source here has no weights at all, which would be the
// error if the output were checked later).
func TestOutputIsDirectory(t *testing.T) {
	src := t.TempDir()
	out := t.TempDir()
	for _, conv := range []func() error{
		func() error { _, err := FromHF(context.Background(), src, out, Options{}); return err },
		func() error {
			_, err := FromGGUF(context.Background(), filepath.Join(src, "none.gguf"), out, Options{})
			return err
		},
		func() error { _, err := Run(context.Background(), src, out, Options{}); return err },
	} {
		err := conv()
		if err == nil || !strings.Contains(err.Error(), "is a directory; give a file name, such as "+filepath.Join(out, "model.cmf")) {
			t.Fatalf("error %v", err)
		}
	}
	if _, err := FromHF(context.Background(), src, filepath.Join(src, "missing", "m.cmf"), Options{}); err == nil || !strings.Contains(err.Error(), "the output's folder") {
		t.Fatalf("missing output folder: %v", err)
	}
}

// TestGGUFHeadCountRefused: a GGUF head count of 0 (or a missing one, or a
// zero RoPE base) is named, not "metadata lacks ...".
func TestGGUFHeadCountRefused(t *testing.T) {
	var top hfConfig
	b, _ := json.Marshal(tinyConfig("qwen2"))
	json.Unmarshal(b, &top)
	arch, err := archFromHF(top, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		edit  func(w *gguf.Writer)
		heads int
		theta float64
		want  string
	}{
		{"head_count 0", nil, 0, 10000, "qwen2.attention.head_count is 0; it must be at least 1"},
		{"freq_base 0", nil, 4, 0, "qwen2.rope.freq_base = 0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := arch
			a.NumAttentionHeads, a.RopeTheta = c.heads, c.theta
			p := filepath.Join(t.TempDir(), "m.gguf")
			writeGGUF(t, p, "qwen2", a, nil, gguf.TypeF32, c.edit)
			_, err := FromGGUF(context.Background(), p, filepath.Join(t.TempDir(), "m.cmf"), Options{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}

// TestConvertExtremeWeights: a checkpoint tensor of finite values near
// 3e38 converts to q8_2f (it panicked in FitColumns, issue 8) and is
// refused, naming the tensor, by the formats that cannot hold it; a NaN is
// refused by the quantized formats with the tensor, row and column.
func TestConvertExtremeWeights(t *testing.T) {
	const name = "model.layers.0.mlp.up_proj.weight"
	for _, c := range []struct {
		what  string
		q     quant.DType
		value float32
		want  string // "" when it must convert
	}{
		{"near 3e38", quant.Q82F, 3e38, ""},
		{"near 3e38", quant.Q4TP, 3e38, name + " as q4tp: quant: q4tp: weight"},
		{"near 3e38", quant.Q8Row, 3e38, name + " as q8_row: quant: q8_row: row"},
		{"NaN", quant.Q82F, float32(math.NaN()), name + " as q8_2f: quant: q8_2f: non-finite weight NaN at row"},
		{"NaN", quant.Q4TP, float32(math.NaN()), name + " as q4tp: quant: q4tp: non-finite weight NaN at row"},
	} {
		t.Run(c.what+"/"+c.q.String(), func(t *testing.T) {
			dir := t.TempDir()
			vals := writeHF(t, dir, tinyConfig("llama"), safetensors.F32, false, false)
			v := vals[name]
			for i := range v {
				if math.IsNaN(float64(c.value)) {
					if i == 7 {
						v[i] = c.value
					}
					continue
				}
				v[i] = float32(math.Max(-math.MaxFloat32, math.Min(math.MaxFloat32, float64(v[i])/0.4*float64(c.value))))
			}
			var wts []safetensors.WriteTensor
			var top hfConfig
			b, _ := json.Marshal(tinyConfig("llama"))
			json.Unmarshal(b, &top)
			arch, _ := archFromHF(top, nil)
			want, _ := model.Tensors(&arch)
			for _, w := range want {
				var d []byte
				for _, f := range vals[w.Name] {
					d = binary.LittleEndian.AppendUint32(d, math.Float32bits(f))
				}
				wts = append(wts, safetensors.WriteTensor{Name: w.Name, DType: safetensors.F32, Shape: w.Shape, Data: d})
			}
			if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), wts, nil); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "m.cmf")
			_, err := FromHF(context.Background(), dir, out, Options{Quant: c.q})
			if c.want != "" {
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("error %v, want %q", err, c.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			m, err := cmf.OpenWith(out, cmf.OpenOptions{NoVerify: true})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			tt, data, err := m.TensorData(name)
			if err != nil {
				t.Fatal(err)
			}
			if tt.DType != c.q {
				t.Fatalf("stored as %s", tt.DType)
			}
			got, err := quant.Decode(tt.DType, data, tt.Shape)
			if err != nil {
				t.Fatal(err)
			}
			var amax float64
			for _, x := range v {
				amax = max(amax, math.Abs(float64(x)))
			}
			for i, x := range v {
				if y := float64(got[i]); math.IsInf(y, 0) || math.IsNaN(y) || math.Abs(y-float64(x)) > amax/100 {
					t.Fatalf("[%d]: %g stored as %g", i, x, y)
				}
			}
		})
	}
}
