package cpu_test

import (
	"slices"
	"testing"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/backendtest"
	"github.com/cortiq/cortiq/backend/cpu"
	"github.com/cortiq/cortiq/quant"
)

// TestParityAcrossThreads runs the parity suite on a 2-worker device
// against a 1-worker one: every row is computed by one worker with the same
// kernel either way, so the logits must be bitwise equal.
func TestParityAcrossThreads(t *testing.T) {
	two, one := cpu.New(2), cpu.New(1)
	defer two.Close()
	defer one.Close()
	backendtest.Parity(t, two, one, func(backendtest.Case) float64 { return 0 })
}

// TestBatchingDoesNotChangeResults: a schedule whose steps mix three
// sequences gives the logits of the same steps run one sequence at a
// time. Quantized formats quantize activations per row, so they match
// bitwise; float formats may take another inner kernel for one row.
func TestBatchingDoesNotChangeResults(t *testing.T) {
	d := cpu.New(2)
	defer d.Close()
	sched := backendtest.Schedules()["three_sequences"]
	for _, c := range backendtest.Cases() {
		got, err := backendtest.Run(d, c, sched, 5)
		if err != nil {
			t.Fatal(err)
		}
		want, err := backendtest.Run(d, c, backendtest.Serial(sched), 5)
		if err != nil {
			t.Fatal(err)
		}
		tol := 1e-12
		switch c.DType {
		case quant.F32, quant.F16, quant.BF16:
			tol = 1e-10
		}
		if e := backendtest.NMSE(got, want); e > tol {
			t.Errorf("%s: batched vs serial NMSE %.3g", c.Name, e)
		}
	}
}

// perturbed is a device whose logits are off by a relative 1e-3: the
// comparison the parity suite makes must see it.
type perturbed struct{ *cpu.Device }

func (p perturbed) Run(b *backend.Batch, step func(backend.Ops)) error {
	if err := p.Device.Run(b, step); err != nil {
		return err
	}
	for i := range b.Out {
		b.Out[i] *= 1.001
	}
	return nil
}

func TestParityDetectsADifference(t *testing.T) {
	d := cpu.New(1)
	defer d.Close()
	c := backendtest.Cases()[0]
	sched := backendtest.Schedules()["prefill3+decode"]
	got, err := backendtest.Run(perturbed{d}, c, sched, 1)
	if err != nil {
		t.Fatal(err)
	}
	want, err := backendtest.Run(d, c, sched, 1)
	if err != nil {
		t.Fatal(err)
	}
	if e := backendtest.NMSE(got, want); e < 0.5e-6 {
		t.Fatalf("a 1e-3 relative perturbation gave NMSE %.3g", e)
	}
}

// TestRunRejects: bad batches are errors, not panics.
func TestRunRejects(t *testing.T) {
	d := cpu.New(1)
	defer d.Close()
	spec := backend.SeqSpec{Layers: 1, Attention: []int{0}, KVHeads: 1, HeadDim: 8}
	s, err := d.NewSeq(spec, 4)
	if err != nil {
		t.Fatal(err)
	}
	noop := func(backend.Ops) {}
	for name, b := range map[string]*backend.Batch{
		"mismatch": {Seqs: []backend.Seq{s}},
		"empty":    {Seqs: []backend.Seq{s}, Tokens: [][]int{{}}},
		"overflow": {Seqs: []backend.Seq{s}, Tokens: [][]int{{1, 2, 3, 4, 5}}},
		"twice":    {Seqs: []backend.Seq{s, s}, Tokens: [][]int{{1}, {2}}},
	} {
		if err := d.Run(b, noop); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if s.Len() != 0 {
		t.Fatalf("a rejected step advanced the sequence to %d", s.Len())
	}
	if _, err := d.NewSeq(spec, 0); err == nil {
		t.Fatal("context 0 accepted")
	}
	if err := s.Truncate(1); err == nil {
		t.Fatal("truncate past the length accepted")
	}
}

// TestOutRows: the last logits written to one buffer per sequence
// (Batch.OutRows) equal those written to one block, bit for bit, for every
// case and schedule (one sequence: in place; several: through the run
// state).
func TestOutRows(t *testing.T) {
	d := cpu.New(2)
	defer d.Close()
	ran := 0
	for _, c := range backendtest.Cases() {
		for name, s := range backendtest.Schedules() {
			block, _, err := backendtest.RunLast(d, c, s, 3, false)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := backendtest.RunLastRows(d, c, s, 3)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(rows, block) {
				t.Fatalf("%s/%s: logits to rows differ from one block (NMSE %.3g)", c.Name, name, backendtest.NMSE(rows, block))
			}
			ran++
		}
	}
	if ran == 0 {
		t.Fatal("no case ran")
	}
}
