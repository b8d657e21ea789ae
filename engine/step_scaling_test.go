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
// steps are those the neighbours slowed least), for steps that bring every
// session's logits to the host (engine.Step) and for steps that return
// greedy ids only (engine.StepNext), interleaved. It measures; it asserts
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
	// ids: engine.StepNext without logits (the greedy server step); else
	// engine.Step (every session's logits to the host).
	step := func(ss []*engine.Session, k int, ids bool) time.Duration {
		toks := make([][]int, len(ss))
		for i := range toks {
			toks[i] = []int{10 + (k+i)%50}
		}
		next := make([]int, len(ss))
		t0 := time.Now()
		var err error
		if ids {
			_, err = e.StepNext(ss, toks, nil, next)
		} else {
			_, err = e.Step(ss, toks)
		}
		if err != nil {
			t.Fatal(err)
		}
		return time.Since(t0)
	}
	// Rounds alternate 1 and 8 sessions, each with logits then with ids.
	var t1, t8, i1, i8 []time.Duration
	for r := range rounds {
		for _, x := range []struct {
			ss   []*engine.Session
			ids  bool
			into *[]time.Duration
		}{{one, false, &t1}, {eight, false, &t8}, {one, true, &i1}, {eight, true, &i8}} {
			for k := range perRound / 2 {
				*x.into = append(*x.into, step(x.ss, r*perRound+k, x.ids))
			}
		}
	}
	for _, d := range [][]time.Duration{t1, t8, i1, i8} {
		slices.Sort(d)
	}
	t.Logf("1 session:  step min %v, median %v (%.1f tok/s at the minimum); ids only: min %v, median %v", t1[0], t1[len(t1)/2], 1/t1[0].Seconds(), i1[0], i1[len(i1)/2])
	t.Logf("8 sessions: step min %v, median %v (%.1f tok/s at the minimum); ids only: min %v, median %v", t8[0], t8[len(t8)/2], 8/t8[0].Seconds(), i8[0], i8[len(i8)/2])
	t.Logf("aggregate decode, 8 sessions / 1: %.2f× (minima), %.2f× (medians); ids only: %.2f× (minima), %.2f× (medians)",
		8*t1[0].Seconds()/t8[0].Seconds(), 8*t1[len(t1)/2].Seconds()/t8[len(t8)/2].Seconds(),
		8*i1[0].Seconds()/i8[0].Seconds(), 8*i1[len(i1)/2].Seconds()/i8[len(i8)/2].Seconds())
}
