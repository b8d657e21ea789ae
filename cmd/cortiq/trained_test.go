package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/safetensors"
)

// trainedRef is testdata/trained/brown_llama/reference.json: a small Llama
// trained on the Brown corpus (tools/refgen/trained.py), whose predictions
// are confident enough to show what each weight format costs.
type trainedRef struct {
	EvalIDs       []int     `json:"eval_ids"`
	GreedyIDs     []int     `json:"greedy_ids"`
	GreedyMargins []float64 `json:"greedy_margins"`
	Perplexity    struct {
		Ctx, Chunks int
		PPL         float64 `json:"ppl"`
		Tokens      int     `json:"tokens_scored"`
	} `json:"perplexity"`
}

// TestTrainedModelFormats converts the trained fixture to every format and
// compares with transformers (float32, eager, from the bf16 checkpoint):
// f32 must match its logits, greedy ids and perplexity; the quantized
// formats must agree on the top-1 token at ≥ 95% of positions, with their
// KL divergence and perplexity reported.
func TestTrainedModelFormats(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "trained", "brown_llama")
	var ref trainedRef
	b, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	rs, err := safetensors.Open(filepath.Join(dir, "reference.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	want, _ := rs.Float32("logits")
	T := len(ref.EvalIDs)
	V := len(want) / T
	var q40Top1, q40Rel float64
	text, err := os.ReadFile(filepath.Join("..", "..", "testdata", "text", "brown_eval.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		q            string
		top1, pplRel float64 // minimum top-1 agreement, maximum perplexity increase
	}{{"f32", 1, 1e-4}, {"bf16", 1, 1e-4}, {"q8_row", 0.95, 0.01}, {"q8_2f", 0.95, 0.01}, {"sim-q8_0", 0, 1}, {"sim-q4_0", 0, 1}, {"q4tp", 0, 0}} {
		t.Run(c.q, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "m.cmf")
			src, q := dir, c.q
			if sim, ok := strings.CutPrefix(c.q, "sim-"); ok {
				// llama.cpp's Q4_0 / Q8_0 for comparison: the same tensors
				// fake-quantized (values rounded through the format) and
				// stored as f32; the head gets Q8_0 as in llama.cpp.
				src, q = simulateGGML(t, dir, sim), "f32"
			}
			if _, err := cli(t, "convert", src, "-o", p, "--quant", q); err != nil {
				t.Fatal(err)
			}
			e, err := engine.Open(p, engine.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			s, err := e.NewSession(T)
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.Model.Forward(s.Cache(), ref.EvalIDs, 0, model.AllLogits)
			if err != nil {
				t.Fatal(err)
			}
			var ss, worst, kl float64
			agree := 0
			for _, v := range want {
				ss += float64(v) * float64(v)
			}
			rms := math.Sqrt(ss / float64(len(want)))
			for p := 0; p < T; p++ {
				a, g := want[p*V:(p+1)*V], got[p*V:(p+1)*V]
				if argmax(a) == argmax(g) {
					agree++
				}
				kl += klDiv(a, g)
				for j := range a {
					worst = max(worst, math.Abs(float64(a[j]-g[j]))/rms)
				}
			}
			top1 := float64(agree) / float64(T)
			res, err := perplexity(context.Background(), e, mustEncode(t, e, string(text)), ref.Perplexity.Ctx, ref.Perplexity.Chunks, nil)
			if err != nil {
				t.Fatal(err)
			}
			rel := res.PPL/ref.Perplexity.PPL - 1
			t.Logf("%-6s top-1 agreement %.1f%%, mean KL %.2e nats, max |Δlogit|/rms %.2e, perplexity %.4f (transformers %.4f, %+.2f%%)",
				c.q, 100*top1, kl/float64(T), worst, res.PPL, ref.Perplexity.PPL, 100*rel)
			if c.q == "sim-q4_0" {
				q40Top1, q40Rel = top1, rel
			}
			if strings.HasPrefix(c.q, "sim-") {
				return // a comparison row, not a check
			}
			if c.q == "q4tp" {
				// No 4-bit format reaches 95% top-1 on a model this small
				// (llama.cpp's Q4_0 does not either): q4tp is held to
				// Q4_0's quality, within 5 points of agreement and one
				// point of perplexity.
				c.top1, c.pplRel = q40Top1-0.05, q40Rel+0.01
			}
			if top1 < c.top1 {
				t.Errorf("%s: top-1 agreement %.1f%% < %.0f%%", c.q, 100*top1, 100*c.top1)
			}
			if rel > c.pplRel || (c.q == "f32" || c.q == "bf16") && math.Abs(rel) > c.pplRel {
				t.Errorf("%s: perplexity %.4f vs transformers %.4f", c.q, res.PPL, ref.Perplexity.PPL)
			}
			if res.Tokens != ref.Perplexity.Tokens {
				t.Errorf("%d tokens scored, transformers %d", res.Tokens, ref.Perplexity.Tokens)
			}
			if c.q == "f32" || c.q == "bf16" {
				if worst > 1e-4 {
					t.Errorf("logits differ by %.2e of their RMS", worst)
				}
				out, err := cli(t, "run", p, "--ids", joinInts(ref.EvalIDs), "-n", "16", "--temperature", "0", "--ignore-eos", "--json")
				if err != nil {
					t.Fatal(err)
				}
				var gen struct{ IDs []int }
				json.Unmarshal([]byte(out), &gen)
				for i, id := range ref.GreedyIDs {
					if ref.GreedyMargins[i] < 1e-3 {
						break
					}
					if gen.IDs[i] != id {
						t.Fatalf("greedy %v, transformers %v", gen.IDs, ref.GreedyIDs)
					}
				}
			}
		})
	}
}

func mustEncode(t *testing.T, e *engine.Engine, s string) []int {
	ids, err := e.Encode(s, false)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func argmax(v []float32) int {
	b := 0
	for i, x := range v {
		if x > v[b] {
			b = i
		}
	}
	return b
}

// klDiv is KL(softmax(p) || softmax(q)) in nats.
func klDiv(p, q []float32) float64 {
	lse := func(v []float32) float64 {
		m := float64(v[argmax(v)])
		var z float64
		for _, x := range v {
			z += math.Exp(float64(x) - m)
		}
		return m + math.Log(z)
	}
	lp, lq := lse(p), lse(q)
	var kl float64
	for i := range p {
		a, b := float64(p[i])-lp, float64(q[i])-lq
		kl += math.Exp(a) * (a - b)
	}
	return kl
}

func joinInts(v []int) string {
	b := make([]byte, 0, 6*len(v))
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, []byte(itoaInt(x))...)
	}
	return string(b)
}

func itoaInt(x int) string { return strconv.Itoa(x) }

// simulateGGML writes a copy of the checkpoint whose 2-D weights are
// rounded through llama.cpp's Q4_0 or Q8_0 (quant.RefQ4_0/RefQ8_0), the
// output head through Q8_0, stored as f32.
func simulateGGML(t *testing.T, dir, format string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "sim")
	os.MkdirAll(out, 0o755)
	for _, f := range []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(out, f), b, 0o644)
	}
	st, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var ws []safetensors.WriteTensor
	for _, name := range st.Tensors() {
		info, _ := st.Tensor(name)
		v, err := st.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Shape) == 2 && info.Shape[1]%32 == 0 && name != "model.embed_tokens.weight" {
			if format == "q4_0" && name != "lm_head.weight" {
				v = quant.RefQ4_0(v)
			} else {
				v = quant.RefQ8_0(v)
			}
		}
		ws = append(ws, safetensors.WriteTensor{Name: name, DType: safetensors.F32, Shape: info.Shape, Data: safetensors.F32Bytes(v)})
	}
	if err := safetensors.Write(filepath.Join(out, "model.safetensors"), ws, nil); err != nil {
		t.Fatal(err)
	}
	return out
}
