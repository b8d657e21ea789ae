package model_test

import (
	"testing"

	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
)

// TestForwardMultiMatchesSingle steps several sequences together (decode
// rows mixed with prefill chunks, at different lengths) and compares each
// sequence's logits with the same sequence run alone.
func TestForwardMultiMatchesSingle(t *testing.T) {
	for _, v := range []variant{variants[0], variants[8], variants[9]} {
		for _, q := range []quant.DType{quant.F32, quant.Q8Row} {
			t.Run(v.name+"/"+q.String(), func(t *testing.T) {
				m, _ := tinyModel(t, v, q, opts(t, 2, 5))
				V := m.Arch.VocabSize
				const seqs = 4
				ids := make([][]int, seqs)
				caches := make([]*model.Cache, seqs)
				for i := range ids {
					ids[i] = prompt(9+3*i, V, uint64(10+i))
					caches[i] = newCache(t, m, 32)
				}
				// Step 1: prefill chunks of different lengths; steps 2..: the
				// rest, one token per sequence per step, with sequence 3 still
				// prefilling in chunks of 4.
				pos := make([]int, seqs)
				for step := 0; ; step++ {
					var cs []*model.Cache
					var toks [][]int
					var who []int
					for i := range ids {
						if pos[i] == len(ids[i]) {
							continue
						}
						n := 1
						if step == 0 {
							n = 2 + i
						} else if i == 3 {
							n = 4
						}
						n = min(n, len(ids[i])-pos[i])
						cs = append(cs, caches[i])
						toks = append(toks, ids[i][pos[i]:pos[i]+n])
						who = append(who, i)
					}
					if len(cs) == 0 {
						break
					}
					got, err := m.ForwardMulti(cs, toks)
					if err != nil {
						t.Fatal(err)
					}
					for j, i := range who {
						pos[i] += len(toks[j])
						alone := forward(t, m, newCache(t, m, 32), ids[i][:pos[i]], 0, model.LastLogits)
						if e := relErr(got[j], alone); e > 1e-5 {
							t.Fatalf("step %d sequence %d at %d: batched vs alone error %.3g", step, i, pos[i], e)
						}
					}
				}
				for i, c := range caches {
					if c.Len() != len(ids[i]) {
						t.Fatalf("sequence %d: cache holds %d, want %d", i, c.Len(), len(ids[i]))
					}
				}
				if _, err := m.ForwardMulti([]*model.Cache{caches[0], caches[0]}, [][]int{{1}, {2}}); err == nil {
					t.Fatal("a cache twice in one step was accepted")
				}
				if _, err := m.ForwardMulti([]*model.Cache{caches[0]}, [][]int{make([]int, 40)}); err == nil {
					t.Fatal("a step past the context was accepted")
				}
			})
		}
	}
}
