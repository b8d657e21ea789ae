package sample

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// ErrNoCandidates is returned when every logit is -Inf, so no token can be
// drawn.
var ErrNoCandidates = errors.New("sample: no token has a finite logit")

// NaNError reports a NaN logit. A NaN means the model produced garbage for
// this position; the sampler refuses to guess rather than silently skipping
// it.
type NaNError struct {
	Index int // token id of the first NaN logit
}

func (e *NaNError) Error() string {
	return fmt.Sprintf("sample: logit of token %d is NaN", e.Index)
}

// Candidates is the working set the sampling stages operate on: token ids
// with their logits and, once Softmax has run, their probabilities. It plays
// the role of llama.cpp's llama_token_data_array.
//
// The methods are the plain, easy-to-check form of each stage; calling them
// in the package's documented order (TopK, Temperature, Softmax, TopP, MinP,
// Normalize, Draw) gives exactly the distribution Sampler.Sample draws from.
// Sampler uses fused fast paths instead; the tests compare the two.
type Candidates struct {
	IDs    []int32
	Logits []float32
	Probs  []float32 // valid after Softmax
	// Sorted reports that the set is ordered best first: descending logit,
	// ties broken by ascending id.
	Sorted bool

	heap []int32 // TopK / Sort scratch

	spareIDs    []int32 // permute's gather buffers
	spareLogits []float32
	spareProbs  []float32
}

// Len returns the number of candidates.
func (c *Candidates) Len() int { return len(c.IDs) }

// Load resets c to the whole vocabulary, copying logits (logits is not
// modified). Every id is a candidate, in id order.
//
// Non-finite logits follow one rule everywhere in the package: a NaN is an
// error (*NaNError); -Inf marks a token that can never be drawn; if any logit
// is +Inf, the +Inf tokens share all the probability equally and every other
// token gets none.
func (c *Candidates) Load(logits []float32) error {
	n := len(logits)
	c.IDs = grow(c.IDs, n)
	c.Logits = grow(c.Logits, n)
	c.Probs = c.Probs[:0]
	c.Sorted = false
	copy(c.Logits, logits)
	for i := range c.IDs {
		c.IDs[i] = int32(i)
	}
	if _, err := screenLogits(c.Logits); err != nil {
		return err
	}
	return nil
}

// screenLogits checks xs for NaN and applies the +Inf rule in place (see
// Candidates.Load). It returns the maximum logit afterwards, or
// ErrNoCandidates when all are -Inf (or xs is empty).
func screenLogits(xs []float32) (float32, error) {
	max := float32(math.Inf(-1))
	posInf := false
	for i, x := range xs {
		if x != x {
			return 0, &NaNError{Index: i}
		}
		if x > max {
			max = x
		}
	}
	if math.IsInf(float64(max), 1) {
		posInf = true
	}
	if posInf {
		for i, x := range xs {
			if math.IsInf(float64(x), 1) {
				xs[i] = 0
			} else {
				xs[i] = float32(math.Inf(-1))
			}
		}
		return 0, nil
	}
	if math.IsInf(float64(max), -1) {
		return 0, ErrNoCandidates
	}
	return max, nil
}

// Greedy returns the token with the largest logit; ties go to the lowest
// id. It follows the non-finite rules of Candidates.Load and does not modify
// logits.
func Greedy(logits []float32) (int32, error) {
	best := -1
	max := float32(math.Inf(-1))
	for i, x := range logits {
		if x != x {
			return 0, &NaNError{Index: i}
		}
		if x > max {
			max, best = x, i
		}
	}
	if best < 0 {
		return 0, ErrNoCandidates
	}
	return int32(best), nil
}

// better reports whether candidate i ranks before candidate j: higher logit,
// then lower id. Ids are unique, so this is a strict total order.
func (c *Candidates) better(i, j int) bool {
	li, lj := c.Logits[i], c.Logits[j]
	return li > lj || (li == lj && c.IDs[i] < c.IDs[j])
}

// Sort orders the set best first (descending logit, ascending id).
func (c *Candidates) Sort() {
	if c.Sorted {
		return
	}
	idx := grow(c.heap, len(c.IDs))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(a, b int32) int {
		switch {
		case c.better(int(a), int(b)):
			return -1
		case c.better(int(b), int(a)):
			return 1
		}
		return 0
	})
	c.heap = idx
	c.permute(idx)
	c.Sorted = true
}

// permute replaces the set by the candidates at positions idx, in that
// order. It gathers into spare buffers and swaps them in, so it does not
// allocate once the buffers have grown.
func (c *Candidates) permute(idx []int32) {
	n := len(idx)
	hasProbs := len(c.Probs) == len(c.IDs)
	ids := grow(c.spareIDs, n)
	lg := grow(c.spareLogits, n)
	for k, src := range idx {
		ids[k], lg[k] = c.IDs[src], c.Logits[src]
	}
	c.spareIDs, c.IDs = c.IDs, ids
	c.spareLogits, c.Logits = c.Logits, lg
	if hasProbs {
		pr := grow(c.spareProbs, n)
		for k, src := range idx {
			pr[k] = c.Probs[src]
		}
		c.spareProbs, c.Probs = c.Probs, pr
	} else {
		c.Probs = c.Probs[:0]
	}
}

// TopK keeps the k best candidates (ties: lower id first) and leaves them
// sorted. k <= 0 or k >= Len() keeps everything unchanged. It selects with a
// bounded heap, O(n log k), instead of sorting the whole vocabulary.
func (c *Candidates) TopK(k int) {
	n := len(c.IDs)
	if k <= 0 || k >= n {
		return
	}
	if c.Sorted {
		c.truncate(k)
		return
	}
	h := c.heap[:0]
	// Min-heap on "better": the root is the worst kept candidate.
	worse := func(a, b int32) bool { return c.better(int(b), int(a)) }
	for i := range n {
		if len(h) < k {
			h = append(h, int32(i))
			heapUp(h, len(h)-1, worse)
			continue
		}
		if c.better(i, int(h[0])) {
			h[0] = int32(i)
			heapDown(h, 0, worse)
		}
	}
	slices.SortFunc(h, func(a, b int32) int {
		switch {
		case a == b:
			return 0
		case c.better(int(a), int(b)):
			return -1
		}
		return 1
	})
	c.heap = h
	c.permute(h)
	c.Sorted = true
}

func (c *Candidates) truncate(n int) {
	c.IDs, c.Logits = c.IDs[:n], c.Logits[:n]
	if len(c.Probs) > n {
		c.Probs = c.Probs[:n]
	}
}

// Temperature divides every logit by t. t must be positive; t == 0 is the
// greedy case, which the caller handles with Greedy before this stage.
func (c *Candidates) Temperature(t float32) {
	if t <= 0 || t == 1 {
		return
	}
	for i := range c.Logits {
		c.Logits[i] /= t
	}
}

// Softmax fills Probs with the softmax of Logits over the current set,
// using math.Exp (this is the reference form; Sampler uses a faster
// exponential).
func (c *Candidates) Softmax() error {
	if len(c.IDs) == 0 {
		return ErrNoCandidates
	}
	max := float32(math.Inf(-1))
	for _, x := range c.Logits {
		if x > max {
			max = x
		}
	}
	if math.IsInf(float64(max), -1) {
		return ErrNoCandidates
	}
	c.Probs = grow(c.Probs, len(c.IDs))
	var sum float64
	for i, x := range c.Logits {
		e := math.Exp(float64(x - max))
		c.Probs[i] = float32(e)
		sum += e
	}
	for i := range c.Probs {
		c.Probs[i] = float32(float64(c.Probs[i]) / sum)
	}
	return nil
}

// TopP keeps the smallest best-first prefix whose probability mass is at
// least p (nucleus sampling), and always at least one token. p <= 0 or
// p >= 1 disables it. Probabilities are not renormalised here. Requires
// Softmax; sorts the set if it is not sorted yet.
func (c *Candidates) TopP(p float32) {
	if p <= 0 || p >= 1 || len(c.IDs) == 0 {
		return
	}
	c.Sort()
	var cum float64
	for i, q := range c.Probs {
		cum += float64(q)
		if cum >= float64(p) {
			c.truncate(i + 1)
			return
		}
	}
}

// MinP drops candidates whose probability is below p times the largest
// probability in the set. p <= 0 disables it; the most likely token always
// survives. Order is preserved. Requires Softmax.
func (c *Candidates) MinP(p float32) {
	if p <= 0 || len(c.IDs) == 0 {
		return
	}
	var pmax float32
	for _, q := range c.Probs {
		pmax = max(pmax, q)
	}
	thr := p * pmax
	k := 0
	for i := range c.IDs {
		if c.Probs[i] >= thr {
			c.IDs[k], c.Logits[k], c.Probs[k] = c.IDs[i], c.Logits[i], c.Probs[i]
			k++
		}
	}
	c.truncate(k)
}

// Normalize rescales Probs to sum to one.
func (c *Candidates) Normalize() {
	var sum float64
	for _, q := range c.Probs {
		sum += float64(q)
	}
	if sum <= 0 {
		return
	}
	for i := range c.Probs {
		c.Probs[i] = float32(float64(c.Probs[i]) / sum)
	}
}

// Draw picks a candidate given u uniform in [0,1): it walks the set in its
// current order and returns the first id whose cumulative probability
// exceeds u·Σprobs. Requires Softmax.
func (c *Candidates) Draw(u float64) (int32, error) {
	if len(c.Probs) != len(c.IDs) || len(c.IDs) == 0 {
		return 0, ErrNoCandidates
	}
	return drawFrom(c.IDs, c.Probs, u)
}

// drawFrom is the inverse-CDF draw shared by Candidates and Sampler. ids may
// be nil, meaning position i is token i.
func drawFrom(ids []int32, probs []float32, u float64) (int32, error) {
	var total float64
	for _, q := range probs {
		total += float64(q)
	}
	if !(total > 0) {
		return 0, ErrNoCandidates
	}
	r := u * total
	var cum float64
	last := -1
	for i, q := range probs {
		if q <= 0 {
			continue
		}
		last = i
		cum += float64(q)
		if r < cum {
			break
		}
	}
	if ids == nil {
		return int32(last), nil
	}
	return ids[last], nil
}

// grow returns s resized to n, reusing its backing array when it is large
// enough.
func grow[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}

// heapUp and heapDown maintain a binary heap whose root is the element for
// which less(root, x) holds against every other x.
func heapUp(h []int32, i int, less func(a, b int32) bool) {
	for i > 0 {
		p := (i - 1) / 2
		if !less(h[i], h[p]) {
			return
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func heapDown(h []int32, i int, less func(a, b int32) bool) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && less(h[r], h[l]) {
			m = r
		}
		if !less(h[m], h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}
