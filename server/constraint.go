package server

import (
	"bytes"
	"math"
	"slices"
	"sync"
	"unicode/utf8"

	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/tokenizer"
)

// constraint limits the tokens that may come next.
type constraint interface {
	// mask sets the logits of the tokens that may not come next to -Inf.
	mask(logits []float32)
	// accept advances past the sampled token.
	accept(tok int)
}

// vocab holds every token's bytes, sorted, computed once per model: the
// mask walk visits tokens sharing a prefix together and stops a whole group
// at the first byte the grammar refuses.
type vocab struct {
	size  int
	ids   []int32  // token ids sorted by their bytes
	bytes [][]byte // bytes[ids[k]] in the same order
	tok   [][]byte // bytes of each id (nil: never allowed)
	eos   []int32

	// The tokens that are plain text inside a JSON string (whole UTF-8
	// characters, no quote, backslash or control byte), and the rest,
	// sorted like ids: inside an unbounded string every plain token is
	// allowed without a walk, and only the rest are walked.
	plain     []int32
	restIDs   []int32
	restBytes [][]byte
}

func buildVocab(e *engine.Engine) *vocab {
	return vocabOf(e.Tok, e.File.Header.Arch.VocabSize, e.EOS)
}

// vocabOf collects the bytes of the first n ids of tok (special tokens and
// empty ones are never allowed by a grammar; eos is allowed when complete).
func vocabOf(tok *tokenizer.Tokenizer, n int, eos []int32) *vocab {
	v := &vocab{size: n, tok: make([][]byte, n), eos: eos}
	if tok == nil {
		return v
	}
	for id := 0; id < n && id < tok.VocabSize(); id++ {
		if tok.IsSpecial(id) {
			continue
		}
		b, ok := tok.TokenBytes(id)
		if !ok {
			b = []byte(tok.Decode([]int{id}))
		}
		if len(b) == 0 {
			continue
		}
		v.tok[id] = b
		v.ids = append(v.ids, int32(id))
	}
	sortVocab(v)
	return v
}

// sortVocab orders v.ids by their bytes and fills v.bytes and the plain
// string split.
func sortVocab(v *vocab) {
	slices.SortFunc(v.ids, func(a, b int32) int { return bytes.Compare(v.tok[a], v.tok[b]) })
	v.bytes = make([][]byte, len(v.ids))
	v.plain, v.restIDs, v.restBytes = nil, nil, nil
	for k, id := range v.ids {
		v.bytes[k] = v.tok[id]
		if plainStringText(v.tok[id]) {
			v.plain = append(v.plain, id)
		} else {
			v.restIDs = append(v.restIDs, id)
			v.restBytes = append(v.restBytes, v.tok[id])
		}
	}
}

// plainStringText reports whether b can appear inside a JSON string as it
// is and leaves the string open: whole UTF-8 characters, none of them a
// quote, a backslash or a control character.
func plainStringText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, c := range b {
		if c == '"' || c == '\\' || c < 0x20 {
			return false
		}
	}
	return true
}

// lazyVocab builds the vocab on first use.
type lazyVocab struct {
	once sync.Once
	v    *vocab
	e    *engine.Engine
}

func (l *lazyVocab) get() *vocab {
	l.once.Do(func() { l.v = buildVocab(l.e) })
	return l.v
}

// grammarConstraint drives a gstate with each sampled token and masks by
// walking the sorted vocabulary from the current state.
type grammarConstraint struct {
	v       *vocab
	st      gstate
	allowed []bool
}

func newGrammarConstraint(v *vocab, root *gnode) *grammarConstraint {
	return &grammarConstraint{v: v, st: newGState(root), allowed: make([]bool, v.size)}
}

func (c *grammarConstraint) mask(logits []float32) {
	clear(c.allowed)
	if f := c.st.top; !c.st.done && f.n.kind == kString && f.st == 1 && f.n.maxLen == 0 {
		// Inside an unbounded string: plain tokens keep it open and are
		// all allowed; walk only the others.
		for _, id := range c.v.plain {
			c.allowed[id] = true
		}
		c.walk(c.v.restIDs, c.v.restBytes, c.st, 0, len(c.v.restIDs), 0)
	} else {
		c.walk(c.v.ids, c.v.bytes, c.st, 0, len(c.v.ids), 0)
	}
	c.finish(logits)
}

// maskPlain is mask without the string fast path: the reference it is
// tested against.
func (c *grammarConstraint) maskPlain(logits []float32) {
	clear(c.allowed)
	c.walk(c.v.ids, c.v.bytes, c.st, 0, len(c.v.ids), 0)
	c.finish(logits)
}

func (c *grammarConstraint) finish(logits []float32) {
	if c.st.accepting() {
		for _, id := range c.v.eos {
			if int(id) < len(c.allowed) {
				c.allowed[id] = true
			}
		}
	}
	ninf := float32(math.Inf(-1))
	for id := range logits {
		if id >= len(c.allowed) || !c.allowed[id] {
			logits[id] = ninf
		}
	}
}

// walk marks the tokens of ids[lo:hi] (bytes bs, sorted), which share
// their first depth bytes (already fed into st), that the grammar accepts in
// full.
func (c *grammarConstraint) walk(ids []int32, bs [][]byte, st gstate, lo, hi, depth int) {
	for lo < hi && len(bs[lo]) == depth {
		c.allowed[ids[lo]] = true
		lo++
	}
	for lo < hi {
		b := bs[lo][depth]
		end := lo + 1
		for end < hi && bs[end][depth] == b {
			end++
		}
		next := st
		if next.feed(b) {
			c.walk(ids, bs, next, lo, end, depth+1)
		}
		lo = end
	}
}

func (c *grammarConstraint) accept(tok int) {
	if tok < 0 || tok >= len(c.v.tok) {
		return
	}
	for _, b := range c.v.tok[tok] {
		if !c.st.feed(b) {
			return
		}
	}
}

// validPrefix reports whether text is a prefix the grammar accepts, and
// whether it is complete (used by tests and to check constrained output).
func validPrefix(root *gnode, text []byte) (ok, complete bool) {
	st := newGState(root)
	for _, b := range text {
		if !st.feed(b) {
			return false, false
		}
	}
	return true, st.accepting()
}

// forcedTokens makes the model emit exactly ids, then EOS: a test seam that
// drives the whole serving path (decoding, stop handling, the output
// parser, streaming) with known text from a random-weight model.
type forcedTokens struct {
	ids []int
	i   int
	eos []int32
}

func (f *forcedTokens) mask(logits []float32) {
	ninf := float32(math.Inf(-1))
	for id := range logits {
		keep := false
		if f.i < len(f.ids) {
			keep = id == f.ids[f.i]
		} else {
			keep = slices.Contains(f.eos, int32(id))
		}
		if !keep {
			logits[id] = ninf
		}
	}
}

func (f *forcedTokens) accept(int) { f.i++ }
