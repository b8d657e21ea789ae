package model_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/cpu"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/sample"
)

// argmaxCPU is the CPU device made a backend.Argmaxer the way a GPU is
// one: it serves Batch.Next and Batch.LogitsOf itself, so that the model's
// device branch of ForwardMultiNext runs without a GPU.
type argmaxCPU struct {
	*cpu.Device
	vocab int
	runs  int // steps that asked for ids
}

func (d *argmaxCPU) Argmaxes() bool { return true }

func (d *argmaxCPU) Run(b *backend.Batch, step func(backend.Ops)) error {
	if b.Next == nil {
		return d.Device.Run(b, step)
	}
	d.runs++
	V := d.vocab
	if len(b.Out) < len(b.LogitsOf)*V && len(b.OutRows) < len(b.LogitsOf) {
		return fmt.Errorf("argmaxCPU: Out of %d, %d rows, for %d rows", len(b.Out), len(b.OutRows), len(b.LogitsOf))
	}
	inner := *b
	inner.Next, inner.LogitsOf, inner.OutRows, inner.Out = nil, nil, nil, make([]float32, len(b.Seqs)*V)
	if err := d.Device.Run(&inner, step); err != nil {
		return err
	}
	for i := range b.Seqs {
		id, err := sample.Greedy(inner.Out[i*V : (i+1)*V])
		if err != nil {
			return err
		}
		b.Next[i] = id
	}
	for k, i := range b.LogitsOf {
		if b.OutRows != nil {
			copy(b.OutRows[k][:V], inner.Out[i*V:(i+1)*V])
		} else {
			copy(b.Out[k*V:(k+1)*V], inner.Out[i*V:(i+1)*V])
		}
	}
	return nil
}

// TestForwardMultiNext runs the same batched steps (prefill chunks, then
// decode rows of four sequences) three ways on one model: ForwardMulti
// (every row's logits), ForwardMultiNext asking for the logits of every
// other sequence, and ForwardMultiNext asking for all of them. Every id
// must be the argmax of ForwardMulti's logits of the same step (ties to
// the lowest id, sample.Greedy), and of the logits returned beside it; the
// logits returned must equal ForwardMulti's; the others must be nil. On
// the CPU the model reduces the logits itself; on argmaxCPU the device
// picks the ids (backend.Argmaxer).
func TestForwardMultiNext(t *testing.T) {
	for _, dev := range []string{"cpu", "argmaxer"} {
		for _, q := range []quant.DType{quant.F32, quant.Q4TP} {
			t.Run(dev+"/"+q.String(), func(t *testing.T) {
				c := cpu.New(2)
				defer c.Close()
				var d backend.Device = c
				am := &argmaxCPU{Device: c}
				if dev == "argmaxer" {
					d = am
				}
				m, _ := tinyModel(t, variants[0], q, model.LoadOptions{Device: d, Batch: 5})
				V := m.Arch.VocabSize
				am.vocab = V
				const seqs = 4
				var ids [seqs][]int
				var ref, half, all [seqs]*model.Cache
				for i := range seqs {
					ids[i] = prompt(3+2*i+12, V, uint64(40+i))
					ref[i], half[i], all[i] = newCache(t, m, 32), newCache(t, m, 32), newCache(t, m, 32)
				}
				for step := 0; step < 10; step++ {
					var toks [][]int
					for i := range seqs {
						if step == 0 {
							toks = append(toks, ids[i][:2+i]) // prefill chunks of 2..5
						} else {
							p := ref[i].Len()
							toks = append(toks, ids[i][p:p+1])
						}
					}
					lg, err := m.ForwardMulti(ref[:], toks)
					if err != nil {
						t.Fatal(err)
					}
					wantIDs := make([]int, seqs)
					for i := range seqs {
						id, err := sample.Greedy(lg[i])
						if err != nil {
							t.Fatal(err)
						}
						wantIDs[i] = int(id)
					}
					for _, run := range []struct {
						caches []*model.Cache
						want   []bool
					}{{half[:], []bool{false, true, false, true}}, {all[:], []bool{true, true, true, true}}} {
						next := make([]int, seqs)
						got, err := m.ForwardMultiNext(run.caches, toks, run.want, next)
						if err != nil {
							t.Fatal(err)
						}
						if !slices.Equal(next, wantIDs) {
							t.Fatalf("step %d want %v: ids %v, argmax of ForwardMulti's logits %v", step, run.want, next, wantIDs)
						}
						for i, w := range run.want {
							switch {
							case !w && got[i] != nil:
								t.Fatalf("step %d: logits of sequence %d came back unasked", step, i)
							case w && !slices.Equal(got[i], lg[i]):
								t.Fatalf("step %d: sequence %d's logits differ from ForwardMulti's (error %.3g)", step, i, relErr(got[i], lg[i]))
							case w:
								if id, _ := sample.Greedy(got[i]); int(id) != next[i] {
									t.Fatalf("step %d: sequence %d: id %d, argmax of its own logits %d", step, i, next[i], id)
								}
							}
						}
					}
				}
				if dev == "argmaxer" && am.runs != 20 {
					t.Fatalf("the device picked ids in %d steps, want 20", am.runs)
				}
				// No ids for a cache given twice, nor a wrong count of ids.
				if _, err := m.ForwardMultiNext([]*model.Cache{ref[0], ref[0]}, [][]int{{1}, {2}}, nil, make([]int, 2)); err == nil {
					t.Fatal("a cache twice in one step was accepted")
				}
				if _, err := m.ForwardMultiNext(ref[:1], [][]int{{1}}, nil, nil); err == nil {
					t.Fatal("no room for the ids was accepted")
				}
			})
		}
	}
}
