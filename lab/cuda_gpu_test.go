package lab

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/synth"
)

// needGPU skips the test with the driver's reason when there is no GPU.
func needGPU(t *testing.T) {
	t.Helper()
	d, err := driver.Open(0)
	if errors.Is(err, driver.ErrNoDevice) {
		t.Skipf("no GPU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
}

// TestGPULabVariants: every CUDA variant matches arm 0 within its
// tolerance on random q4tp and q8_row tensors of odd shapes (with bf16,
// f16, f32 and q8_2f tensors that every variant runs in production), in
// every mode (the log shows which are bitwise; cur and shf are expected to be).
func TestGPULabVariants(t *testing.T) {
	needGPU(t)
	groups := oddWalk(t, true)
	rep, err := RunCUDA(context.Background(), groups, CUDAOptions{Rounds: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range rep.Notes {
		t.Errorf("note: %s", n)
	}
	if want := len(CUDAVariants()) * len(Modes); len(rep.Results) != want {
		t.Errorf("%d arms, want %d", len(rep.Results), want)
	}
	for _, r := range rep.Results {
		t.Logf("%-16s %s", r.Variant, r.Check)
		if r.Failed {
			t.Errorf("%s: %s, tolerance %.0e", r.Variant, r.Check, r.Tol)
		}
		if r.Tol >= 0 && r.Check == "" || r.Tol < 0 && r.Check != "n/a" {
			t.Errorf("%s: check %q with tolerance %g", r.Variant, r.Check, r.Tol)
		}
		if r.Tol == 0 && r.Check != "bitwise" {
			t.Errorf("%s: %s, want bitwise", r.Variant, r.Check)
		}
		if len(r.Times) != 2 || r.MedianMS <= 0 {
			t.Errorf("%s: times %v", r.Variant, r.Times)
		}
	}
	if rep.ReadProbeGBps <= 0 {
		t.Errorf("read probe %v GB/s", rep.ReadProbeGBps)
	}
}

// TestGPULabTinyModel: the lab over a tiny synthesized q4tp model and a
// q8_row one completes in each mode with every check passing.
func TestGPULabTinyModel(t *testing.T) {
	needGPU(t)
	for _, d := range []quant.DType{quant.Q4TP, quant.Q8Row} {
		t.Run(d.String(), func(t *testing.T) {
			a, err := synth.Arch("tiny_llama", "")
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "m.cmf")
			if _, err := synth.Write(context.Background(), path, a, d, synth.Options{Seed: 5}); err != nil {
				t.Fatal(err)
			}
			f, err := cmf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			groups, err := Walk(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, mode := range Modes {
				rep, err := RunCUDA(context.Background(), groups, CUDAOptions{Rounds: 3, Modes: []string{mode}})
				if err != nil {
					t.Fatalf("%s: %v", mode, err)
				}
				if len(rep.Notes) > 0 {
					t.Errorf("%s: %v", mode, rep.Notes)
				}
				for _, r := range rep.Results {
					if r.Failed || len(r.Times) != 3 || r.GBps <= 0 {
						t.Errorf("%s: %s: %s failed=%v times %v", mode, r.Variant, r.Check, r.Failed, r.Times)
					}
					if mode != ModeSerial && r.Mode != mode && r.Mode != ModeSerial {
						t.Errorf("%s: arm %s in mode %s", mode, r.Variant, r.Mode)
					}
				}
			}
		})
	}
}
