package cuda

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/synth"
)

// deepShape is a synth shape with its layer count raised to the real
// model's 48 (tiny widths: the host's per-launch cost does not depend on
// them).
func deepShape(tb testing.TB, shape string) cmf.Arch {
	a, err := synth.Arch(shape, "")
	if err != nil {
		tb.Fatal(err)
	}
	a.NumLayers = 48
	if len(a.LayerTypes) > 0 {
		a.LayerTypes = make([]string, 48)
		for i := range a.LayerTypes {
			a.LayerTypes[i] = "full_attention"
			if a.LinearCore != nil && i%4 != 3 {
				a.LayerTypes[i] = "linear_attention"
			}
		}
	}
	return a
}

// synthFile writes a model of arch with random weights in dt (seed) and
// returns its path.
func synthFile(tb testing.TB, arch cmf.Arch, dt quant.DType, seed uint64) string {
	path := filepath.Join(tb.TempDir(), "m.cmf")
	if _, err := synth.Write(context.Background(), path, arch, dt, synth.Options{Seed: seed}); err != nil {
		tb.Fatal(err)
	}
	return path
}

// loadOnFake loads the model at path on d (closed with the test) and
// returns it with a cache of ctx positions.
func loadOnFake(tb testing.TB, d *Device, path string, ctx int) (*model.Model, *model.Cache) {
	cm, err := cmf.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cm.Close() })
	m, err := model.Load(cm, model.LoadOptions{Device: d, Batch: 8})
	if err != nil {
		tb.Fatal(err)
	}
	c, err := m.NewCache(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return m, c
}

// decodeOnFake loads a 48-layer tiny model of shape on the fake device
// (graphs on), prefills a prompt and returns a function running one
// decode step (a replayed graph after the first).
func decodeOnFake(tb testing.TB, shape string, opt Options) (step func(), d *Device) {
	path := synthFile(tb, deepShape(tb, shape), quant.Q4TP, 1)
	f := newFake(tb, 1)
	opt.Seqs, opt.Ctx, opt.MaxRows, opt.Graphs = 1, 4096, 16, true
	d = fakeOpen(f, opt)
	m, c := loadOnFake(tb, d, path, 4096)
	if _, err := m.Forward(c, []int{1, 2, 3}, 0, model.LastLogits); err != nil {
		tb.Fatal(err)
	}
	tok := 5
	return func() {
		if _, err := m.Forward(c, []int{tok}, c.Len(), model.LastLogits); err != nil {
			tb.Fatal(err)
		}
		tok = (tok*31 + 7) % 200
	}, d
}

// BenchmarkDecodeCheck times the host's check of a replayed decode step
// of 48-layer MoE and hybrid models on the fake device: "every" packs
// each step's launches to compare them with the graph's
// (Options.CheckEveryStep), "memo" replays the model's step again without
// (Batch.Step); ns-check/launch is what the GPU's decode pays per kernel
// (cortiq bench's host line).
func BenchmarkDecodeCheck(b *testing.B) {
	for _, c := range []struct {
		shape, mode string
	}{{"tiny_qwen3_moe", "every"}, {"tiny_qwen3_moe", "memo"}, {"tiny_qwen3_next", "every"}, {"tiny_qwen3_next", "memo"}} {
		b.Run(c.shape+"/"+c.mode, func(b *testing.B) {
			step, d := decodeOnFake(b, c.shape, Options{CheckEveryStep: c.mode == "every"})
			step() // records the graph
			d.TimeSteps(true)
			step() // the kernel-by-kernel timed step
			b.ResetTimer()
			for range b.N {
				step()
			}
			b.StopTimer()
			st := d.StepTimes()
			if st.Steps != b.N || st.Graphs != b.N {
				b.Fatalf("%d steps timed, %d replayed, of %d", st.Steps, st.Graphs, b.N)
			}
			if want := b.N; c.mode == "every" {
				if st.Unchecked != 0 {
					b.Fatalf("%d steps replayed unchecked with CheckEveryStep", st.Unchecked)
				}
			} else if st.Unchecked < want-1 {
				b.Fatalf("%d of %d steps replayed unchecked", st.Unchecked, want)
			}
			check := st.HostCheck / time.Duration(b.N)
			b.ReportMetric(float64(check.Nanoseconds()), "ns-check/step")
			b.ReportMetric(float64(check.Nanoseconds())/float64(st.Kernels), "ns-check/launch")
			b.ReportMetric(float64(st.Kernels), "launches")
		})
	}
}
