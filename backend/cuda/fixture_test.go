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

// TestHybridSnapshotsOnFake: Qwen3-Next (q8_row; several Gated DeltaNet
// and attention layers) on the fake device resumes from model snapshots
// as the CPU does: a snapshot restored into another cache (RestoreFrom:
// K/V prefix copied, state restored) continues bitwise as the original
// cache, and a snapshot taken on the CPU backend restored into the GPU's
// cache (same tokens) continues within rounding of the GPU's own state:
// the two devices' snapshots have one layout over every layer.
func TestHybridSnapshotsOnFake(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.cmf")
	if _, err := convert.FromHF(context.Background(), filepath.Join("..", "..", "testdata", "models", "qwen3_next_f32"), path, convert.Options{Quant: quant.Q8Row, Threads: 1}); err != nil {
		t.Fatal(err)
	}
	f := newFake(t, 3)
	f.numeric, f.decoded = true, map[string][]float32{}
	dev := fakeOpen(f, Options{Seqs: 3, Ctx: 64, MaxRows: 16, Graphs: true})
	c := cpu.New(1)
	defer c.Close()
	load := func(d backend.Device) *model.Model {
		cm, err := cmf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cm.Close() })
		m, err := model.Load(cm, model.LoadOptions{Device: d, Batch: 5})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	gm, cm := load(dev), load(c)
	prompt := []int{1, 17, 33, 5, 90, 2, 64, 11, 7, 3, 45, 8}
	fwd := func(m *model.Model, cache *model.Cache, toks []int, pos int) []float32 {
		out, err := m.Forward(cache, toks, pos, model.LastLogits)
		if err != nil {
			t.Fatal(err)
		}
		return append([]float32(nil), out...)
	}
	newCache := func(m *model.Model) *model.Cache {
		cache, err := m.NewCache(32)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cache.Close() })
		return cache
	}
	ga, ca := newCache(gm), newCache(cm)
	fwd(gm, ga, prompt, 0)
	fwd(cm, ca, prompt, 0)
	gs, err := ga.Snapshot(nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := ca.Snapshot(nil)
	if err != nil {
		t.Fatal(err)
	}
	if gs.Bytes() != cs.Bytes() || gs.Bytes() != gm.SnapshotBytes() || gs.Len != len(prompt) {
		t.Fatalf("snapshots of %d and %d bytes (model %d) at length %d", gs.Bytes(), cs.Bytes(), gm.SnapshotBytes(), gs.Len)
	}
	next := fwd(gm, ga, []int{4}, len(prompt))
	if n := backendtest.NMSE(next, fwd(cm, ca, []int{4}, len(prompt))); n > 1e-9 {
		t.Fatalf("decode after the prompt: NMSE %.3g against the CPU", n)
	}
	gb := newCache(gm)
	if err := gb.RestoreFrom(ga, gs); err != nil {
		t.Fatal(err)
	}
	if got := fwd(gm, gb, []int{4}, len(prompt)); backendtest.NMSE(got, next) != 0 {
		t.Fatalf("resumed from the snapshot: NMSE %.3g against the original cache", backendtest.NMSE(got, next))
	}
	// The CPU's snapshot in the GPU's cache (its K/V rows hold the prompt).
	if err := gb.Restore(cs); err != nil {
		t.Fatal(err)
	}
	if n := backendtest.NMSE(fwd(gm, gb, []int{4}, len(prompt)), next); n > 1e-9 {
		t.Fatalf("resumed from the CPU's snapshot: NMSE %.3g against the GPU's own state", n)
	}
	if f.replays == 0 {
		t.Fatal("no decode step was replayed from a graph")
	}
}
