package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
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

// fixtureBounds are the accuracy bounds of the lossy weight formats on the
// dense fixtures, by the CPU's metrics (model.TestFixturesQuantized): the
// RMS logit error over the RMS of transformers' logits, and the mean KL
// divergence from transformers' distribution, over every prompt position
// of a fixture's cases. The quantized formats' numbers are the CPU test's
// quantBounds (keep them in step). f16: f32 fixtures converted to f16 are
// ≤ 3.5e-3 of the RMS in max error on the GPU; by these metrics the CPU
// measures ≤ 6.5e-4 relRMS and ≤ 2.5e-8 mean KL (qwen2_f32, llama_f32;
// TestFixtureMetricsCPU logs them): the bound is about 5× that in relRMS
// and 40× in KL (KL grows as the square of the error). bf16 fixtures hold
// f16 exactly (5e-7); f32 files are judged by the 1e-4 max-error bar.
var fixtureBounds = map[string]struct{ relRMS, meanKL float64 }{
	"f16":    {3e-3, 1e-6},
	"q8_row": {0.03, 1e-4},
	"q8_2f":  {0.03, 1e-4},
	"q4tp":   {0.35, 1.2e-2},
}

// fixtureQ4TP are the fixtures q4tp runs on, as model's q4tpFixtures: the
// others' layer weights are mostly too narrow for q4tp (stored q8_row).
var fixtureQ4TP = []string{"llama_f32", "llama_bf16_tied", "qwen3_bf16"}

// logitAgreement compares logit rows with reference rows: the RMS error
// over the reference's RMS, the mean KL(ref‖got) per row, and the largest
// |Δ| over the reference's RMS.
func logitAgreement(got, ref [][]float32) (relRMS, meanKL, maxRel float64) {
	var se, sr, sumKL, worst float64
	n := 0
	for i, r := range ref {
		for j, v := range r {
			d := float64(got[i][j] - v)
			se += d * d
			sr += float64(v) * float64(v)
			worst = max(worst, math.Abs(d))
		}
		n += len(r)
		sumKL += klDiv(r, got[i])
	}
	if n == 0 || sr == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	rms := math.Sqrt(sr / float64(n))
	return math.Sqrt(se/float64(n)) / rms, sumKL / float64(len(ref)), worst / rms
}

// fixtureLogits returns the prefill logits of every case's prompt on
// device (one row per position), and transformers' rows.
func fixtureLogits(t *testing.T, name, path, device string) (got, want [][]float32, cases []fixtureCase) {
	t.Helper()
	dir := filepath.Join("..", "..", "testdata", "models", name)
	ref, err := safetensors.Open(filepath.Join(dir, "reference.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	cases = loadCases(t, dir)
	for _, c := range cases {
		out, err := cli(t, "logits", path, "--ids", idList(c.PromptIDs), "--json", "--device", device)
		if err != nil {
			t.Fatal(err)
		}
		var lg struct{ Logits [][]float32 }
		if err := json.Unmarshal([]byte(out), &lg); err != nil {
			t.Fatal(err)
		}
		w, err := ref.Float32(c.TensorPrefix + "logits")
		if err != nil {
			t.Fatal(err)
		}
		V := len(w) / len(c.PromptIDs)
		if len(lg.Logits) != len(c.PromptIDs) {
			t.Fatalf("%s on %s: %d logit rows for %d prompt tokens", c.Name, device, len(lg.Logits), len(c.PromptIDs))
		}
		for p, row := range lg.Logits {
			if len(row) != V {
				t.Fatalf("%s on %s: a row of %d logits, vocabulary %d", c.Name, device, len(row), V)
			}
			got, want = append(got, row), append(want, w[p*V:(p+1)*V])
		}
	}
	return got, want, cases
}

func idList(ids []int) string {
	return strings.Trim(strings.Join(strings.Fields(fmt.Sprint(ids)), ","), "[]")
}

// TestGPUFixtures: every dense fixture, converted to each weight format,
// computes on the GPU (--device cuda) the prefill logits of transformers:
// f32 files (and bf16 files of the bf16 fixtures) within the CPU path's
// bar of 1e-4 of the logits' RMS in max error, the lossy formats within fixtureBounds by the CPU
// test's metrics (RMS error and mean KL). The GPU's logits are also
// compared with the CPU's (--device cpu) on the same converted file: the
// relRMS GPU vs CPU is logged for every format and bounded. f32 files
// reproduce transformers' greedy ids.
func TestGPUFixtures(t *testing.T) {
	needGPU(t)
	for _, name := range []string{"llama_f32", "llama_bf16_tied", "qwen2_f32", "qwen3_f32", "qwen3_bf16"} {
		formats := []string{"f32", "f16", "q8_row", "q8_2f", "q4tp"}
		if strings.Contains(name, "_bf16") {
			formats = append(formats, "bf16") // exact for bf16 weights: the f32 bar
		}
		for _, q := range formats {
			if q == "q4tp" && !slices.Contains(fixtureQ4TP, name) {
				continue
			}
			t.Run(name+"/"+q, func(t *testing.T) {
				path := convertFixture(t, name, q)
				got, want, cases := fixtureLogits(t, name, path, "cuda")
				cpuRows, _, _ := fixtureLogits(t, name, path, "cpu")
				rel, meanKL, worst := logitAgreement(got, want)
				t.Logf("GPU vs transformers: RMS error %.2e of the logits' RMS, mean KL %.2e, max |Δ| %.2e of the RMS (%d rows)", rel, meanKL, worst, len(want))
				cRel, cKL, _ := logitAgreement(cpuRows, want)
				t.Logf("CPU vs transformers: RMS error %.2e of the logits' RMS, mean KL %.2e", cRel, cKL)
				gc, gcKL, gcMax := logitAgreement(got, cpuRows)
				t.Logf("GPU vs CPU: relRMS %.2e, mean KL %.2e, max |Δ| %.2e of the RMS", gc, gcKL, gcMax)
				// GPU vs CPU: f32/bf16 files run the same float32 math in
				// another order; the lossy formats get the format's bound
				// against transformers. A first bound, to tighten from the
				// logged figures: for q8/q4tp the GPU will soon use int8
				// activations per block of 32 (the CPU's avx2 path quantizes
				// per row), so the two differ by more than summation order.
				gcBound := 1e-4
				if b, lossy := fixtureBounds[q]; lossy {
					if rel > b.relRMS || meanKL > b.meanKL || math.IsNaN(rel+meanKL) {
						t.Errorf("GPU logits differ from transformers by %.3g of the RMS (bound %g), mean KL %.3g (bound %g)", rel, b.relRMS, meanKL, b.meanKL)
					}
					gcBound = b.relRMS
				} else if worst > 1e-4 || math.IsNaN(worst) {
					t.Errorf("GPU logits differ from transformers by %.2e of RMS in max error (tolerance 1e-4)", worst)
				}
				if gc > gcBound || math.IsNaN(gc) {
					t.Errorf("GPU logits differ from the CPU's by %.3g of the RMS (bound %g)", gc, gcBound)
				}
				if q != "f32" {
					return
				}
				for _, c := range cases {
					out, err := cli(t, "run", path, "--ids", idList(c.PromptIDs), "-n", fmt.Sprint(len(c.GreedyIDs)), "--temperature", "0", "--ignore-eos", "--json", "--device", "cuda")
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

// TestFixtureMetricsCPU runs the lossy formats' check of TestGPUFixtures
// on the CPU, where it runs in CI: f16 files of every dense fixture (no
// other CPU test judges f16 against transformers) meet fixtureBounds by
// the same metrics, so the GPU is held to a bound the CPU meets. Measured
// here: relRMS ≤ 6.5e-4, mean KL ≤ 2.5e-8 (f32 fixtures), ≤ 5e-7 and
// 3e-15 (bf16 fixtures).
func TestFixtureMetricsCPU(t *testing.T) {
	b := fixtureBounds["f16"]
	for _, name := range []string{"llama_f32", "llama_bf16_tied", "qwen2_f32", "qwen3_f32", "qwen3_bf16"} {
		path := convertFixture(t, name, "f16")
		got, want, _ := fixtureLogits(t, name, path, "cpu")
		rel, meanKL, worst := logitAgreement(got, want)
		t.Logf("%s f16 on the CPU: RMS error %.2e of the logits' RMS, mean KL %.2e, max |Δ| %.2e of the RMS (%d rows)", name, rel, meanKL, worst, len(want))
		if rel > b.relRMS || meanKL > b.meanKL || math.IsNaN(rel+meanKL) {
			t.Errorf("%s f16 on the CPU: %.3g of the RMS (bound %g), mean KL %.3g (bound %g)", name, rel, b.relRMS, meanKL, b.meanKL)
		}
	}
}

// TestGPUBench: `cortiq bench --device cuda` takes the bandwidth fraction
// against the GPU's own read probe (cuda.Device.ReadProbe), not the
// host's: the JSON names the GPU as the probe's source with a figure a GPU
// has, the rows' threads are 0 ("-" in the table) and bandwidth_pct is
// against the row's device probe.
func TestGPUBench(t *testing.T) {
	needGPU(t)
	path := filepath.Join(t.TempDir(), "tiny.cmf")
	if _, err := cli(t, "synth", "--shape", "tiny_llama", "--quant", "q8_row", "-o", path); err != nil {
		t.Fatal(err)
	}
	out, err := cli(t, "bench", path, "-p", "16", "-n", "8", "-r", "2", "--device", "cuda", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var rep struct {
		ReadBandwidth float64 `json:"read_bandwidth_bytes_per_sec"`
		Source        string  `json:"read_bandwidth_source"`
		Profiles      []struct {
			Steps   int     `json:"steps"`
			Graphs  int     `json:"graph_replays"`
			Kernels int     `json:"kernels"`
			Step    float64 `json:"step_us"`
			Kernel  float64 `json:"kernel_us"`
			Gap     float64 `json:"gap_us"`
		} `json:"decode_step_profiles"`
		Results []struct {
			Test          string  `json:"test"`
			Threads       int     `json:"threads"`
			GBPerSec      float64 `json:"gb_per_sec"`
			BandwidthPct  float64 `json:"bandwidth_pct"`
			ReadBandwidth float64 `json:"read_bandwidth"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("read probe on %s: %.0f GB/s", rep.Source, rep.ReadBandwidth/1e9)
	if !strings.HasPrefix(rep.Source, "cuda:0") || !(rep.ReadBandwidth > 100e9 && rep.ReadBandwidth < 50000e9) || len(rep.Results) != 2 {
		t.Fatalf("report: %+v", rep)
	}
	if len(rep.Profiles) != 1 {
		t.Fatalf("decode_step_profiles: %+v", rep.Profiles)
	}
	pr := rep.Profiles[0]
	t.Logf("decode step: %.1f µs (%d steps, %d graph replays), kernels %.1f µs (%d), gaps %.1f µs", pr.Step, pr.Steps, pr.Graphs, pr.Kernel, pr.Kernels, pr.Gap)
	if pr.Steps != 8 || pr.Graphs < 1 || pr.Kernels < 5 || !(pr.Step > 0 && pr.Kernel > 0) || math.Abs(pr.Step-pr.Kernel-pr.Gap) > 1e-6*pr.Step {
		t.Errorf("decode step profile: %+v", pr)
	}
	for _, x := range rep.Results {
		if x.Threads != 0 {
			t.Errorf("%s: threads %d on the GPU", x.Test, x.Threads)
		}
		if x.Test == "tg8" {
			want := 100 * x.GBPerSec * 1e9 / x.ReadBandwidth
			if x.ReadBandwidth < rep.ReadBandwidth || !(x.BandwidthPct > 0) || math.Abs(x.BandwidthPct-want) > 1e-9*want {
				t.Errorf("tg8: %+v (bandwidth_pct want %g)", x, want)
			}
		}
	}
	out, err = cli(t, "bench", path, "-p", "0", "-n", "8", "-r", "1", "--device", "cuda")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "read bandwidth probed on cuda:0") || !strings.Contains(out, " | - | tg8 | ") {
		t.Errorf("table:\n%s", out)
	}
}

// TestGPUMoEFixture: the Qwen3-MoE fixture runs on the GPU — routing, the
// selected experts and the combine on the device — as f32 (float experts:
// within 1e-4 of transformers' RMS in max error, and of the CPU on the same
// file to 1e-5 relRMS) and converted to q8_row (experts included: within
// the q8_row bounds of transformers and of the CPU).
func TestGPUMoEFixture(t *testing.T) {
	needGPU(t)
	const name = "qwen3_moe_f32"
	for _, q := range []string{"f32", "q8_row"} {
		t.Run(q, func(t *testing.T) {
			path := convertFixture(t, name, q)
			gpu, ref, _ := fixtureLogits(t, name, path, "cuda")
			cpu, _, _ := fixtureLogits(t, name, path, "cpu")
			rel, kl, worst := logitAgreement(gpu, ref)
			t.Logf("GPU vs transformers: relRMS %.2e, mean KL %.2e, max |Δ| %.2e of the RMS (%d rows)", rel, kl, worst, len(ref))
			crel, ckl, cworst := logitAgreement(gpu, cpu)
			t.Logf("GPU vs CPU: relRMS %.2e, mean KL %.2e, max |Δ| %.2e of the RMS", crel, ckl, cworst)
			if q == "f32" {
				if worst > 1e-4 || math.IsNaN(worst) {
					t.Errorf("GPU vs transformers: max |Δ| %.3g of the RMS (bound 1e-4)", worst)
				}
				if crel > 1e-5 || math.IsNaN(crel) {
					t.Errorf("GPU vs CPU: relRMS %.3g (bound 1e-5)", crel)
				}
				return
			}
			b := fixtureBounds[q]
			if !(rel <= b.relRMS && kl <= b.meanKL) {
				t.Errorf("GPU vs transformers: relRMS %.3g (bound %g), mean KL %.3g (bound %g)", rel, b.relRMS, kl, b.meanKL)
			}
			if !(crel <= b.relRMS && ckl <= b.meanKL) {
				t.Errorf("GPU vs CPU: relRMS %.3g (bound %g), mean KL %.3g (bound %g)", crel, b.relRMS, ckl, b.meanKL)
			}
		})
	}
}

// TestGPUHybridFixtures: the hybrid fixtures (Gated DeltaNet layers on the
// device, gated attention; the MoE ones in q8_row so their experts run on
// the device too) compute on the GPU the prefill logits of transformers:
// Qwen3.5 in f32 within the f32 bar (max error 1e-4 of the logits' RMS),
// Qwen3-Next and Qwen3.5-MoE in q8_row within the CPU's q8 bounds for the
// hybrid fixtures, and each agrees with the CPU on the same file (f32:
// relRMS 1e-4; q8_row: those bounds).
func TestGPUHybridFixtures(t *testing.T) {
	needGPU(t)
	for _, fx := range []struct{ name, q string }{{"qwen3_5_f32", "f32"}, {"qwen3_next_f32", "q8_row"}, {"qwen3_5_moe_f32", "q8_row"}} {
		t.Run(fx.name+"/"+fx.q, func(t *testing.T) {
			path := convertFixture(t, fx.name, fx.q)
			gpu, ref, _ := fixtureLogits(t, fx.name, path, "cuda")
			cpu, _, _ := fixtureLogits(t, fx.name, path, "cpu")
			rel, kl, worst := logitAgreement(gpu, ref)
			t.Logf("GPU vs transformers: relRMS %.2e, mean KL %.2e, max |Δ| %.2e of the RMS (%d rows)", rel, kl, worst, len(ref))
			grel, gkl, gworst := logitAgreement(gpu, cpu)
			t.Logf("GPU vs CPU: relRMS %.2e, mean KL %.2e, max |Δ| %.2e of the RMS", grel, gkl, gworst)
			if fx.q == "f32" {
				if !(worst <= 1e-4) {
					t.Errorf("GPU vs transformers: max |Δ| %.3g of the RMS (tolerance 1e-4)", worst)
				}
				if !(grel <= 1e-4) {
					t.Errorf("GPU vs CPU: relRMS %.3g (bound 1e-4)", grel)
				}
				return
			}
			// model.TestHybridFixturesQuantized's q8 bounds for these
			// random hybrids (they amplify weight noise 3–5× more than the
			// dense fixtures): the CPU measures 8–12.5% of the RMS, KL ≤
			// 7.2e-4 against transformers. GPU vs CPU: the same bounds, a
			// first bound to tighten from the logged figures (the GPU's
			// prefill GEMM runs on bf16 activations, the CPU on int8).
			b := struct{ relRMS, meanKL float64 }{0.16, 1.5e-3}
			if !(rel <= b.relRMS && kl <= b.meanKL) {
				t.Errorf("GPU vs transformers: relRMS %.3g (bound %g), mean KL %.3g (bound %g)", rel, b.relRMS, kl, b.meanKL)
			}
			if !(grel <= b.relRMS && gkl <= b.meanKL) {
				t.Errorf("GPU vs CPU: relRMS %.3g (bound %g), mean KL %.3g (bound %g)", grel, b.relRMS, gkl, b.meanKL)
			}
		})
	}
}
