package convert

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/safetensors"
)

// tinyConfigs are Hugging Face config.json contents for each architecture.
func tinyConfig(arch string) map[string]any {
	c := map[string]any{
		"model_type": arch, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 48, "rms_norm_eps": 1e-6,
		"max_position_embeddings": 256, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": false,
		"eos_token_id": 2,
	}
	switch arch {
	case "qwen3":
		c["head_dim"] = 32
	case "qwen3_moe":
		c["head_dim"] = 16
		c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"], c["norm_topk_prob"] = 4, 2, 32, true
		c["mlp_only_layers"] = []int{1}
	case "qwen3_next":
		c["head_dim"], c["num_hidden_layers"] = 16, 4
		c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"] = 4, 2, 32, 32
		c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"] = 2, 4, 16, 16, 4
	case "qwen3_5_moe":
		tc := tinyConfig("qwen3_next")
		tc["model_type"] = "qwen3_5_moe_text"
		delete(tc, "rope_theta")
		tc["rope_parameters"] = map[string]any{"rope_theta": 1e7, "partial_rotary_factor": 0.25, "rope_type": "default", "mrope_section": []int{1, 1, 0}, "mrope_interleaved": true}
		return map[string]any{"model_type": "qwen3_5_moe", "text_config": tc, "tie_word_embeddings": false}
	}
	return c
}

// writeHF writes a Hugging Face directory whose tensors follow cortiq's
// own expectations for the config, in the given safetensors dtype. vlm puts
// text weights under model.language_model. and fuses experts.
func writeHF(t *testing.T, dir string, cfg map[string]any, dt safetensors.DType, vlm bool, mtp bool) map[string][]float32 {
	t.Helper()
	os.MkdirAll(dir, 0o755)
	var top hfConfig
	b, _ := json.Marshal(cfg)
	json.Unmarshal(b, &top)
	os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
	arch, err := archFromHF(top, nil)
	if err != nil {
		t.Fatal(err)
	}
	if mtp {
		arch.MTP = &cmf.MTP{NumLayers: 1}
	}
	want, err := model.Tensors(&arch)
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, model.MTPTensors(&arch)...)
	r := rand.New(rand.NewPCG(7, 7))
	vals := map[string][]float32{}
	var wts []safetensors.WriteTensor
	enc := func(v []float32) []byte {
		var out []byte
		for _, f := range v {
			switch dt {
			case safetensors.F32:
				out = binary.LittleEndian.AppendUint32(out, math.Float32bits(f))
			case safetensors.BF16:
				out = binary.LittleEndian.AppendUint16(out, half.F32ToBF16(f))
			}
		}
		return out
	}
	fused := map[string][][]float32{} // prefix → per expert gate|up or down
	for _, w := range want {
		n := 1
		for _, d := range w.Shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64() * 0.1)
			if dt == safetensors.BF16 {
				v[i] = half.RoundBF16(v[i])
			}
		}
		vals[w.Name] = v
		name := w.Name
		if vlm {
			if strings.Contains(name, ".mlp.experts.") {
				fused[name] = [][]float32{v}
				continue
			}
			if rest, ok := strings.CutPrefix(name, "model."); ok {
				name = "model.language_model." + rest
			}
		}
		wts = append(wts, safetensors.WriteTensor{Name: name, DType: dt, Shape: w.Shape, Data: enc(v)})
	}
	if vlm {
		// Fuse experts as published Qwen3.5-MoE checkpoints store them.
		m := arch.MoE
		for l := 0; l < arch.NumLayers; l++ {
			p := "model.layers." + itoa(l) + ".mlp.experts."
			var gu, dn []float32
			for e := 0; e < m.NumExperts; e++ {
				q := p + itoa(e) + "."
				gu = append(gu, vals[q+"gate_proj.weight"]...)
				gu = append(gu, vals[q+"up_proj.weight"]...)
				dn = append(dn, vals[q+"down_proj.weight"]...)
			}
			lp := "model.language_model.layers." + itoa(l) + ".mlp.experts."
			wts = append(wts,
				safetensors.WriteTensor{Name: lp + "gate_up_proj", DType: dt, Shape: []int{m.NumExperts, 2 * m.MoEIntermediateSize, arch.HiddenSize}, Data: enc(gu)},
				safetensors.WriteTensor{Name: lp + "down_proj", DType: dt, Shape: []int{m.NumExperts, arch.HiddenSize, m.MoEIntermediateSize}, Data: enc(dn)})
		}
		if mtp {
			// The MTP layer's experts stay per expert in these files.
			for name := range fused {
				if strings.HasPrefix(name, "mtp.") {
					w := fused[name][0]
					sh := []int{arch.MoE.MoEIntermediateSize, arch.HiddenSize}
					if strings.HasSuffix(name, "down_proj.weight") {
						sh = []int{arch.HiddenSize, arch.MoE.MoEIntermediateSize}
					}
					wts = append(wts, safetensors.WriteTensor{Name: name, DType: dt, Shape: sh, Data: enc(w)})
				}
			}
		}
		wts = append(wts, safetensors.WriteTensor{Name: "model.visual.patch_embed.weight", DType: dt, Shape: []int{2, 2}, Data: enc([]float32{1, 2, 3, 4})})
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), wts, nil); err != nil {
		t.Fatal(err)
	}
	return vals
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestConvertHFArchitectures(t *testing.T) {
	for _, c := range []struct {
		arch string
		dt   safetensors.DType
		vlm  bool
		mtp  bool
	}{
		{"llama", safetensors.F32, false, false},
		{"qwen2", safetensors.F32, false, false},
		{"qwen3", safetensors.BF16, false, false},
		{"qwen3_moe", safetensors.F32, false, false},
		{"qwen3_next", safetensors.F32, false, true},
		{"qwen3_5_moe", safetensors.BF16, true, true},
	} {
		t.Run(c.arch, func(t *testing.T) {
			dir := t.TempDir()
			vals := writeHF(t, filepath.Join(dir, "hf"), tinyConfig(c.arch), c.dt, c.vlm, c.mtp)
			out := filepath.Join(dir, "m.cmf")
			want := quant.F32
			if c.dt == safetensors.BF16 {
				want = quant.BF16
			}
			res, err := FromHF(context.Background(), filepath.Join(dir, "hf"), out, Options{Quant: want})
			if err != nil {
				t.Fatal(err)
			}
			m, err := cmf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if m.Header.Arch.ArchName != strings.TrimSuffix(c.arch, "_text") {
				t.Fatalf("arch %q", m.Header.Arch.ArchName)
			}
			if c.mtp && m.Header.Arch.MTP == nil {
				t.Fatal("MTP head dropped")
			}
			if _, ok := m.Tensor("model.visual.patch_embed.weight"); ok {
				t.Fatal("vision tensor kept")
			}
			// Every tensor round-trips exactly (f32 → f32, bf16 → bf16).
			for name, v := range vals {
				tt, b, err := m.TensorData(name)
				if err != nil {
					t.Fatal(err)
				}
				got, err := quant.Decode(tt.DType, b, tt.Shape)
				if err != nil {
					t.Fatal(err)
				}
				for i := range v {
					if got[i] != v[i] {
						t.Fatalf("%s[%d] = %v, want %v", name, i, got[i], v[i])
					}
				}
			}
			if res.Tensors != len(vals) {
				t.Fatalf("%d tensors written, %d expected", res.Tensors, len(vals))
			}
		})
	}
}

func TestConvertQuantPolicy(t *testing.T) {
	dir := t.TempDir()
	writeHF(t, filepath.Join(dir, "hf"), tinyConfig("llama"), safetensors.F32, false, false)
	out := filepath.Join(dir, "q.cmf")
	keep, _ := ParseKeep(`up_proj=q8_2f`)
	if _, err := FromHF(context.Background(), filepath.Join(dir, "hf"), out, Options{Quant: quant.Q4TP, Keep: []Rule{keep}}); err != nil {
		t.Fatal(err)
	}
	m, err := cmf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	want := map[string]quant.DType{
		"model.layers.0.self_attn.q_proj.weight": quant.Q4TP,
		"model.layers.0.mlp.up_proj.weight":      quant.Q82F,
		"model.layers.0.mlp.down_proj.weight":    quant.Q4TP, // 96 columns: a multiple of 32
		"model.layers.0.input_layernorm.weight":  quant.F32,
		"lm_head.weight":                         quant.Q8Row,
	}
	for n, d := range want {
		tt, ok := m.Tensor(n)
		if !ok || tt.DType != d {
			t.Errorf("%s: %v, want %s", n, tt, d)
		}
	}
	if m.Header.QuantPolicy == nil || m.Header.QuantPolicy.Default != "q4tp" || m.Header.QuantType != "q4tp" {
		t.Fatalf("policy not recorded: %+v", m.Header.QuantPolicy)
	}
}

func TestConvertHFErrors(t *testing.T) {
	base := t.TempDir()
	good := filepath.Join(base, "good")
	writeHF(t, good, tinyConfig("llama"), safetensors.F32, false, false)
	clone := func(name string) string {
		d := filepath.Join(base, name)
		os.MkdirAll(d, 0o755)
		for _, f := range []string{"config.json", "model.safetensors"} {
			b, _ := os.ReadFile(filepath.Join(good, f))
			os.WriteFile(filepath.Join(d, f), b, 0o644)
		}
		return d
	}
	run := func(d, want string) {
		t.Helper()
		out := filepath.Join(base, "out.cmf")
		_, err := FromHF(context.Background(), d, out, Options{Quant: quant.F32})
		t.Logf("%s: %v", filepath.Base(d), err)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want it to mention %q", filepath.Base(d), err, want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%s: failed conversion left %s", filepath.Base(d), out)
		}
	}
	d := clone("badjson")
	os.WriteFile(filepath.Join(d, "config.json"), []byte(`{"model_type": "llama",`), 0o644)
	run(d, "invalid JSON")

	d = clone("arch")
	cfg := tinyConfig("llama")
	cfg["model_type"], cfg["architectures"] = "mamba", []string{"MambaForCausalLM"}
	b, _ := json.Marshal(cfg)
	os.WriteFile(filepath.Join(d, "config.json"), b, 0o644)
	run(d, `"mamba"`)

	d = clone("shape")
	cfg = tinyConfig("llama")
	cfg["intermediate_size"] = 100
	b, _ = json.Marshal(cfg)
	os.WriteFile(filepath.Join(d, "config.json"), b, 0o644)
	run(d, "shape")

	d = clone("missing")
	cfg = tinyConfig("llama")
	cfg["num_hidden_layers"] = 3
	b, _ = json.Marshal(cfg)
	os.WriteFile(filepath.Join(d, "config.json"), b, 0o644)
	run(d, "missing tensor model.layers.2")

	d = clone("truncated")
	st, _ := os.ReadFile(filepath.Join(d, "model.safetensors"))
	os.WriteFile(filepath.Join(d, "model.safetensors"), st[:len(st)-10], 0o644)
	run(d, "safetensors")

	d = clone("dtype")
	os.WriteFile(filepath.Join(d, "model.safetensors"), []byte(strings.Replace(string(st), `"F32"`, `"F64"`, 1)), 0o644)
	run(d, "F64")

	d = clone("noweights")
	os.Remove(filepath.Join(d, "model.safetensors"))
	run(d, "safetensors")
}

// TestChunkedEncodingMatchesWhole converts with tiny row chunks and checks
// every quantized tensor equals a whole-tensor encode of the source.
func TestChunkedEncodingMatchesWhole(t *testing.T) {
	old := chunkFloats
	chunkFloats = 70 * 64 // 70 rows of 64 columns: several chunks a tensor, each split over 2 goroutines
	defer func() { chunkFloats = old }()
	dir := t.TempDir()
	vals := writeHF(t, filepath.Join(dir, "hf"), tinyConfig("qwen3"), safetensors.F32, false, false)
	for _, d := range []quant.DType{quant.Q4TP, quant.Q8Row, quant.BF16} {
		out := filepath.Join(dir, d.String()+".cmf")
		if _, err := FromHF(context.Background(), filepath.Join(dir, "hf"), out, Options{Quant: d, Threads: 2}); err != nil {
			t.Fatal(err)
		}
		m, err := cmf.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		checked := 0
		for name, v := range vals {
			tt, b, _ := m.TensorData(name)
			if tt.DType == quant.F32 {
				continue
			}
			want, err := quant.Encode(tt.DType, v, tt.Shape, nil)
			if err != nil {
				t.Fatal(err)
			}
			if string(want) != string(b) {
				t.Fatalf("%s as %s: chunked bytes differ from a whole-tensor encode", name, tt.DType)
			}
			checked++
		}
		if checked < 10 {
			t.Fatalf("only %d tensors checked", checked)
		}
		m.Close()
	}
}

// TestConvertInterrupted cancels a conversion part way (as Ctrl-C does) and
// checks that no output file, final or temporary, is left behind.
func TestConvertInterrupted(t *testing.T) {
	dir := t.TempDir()
	writeHF(t, filepath.Join(dir, "hf"), tinyConfig("llama"), safetensors.F32, false, false)
	outDir := filepath.Join(dir, "out")
	os.MkdirAll(outDir, 0o755)
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	opt := Options{Quant: quant.Q8Row, Progress: func(done, total int64) {
		calls++
		if calls == 3 {
			cancel()
		}
	}}
	_, err := FromHF(ctx, filepath.Join(dir, "hf"), filepath.Join(outDir, "m.cmf"), opt)
	if err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("cancelled conversion returned %v", err)
	}
	if ents, _ := os.ReadDir(outDir); len(ents) != 0 {
		t.Fatalf("cancelled conversion left %v", ents)
	}
}

// TestConvertUnsupportedDTypeFailsEarly: a tensor stored in a dtype the
// converter cannot decode is reported before any output is written.
func TestConvertUnsupportedDTypeFailsEarly(t *testing.T) {
	dir := t.TempDir()
	cfg := tinyConfig("llama")
	b, _ := json.Marshal(cfg)
	hf := filepath.Join(dir, "hf")
	os.MkdirAll(hf, 0o755)
	os.WriteFile(filepath.Join(hf, "config.json"), b, 0o644)
	var top hfConfig
	json.Unmarshal(b, &top)
	arch, _ := archFromHF(top, nil)
	want, _ := model.Tensors(&arch)
	var wts []safetensors.WriteTensor
	for i, w := range want {
		n := 1
		for _, d := range w.Shape {
			n *= d
		}
		dt, es := safetensors.F32, 4
		if i == len(want)-1 {
			dt, es = safetensors.DType("I32"), 4 // the last tensor: failure must not wait for it
		}
		wts = append(wts, safetensors.WriteTensor{Name: w.Name, DType: dt, Shape: w.Shape, Data: make([]byte, n*es)})
	}
	if err := safetensors.Write(filepath.Join(hf, "model.safetensors"), wts, nil); err != nil {
		t.Fatal(err)
	}
	calls := 0
	_, err := FromHF(context.Background(), hf, filepath.Join(dir, "m.cmf"), Options{Quant: quant.F32, Progress: func(int64, int64) { calls++ }})
	if err == nil || !strings.Contains(err.Error(), "I32") || calls != 0 {
		t.Fatalf("error %v after %d tensors written", err, calls)
	}
}
