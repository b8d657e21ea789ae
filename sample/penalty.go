package sample

// ApplyPenalties applies the repetition, presence and frequency penalties to
// logits in place, for the tokens of window (the recent history). It is the
// plain form of the first stage; Sampler keeps running counts instead of
// recounting the window for every token.
//
// For every distinct token t in window, with c = number of occurrences:
//
//	repetition (llama.cpp / HF):  logit > 0 ? logit / repeat : logit * repeat
//	presence and frequency (OpenAI):  logit -= presence + frequency*c
//
// repeat == 0 or 1 disables the repetition penalty. Tokens outside
// [0, len(logits)) are ignored. It allocates a map; use Sampler on hot paths.
func ApplyPenalties(logits []float32, window []int32, repeat, presence, frequency float32) {
	counts := make(map[int32]int, len(window))
	for _, t := range window {
		if t >= 0 && int(t) < len(logits) {
			counts[t]++
		}
	}
	for t, c := range counts {
		logits[t] = penalize(logits[t], c, repeat, presence, frequency)
	}
}

// penalize returns logit after the three penalties for a token seen c > 0
// times.
func penalize(logit float32, c int, repeat, presence, frequency float32) float32 {
	if repeat != 0 && repeat != 1 {
		if logit > 0 {
			logit /= repeat
		} else {
			logit *= repeat
		}
	}
	return logit - presence - frequency*float32(c)
}

// history is the penalty window: the last n accepted tokens (or all of them
// when n < 0) with running occurrence counts and the list of distinct tokens,
// so applying the penalties costs O(distinct tokens) per sampled token.
type history struct {
	n        int     // window size; < 0 means unbounded
	ring     []int32 // accepted tokens; a ring buffer when n > 0
	head     int     // next write position in ring (n > 0)
	counts   []int32 // occurrences in the window, by token id
	pos      []int32 // index of token in distinct, by token id
	distinct []int32 // tokens with counts > 0
}

func (h *history) reset() {
	for _, t := range h.distinct {
		h.counts[t] = 0
	}
	h.ring = h.ring[:0]
	h.head = 0
	h.distinct = h.distinct[:0]
}

// maxTokenID bounds the ids the penalty window tracks (its counts are
// indexed by id). Real vocabularies are far smaller; larger ids could never
// match a logit anyway and are ignored rather than allocated for.
const maxTokenID = 1 << 24

func (h *history) add(t int32) {
	if t < 0 || t >= maxTokenID {
		return
	}
	if int(t) >= len(h.counts) {
		n := max(int(t)+1, 2*len(h.counts))
		c := make([]int32, n)
		copy(c, h.counts)
		p := make([]int32, n)
		copy(p, h.pos)
		h.counts, h.pos = c, p
	}
	if h.n > 0 && len(h.ring) == h.n {
		old := h.ring[h.head]
		h.ring[h.head] = t
		h.head = (h.head + 1) % h.n
		h.dec(old)
	} else {
		h.ring = append(h.ring, t)
	}
	if h.counts[t] == 0 {
		h.pos[t] = int32(len(h.distinct))
		h.distinct = append(h.distinct, t)
	}
	h.counts[t]++
}

func (h *history) dec(t int32) {
	h.counts[t]--
	if h.counts[t] > 0 {
		return
	}
	// Swap-remove t from distinct.
	i := h.pos[t]
	last := h.distinct[len(h.distinct)-1]
	h.distinct[i] = last
	h.pos[last] = i
	h.distinct = h.distinct[:len(h.distinct)-1]
}

// window returns the tokens in the window, oldest first (allocates; used by
// tests and Sampler.History).
func (h *history) window() []int32 {
	out := make([]int32, 0, len(h.ring))
	if h.n > 0 && len(h.ring) == h.n {
		out = append(out, h.ring[h.head:]...)
		out = append(out, h.ring[:h.head]...)
		return out
	}
	return append(out, h.ring...)
}
