package sample

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sort"
)

// DefaultRepeatLastN is the penalty window used when Params.RepeatLastN is 0
// (llama.cpp's default).
const DefaultRepeatLastN = 64

// Params configures a Sampler. The zero value is valid: greedy decoding with
// no penalties.
type Params struct {
	// Temperature divides the logits; 0 selects greedy decoding (argmax,
	// ties to the lowest id) and skips every later stage.
	Temperature float32
	// TopK keeps the K most likely tokens; 0 disables it.
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probability
	// mass is at least TopP; 0 or 1 disables it.
	TopP float32
	// MinP drops tokens whose probability is below MinP times that of the
	// most likely token; 0 disables it.
	MinP float32
	// RepeatPenalty divides positive logits and multiplies negative ones of
	// tokens in the penalty window; 0 or 1 disables it.
	RepeatPenalty float32
	// PresencePenalty is subtracted once from the logit of every token in the
	// penalty window (OpenAI presence_penalty).
	PresencePenalty float32
	// FrequencyPenalty is subtracted once per occurrence in the penalty window
	// (OpenAI frequency_penalty).
	FrequencyPenalty float32
	// RepeatLastN is the penalty window: the last RepeatLastN accepted
	// tokens. 0 means DefaultRepeatLastN; negative means every accepted token.
	RepeatLastN int
	// Seed seeds the PCG generator; equal seeds and inputs give equal draws.
	Seed uint64
	// LogProbs requests Result.LogProb (costs one exponential per vocabulary
	// entry).
	LogProbs bool
	// TopLogProbs requests the log-probabilities of this many most likely
	// tokens in Result.TopLogProbs (OpenAI top_logprobs).
	TopLogProbs int
}

func (p Params) validate() error {
	finite := func(x float32) bool { return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }
	switch {
	case !finite(p.Temperature) || p.Temperature < 0:
		return fmt.Errorf("sample: temperature %v: must be a finite number >= 0", p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("sample: top_k %d: must be >= 0", p.TopK)
	case !finite(p.TopP) || p.TopP < 0 || p.TopP > 1:
		return fmt.Errorf("sample: top_p %v: must be in [0, 1]", p.TopP)
	case !finite(p.MinP) || p.MinP < 0 || p.MinP > 1:
		return fmt.Errorf("sample: min_p %v: must be in [0, 1]", p.MinP)
	case !finite(p.RepeatPenalty) || p.RepeatPenalty < 0:
		return fmt.Errorf("sample: repeat_penalty %v: must be a finite number >= 0", p.RepeatPenalty)
	case !finite(p.PresencePenalty):
		return fmt.Errorf("sample: presence_penalty %v: must be finite", p.PresencePenalty)
	case !finite(p.FrequencyPenalty):
		return fmt.Errorf("sample: frequency_penalty %v: must be finite", p.FrequencyPenalty)
	case p.TopLogProbs < 0:
		return fmt.Errorf("sample: top_logprobs %d: must be >= 0", p.TopLogProbs)
	}
	return nil
}

func (p Params) penalties() bool {
	return (p.RepeatPenalty != 0 && p.RepeatPenalty != 1) || p.PresencePenalty != 0 || p.FrequencyPenalty != 0
}

func (p Params) topP() bool { return p.TopP > 0 && p.TopP < 1 }

// PlainGreedy reports whether sampling with p is argmax of the raw logits
// and nothing else (temperature 0, no penalty, no log-probabilities): a
// device may then pick the token itself (model.ForwardGreedy).
func (p Params) PlainGreedy() bool {
	return p.Temperature == 0 && !p.penalties() && !p.LogProbs && p.TopLogProbs == 0
}

// TokenLogProb is a token with its log-probability.
type TokenLogProb struct {
	Token   int32
	LogProb float32
}

// Result is one sampled token.
type Result struct {
	Token int32
	// LogProb is the natural-log probability of Token under the model's raw
	// distribution (softmax of the logits as given, before penalties and
	// sampling transforms), like OpenAI's logprobs. Set when Params.LogProbs.
	LogProb float32
	// TopLogProbs lists the Params.TopLogProbs most likely tokens of the same
	// raw distribution, best first (ties: lower id). It aliases a buffer of
	// the Sampler and is overwritten by the next Sample call.
	TopLogProbs []TokenLogProb
}

// Sampler draws tokens from logits following the package's fixed stage
// order. It owns its random generator and penalty history, and reuses its
// buffers, so Sample does not allocate once warmed up. A Sampler is not safe
// for concurrent use; use one per sequence.
type Sampler struct {
	p    Params
	pcg  *rand.PCG
	rng  *rand.Rand
	hist history

	ids   []int32   // gathered candidate ids
	probs []float32 // their unnormalised probabilities
	heap  []int32   // top-k selection
	top   []TokenLogProb
	saved []TokenLogProb // pre-penalty logits of penalised tokens
	order pairSorter
}

// seedStream is the PCG stream selector; any fixed constant works.
const seedStream = 0x9e3779b97f4a7c15

// New returns a Sampler for p.
func New(p Params) (*Sampler, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	n := p.RepeatLastN
	if n == 0 {
		n = DefaultRepeatLastN
	}
	pcg := rand.NewPCG(p.Seed, seedStream)
	return &Sampler{p: p, pcg: pcg, rng: rand.New(pcg), hist: history{n: n}}, nil
}

// Params returns the sampler's parameters.
func (s *Sampler) Params() Params { return s.p }

// Accept records a token (prompt or generated) in the penalty window.
// Negative ids and ids of 1<<24 or more are ignored.
func (s *Sampler) Accept(tok int32) { s.hist.add(tok) }

// History returns the tokens in the penalty window, oldest first.
func (s *Sampler) History() []int32 { return s.hist.window() }

// Reset clears the penalty window and reseeds the generator with Params.Seed.
func (s *Sampler) Reset() {
	s.hist.reset()
	s.pcg.Seed(s.p.Seed, seedStream)
}

// Sample draws the next token from logits (one entry per vocabulary id). It
// uses logits as scratch space: on return they hold the penalised values
// (and, on some paths, the +Inf rule of Candidates.Load applied).
// It does not call Accept; the caller does, once it keeps the token.
//
// Errors: *NaNError for a NaN logit, ErrNoCandidates when every logit is
// -Inf. One uniform variate is consumed per call (none when greedy), so the
// stream of draws depends only on the seed and the inputs.
func (s *Sampler) Sample(logits []float32) (Result, error) {
	var res Result
	var raw rawDist
	if s.p.LogProbs || s.p.TopLogProbs > 0 {
		if err := raw.init(logits); err != nil {
			return Result{}, err
		}
		if n := s.p.TopLogProbs; n > 0 {
			ids, err := s.selectTop(logits, n)
			if err != nil {
				return Result{}, err
			}
			s.top = s.top[:0]
			for _, id := range ids {
				s.top = append(s.top, TokenLogProb{Token: id, LogProb: raw.logProb(logits[id])})
			}
			res.TopLogProbs = s.top
		}
	}

	// Stage 1: penalties.
	s.saved = s.saved[:0]
	if s.p.penalties() {
		for _, t := range s.hist.distinct {
			if int(t) >= len(logits) {
				continue
			}
			if s.p.LogProbs {
				s.saved = append(s.saved, TokenLogProb{Token: t, LogProb: logits[t]})
			}
			logits[t] = penalize(logits[t], int(s.hist.counts[t]), s.p.RepeatPenalty, s.p.PresencePenalty, s.p.FrequencyPenalty)
		}
	}

	// Stage 2: greedy shortcut, else stages 3–9.
	var tok int32
	var err error
	if s.p.Temperature == 0 {
		tok, err = Greedy(logits)
	} else {
		var ids []int32
		var probs []float32
		ids, probs, err = s.distribution(logits)
		if err == nil {
			tok, err = drawFrom(ids, probs, s.rng.Float64())
		}
	}
	if err != nil {
		return Result{}, err
	}
	res.Token = tok
	if s.p.LogProbs {
		x := logits[tok]
		for _, sv := range s.saved {
			if sv.Token == tok {
				x = sv.LogProb
			}
		}
		if raw.nInf > 0 {
			// The token is one of the +Inf ones (they hold all the mass);
			// its logit may have been rewritten by screenLogits.
			x = float32(math.Inf(1))
		}
		res.LogProb = raw.logProb(x)
	}
	return res, nil
}

// rawDist is the log-normaliser of the raw logits, for Result's
// log-probabilities.
type rawDist struct {
	lse  float64 // log Σ e^x over the raw logits
	nInf int     // number of +Inf logits; when > 0 they share all the mass
}

func (r *rawDist) init(logits []float32) error {
	max := float32(math.Inf(-1))
	for i, x := range logits {
		if x != x {
			return &NaNError{Index: i}
		}
		if x > max {
			max = x
		}
	}
	switch {
	case math.IsInf(float64(max), -1):
		return ErrNoCandidates
	case math.IsInf(float64(max), 1):
		for _, x := range logits {
			if math.IsInf(float64(x), 1) {
				r.nInf++
			}
		}
		r.lse = math.Log(float64(r.nInf))
	default:
		r.lse = float64(max) + math.Log(sumExp(logits, max, 1))
	}
	return nil
}

func (r *rawDist) logProb(x float32) float32 {
	if r.nInf > 0 {
		if math.IsInf(float64(x), 1) {
			return float32(-r.lse)
		}
		return float32(math.Inf(-1))
	}
	return float32(float64(x) - r.lse)
}

// distribution runs top-k → temperature → softmax → top-p → min-p on
// penalised logits and returns the kept tokens with their unnormalised
// probabilities (renormalising is left to the draw). ids == nil means
// probs[i] belongs to token i. The slices alias Sampler buffers. It never
// modifies logits.
//
// The fast paths rely on one fact: top-k, top-p and min-p each keep a prefix
// of the same best-first order (descending logit, ascending id), so their
// combination is the shortest of the prefixes, provided each is measured as
// the documented order says (top-p's mass is relative to the set left by
// top-k; min-p is relative to the best token, which every stage keeps).
// That lets min-p, a cheap threshold, run first, and lets top-p look at only
// the head of the distribution.
func (s *Sampler) distribution(logits []float32) ([]int32, []float32, error) {
	t := s.p.Temperature
	invT := 1 / t
	n := len(logits)

	if k := s.p.TopK; k > 0 && k < n {
		ids, err := s.selectTop(logits, k) // sorted best first
		if err != nil {
			return nil, nil, err
		}
		l0 := logits[ids[0]]
		if math.IsInf(float64(l0), -1) {
			return nil, nil, ErrNoCandidates
		}
		probs := grow(s.probs, k)
		s.probs = probs
		var z float64
		for i, id := range ids {
			var e float32
			if math.IsInf(float64(l0), 1) {
				// +Inf tokens share the mass (see Candidates.Load).
				if logits[id] == l0 {
					e = 1
				}
			} else {
				e = expNeg((logits[id] - l0) * invT)
			}
			probs[i] = e
			z += float64(e)
		}
		m := k
		if s.p.topP() {
			target := float64(s.p.TopP) * z
			var cum float64
			for i, q := range probs {
				cum += float64(q)
				if cum >= target {
					m = i + 1
					break
				}
			}
		}
		if s.p.MinP > 0 {
			thr := s.p.MinP * probs[0]
			for i := 1; i < m; i++ {
				if probs[i] < thr {
					m = i
					break
				}
			}
		}
		return ids[:m], probs[:m], nil
	}

	max, err := screenLogits(logits)
	if err != nil {
		return nil, nil, err
	}
	cutoff := float32(math.Inf(-1))
	if s.p.MinP > 0 {
		// p_i >= minP·p_max  ⇔  (l_i - l_max)/T >= ln(minP)
		cutoff = max + t*float32(math.Log(float64(s.p.MinP)))
	}

	if s.p.topP() {
		target := float64(s.p.TopP) * sumExp(logits, max, invT)
		// Look at the head first: tokens within e^-9.2 ≈ 1e-4, then 1e-8, of
		// the best usually carry the nucleus, and the head is small.
		for _, depth := range [...]float32{9.21, 18.42, float32(math.Inf(1))} {
			g := cutoff
			if d := max - depth*t; d > g {
				g = d
			}
			mass := s.gather(logits, g, max, invT)
			if mass >= target || g == cutoff {
				m := s.nucleus(logits, target)
				return s.ids[:m], s.probs[:m], nil
			}
		}
	}
	if s.p.MinP > 0 {
		s.gather(logits, cutoff, max, invT)
		return s.ids, s.probs, nil
	}
	probs := grow(s.probs, n)
	s.probs = probs
	for i, x := range logits {
		probs[i] = expNeg((x - max) * invT)
	}
	return nil, probs, nil
}

// gather collects the tokens with logit >= g into s.ids / s.probs (as
// unnormalised probabilities e^((l-max)/T)) and returns their mass.
func (s *Sampler) gather(logits []float32, g, max, invT float32) float64 {
	ids, probs := s.ids[:0], s.probs[:0]
	var mass float64
	for i, x := range logits {
		if x >= g {
			e := expNeg((x - max) * invT)
			ids = append(ids, int32(i))
			probs = append(probs, e)
			mass += float64(e)
		}
	}
	s.ids, s.probs = ids, probs
	return mass
}

// nucleus reorders s.ids / s.probs so that their first m entries are the
// smallest best-first prefix with mass >= target, and returns m (all of them
// if the mass is never reached). It is a quickselect on the mass, O(n)
// expected, with a depth limit that falls back to sorting.
func (s *Sampler) nucleus(logits []float32, target float64) int {
	ids, probs := s.ids, s.probs
	better := func(a, b int) bool {
		la, lb := logits[ids[a]], logits[ids[b]]
		return la > lb || (la == lb && ids[a] < ids[b])
	}
	swap := func(a, b int) {
		ids[a], ids[b] = ids[b], ids[a]
		probs[a], probs[b] = probs[b], probs[a]
	}
	lo, hi := 0, len(ids)
	need := target
	for depth := 2 * bits.Len(uint(hi)); hi-lo > 16 && depth > 0; depth-- {
		// Median of three to hi-1.
		a, b, c := lo, lo+(hi-lo)/2, hi-1
		if better(b, a) {
			a, b = b, a
		}
		if better(c, b) {
			b = c
			if better(b, a) {
				b = a
			}
		}
		swap(b, hi-1)
		p := lo
		for i := lo; i < hi-1; i++ {
			if better(i, hi-1) {
				swap(i, p)
				p++
			}
		}
		swap(p, hi-1)
		var mass float64
		for i := lo; i < p; i++ {
			mass += float64(probs[i])
		}
		if mass >= need {
			hi = p
			continue
		}
		need -= mass + float64(probs[p])
		if need <= 0 {
			return p + 1
		}
		lo = p + 1
	}
	s.order = pairSorter{ids: ids[lo:hi], probs: probs[lo:hi], logits: logits}
	sort.Sort(&s.order)
	for i := lo; i < hi; i++ {
		need -= float64(probs[i])
		if need <= 0 {
			return i + 1
		}
	}
	return hi
}

// pairSorter sorts ids and probs together best first.
type pairSorter struct {
	ids    []int32
	probs  []float32
	logits []float32
}

func (p *pairSorter) Len() int { return len(p.ids) }
func (p *pairSorter) Less(a, b int) bool {
	la, lb := p.logits[p.ids[a]], p.logits[p.ids[b]]
	return la > lb || (la == lb && p.ids[a] < p.ids[b])
}
func (p *pairSorter) Swap(a, b int) {
	p.ids[a], p.ids[b] = p.ids[b], p.ids[a]
	p.probs[a], p.probs[b] = p.probs[b], p.probs[a]
}

// selectTop returns the ids of the k largest logits, best first (ties: lower
// id), using a bounded min-heap: one comparison per token plus O(log k) work
// for the few that enter the heap. The result aliases s.heap. A NaN logit is
// an error.
func (s *Sampler) selectTop(logits []float32, k int) ([]int32, error) {
	k = min(k, len(logits))
	h := s.heap[:0]
	worse := func(a, b int32) bool {
		la, lb := logits[a], logits[b]
		return la < lb || (la == lb && a > b)
	}
	for i, x := range logits {
		if x != x {
			return nil, &NaNError{Index: i}
		}
		if len(h) < k {
			h = append(h, int32(i))
			heapUp(h, len(h)-1, worse)
			continue
		}
		// Later ids lose ties, so only a strictly larger logit enters.
		if x > logits[h[0]] {
			h[0] = int32(i)
			heapDown(h, 0, worse)
		}
	}
	slices.SortFunc(h, func(a, b int32) int {
		switch {
		case a == b:
			return 0
		case worse(b, a):
			return -1
		}
		return 1
	})
	s.heap = h
	return h, nil
}
