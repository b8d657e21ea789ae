package engine_test

import (
	"context"
	"slices"
	"testing"

	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/sample"
)

// TestStepNextGreedyEqualsGenerate decodes three sessions together with
// StepNext (ids only, no logits) and checks that each equals the same
// prompt generated alone with greedy sampling, that the sessions' tokens
// track their caches, and that a row asked for logits gets its own.
func TestStepNextGreedyEqualsGenerate(t *testing.T) {
	e := fixture(t)
	prompts := [][]int{{1, 2, 3, 4, 5}, {9, 8, 7}, {100, 200, 300, 400, 50, 60, 70}}
	const n = 8
	var want [][]int
	for _, p := range prompts {
		s, err := e.NewSession(64)
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.Generate(context.Background(), p, engine.GenOptions{MaxTokens: n, IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, r.IDs)
		s.Close()
	}
	ss := make([]*engine.Session, len(prompts))
	toks := make([][]int, len(prompts))
	for i, p := range prompts {
		s, err := e.NewSession(64)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ss[i], toks[i] = s, p // the whole prompt in the first step
	}
	got := make([][]int, len(prompts))
	next := make([]int, len(prompts))
	for k := range n {
		var wantLogits []bool
		if k == 3 {
			wantLogits = []bool{false, true, false}
		}
		lg, err := e.StepNext(ss, toks, wantLogits, next)
		if err != nil {
			t.Fatal(err)
		}
		for i := range ss {
			switch {
			case k == 3 && i == 1:
				id, err := sample.Greedy(lg[i])
				if err != nil || int(id) != next[i] {
					t.Fatalf("step %d: id %d, argmax of the logits beside it %d (%v)", k, next[i], id, err)
				}
			case lg[i] != nil:
				t.Fatalf("step %d: logits of session %d came back unasked", k, i)
			}
			got[i] = append(got[i], next[i])
			toks[i] = []int{next[i]}
		}
	}
	t.Logf("greedy ids: %v", got)
	for i := range prompts {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("session %d: batched greedy %v, alone %v", i, got[i], want[i])
		}
		if tk := ss[i].Tokens(); len(tk) != len(prompts[i])+n-1 || ss[i].Cache().Len() != len(tk) {
			t.Errorf("session %d: %d tokens tracked, cache %d", i, len(tk), ss[i].Cache().Len())
		}
	}
}
