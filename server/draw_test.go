package server

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/cortiq/cortiq/sample"
)

// TestDrawMatchesSerial: the scheduler's parallel draw over a step's rows
// gives each row exactly what its own sampler gives on its own (seeded
// sampling with top-k/top-p and log-probabilities), and skips rows still
// prefilling and rows whose token came from the device (no logits).
func TestDrawMatchesSerial(t *testing.T) {
	const n, V = 12, 4096
	params := func(i int) sample.Params {
		return sample.Params{Temperature: 0.8, TopK: 40 * (i % 2), TopP: 0.9, Seed: uint64(i), LogProbs: true, TopLogProbs: i % 3}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([][]float32, n)
	keep := make([][]float32, n)
	var rows []*slot
	for i := range n {
		sm, err := sample.New(params(i))
		if err != nil {
			t.Fatal(err)
		}
		sl := &slot{j: &job{params: params(i), sm: sm}}
		switch i {
		case 3:
			sl.pending = []int{1} // prefilling: nothing to draw
		case 5:
			rows = append(rows, sl)
			continue // its id came from the device: no logits
		}
		logits[i] = make([]float32, V)
		for k := range logits[i] {
			logits[i][k] = float32(rng.NormFloat64() * 3)
		}
		keep[i] = append([]float32(nil), logits[i]...)
		rows = append(rows, sl)
	}
	s := &scheduler{}
	for round := range 3 {
		s.draw(rows, logits)
		for i := range n {
			if i == 3 || i == 5 {
				if !reflect.DeepEqual(s.drawn[i], drawn{}) {
					t.Fatalf("row %d drawn: %+v", i, s.drawn[i])
				}
				continue
			}
			sm, _ := sample.New(params(i))
			var want sample.Result
			for range round + 1 { // the row's sampler has drawn round+1 times
				want, _ = sm.Sample(append([]float32(nil), keep[i]...))
			}
			got := s.drawn[i]
			if got.err != nil || got.r.Token != want.Token || got.r.LogProb != want.LogProb || !reflect.DeepEqual(got.r.TopLogProbs, want.TopLogProbs) {
				t.Fatalf("round %d row %d: drawn %+v, alone %+v", round, i, got, want)
			}
			copy(logits[i], keep[i]) // Sample uses the logits as scratch
		}
	}
}
