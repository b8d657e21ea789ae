package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/chat"
	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/safetensors"
)

// fixtureCase is one prompt of a reference fixture (testdata/models/README.md).
type fixtureCase struct {
	Name                string            `json:"name"`
	TensorPrefix        string            `json:"tensor_prefix"`
	Messages            []chat.Message    `json:"messages"`
	ChatTemplateKwargs  map[string]any    `json:"chat_template_kwargs"`
	AddGenerationPrompt bool              `json:"add_generation_prompt"`
	Text                string            `json:"text"`
	PromptIDs           []int             `json:"prompt_ids"`
	GreedyIDs           []int             `json:"greedy_ids"`
	GreedyMargins       []float64         `json:"greedy_margins"`
	Extra               map[string]string `json:"-"`
}

func loadCases(t *testing.T, dir string) []fixtureCase {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Cases []json.RawMessage `json:"cases"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	var out []fixtureCase
	for _, raw := range r.Cases {
		var c fixtureCase
		var m map[string]any
		json.Unmarshal(raw, &m)
		// greedy_margins may be stored as a JSON string of a list.
		if s, ok := m["greedy_margins"].(string); ok {
			var f []float64
			json.Unmarshal([]byte(s), &f)
			m["greedy_margins"] = f
		}
		nb, _ := json.Marshal(m)
		if err := json.Unmarshal(nb, &c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// fixtureTolerance is the largest prefill logit error allowed against
// transformers per fixture, as a fraction of the logits' RMS: 3× the
// largest figure measured over the kernel sets (the same figures as
// model.TestFixturesMatchTransformers: 2.2e-6, 2.6e-6, 1.7e-6, 4.2e-6 and
// 2.5e-6 in this order).
var fixtureTolerance = map[string]float64{
	"llama_f32": 7e-6, "llama_bf16_tied": 8e-6, "qwen2_f32": 5e-6, "qwen3_f32": 1.3e-5, "qwen3_bf16": 8e-6,
	// MoE / hybrid: 3× the largest over the kernel sets of 2.2e-6, 1.2e-5,
	// 2.0e-5, 2.6e-5, mostly transformers' own float32 drift (≤ 1.5e-5 of
	// the RMS from float64, testdata/f64).
	"qwen3_moe_f32": 7e-6, "qwen3_next_f32": 4e-5, "qwen3_5_f32": 6e-5, "qwen3_5_moe_f32": 8e-5,
}

// TestFixturesEndToEnd converts each reference fixture (dense, MoE and
// hybrid) with the CLI and checks, against Hugging Face transformers'
// outputs: the chat template render, tokenization, the prefill logits of
// every position (cortiq logits) and the 16-token greedy continuation with
// the cache (cortiq run --ids). transformers' float32 logits of the
// MoE/hybrid fixtures are within 1.5e-5 of the RMS of a float64 run
// (testdata/f64), well inside the 1e-4 bound.
func TestFixturesEndToEnd(t *testing.T) {
	for _, name := range []string{"llama_f32", "llama_bf16_tied", "qwen2_f32", "qwen3_f32", "qwen3_bf16",
		"qwen3_moe_f32", "qwen3_next_f32", "qwen3_5_f32", "qwen3_5_moe_f32"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("..", "..", "testdata", "models", name)
			cmfPath := filepath.Join(t.TempDir(), name+".cmf")
			if _, err := cli(t, "convert", dir, "-o", cmfPath, "--quant", "f32"); err != nil {
				t.Fatal(err)
			}
			ref, err := safetensors.Open(filepath.Join(dir, "reference.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			e, err := engine.Open(cmfPath, engine.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			for _, c := range loadCases(t, dir) {
				// Chat template from the CMF file renders like transformers.
				opt := chat.Options{AddGenerationPrompt: c.AddGenerationPrompt}
				if v, ok := c.ChatTemplateKwargs["enable_thinking"].(bool); ok {
					opt.EnableThinking = &v
				}
				text, err := e.RenderChat(c.Messages, opt)
				if err != nil {
					t.Fatal(err)
				}
				if text != c.Text {
					t.Fatalf("%s: rendered prompt differs:\n%q\n%q", c.Name, text, c.Text)
				}
				ids, err := e.Encode(text, true)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(ids, c.PromptIDs) {
					t.Fatalf("%s: prompt ids %v, transformers %v", c.Name, ids, c.PromptIDs)
				}
				idArg := strings.Trim(strings.Join(strings.Fields(fmt.Sprint(c.PromptIDs)), ","), "[]")
				// Prefill logits of every position.
				out, err := cli(t, "logits", cmfPath, "--ids", idArg, "--json")
				if err != nil {
					t.Fatal(err)
				}
				var lg struct{ Logits [][]float32 }
				if err := json.Unmarshal([]byte(out), &lg); err != nil {
					t.Fatal(err)
				}
				want, err := ref.Float32(c.TensorPrefix + "logits")
				if err != nil {
					t.Fatal(err)
				}
				if len(lg.Logits) != len(c.PromptIDs) {
					t.Fatalf("%s: %d rows of logits for %d prompt tokens", c.Name, len(lg.Logits), len(c.PromptIDs))
				}
				V := len(want) / len(c.PromptIDs)
				var ss float64
				for _, v := range want {
					ss += float64(v) * float64(v)
				}
				rms := math.Sqrt(ss / float64(len(want)))
				worst := 0.0
				for p, row := range lg.Logits {
					if len(row) < V {
						t.Fatalf("row %d has %d logits, want %d", p, len(row), V)
					}
					for j := 0; j < V; j++ {
						worst = max(worst, math.Abs(float64(row[j]-want[p*V+j]))/rms)
					}
				}
				t.Logf("%s: max |Δlogit|/rms = %.2e over %d×%d", c.Name, worst, len(lg.Logits), V)
				if tol := fixtureTolerance[name]; worst > tol {
					t.Fatalf("%s: prefill logits differ from transformers by %.2e of their RMS (tolerance %g)", c.Name, worst, tol)
				}
				// Greedy continuation with the KV cache.
				out, err = cli(t, "run", cmfPath, "--ids", idArg, "-n", fmt.Sprint(len(c.GreedyIDs)), "--temperature", "0", "--ignore-eos", "--json")
				if err != nil {
					t.Fatal(err)
				}
				var gen struct{ IDs []int }
				if err := json.Unmarshal([]byte(out), &gen); err != nil {
					t.Fatal(err)
				}
				for i, id := range c.GreedyIDs {
					if i < len(c.GreedyMargins) && c.GreedyMargins[i] < 1e-4 {
						t.Logf("%s: step %d margin %.1e too small to compare; stopping there", c.Name, i, c.GreedyMargins[i])
						break
					}
					if i >= len(gen.IDs) || gen.IDs[i] != id {
						t.Fatalf("%s: greedy ids %v, transformers %v (first difference at step %d)", c.Name, gen.IDs, c.GreedyIDs, i)
					}
				}
			}
		})
	}
}
