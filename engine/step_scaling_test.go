package engine_test

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/cortiq/cortiq/engine"
)

// TestStepScaling times engine.Step on a real model file with 1 session
// and with 8, alternating rounds of each so that both see the same
// machine, and reports the per-step minimum and median and the aggregate
// rate ratio 8·t1/t8 (from the minima: on a shared machine the fastest
// steps are those the neighbours slowed least). It measures; it asserts
// only that the steps run. Set CORTIQ_LOAD_MODEL to a CMF file
// (CORTIQ_STEP_ROUNDS: rounds, default 12).
func TestStepScaling(t *testing.T) {
	path := os.Getenv("CORTIQ_LOAD_MODEL")
	if path == "" {
		t.Skip("set CORTIQ_LOAD_MODEL to a CMF file to time batched decode steps")
	}
	e, err := engine.Open(path, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	rounds := 12
	if v := os.Getenv("CORTIQ_STEP_ROUNDS"); v != "" {
		if _, err := fmt.Sscan(v, &rounds); err != nil {
			t.Fatal(err)
		}
	}
	const perRound = 4
	open := func(n int) []*engine.Session {
		ss := make([]*engine.Session, n)
		for i := range ss {
			s, err := e.NewSession(16 + rounds*perRound + 8)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.Prefill([]int{1, 2 + i, 3, 4, 5, 6, 7, 8}); err != nil {
				t.Fatal(err)
			}
			ss[i] = s
		}
		return ss
	}
	one, eight := open(1), open(8)
	defer func() {
		for _, s := range append(one, eight...) {
			s.Close()
		}
	}()
	step := func(ss []*engine.Session, k int) time.Duration {
		toks := make([][]int, len(ss))
		for i := range toks {
			toks[i] = []int{10 + (k+i)%50}
		}
		t0 := time.Now()
		if _, err := e.Step(ss, toks); err != nil {
			t.Fatal(err)
		}
		return time.Since(t0)
	}
	var t1, t8 []time.Duration
	for r := range rounds {
		for k := range perRound {
			t1 = append(t1, step(one, r*perRound+k))
		}
		for k := range perRound {
			t8 = append(t8, step(eight, r*perRound+k))
		}
	}
	slices.Sort(t1)
	slices.Sort(t8)
	t.Logf("1 session:  step min %v, median %v (%.1f tok/s at the minimum)", t1[0], t1[len(t1)/2], 1/t1[0].Seconds())
	t.Logf("8 sessions: step min %v, median %v (%.1f tok/s at the minimum)", t8[0], t8[len(t8)/2], 8/t8[0].Seconds())
	t.Logf("aggregate decode, 8 sessions / 1: %.2f× (minima), %.2f× (medians)",
		8*t1[0].Seconds()/t8[0].Seconds(), 8*t1[len(t1)/2].Seconds()/t8[len(t8)/2].Seconds())
}
