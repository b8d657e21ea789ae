package model_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cortiq/cortiq/backend/cpu"
	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/convert"
	"github.com/cortiq/cortiq/kernels"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/safetensors"
)

var isaFlag = flag.String("isa", "", "run the tests with this kernel set (generic, avx2, avx512) instead of the CPU's best")

func TestMain(m *testing.M) {
	flag.Parse()
	if *isaFlag != "" {
		if _, err := kernels.SetISA(*isaFlag); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	// The converter warns about the missing tokenizer of the tiny models.
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	// Opening a CMF file records verified weights in the user cache
	// directory: keep the tests out of the real one.
	// Created on first use only, so that killed fuzz workers leave nothing.
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("cortiq-test-cache-%d-%d", os.Getpid(), time.Now().UnixNano()))
	os.Setenv("XDG_CACHE_HOME", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// variant is a tiny Hugging Face config exercising one feature of the
// decoder.
type variant struct {
	name string
	cfg  map[string]any
}

func baseConfig(arch string) map[string]any {
	return map[string]any{
		"model_type": arch, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 53, "rms_norm_eps": 1e-6,
		"max_position_embeddings": 512, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": false,
	}
}

func with(arch string, kv ...any) map[string]any {
	c := baseConfig(arch)
	for i := 0; i < len(kv); i += 2 {
		c[kv[i].(string)] = kv[i+1]
	}
	return c
}

// variants covers biases, q/k norm, GQA ratios, tied heads, explicit
// head_dim, partial rotary and every RoPE scaling type.
var variants = []variant{
	{"llama_gqa", with("llama")},
	{"llama_mha_bias_tied", with("llama", "num_key_value_heads", 4, "attention_bias", true, "mlp_bias", true, "tie_word_embeddings", true)},
	{"llama_mqa_partial", with("llama", "num_key_value_heads", 1, "partial_rotary_factor", 0.5)},
	{"llama_linear", with("llama", "rope_scaling", map[string]any{"type": "linear", "factor": 2.0})},
	{"llama_dynamic", with("llama", "max_position_embeddings", 8, "rope_scaling", map[string]any{"type": "dynamic", "factor": 2.0})},
	{"llama_llama3", with("llama", "rope_theta", 500000.0, "rope_scaling", map[string]any{
		"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64})},
	{"llama_yarn", with("llama", "rope_scaling", map[string]any{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})},
	{"llama_yarn_untruncated", with("llama", "head_dim", 32, "rope_theta", 1000.0, "rope_scaling", map[string]any{
		"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64, "truncate": false,
		"beta_fast": 8.0, "beta_slow": 0.5, "attention_factor": 1.2})},
	{"qwen2", with("qwen2")},
	{"qwen3", with("qwen3", "head_dim", 32, "tie_word_embeddings", true, "rope_theta", 1e6)},
	{"qwen3_gqa4", with("qwen3", "head_dim", 16, "num_key_value_heads", 1)},
}

// hfTensors lists the checkpoint tensors of a dense config with shapes.
func hfTensors(c map[string]any) map[string][]int {
	n := func(k string) int { f, _ := c[k].(float64); return int(f) }
	b := func(k string) bool { v, _ := c[k].(bool); return v }
	H, I, V, nh, nkv := n("hidden_size"), n("intermediate_size"), n("vocab_size"), n("num_attention_heads"), n("num_key_value_heads")
	hd := n("head_dim")
	if hd == 0 {
		hd = H / nh
	}
	arch := c["model_type"].(string)
	qkvBias := arch == "qwen2" || b("attention_bias")
	ts := map[string][]int{"model.embed_tokens.weight": {V, H}, "model.norm.weight": {H}}
	if !b("tie_word_embeddings") {
		ts["lm_head.weight"] = []int{V, H}
	}
	for l := range n("num_hidden_layers") {
		p := fmt.Sprintf("model.layers.%d.", l)
		ts[p+"input_layernorm.weight"] = []int{H}
		ts[p+"post_attention_layernorm.weight"] = []int{H}
		ts[p+"self_attn.q_proj.weight"] = []int{nh * hd, H}
		ts[p+"self_attn.k_proj.weight"] = []int{nkv * hd, H}
		ts[p+"self_attn.v_proj.weight"] = []int{nkv * hd, H}
		ts[p+"self_attn.o_proj.weight"] = []int{H, nh * hd}
		if qkvBias {
			ts[p+"self_attn.q_proj.bias"] = []int{nh * hd}
			ts[p+"self_attn.k_proj.bias"] = []int{nkv * hd}
			ts[p+"self_attn.v_proj.bias"] = []int{nkv * hd}
		}
		if arch == "llama" && b("attention_bias") {
			ts[p+"self_attn.o_proj.bias"] = []int{H}
		}
		if arch == "qwen3" {
			ts[p+"self_attn.q_norm.weight"] = []int{hd}
			ts[p+"self_attn.k_norm.weight"] = []int{hd}
		}
		ts[p+"mlp.gate_proj.weight"] = []int{I, H}
		ts[p+"mlp.up_proj.weight"] = []int{I, H}
		ts[p+"mlp.down_proj.weight"] = []int{H, I}
		if b("mlp_bias") {
			ts[p+"mlp.gate_proj.bias"] = []int{I}
			ts[p+"mlp.up_proj.bias"] = []int{I}
			ts[p+"mlp.down_proj.bias"] = []int{H}
		}
	}
	return ts
}

// writeHF writes a Hugging Face directory (config.json, model.safetensors)
// with random weights for the config.
func writeHF(t testing.TB, dir string, cfg map[string]any, seed uint64) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var norm map[string]any // numbers as float64, as hfTensors expects
	if err := json.Unmarshal(b, &norm); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 99))
	var wts []safetensors.WriteTensor
	ts := hfTensors(norm)
	for _, name := range slices.Sorted(maps.Keys(ts)) { // a fixed order: the same weights every run
		shape := ts[name]
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			switch {
			case strings.HasSuffix(name, "norm.weight"):
				v[i] = float32(1 + 0.2*r.NormFloat64())
			case strings.Contains(name, "embed_tokens"):
				v[i] = float32(r.NormFloat64())
			default:
				// Weights with std 1/sqrt(fan-in) keep activations O(1).
				v[i] = float32(r.NormFloat64() / math.Sqrt(float64(shape[len(shape)-1])))
			}
		}
		wts = append(wts, safetensors.WriteTensor{Name: name, DType: safetensors.F32, Shape: shape, Data: safetensors.F32Bytes(v)})
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), wts, nil); err != nil {
		t.Fatal(err)
	}
}

// convertHF converts dir to a CMF file of format q in a temp dir and opens it.
func convertHF(t testing.TB, dir string, q quant.DType) *cmf.Model {
	t.Helper()
	out := filepath.Join(t.TempDir(), "m.cmf")
	if _, err := convert.FromHF(context.Background(), dir, out, convert.Options{Quant: q, Threads: 1}); err != nil {
		t.Fatal(err)
	}
	m, err := cmf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// tinyModel writes, converts and loads one variant.
func tinyModel(t testing.TB, v variant, q quant.DType, opt model.LoadOptions) (*model.Model, *cmf.Model) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "hf")
	writeHF(t, dir, v.cfg, 1)
	cm := convertHF(t, dir, q)
	m, err := model.Load(cm, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m, cm
}

func prompt(n, vocab int, seed uint64) []int {
	r := rand.New(rand.NewPCG(seed, 5))
	ids := make([]int, n)
	for i := range ids {
		ids[i] = r.IntN(vocab)
	}
	return ids
}

// relErr returns max |got-want| over the RMS of want.
func relErr[F float32 | float64](got []float32, want []F) float64 {
	var ss, worst float64
	for i, w := range want {
		ss += float64(w) * float64(w)
		worst = max(worst, math.Abs(float64(got[i])-float64(w)))
	}
	return worst / math.Sqrt(ss/float64(len(want)))
}

func forward(t testing.TB, m *model.Model, c *model.Cache, ids []int, pos int, want model.Logits) []float32 {
	t.Helper()
	out, err := m.Forward(c, ids, pos, want)
	if err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), out...)
}

func newCache(t testing.TB, m *model.Model, n int) *model.Cache {
	t.Helper()
	c, err := m.NewCache(n)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestForwardMatchesReference runs every variant's f32 conversion and
// compares the logits of every prompt position with the float64 scalar
// reference forward.
func TestForwardMatchesReference(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			m, cm := tinyModel(t, v, quant.F32, opts(t, 2, 0))
			V := m.Arch.VocabSize
			ids := prompt(13, V, 1)
			got := forward(t, m, newCache(t, m, 32), ids, 0, model.AllLogits)
			ref := newRefModel(t, cm).forward(ids)
			var worst float64
			for p := range ids {
				e := relErr(got[p*V:(p+1)*V], ref[p])
				worst = max(worst, e)
				if e > forwardTolerance {
					t.Fatalf("position %d: max error %.3g of the logits' RMS (tolerance %g)", p, e, forwardTolerance)
				}
			}
			t.Logf("max error %.2g of the logits' RMS", worst)
		})
	}
}

// quantTolerance is the error allowed against the reference run on the
// same stored weights, as a fraction of the logits' RMS (max error). Only
// float32 rounding differs for the float formats, and for every format
// on the generic kernels: measured 5e-7 to 9e-7, allowed 3e-6. The SIMD
// kernels of the integer formats also quantize activations to int8 in
// blocks of 32 (as llama.cpp does), which adds 2.9–4% of the logits' RMS
// here (3–6.5% over 24 random tiny models): allowed 8%.
func quantTolerance(q quant.DType) float64 {
	if q.Quantized() && kernels.ISA() != "generic" {
		return 8e-2
	}
	return 3e-6
}

// TestQuantizedForwardMatchesReference checks the kernels of every stored
// format inside the whole forward pass: the reference decodes the same
// stored weights, so only activation rounding differs.
func TestQuantizedForwardMatchesReference(t *testing.T) {
	for _, q := range []quant.DType{quant.F16, quant.BF16, quant.Q8Row, quant.Q82F, quant.Q4TP} {
		for _, v := range []variant{variants[1], variants[9]} {
			t.Run(q.String()+"/"+v.name, func(t *testing.T) {
				m, cm := tinyModel(t, v, q, opts(t, 2, 5))
				V := m.Arch.VocabSize
				ids := prompt(11, V, 2)
				got := forward(t, m, newCache(t, m, 16), ids, 0, model.AllLogits)
				ref := newRefModel(t, cm).forward(ids)
				var worst float64
				for p := range ids {
					e := relErr(got[p*V:(p+1)*V], ref[p])
					worst = max(worst, e)
					if e > quantTolerance(q) {
						t.Fatalf("position %d: max error %.3g of the logits' RMS (tolerance %g, %s kernels)", p, e, quantTolerance(q), kernels.ISA())
					}
				}
				t.Logf("max error %.2g of the logits' RMS", worst)
			})
		}
	}
}

// TestDecodeMatchesPrefill prefills part of a prompt, then decodes the rest
// one token at a time through the cache; each step's logits must equal
// those of one fresh prefill of the whole sequence.
func TestDecodeMatchesPrefill(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			m, _ := tinyModel(t, v, quant.F32, opts(t, 2, 0))
			V, n := m.Arch.VocabSize, 12
			if v.name == "llama_dynamic" {
				// Dynamic NTK changes the frequencies with the sequence
				// length, so cached keys differ from a fresh prefill past
				// max_position_embeddings (as in transformers).
				n = m.Arch.MaxPositionEmbeddings
			}
			ids := prompt(n, V, 3)
			full := forward(t, m, newCache(t, m, n), ids, 0, model.AllLogits)
			c := newCache(t, m, n)
			forward(t, m, c, ids[:4], 0, model.NoLogits)
			for p := 4; p < n; p++ {
				got := forward(t, m, c, ids[p:p+1], p, model.LastLogits)
				if e := relErr(got, full[p*V:(p+1)*V]); e > 1e-5 {
					t.Fatalf("decode at %d: error %.3g", p, e)
				}
			}
			if c.Len() != n {
				t.Fatalf("cache holds %d, want %d", c.Len(), n)
			}
		})
	}
}

// TestPrefillMatchesTokenByToken compares batched prefill (MatMul), a
// prefill in chunks of 3 positions, and token-by-token decode (MatVec).
func TestPrefillMatchesTokenByToken(t *testing.T) {
	for _, v := range []variant{variants[0], variants[2], variants[8], variants[9]} {
		t.Run(v.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "hf")
			writeHF(t, dir, v.cfg, 4)
			cm := convertHF(t, dir, quant.F32)
			big, err := model.Load(cm, opts(t, 2, 0))
			if err != nil {
				t.Fatal(err)
			}
			defer big.Close()
			small, err := model.Load(cm, opts(t, 1, 3))
			if err != nil {
				t.Fatal(err)
			}
			defer small.Close()
			V := big.Arch.VocabSize
			ids := prompt(17, V, 4)
			batched := forward(t, big, newCache(t, big, 20), ids, 0, model.AllLogits)
			chunked := forward(t, small, newCache(t, small, 20), ids, 0, model.AllLogits)
			c := newCache(t, big, 20)
			for p, id := range ids {
				one := forward(t, big, c, []int{id}, p, model.LastLogits)
				if e := relErr(one, batched[p*V:(p+1)*V]); e > 1e-5 {
					t.Fatalf("position %d: token-by-token vs batched error %.3g", p, e)
				}
				if e := relErr(chunked[p*V:(p+1)*V], batched[p*V:(p+1)*V]); e > 1e-5 {
					t.Fatalf("position %d: chunked vs batched error %.3g", p, e)
				}
			}
			last := forward(t, big, newCache(t, big, 20), ids, 0, model.LastLogits)
			if e := relErr(last, batched[16*V:]); e > 1e-6 {
				t.Fatalf("LastLogits differs from the last row of AllLogits: %.3g", e)
			}
		})
	}
}

// TestCacheTruncateAndLimits rolls a cache back to a prefix and checks
// the context limit, position and token checks, and Bytes.
func TestCacheTruncateAndLimits(t *testing.T) {
	m, _ := tinyModel(t, variants[9], quant.F32, opts(t, 2, 0))
	V := m.Arch.VocabSize
	a, b, c2 := prompt(5, V, 10), prompt(4, V, 11), prompt(3, V, 12)
	c := newCache(t, m, 12)
	forward(t, m, c, append(append([]int(nil), a...), b...), 0, model.NoLogits)
	if err := c.Truncate(len(a)); err != nil {
		t.Fatal(err)
	}
	got := forward(t, m, c, c2, len(a), model.AllLogits)
	want := forward(t, m, newCache(t, m, 12), append(append([]int(nil), a...), c2...), 0, model.AllLogits)
	if e := relErr(got, want[len(a)*V:]); e > 1e-5 {
		t.Fatalf("after truncate: error %.3g", e)
	}
	if err := c.Truncate(100); err == nil {
		t.Error("truncate past the end accepted")
	}
	// 8 held + 5 more > 12: refused, and the cache is left as it was.
	if _, err := m.Forward(c, prompt(5, V, 13), c.Len(), model.LastLogits); err == nil || !strings.Contains(err.Error(), "exceed the context") {
		t.Errorf("overlong prompt: %v", err)
	}
	if c.Len() != 8 {
		t.Errorf("failed forward changed the cache length to %d", c.Len())
	}
	if _, err := m.Forward(c, []int{1}, 3, model.LastLogits); err == nil {
		t.Error("forward at a position other than Len accepted")
	}
	if _, err := m.Forward(c, []int{V}, 8, model.LastLogits); err == nil {
		t.Error("token outside the vocabulary accepted")
	}
	if _, err := m.Forward(c, nil, 8, model.LastLogits); err == nil {
		t.Error("empty token list accepted")
	}
	if _, err := m.NewCache(0); err == nil {
		t.Error("zero context accepted")
	}
	a2 := &m.Arch
	if want := int64(2 * a2.NumLayers * a2.NumKVHeads * 12 * a2.HeadDim * 4); c.Bytes() != want || c.Cap() != 12 {
		t.Errorf("Bytes %d Cap %d, want %d and 12", c.Bytes(), c.Cap(), want)
	}
	c.Reset()
	if c.Len() != 0 {
		t.Error("Reset")
	}
	other := newCache(t, m, 4)
	m2, _ := tinyModel(t, variants[0], quant.F32, opts(t, 1, 0))
	if _, err := m2.Forward(other, []int{1}, 0, model.LastLogits); err == nil {
		t.Error("cache of another model accepted")
	}
}

// rewrite copies a CMF file, letting edit change the header and the
// tensor list (a nil data slice keeps the original bytes).
func rewrite(t *testing.T, src *cmf.Model, edit func(h *cmf.Header, specs *[]cmf.TensorSpec, data map[string][]byte)) *cmf.Model {
	t.Helper()
	h := src.Header
	var specs []cmf.TensorSpec
	data := map[string][]byte{}
	for i := range src.Tensors {
		tt := &src.Tensors[i]
		specs = append(specs, cmf.TensorSpec{Name: tt.Name, DType: tt.DType, Shape: tt.Shape})
		data[tt.Name] = src.Data(tt)
	}
	edit(&h, &specs, data)
	out := filepath.Join(t.TempDir(), "bad.cmf")
	w, err := cmf.Create(out, &h, specs, cmf.WriteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		if err := w.WriteTensor(s.Name, data[s.Name]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	m, err := cmf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestLoadRejects(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hf")
	writeHF(t, dir, variants[9].cfg, 1)
	good := convertHF(t, dir, quant.F32)
	const q = "model.layers.1.self_attn.q_proj.weight"
	cases := []struct {
		name, want string
		edit       func(h *cmf.Header, specs *[]cmf.TensorSpec, data map[string][]byte)
	}{
		{"missing tensor", `"model.layers.1.self_attn.k_norm.weight" is missing`, func(h *cmf.Header, s *[]cmf.TensorSpec, d map[string][]byte) {
			for i, x := range *s {
				if x.Name == "model.layers.1.self_attn.k_norm.weight" {
					*s = append((*s)[:i], (*s)[i+1:]...)
					break
				}
			}
		}},
		{"wrong shape", q + `" has shape [64 128]`, func(h *cmf.Header, s *[]cmf.TensorSpec, d map[string][]byte) {
			for i, x := range *s {
				if x.Name == q {
					(*s)[i].Shape = []int{64, 128}
				}
			}
		}},
		{"vector dtype", `"model.norm.weight" is u8`, func(h *cmf.Header, s *[]cmf.TensorSpec, d map[string][]byte) {
			for i, x := range *s {
				if x.Name == "model.norm.weight" {
					(*s)[i].DType, (*s)[i].Shape = quant.U8, []int{256}
					(*s)[i].Shape = []int{64}
					d[x.Name] = d[x.Name][:64]
				}
			}
		}},
		{"matrix dtype", q + `" (i32)`, func(h *cmf.Header, s *[]cmf.TensorSpec, d map[string][]byte) {
			for i, x := range *s {
				if x.Name == q {
					(*s)[i].DType = quant.I32
				}
			}
		}},
		{"qk norm flag", "qk_norm", func(h *cmf.Header, s *[]cmf.TensorSpec, d map[string][]byte) { h.Arch.QKNorm = false }},
		{"moe arch without moe section", `qwen3_moe needs the header's moe section`, func(h *cmf.Header, s *[]cmf.TensorSpec, d map[string][]byte) {
			h.Arch.ArchName = "qwen3_moe"
		}},
		{"unknown arch", `unknown architecture "gpt2"`, func(h *cmf.Header, s *[]cmf.TensorSpec, d map[string][]byte) { h.Arch.ArchName = "gpt2" }},
		{"sliding window", "layer 1 is sliding_attention", func(h *cmf.Header, s *[]cmf.TensorSpec, d map[string][]byte) {
			h.Arch.LayerTypes = []string{"full_attention", "sliding_attention"}
		}},
		{"longrope", `"longrope" is not supported`, func(h *cmf.Header, s *[]cmf.TensorSpec, d map[string][]byte) {
			h.Arch.RopeScaling = &cmf.RopeScaling{Type: "longrope", Factor: 2}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bad := rewrite(t, good, c.edit)
			m, err := model.Load(bad, opts(t, 1, 0))
			if err == nil {
				m.Close()
				t.Fatal("loaded")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not contain %q", err, c.want)
			}
		})
	}
}

// opts returns load options on a CPU device of threads workers (0: all
// cores), closed when the test ends.
func opts(tb testing.TB, threads, batch int) model.LoadOptions {
	d := cpu.New(threads)
	tb.Cleanup(func() { d.Close() })
	return model.LoadOptions{Device: d, Batch: batch}
}

// TestSessionBytesMatchesAllocation checks the figures the command line
// compares with the memory available before allocating: NewCache
// allocates CacheBytes (within 3%: headers, the Cache struct and the
// allocator's rounding of large objects to pages are not counted), and a
// session's first full prefill step stays within SessionBytes (5% for the
// same rounding and the worker pool's small scratch).
func TestSessionBytesMatchesAllocation(t *testing.T) {
	for _, c := range []struct{ batch, ctx int }{{4, 3000}, {64, 500}, {16, 10000}} {
		m, _ := tinyModel(t, variants[9], quant.F32, opts(t, 2, c.batch))
		var before, mid, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		cache, err := m.NewCache(c.ctx)
		runtime.ReadMemStats(&mid)
		if err != nil {
			t.Fatal(err)
		}
		got, want := float64(mid.TotalAlloc-before.TotalAlloc), float64(m.CacheBytes(c.ctx))
		if math.Abs(got-want) > 0.03*want {
			t.Errorf("batch %d ctx %d: NewCache allocated %.0f bytes, CacheBytes says %.0f", c.batch, c.ctx, got, want)
		}
		if _, err := m.Forward(cache, prompt(c.batch, m.Arch.VocabSize, 1), 0, model.LastLogits); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		if got, bound := after.TotalAlloc-before.TotalAlloc, uint64(1.05*float64(m.SessionBytes(c.ctx))); got > bound {
			t.Errorf("batch %d ctx %d: a session and its first step allocated %d bytes, SessionBytes says %d", c.batch, c.ctx, got, bound)
		}
		runtime.KeepAlive(cache)
	}
}

// forwardTolerance bounds the f32 forward pass against the float64
// reference (fraction of the logits' RMS, max over positions): 3× the
// worst measured over the variants and kernel sets (1.2e-6 generic,
// 9.9e-7 avx2, 8.4e-7 avx512).
const forwardTolerance = 3.6e-6
