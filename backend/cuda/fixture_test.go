package cuda

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/backendtest"
	"github.com/cortiq/cortiq/backend/cpu"
	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/convert"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
)

// TestFixturesOnFake loads the repository's dense fixtures (several
// layers, GQA, q/k norm, biases, tied heads, bf16 weights) and hybrid ones
// (Qwen3.5, Qwen3-Next, Qwen3.5-MoE: Gated DeltaNet, gated attention, MoE) on the fake
// device with the kernels' models and on the CPU backend, and compares
// the logits of a chunked prefill (last-row gather), of every prefill row,
// and of decode steps (replayed graphs).
func TestFixturesOnFake(t *testing.T) {
	type fixture struct {
		name string
		q    quant.DType
	}
	var fixtures []fixture
	for _, name := range []string{"llama_f32", "llama_bf16_tied", "qwen2_f32", "qwen3_f32", "qwen3_bf16"} {
		fixtures = append(fixtures, fixture{name, quant.F32})
	}
	// The hybrids (Gated DeltaNet layers, gated attention; the MoE ones
	// in q8_row, the experts the device runs).
	fixtures = append(fixtures, fixture{"qwen3_f32", quant.Q4TP}, fixture{"qwen3_5_f32", quant.F32},
		fixture{"qwen3_next_f32", quant.Q8Row}, fixture{"qwen3_5_moe_f32", quant.Q8Row})
	for _, fx := range fixtures {
		name, q := fx.name, fx.q
		{
			t.Run(name+"/"+q.String(), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "m.cmf")
				if _, err := convert.FromHF(context.Background(), filepath.Join("..", "..", "testdata", "models", name), path, convert.Options{Quant: q, Threads: 1}); err != nil {
					t.Fatal(err)
				}
				f := newFake(t, 2)
				f.numeric, f.decoded = true, map[string][]float32{}
				dev := fakeOpen(f, Options{Seqs: 2, Ctx: 64, MaxRows: 16, Graphs: true})
				c := cpu.New(1)
				defer c.Close()
				run := func(d backend.Device) []float32 {
					cm, err := cmf.Open(path)
					if err != nil {
						t.Fatal(err)
					}
					defer cm.Close()
					m, err := model.Load(cm, model.LoadOptions{Device: d, Batch: 5})
					if err != nil {
						t.Fatal(err)
					}
					cache, err := m.NewCache(32)
					if err != nil {
						t.Fatal(err)
					}
					defer cache.Close()
					prompt := []int{1, 17, 33, 5, 90, 2, 64, 11, 7, 3, 45, 8}
					out, err := m.Forward(cache, prompt, 0, model.LastLogits)
					if err != nil {
						t.Fatal(err)
					}
					all := append([]float32(nil), out...)
					for i, tok := range []int{4, 19, 23, 6} {
						out, err := m.Forward(cache, []int{tok}, len(prompt)+i, model.LastLogits)
						if err != nil {
							t.Fatal(err)
						}
						all = append(all, out...)
					}
					c2, err := m.NewCache(32)
					if err != nil {
						t.Fatal(err)
					}
					defer c2.Close()
					out, err = m.Forward(c2, prompt[:7], 0, model.AllLogits)
					if err != nil {
						t.Fatal(err)
					}
					return append(all, out...)
				}
				got, want := run(dev), run(c)
				tol := 1e-9
				if q != quant.F32 {
					tol = 2e-4
				}
				if n := backendtest.NMSE(got, want); !(n <= tol) {
					t.Fatalf("NMSE %.3g against the CPU (tolerance %.0g)", n, tol)
				}
				if f.replays == 0 {
					t.Fatal("no decode step was replayed from a graph")
				}
				t.Logf("NMSE %.3g against the CPU; %d launches, %d replays", backendtest.NMSE(got, want), len(f.calls), f.replays)
			})
		}
	}
}
