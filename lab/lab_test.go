package lab_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/kernels"
	"github.com/cortiq/cortiq/lab"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/synth"
)

// TestLabTinyModel runs the CPU lab for a few rounds on tiny models of
// every quantized format and checks the walk and the correctness column
// (not the timings, which a shared machine cannot promise).
func TestLabTinyModel(t *testing.T) {
	for _, d := range []quant.DType{quant.Q4TP, quant.Q8Row, quant.Q82F, quant.BF16} {
		t.Run(d.String(), func(t *testing.T) {
			a, err := synth.Arch("tiny_llama", "")
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "m.cmf")
			if _, err := synth.Write(context.Background(), path, a, d, synth.Options{Seed: 3}); err != nil {
				t.Fatal(err)
			}
			f, err := cmf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			groups, err := lab.Walk(f)
			if err != nil {
				t.Fatal(err)
			}
			// 2 layers × (q|k|v, o, gate|up, down) + head.
			if len(groups) != 2*4+1 || len(groups[0]) != 3 || len(groups[2]) != 2 {
				t.Fatalf("walk has %d groups (first %d, third %d tensors)", len(groups), len(groups[0]), len(groups[2]))
			}
			pool, single := kernels.NewPool(2), kernels.NewPool(1)
			defer pool.Close()
			defer single.Close()
			rep, err := lab.Run(context.Background(), groups, lab.CPUVariants(pool, single), 3)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]lab.Result{}
			for _, r := range rep.Results {
				seen[r.Variant] = r
				if r.Failed {
					t.Errorf("%s: %s off production by %.2e (tolerance %.0e)", r.Variant, r.Check, r.Worst, r.Tol)
				}
				if len(r.Times) != 3 || r.MedianMS <= 0 || r.GBps <= 0 {
					t.Errorf("%s: times %v median %v GB/s %v", r.Variant, r.Times, r.MedianMS, r.GBps)
				}
			}
			for _, v := range []string{"prod", "split", "1thread"} {
				if seen[v].Check != "bitwise" {
					t.Errorf("%s: %q, want bitwise (same arithmetic as production)", v, seen[v].Check)
				}
			}
			if seen["prod"].Ratio != 1 || seen["loads"].Check != "n/a" {
				t.Errorf("arm 0 ratio %v, loads check %q", seen["prod"].Ratio, seen["loads"].Check)
			}
			if _, ok := seen["generic"]; !ok && len(kernels.ISAs()) > 1 {
				t.Error("no generic arm")
			}
			if rep.WalkBytes <= 0 || rep.Tensors != 2*7+1 {
				t.Errorf("walk bytes %d, tensors %d", rep.WalkBytes, rep.Tensors)
			}
		})
	}
}

// TestLabCatchesAWrongVariant: a variant whose output is off is marked
// failed (the check can fail).
func TestLabCatchesAWrongVariant(t *testing.T) {
	a, _ := synth.Arch("tiny_llama", "")
	path := filepath.Join(t.TempDir(), "m.cmf")
	if _, err := synth.Write(context.Background(), path, a, quant.Q8Row, synth.Options{Seed: 1}); err != nil {
		t.Fatal(err)
	}
	f, err := cmf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	groups, err := lab.Walk(f)
	if err != nil {
		t.Fatal(err)
	}
	pool := kernels.NewPool(1)
	defer pool.Close()
	vs := lab.CPUVariants(pool, nil)
	vs = append(vs, lab.Broken(vs[0], 1e-3))
	rep, err := lab.Run(context.Background(), groups, vs, 1)
	if err != nil {
		t.Fatal(err)
	}
	if last := rep.Results[len(rep.Results)-1]; !last.Failed || last.Worst < 1e-3 {
		t.Fatalf("a variant off by 1e-3 of RMS passed: %+v", last)
	}
}

func TestSelect(t *testing.T) {
	vs := lab.CPUVariants(nil, nil)
	got, err := lab.Select(vs, "loads, split")
	if err != nil || len(got) != 3 || got[0].Name != "prod" || got[1].Name != "loads" {
		t.Fatalf("Select: %v %v", got, err)
	}
	if _, err := lab.Select(vs, "nope"); err == nil {
		t.Fatal("unknown variant accepted")
	}
}
