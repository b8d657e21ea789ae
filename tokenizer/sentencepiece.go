package tokenizer

import (
	"fmt"
	"math"
	"unicode/utf8"
)

// Token types of GGUF vocabularies (tokenizer.ggml.token_type), as in
// llama.cpp and SentencePiece.
const (
	TokenNormal      = 1
	TokenUnknown     = 2
	TokenControl     = 3
	TokenUserDefined = 4
	TokenUnused      = 5
	TokenByte        = 6
)

// spModel is SentencePiece BPE as llama.cpp runs it on GGUF vocabularies:
// repeatedly merge the adjacent pair whose concatenation is the vocabulary
// piece with the highest score (leftmost on ties); characters left outside
// the vocabulary become <0xNN> byte tokens.
type spModel struct {
	vocab   map[string]int
	scores  []float32
	byteIDs [256]int32
	unkID   int
}

func (m *spModel) unknownID() int { return m.unkID }

type spSymbol struct {
	start, size int32 // byte span in the text
	prev, next  int32
}

type spBigram struct {
	score       float32
	left, right int32
	size        int32
}

type spHeap []spBigram

func (h spHeap) less(i, j int) bool {
	if h[i].score != h[j].score {
		return h[i].score > h[j].score
	}
	return h[i].left < h[j].left
}

func (h *spHeap) push(b spBigram) {
	*h = append(*h, b)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *spHeap) pop() spBigram {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		l := 2*i + 1
		if l >= len(s) {
			break
		}
		c := l
		if r := l + 1; r < len(s) && s.less(r, l) {
			c = r
		}
		if !s.less(c, i) {
			break
		}
		s[i], s[c] = s[c], s[i]
		i = c
	}
	*h = s
	return top
}

func (m *spModel) tokenize(p piece, dst []int) []int {
	text := p.text
	if p.byteLevel {
		text = byteLevelString(text)
	}
	syms := make([]spSymbol, 0, len(text))
	for i := 0; i < len(text); {
		_, n := utf8.DecodeRuneInString(text[i:])
		k := int32(len(syms))
		syms = append(syms, spSymbol{start: int32(i), size: int32(n), prev: k - 1, next: k + 1})
		i += n
	}
	if len(syms) == 0 {
		return dst
	}
	syms[len(syms)-1].next = -1
	var h spHeap
	tryAdd := func(left, right int32) {
		if left < 0 || right < 0 {
			return
		}
		s := text[syms[left].start : syms[right].start+syms[right].size]
		id, ok := m.vocab[s]
		if !ok || id >= len(m.scores) {
			return
		}
		h.push(spBigram{score: m.scores[id], left: left, right: right, size: int32(len(s))})
	}
	for i := 1; i < len(syms); i++ {
		tryAdd(int32(i-1), int32(i))
	}
	for len(h) > 0 {
		b := h.pop()
		l, r := &syms[b.left], &syms[b.right]
		if l.size == 0 || r.size == 0 || l.size+r.size != b.size {
			continue // stale
		}
		l.size += r.size
		r.size = 0
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = b.left
		}
		tryAdd(l.prev, b.left)
		tryAdd(b.left, l.next)
	}
	for i := int32(0); i >= 0; i = syms[i].next {
		s := text[syms[i].start : syms[i].start+syms[i].size]
		if id, ok := m.vocab[s]; ok {
			dst = append(dst, id)
			continue
		}
		for k := 0; k < len(s); k++ {
			if id := m.byteIDs[s[k]]; id >= 0 {
				dst = append(dst, int(id))
			} else if m.unkID >= 0 {
				dst = append(dst, m.unkID)
			}
		}
	}
	return dst
}

// FromSentencePiece builds a SentencePiece BPE tokenizer (Llama-1/2,
// Mistral vocabularies as stored in GGUF: tokenizer.ggml.tokens, .scores and
// .token_type). Spaces become ▁, a ▁ is prepended to each stretch of text
// between special tokens (cfg.AddDummyPrefix, default true), characters
// missing from the vocabulary fall back to <0xNN> byte tokens. Control and
// unknown tokens are special (matched in text only with parseSpecial,
// skipped by SkipSpecial); user-defined tokens are always matched. Encode
// with addSpecial adds BOS unless cfg.AddBOS / AddEOS say otherwise.
func FromSentencePiece(tokens []string, scores []float32, types []int32, cfg Config) (*Tokenizer, error) {
	if len(tokens) == 0 {
		return nil, fmt.Errorf("sentencepiece: empty vocabulary")
	}
	if len(scores) != len(tokens) {
		return nil, fmt.Errorf("sentencepiece: %d scores for %d tokens", len(scores), len(tokens))
	}
	if types != nil && len(types) != len(tokens) {
		return nil, fmt.Errorf("sentencepiece: %d token types for %d tokens", len(types), len(tokens))
	}
	m := &spModel{vocab: make(map[string]int, len(tokens)), scores: scores, unkID: -1}
	for i := range m.byteIDs {
		m.byteIDs[i] = -1
	}
	var added []AddedToken
	for id, s := range tokens {
		if math.IsNaN(float64(scores[id])) {
			return nil, fmt.Errorf("sentencepiece: token %d (%q): score is NaN", id, s)
		}
		typ := int32(TokenNormal)
		if types != nil {
			typ = types[id]
		}
		if _, dup := m.vocab[s]; !dup {
			m.vocab[s] = id
		}
		switch typ {
		case TokenUnknown:
			if m.unkID < 0 {
				m.unkID = id
			}
			added = append(added, AddedToken{ID: id, Content: s, Special: true})
		case TokenControl:
			added = append(added, AddedToken{ID: id, Content: s, Special: true})
		case TokenUserDefined:
			added = append(added, AddedToken{ID: id, Content: s})
		case TokenByte:
			if b, ok := parseByteToken(s); ok {
				m.byteIDs[b] = int32(id)
			}
		}
	}
	vocab := m.vocab
	t := &Tokenizer{model: m}
	dummy := cfg.AddDummyPrefix == nil || *cfg.AddDummyPrefix
	if dummy {
		t.norm = sequenceNorm{prependNorm{"▁"}, replaceNorm{m: literalMatcher{" "}, content: "▁"}}
		t.dec = sequenceDec{replaceDec{m: literalMatcher{"▁"}, content: " "}, byteFallbackDec{}, fuseDec{}, stripDec{content: ' ', start: 1}}
	} else {
		t.norm = replaceNorm{m: literalMatcher{" "}, content: "▁"}
		t.dec = sequenceDec{replaceDec{m: literalMatcher{"▁"}, content: " "}, byteFallbackDec{}, fuseDec{}}
	}
	if len(added) > 0 {
		t.added = newAddedVocab(added, nil)
	}
	if cfg.BOS == "" {
		cfg.BOS = "<s>"
	}
	if cfg.EOS == "" {
		cfg.EOS = "</s>"
	}
	if cfg.AddBOS == nil && cfg.AddEOS == nil {
		yes := true
		cfg.AddBOS = &yes
		if _, ok := vocab[cfg.BOS]; !ok {
			no := false
			cfg.AddBOS = &no
		}
	}
	if err := t.finish(vocab, added, cfg); err != nil {
		return nil, fmt.Errorf("sentencepiece: %w", err)
	}
	return t, nil
}
