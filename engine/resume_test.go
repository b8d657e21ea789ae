package engine_test

import (
	"testing"

	"github.com/cortiq/cortiq/engine"
)

// TestResumeThenStep: Resume keeps the common prefix (at most all but the
// last prompt token) and Step over the rest gives Prefill's logits.
func TestResumeThenStep(t *testing.T) {
	e := fixture(t)
	a, err := e.Encode("<|im_start|>user\nTell me a story<|im_end|>\n", true)
	if err != nil {
		t.Fatal(err)
	}
	b := append(append([]int(nil), a[:len(a)-3]...), 7, 8, 9, 10)
	s, _ := e.NewSession(128)
	ref, _ := e.NewSession(128)
	defer s.Close()
	defer ref.Close()
	if _, err := e.Step([]*engine.Session{s}, [][]int{a}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		prompt []int
		keep   int
	}{{b, len(a) - 3}, {a[:5], 4}, {a[:1], 0}} {
		keep, err := s.Resume(c.prompt)
		if err != nil || keep != c.keep || len(s.Tokens()) != keep || s.Cache().Len() != keep {
			t.Fatalf("resume: keep %d (want %d), %d tokens, cache %d, %v", keep, c.keep, len(s.Tokens()), s.Cache().Len(), err)
		}
		got, err := e.Step([]*engine.Session{s}, [][]int{c.prompt[keep:]})
		if err != nil {
			t.Fatal(err)
		}
		ref.Reset()
		want, _, err := ref.Prefill(c.prompt)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if got[0][i] != want[i] {
				t.Fatalf("prompt of %d: logit %d: %v after Resume+Step, %v after Prefill", len(c.prompt), i, got[0][i], want[i])
			}
		}
	}
	if s.SnapshotInterval() != 0 {
		t.Fatal("a plain model reports a snapshot interval")
	}
}
