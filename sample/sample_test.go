package sample

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

func approx(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func TestExpNegMatchesMathExp(t *testing.T) {
	worst := 0.0
	for i := 0; i <= 1_000_000; i++ {
		x := -87 * float32(i) / 1_000_000
		want := math.Exp(float64(x))
		got := float64(expNeg(x))
		if rel := math.Abs(got-want) / want; rel > worst {
			worst = rel
		}
	}
	if worst > 1e-5 {
		t.Fatalf("expNeg worst relative error %g > 1e-5", worst)
	}
	if expNeg(float32(math.Inf(-1))) != 0 || expNeg(-100) != 0 {
		t.Fatal("expNeg of very negative input must be 0")
	}
	xs := []float32{3, 1, float32(math.Inf(-1)), 2.5}
	want := 0.0
	for _, x := range xs {
		want += math.Exp(float64((x - 3) * 0.5))
	}
	if got := sumExp(xs, 3, 0.5); !approx(got, want, 1e-5*want) {
		t.Fatalf("sumExp = %v, want %v", got, want)
	}
}

func TestApplyPenaltiesHandComputed(t *testing.T) {
	logits := []float32{2, -1, 0.5, 3}
	// token 0 twice, 1 and 2 once, 3 never; 99 is out of range.
	ApplyPenalties(logits, []int32{0, 1, 0, 2, 99}, 2, 0.5, 0.25)
	want := []float32{
		2.0/2 - 0.5 - 2*0.25, // 0
		-1*2 - 0.5 - 0.25,    // -2.75
		0.5/2 - 0.5 - 0.25,   // -0.5
		3,
	}
	for i := range want {
		if !approx(float64(logits[i]), float64(want[i]), 1e-6) {
			t.Errorf("token %d: got %v want %v", i, logits[i], want[i])
		}
	}
	// repeat 0 and 1 both disable the multiplicative part.
	for _, r := range []float32{0, 1} {
		l := []float32{2, -2}
		ApplyPenalties(l, []int32{0, 1}, r, 0, 0)
		if l[0] != 2 || l[1] != -2 {
			t.Errorf("repeat %v changed logits: %v", r, l)
		}
	}
}

func TestSamplerPenaltyWindowMatchesPlain(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 5, 64, -1} {
		p := Params{Temperature: 0, RepeatPenalty: 1.3, PresencePenalty: 0.4, FrequencyPenalty: 0.2, RepeatLastN: n}
		s, err := New(p)
		if err != nil {
			t.Fatal(err)
		}
		var all []int32
		for step := range 300 {
			tok := int32(rng.IntN(40))
			switch step % 7 {
			case 0:
				tok = int32(200 + rng.IntN(5)) // beyond the vocabulary: ignored
			case 3:
				s.Accept(-1) // never recorded
				s.Accept(1 << 30)
			}
			s.Accept(tok)
			all = append(all, tok)
			win := all
			if n > 0 && len(win) > n {
				win = win[len(win)-n:]
			}
			if got := s.History(); !slices.Equal(got, win) {
				t.Fatalf("n=%d step %d: history %v, want %v", n, step, got, win)
			}
			base := make([]float32, 50)
			for i := range base {
				base[i] = float32(rng.NormFloat64() * 3)
			}
			want := slices.Clone(base)
			ApplyPenalties(want, win, p.RepeatPenalty, p.PresencePenalty, p.FrequencyPenalty)
			got := slices.Clone(base)
			if _, err := s.Sample(got); err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("n=%d step %d token %d: sampler %v, plain %v", n, step, i, got[i], want[i])
				}
			}
		}
	}
}

func TestTopKHand(t *testing.T) {
	var c Candidates
	if err := c.Load([]float32{1, 3, 3, 2, 0}); err != nil {
		t.Fatal(err)
	}
	c.TopK(3)
	if !slices.Equal(c.IDs, []int32{1, 2, 3}) || !slices.Equal(c.Logits, []float32{3, 3, 2}) || !c.Sorted {
		t.Fatalf("TopK(3) = %v %v sorted=%v", c.IDs, c.Logits, c.Sorted)
	}
	c.TopK(1)
	if !slices.Equal(c.IDs, []int32{1}) {
		t.Fatalf("TopK(1) on sorted = %v", c.IDs)
	}
	// k <= 0 or >= n: no-op, order untouched.
	c.Load([]float32{1, 3, 2})
	c.TopK(0)
	c.TopK(3)
	if !slices.Equal(c.IDs, []int32{0, 1, 2}) || c.Sorted {
		t.Fatalf("disabled TopK changed the set: %v", c.IDs)
	}
}

// sortRef returns the ids of logits in best-first order by full sort.
func sortRef(logits []float32) []int32 {
	ids := make([]int32, len(logits))
	for i := range ids {
		ids[i] = int32(i)
	}
	sort.SliceStable(ids, func(a, b int) bool { return logits[ids[a]] > logits[ids[b]] })
	return ids
}

func randomLogits(rng *rand.Rand, n int) []float32 {
	l := make([]float32, n)
	for i := range l {
		switch rng.IntN(10) {
		case 0:
			l[i] = float32(rng.IntN(3)) // ties
		case 1:
			l[i] = float32(math.Inf(-1))
		default:
			l[i] = float32(rng.NormFloat64() * 3)
		}
	}
	return l
}

func TestTopKMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var c Candidates
	s, _ := New(Params{})
	for range 300 {
		n := 1 + rng.IntN(500)
		k := 1 + rng.IntN(n)
		l := randomLogits(rng, n)
		want := sortRef(l)[:k]
		if got, err := s.selectTop(l, k); err != nil || !slices.Equal(got, want) {
			t.Fatalf("selectTop n=%d k=%d: %v want %v", n, k, got, want)
		}
		c.Load(l)
		c.TopK(k)
		if k < n && !slices.Equal(c.IDs, want) {
			t.Fatalf("Candidates.TopK n=%d k=%d: %v want %v", n, k, c.IDs, want)
		}
	}
}

func TestTemperatureSoftmaxHand(t *testing.T) {
	var c Candidates
	c.Load([]float32{0, float32(math.Log(2)), float32(math.Log(3))})
	if err := c.Softmax(); err != nil {
		t.Fatal(err)
	}
	for i, w := range []float64{1.0 / 6, 2.0 / 6, 3.0 / 6} {
		if !approx(float64(c.Probs[i]), w, 1e-6) {
			t.Errorf("softmax[%d] = %v want %v", i, c.Probs[i], w)
		}
	}
	// T = 0.5 squares the ratios: 1:4:9.
	c.Load([]float32{0, float32(math.Log(2)), float32(math.Log(3))})
	c.Temperature(0.5)
	c.Softmax()
	for i, w := range []float64{1.0 / 14, 4.0 / 14, 9.0 / 14} {
		if !approx(float64(c.Probs[i]), w, 1e-6) {
			t.Errorf("T=0.5 softmax[%d] = %v want %v", i, c.Probs[i], w)
		}
	}
}

// loadProbs builds a candidate set whose softmax is exactly probs.
func loadProbs(t *testing.T, probs []float64) *Candidates {
	t.Helper()
	l := make([]float32, len(probs))
	for i, p := range probs {
		l[i] = float32(math.Log(p))
	}
	c := &Candidates{}
	if err := c.Load(l); err != nil {
		t.Fatal(err)
	}
	if err := c.Softmax(); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTopPHand(t *testing.T) {
	probs := []float64{0.05, 0.5, 0.15, 0.3} // best first: 1, 3, 2, 0
	for _, tc := range []struct {
		p    float32
		want []int32
	}{
		{0.5, []int32{1}},
		{0.7, []int32{1, 3}},
		{0.81, []int32{1, 3, 2}},
		{0.96, []int32{1, 3, 2, 0}},
		{0.01, []int32{1}}, // at least one
	} {
		c := loadProbs(t, probs)
		c.TopP(tc.p)
		if !slices.Equal(c.IDs, tc.want) {
			t.Errorf("TopP(%v) = %v want %v", tc.p, c.IDs, tc.want)
		}
	}
	c := loadProbs(t, probs)
	c.TopP(1)
	c.TopP(0)
	if c.Len() != 4 {
		t.Errorf("TopP(0/1) must be a no-op, kept %d", c.Len())
	}
}

func TestMinPHand(t *testing.T) {
	c := loadProbs(t, []float64{0.05, 0.5, 0.15, 0.3})
	c.MinP(0.2) // threshold 0.1: drops token 0
	if !slices.Equal(c.IDs, []int32{1, 2, 3}) {
		t.Fatalf("MinP(0.2) = %v", c.IDs)
	}
	c.MinP(1) // only the best survives
	if !slices.Equal(c.IDs, []int32{1}) {
		t.Fatalf("MinP(1) = %v", c.IDs)
	}
	c.Normalize()
	if c.Probs[0] != 1 {
		t.Fatalf("Normalize of a single token: %v", c.Probs[0])
	}
}

func TestDrawHand(t *testing.T) {
	c := &Candidates{IDs: []int32{7, 8, 9}, Probs: []float32{0.25, 0.5, 0.25}, Logits: make([]float32, 3)}
	for _, tc := range []struct {
		u    float64
		want int32
	}{{0, 7}, {0.24, 7}, {0.25, 8}, {0.74, 8}, {0.75, 9}, {0.999999, 9}} {
		if got, err := c.Draw(tc.u); err != nil || got != tc.want {
			t.Errorf("Draw(%v) = %v, %v want %v", tc.u, got, err, tc.want)
		}
	}
	// A zero-probability token is never drawn, even at u = 0.
	c = &Candidates{IDs: []int32{1, 2}, Probs: []float32{0, 1}, Logits: make([]float32, 2)}
	if got, _ := c.Draw(0); got != 2 {
		t.Errorf("Draw(0) picked a zero-probability token: %v", got)
	}
}

func TestGreedyTiesLowestID(t *testing.T) {
	l := []float32{1, 5, 5, 2, 5}
	if got, err := Greedy(l); err != nil || got != 1 {
		t.Fatalf("Greedy = %v, %v want 1", got, err)
	}
	s, _ := New(Params{Temperature: 0, Seed: 9})
	for range 5 {
		r, err := s.Sample(slices.Clone(l))
		if err != nil || r.Token != 1 {
			t.Fatalf("greedy Sample = %v, %v want 1", r.Token, err)
		}
	}
}

func TestNonFiniteLogits(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	ninf := float32(math.Inf(-1))
	configs := []Params{
		{},
		{Temperature: 1},
		{Temperature: 0.7, TopK: 2},
		{Temperature: 0.7, TopP: 0.9},
		{Temperature: 0.7, MinP: 0.1},
		{Temperature: 0.7, TopK: 3, TopP: 0.9, MinP: 0.1, LogProbs: true, TopLogProbs: 2},
	}
	for _, p := range configs {
		s, err := New(p)
		if err != nil {
			t.Fatal(err)
		}
		var ne *NaNError
		if _, err := s.Sample([]float32{1, nan, 2}); !errors.As(err, &ne) || ne.Index != 1 {
			t.Errorf("%+v: NaN gave %v", p, err)
		}
		if _, err := s.Sample([]float32{ninf, ninf}); !errors.Is(err, ErrNoCandidates) {
			t.Errorf("%+v: all -Inf gave %v", p, err)
		}
		if _, err := s.Sample(nil); !errors.Is(err, ErrNoCandidates) {
			t.Errorf("%+v: empty logits gave %v", p, err)
		}
		seen := map[int32]int{}
		for range 400 {
			r, err := s.Sample([]float32{3, inf, 5, inf, ninf})
			if err != nil {
				t.Fatalf("%+v: +Inf: %v", p, err)
			}
			seen[r.Token]++
		}
		if seen[1]+seen[3] != 400 {
			t.Errorf("%+v: +Inf tokens must take all the mass: %v", p, seen)
		}
		if p.Temperature > 0 && (seen[1] < 120 || seen[3] < 120) {
			t.Errorf("%+v: +Inf tokens must share equally: %v", p, seen)
		}
		for range 200 {
			r, err := s.Sample([]float32{ninf, 0, ninf, -1})
			if err != nil {
				t.Fatal(err)
			}
			if r.Token == 0 || r.Token == 2 {
				t.Fatalf("%+v: drew a -Inf token", p)
			}
		}
	}
	var c Candidates
	var ne *NaNError
	if err := c.Load([]float32{nan}); !errors.As(err, &ne) {
		t.Errorf("Load NaN: %v", err)
	}
	if _, err := Greedy([]float32{ninf}); !errors.Is(err, ErrNoCandidates) {
		t.Errorf("Greedy all -Inf: %v", err)
	}
}

func TestParamsValidation(t *testing.T) {
	bad := []Params{
		{Temperature: -1}, {Temperature: float32(math.NaN())}, {TopK: -1}, {TopP: 1.5}, {TopP: -0.1},
		{MinP: 2}, {RepeatPenalty: -1}, {PresencePenalty: float32(math.Inf(1))}, {TopLogProbs: -3},
	}
	for _, p := range bad {
		if _, err := New(p); err == nil {
			t.Errorf("New(%+v) accepted invalid params", p)
		}
	}
}

func llmLikeLogits(rng *rand.Rand, n int) []float32 {
	l := make([]float32, n)
	for i := range l {
		l[i] = float32(rng.NormFloat64()*2.5 - 4)
	}
	for range 30 { // a head of plausible tokens
		l[rng.IntN(n)] = float32(4 + rng.NormFloat64()*3)
	}
	return l
}

func TestDeterminism(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	logits := llmLikeLogits(rng, 5000)
	p := Params{Temperature: 1.1, TopP: 0.97, Seed: 42, RepeatPenalty: 1.1}
	run := func(s *Sampler) []int32 {
		var out []int32
		for range 200 {
			r, err := s.Sample(slices.Clone(logits))
			if err != nil {
				t.Fatal(err)
			}
			s.Accept(r.Token)
			out = append(out, r.Token)
		}
		return out
	}
	a, _ := New(p)
	b, _ := New(p)
	ra, rb := run(a), run(b)
	if !slices.Equal(ra, rb) {
		t.Fatal("same seed gave different sequences")
	}
	a.Reset()
	if !slices.Equal(run(a), ra) {
		t.Fatal("Reset did not reproduce the sequence")
	}
	p.Seed = 43
	c, _ := New(p)
	if slices.Equal(run(c), ra) {
		t.Fatal("different seeds gave the same 200-token sequence")
	}
}

// plainDistribution applies the exported stages in the documented order and
// returns token -> normalised probability.
func plainDistribution(t *testing.T, p Params, logits []float32) map[int32]float64 {
	t.Helper()
	var c Candidates
	if err := c.Load(logits); err != nil {
		t.Fatal(err)
	}
	c.TopK(p.TopK)
	c.Temperature(p.Temperature)
	if err := c.Softmax(); err != nil {
		t.Fatal(err)
	}
	c.TopP(p.TopP)
	c.MinP(p.MinP)
	c.Normalize()
	out := map[int32]float64{}
	for i, id := range c.IDs {
		if c.Probs[i] > 0 {
			out[id] = float64(c.Probs[i])
		}
	}
	return out
}

func fastDistribution(t *testing.T, s *Sampler, logits []float32) map[int32]float64 {
	t.Helper()
	ids, probs, err := s.distribution(logits)
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, q := range probs {
		sum += float64(q)
	}
	out := map[int32]float64{}
	for i, q := range probs {
		id := int32(i)
		if ids != nil {
			id = ids[i]
		}
		if q > 0 {
			out[id] = float64(q) / sum
		}
	}
	return out
}

func TestFastPathMatchesPlainChain(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 400 {
		n := 1 + rng.IntN(3000)
		var logits []float32
		if trial%2 == 0 {
			logits = llmLikeLogits(rng, n)
		} else {
			logits = randomLogits(rng, n)
			logits[rng.IntN(n)] = 1 // at least one finite
		}
		p := Params{Temperature: []float32{0.3, 0.7, 1, 1.5}[rng.IntN(4)]}
		if rng.IntN(2) == 0 {
			p.TopK = 1 + rng.IntN(n+5)
		}
		if rng.IntN(3) > 0 {
			p.TopP = []float32{0.5, 0.9, 0.95, 0.999}[rng.IntN(4)]
		}
		if rng.IntN(2) == 0 {
			p.MinP = []float32{0.01, 0.05, 0.2}[rng.IntN(3)]
		}
		s, err := New(p)
		if err != nil {
			t.Fatal(err)
		}
		want := plainDistribution(t, p, logits)
		got := fastDistribution(t, s, logits)
		if len(got) != len(want) {
			t.Fatalf("trial %d %+v n=%d: fast keeps %d tokens, plain %d", trial, p, n, len(got), len(want))
		}
		for id, w := range want {
			g, ok := got[id]
			if !ok || !approx(g, w, 1e-4*w+1e-7) {
				t.Fatalf("trial %d %+v: token %d fast %v plain %v", trial, p, id, g, w)
			}
		}
	}
}

func TestNucleusMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	s, _ := New(Params{})
	for range 300 {
		n := 1 + rng.IntN(2000)
		logits := randomLogits(rng, n)
		for i := range logits {
			if math.IsInf(float64(logits[i]), -1) {
				logits[i] = -30
			}
		}
		max := slices.Max(logits)
		total := s.gather(logits, float32(math.Inf(-1)), max, 1)
		target := total * rng.Float64()
		m := s.nucleus(logits, target)
		got := slices.Clone(s.ids[:m])
		slices.Sort(got)
		// Reference: sort everything, take the prefix.
		order := sortRef(logits)
		var cum float64
		k := len(order)
		for i, id := range order {
			cum += float64(expNeg(logits[id] - max))
			if cum >= target {
				k = i + 1
				break
			}
		}
		want := slices.Clone(order[:k])
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("n=%d target=%v: nucleus kept %d tokens, reference %d", n, target, len(got), len(want))
		}
	}
}

// chiSquare compares observed counts with expected probabilities, pooling
// bins with an expected count below 5 into one.
func chiSquare(counts map[int32]int, probs map[int32]float64, n int) (stat float64, df int) {
	var poolO, poolE float64
	for id, p := range probs {
		e := p * float64(n)
		o := float64(counts[id])
		if e < 5 {
			poolO += o
			poolE += e
			continue
		}
		stat += (o - e) * (o - e) / e
		df++
	}
	if poolE > 0 {
		stat += (poolO - poolE) * (poolO - poolE) / poolE
		df++
	}
	return stat, df - 1
}

func TestSamplingFrequenciesMatchDistribution(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	big := llmLikeLogits(rng, 2000)
	cases := []struct {
		name   string
		p      Params
		logits []float32
	}{
		{"temperature only", Params{Temperature: 0.8}, []float32{1, 2, 0.5, -1, 3, 2.2, 0, 1.5}},
		{"llama.cpp defaults", Params{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05}, big},
		{"top-p only", Params{Temperature: 1.2, TopP: 0.9}, big},
		{"min-p only", Params{Temperature: 1, MinP: 0.02}, big},
		{"top-k + min-p", Params{Temperature: 0.6, TopK: 6, MinP: 0.1}, []float32{1, 2, 0.5, -1, 3, 2.2, 0, 1.5}},
	}
	const draws = 40000
	for _, tc := range cases {
		tc.p.Seed = 1234
		s, err := New(tc.p)
		if err != nil {
			t.Fatal(err)
		}
		want := plainDistribution(t, tc.p, tc.logits)
		counts := map[int32]int{}
		for range draws {
			r, err := s.Sample(tc.logits)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := want[r.Token]; !ok {
				t.Fatalf("%s: drew token %d outside the kept set", tc.name, r.Token)
			}
			counts[r.Token]++
		}
		stat, df := chiSquare(counts, want, draws)
		// Loose bound: mean df, sd sqrt(2df); allow 6 sd plus slack.
		if limit := float64(df) + 6*math.Sqrt(2*float64(df)) + 10; stat > limit {
			t.Errorf("%s: chi-square %.1f with %d df exceeds %.1f", tc.name, stat, df, limit)
		}
		t.Logf("%s: %d kept tokens, chi-square %.1f, df %d", tc.name, len(want), stat, df)
	}
}

func TestLogProbs(t *testing.T) {
	logits := []float32{1, 3, 2, 3}
	lse := math.Log(math.Exp(1) + 2*math.Exp(3) + math.Exp(2))
	s, _ := New(Params{Temperature: 0, LogProbs: true, TopLogProbs: 3, RepeatPenalty: 3})
	s.Accept(1) // penalises token 1; greedy then picks token 3
	r, err := s.Sample(slices.Clone(logits))
	if err != nil {
		t.Fatal(err)
	}
	if r.Token != 3 || !approx(float64(r.LogProb), 3-lse, 1e-5) {
		t.Fatalf("token %d logprob %v, want 3 and %v", r.Token, r.LogProb, 3-lse)
	}
	wantTop := []TokenLogProb{{1, float32(3 - lse)}, {3, float32(3 - lse)}, {2, float32(2 - lse)}}
	for i, w := range wantTop {
		g := r.TopLogProbs[i]
		if g.Token != w.Token || !approx(float64(g.LogProb), float64(w.LogProb), 1e-5) {
			t.Fatalf("top[%d] = %+v want %+v", i, g, w)
		}
	}
	// The penalised token's logprob is still the raw one.
	s2, _ := New(Params{Temperature: 0, LogProbs: true, PresencePenalty: -5})
	s2.Accept(0) // a negative presence penalty boosts token 0 to the top
	r, _ = s2.Sample(slices.Clone(logits))
	if r.Token != 0 || !approx(float64(r.LogProb), 1-lse, 1e-5) {
		t.Fatalf("boosted token: %d logprob %v want 0 and %v", r.Token, r.LogProb, 1-lse)
	}
}

func TestSampleDoesNotAllocate(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	logits := llmLikeLogits(rng, 151936)
	for _, p := range []Params{
		{},
		{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05},
		{Temperature: 0.7, TopP: 0.95},
		{Temperature: 1},
		{Temperature: 1, MinP: 0.05, LogProbs: true, TopLogProbs: 5, RepeatPenalty: 1.1},
	} {
		s, _ := New(p)
		for i := range 64 {
			s.Accept(int32(i * 37))
		}
		s.Sample(logits) // warm up buffers
		allocs := testing.AllocsPerRun(5, func() {
			if _, err := s.Sample(logits); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%+v: %v allocations per Sample", p, allocs)
		}
	}
}

func BenchmarkSample(b *testing.B) {
	const vocab = 151936
	rng := rand.New(rand.NewPCG(15, 16))
	logits := llmLikeLogits(rng, vocab)
	for _, bc := range []struct {
		name string
		p    Params
	}{
		{"greedy", Params{}},
		{"llamacpp_defaults_k40_p0.95_minp0.05_t0.8", Params{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05}},
		{"qwen3_k20_p0.95_t0.6", Params{Temperature: 0.6, TopK: 20, TopP: 0.95}},
		{"topp0.95_t0.7", Params{Temperature: 0.7, TopP: 0.95}},
		{"minp0.05_t1", Params{Temperature: 1, MinP: 0.05}},
		{"temperature1_full", Params{Temperature: 1}},
		{"k40_penalties_logprobs_top5", Params{Temperature: 0.8, TopK: 40, RepeatPenalty: 1.1,
			PresencePenalty: 0.5, LogProbs: true, TopLogProbs: 5}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s, err := New(bc.p)
			if err != nil {
				b.Fatal(err)
			}
			for i := range 64 {
				s.Accept(int32(i * 101))
			}
			b.SetBytes(vocab * 4)
			for b.Loop() {
				if _, err := s.Sample(logits); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/token")
		})
	}
}

func TestLogProbsPositiveInf(t *testing.T) {
	inf := float32(math.Inf(1))
	s, _ := New(Params{Temperature: 1, LogProbs: true, TopLogProbs: 3})
	r, err := s.Sample([]float32{0, inf, 2, inf})
	if err != nil {
		t.Fatal(err)
	}
	if (r.Token != 1 && r.Token != 3) || !approx(float64(r.LogProb), -math.Ln2, 1e-6) {
		t.Fatalf("token %d logprob %v, want 1 or 3 with -ln2", r.Token, r.LogProb)
	}
	if r.TopLogProbs[2].Token != 2 || !math.IsInf(float64(r.TopLogProbs[2].LogProb), -1) {
		t.Fatalf("finite token next to +Inf must have logprob -Inf: %+v", r.TopLogProbs)
	}
}

// FuzzSample feeds arbitrary bytes as logits (any float32 bit pattern,
// NaN and Inf included) under varied parameters: Sample must return a valid
// token or an error, never panic.
func FuzzSample(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 192, 127}, uint8(3), uint8(90), uint8(5))
	f.Add([]byte{0, 0, 128, 127, 0, 0, 128, 255}, uint8(0), uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, raw []byte, k, p, mode uint8) {
		logits := make([]float32, len(raw)/4)
		for i := range logits {
			logits[i] = math.Float32frombits(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
		params := Params{
			Temperature: float32(mode%4) * 0.5,
			TopK:        int(k % 8),
			TopP:        float32(p%101) / 100,
			MinP:        float32(mode%3) * 0.1,
			LogProbs:    mode&8 != 0,
			TopLogProbs: int(mode % 5),
		}
		if mode&16 != 0 {
			params.RepeatPenalty, params.FrequencyPenalty = 1.3, 0.5
		}
		s, err := New(params)
		if err != nil {
			t.Fatal(err)
		}
		for i := range min(len(logits), 5) {
			s.Accept(int32(i))
		}
		r, err := s.Sample(logits)
		if err == nil && (r.Token < 0 || int(r.Token) >= len(logits)) {
			t.Fatalf("token %d out of range [0,%d)", r.Token, len(logits))
		}
	})
}

// TestDefaultsValid checks that the shared defaults pass validation and
// actually sample (not greedy), with the documented values.
func TestDefaultsValid(t *testing.T) {
	p := Defaults()
	if p.Temperature != 0.8 || p.TopK != 40 || p.TopP != 0.95 || p.MinP != 0.05 || p.RepeatPenalty != 1 || p.RepeatLastN != 64 {
		t.Fatalf("Defaults() = %+v", p)
	}
	if err := p.validate(); err != nil {
		t.Fatal(err)
	}
}

// PlainGreedy: only temperature 0 with no penalty and no log-probabilities.
func TestPlainGreedy(t *testing.T) {
	for _, c := range []struct {
		p    Params
		want bool
	}{
		{Params{}, true},
		{Params{RepeatPenalty: 1}, true},
		{Params{Temperature: 0.7}, false},
		{Params{RepeatPenalty: 1.1}, false},
		{Params{PresencePenalty: 0.5}, false},
		{Params{LogProbs: true}, false},
		{Params{TopLogProbs: 2}, false},
		{Params{TopK: 40}, true}, // greedy skips the later stages
	} {
		if got := c.p.PlainGreedy(); got != c.want {
			t.Errorf("%+v: PlainGreedy %v, want %v", c.p, got, c.want)
		}
	}
}
