package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/safetensors"
)

// needGPU skips unless a CUDA device opens.
func needGPU(t *testing.T) {
	t.Helper()
	d, err := openCUDA(0, deviceSize{seqs: 1, ctx: 16})
	if errors.Is(err, backend.ErrNoDevice) {
		t.Skipf("no GPU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
}

// TestGPUFixtures: every dense fixture, converted to each weight format,
// computes on the GPU (--device cuda) the prefill logits of transformers
// within the CPU path's bar for f32 weights (1e-4 of their RMS) and within
// the format's tolerance for the others, and reproduces the greedy ids.
func TestGPUFixtures(t *testing.T) {
	needGPU(t)
	tol := map[string]float64{"f32": 1e-4, "bf16": 1e-4, "f16": 2e-2, "q8_row": 5e-2, "q8_2f": 5e-2, "q4tp": 0.3}
	for _, name := range []string{"llama_f32", "llama_bf16_tied", "qwen2_f32", "qwen3_f32", "qwen3_bf16"} {
		for _, q := range []string{"f32", "f16", "q8_row", "q8_2f", "q4tp"} {
			t.Run(name+"/"+q, func(t *testing.T) {
				dir := filepath.Join("..", "..", "testdata", "models", name)
				path := convertFixture(t, name, q)
				ref, err := safetensors.Open(filepath.Join(dir, "reference.safetensors"))
				if err != nil {
					t.Fatal(err)
				}
				defer ref.Close()
				for _, c := range loadCases(t, dir) {
					ids := strings.Trim(strings.Join(strings.Fields(fmt.Sprint(c.PromptIDs)), ","), "[]")
					out, err := cli(t, "logits", path, "--ids", ids, "--json", "--device", "cuda")
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
					V := len(want) / len(c.PromptIDs)
					var ss float64
					for _, v := range want {
						ss += float64(v) * float64(v)
					}
					rms, worst := math.Sqrt(ss/float64(len(want))), 0.0
					for p, row := range lg.Logits {
						for j := 0; j < V; j++ {
							worst = max(worst, math.Abs(float64(row[j]-want[p*V+j]))/rms)
						}
					}
					t.Logf("%s %s: GPU max |Δlogit|/rms = %.2e", c.Name, q, worst)
					if worst > tol[q] {
						t.Fatalf("%s: GPU logits differ from transformers by %.2e of RMS (tolerance %.0e)", c.Name, worst, tol[q])
					}
					if q != "f32" {
						continue
					}
					out, err = cli(t, "run", path, "--ids", ids, "-n", fmt.Sprint(len(c.GreedyIDs)), "--temperature", "0", "--ignore-eos", "--json", "--device", "cuda")
					if err != nil {
						t.Fatal(err)
					}
					var gen struct{ IDs []int }
					if err := json.Unmarshal([]byte(out), &gen); err != nil {
						t.Fatal(err)
					}
					for i, id := range c.GreedyIDs {
						if i < len(c.GreedyMargins) && c.GreedyMargins[i] < 1e-4 {
							break
						}
						if i >= len(gen.IDs) || gen.IDs[i] != id {
							t.Fatalf("%s: GPU greedy ids %v, transformers %v (step %d)", c.Name, gen.IDs, c.GreedyIDs, i)
						}
					}
				}
			})
		}
	}
}

// TestGPULabCommand: `cortiq lab --device cuda` on a tiny q4tp model
// prints the GPU table (read probe, every launch mode) and its --json has
// every arm with a passing check.
func TestGPULabCommand(t *testing.T) {
	needGPU(t)
	path := filepath.Join(t.TempDir(), "tiny.cmf")
	if _, err := cli(t, "synth", "--shape", "tiny_qwen3", "--quant", "q4tp", "-o", path); err != nil {
		t.Fatal(err)
	}
	out, err := cli(t, "lab", path, "--device", "cuda", "--rounds", "2")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"read probe:", "of probe", "prod+graph", "prod+graph+pdl", "loads", "dp4a", "hlfm"} {
		if !strings.Contains(out, want) {
			t.Fatalf("GPU lab table lacks %q:\n%s", want, out)
		}
	}
	out, err = cli(t, "lab", path, "--device", "cuda", "--rounds", "2", "--variants", "shf", "--modes", "graph", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Probe   float64 `json:"read_probe_gb_per_sec"`
		Results []struct {
			Variant, Mode, Check string
			Failed               bool
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if rep.Probe <= 0 || len(rep.Results) != 4 || rep.Results[0].Variant != "prod" || rep.Results[3].Variant != "shf+graph" {
		t.Fatalf("lab --json: %+v", rep)
	}
	for _, r := range rep.Results {
		if r.Failed || r.Check == "" {
			t.Errorf("%s: %s failed=%v", r.Variant, r.Check, r.Failed)
		}
	}
}
