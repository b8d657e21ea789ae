package tokenizer

import (
	"fmt"
	"strings"
	"time"

	"github.com/dlclark/regexp2/v2"
)

// piece is one split of the input on its way to the model.
type piece struct {
	text string
	// id >= 0: the piece is already a token (an added token).
	id int
	// byteLevel: the model must read text through the byte-level alphabet
	// (set by the ByteLevel pre-tokenizer; text itself stays raw UTF-8).
	byteLevel bool
	// first: the piece starts at offset 0 of the original input.
	first bool
}

// preTokenizer splits the pieces that are not yet tokens.
type preTokenizer interface {
	preTokenize(in []piece) ([]piece, error)
}

// matcher finds the non-overlapping matches of a pattern, as byte spans.
type matcher interface {
	findAll(s string, dst [][2]int) ([][2]int, error)
}

// regexMatcher is the general path, on the regexp2 engine (backtracking,
// with the look-arounds that HF's Oniguruma patterns use).
type regexMatcher struct{ re *regexp2.Regexp }

func compileRegex(pattern string) (*regexMatcher, error) {
	re, err := regexp2.Compile(pattern, regexp2.OptionMaxBacktrackingStackSize(-1))
	if err != nil {
		return nil, fmt.Errorf("compile regex %q: %w", pattern, err)
	}
	re.MatchTimeout = 10 * time.Second
	return &regexMatcher{re: re}, nil
}

func (m *regexMatcher) findAll(s string, dst [][2]int) ([][2]int, error) {
	idx, err := m.re.FindAllStringIndex(s, -1)
	if err != nil {
		return dst, fmt.Errorf("regex %q: %w", m.re.String(), err)
	}
	for _, p := range idx {
		dst = append(dst, [2]int{p[0], p[1]})
	}
	return dst, nil
}

func (m *fastMatcher) findAll(s string, dst [][2]int) ([][2]int, error) {
	for i := 0; i < len(s); {
		j := m.next(s, i)
		dst = append(dst, [2]int{i, j})
		i = j
	}
	return dst, nil
}

// literalMatcher finds a fixed string.
type literalMatcher struct{ lit string }

func (m literalMatcher) findAll(s string, dst [][2]int) ([][2]int, error) {
	if m.lit == "" {
		return dst, nil
	}
	for i := 0; ; {
		k := strings.Index(s[i:], m.lit)
		if k < 0 {
			return dst, nil
		}
		dst = append(dst, [2]int{i + k, i + k + len(m.lit)})
		i += k + len(m.lit)
	}
}

// runeClassMatcher matches each rune for which pred holds.
type runeClassMatcher struct{ pred func(rune) bool }

func (m runeClassMatcher) findAll(s string, dst [][2]int) ([][2]int, error) {
	for i, r := range s {
		if m.pred(r) {
			dst = append(dst, [2]int{i, i + len(string(r))})
		}
	}
	return dst, nil
}

type splitBehavior int

const (
	splitRemoved splitBehavior = iota
	splitIsolated
	splitMergedWithPrevious
	splitMergedWithNext
	splitContiguous
)

func parseSplitBehavior(s string) (splitBehavior, error) {
	switch s {
	case "Removed":
		return splitRemoved, nil
	case "Isolated":
		return splitIsolated, nil
	case "MergedWithPrevious":
		return splitMergedWithPrevious, nil
	case "MergedWithNext":
		return splitMergedWithNext, nil
	case "Contiguous":
		return splitContiguous, nil
	}
	return 0, fmt.Errorf("unknown split behavior %q", s)
}

type span struct {
	lo, hi  int
	isMatch bool
}

// splitSpans cuts s at the matches of m and groups the parts as HF's
// NormalizedString::split does for the given behavior. Empty parts are
// dropped by the caller.
func splitSpans(s string, m matcher, behavior splitBehavior, invert bool, scratch [][2]int) ([]span, [][2]int, error) {
	if s == "" {
		return nil, scratch, nil
	}
	matches, err := m.findAll(s, scratch[:0])
	if err != nil {
		return nil, matches, err
	}
	parts := make([]span, 0, 2*len(matches)+1)
	prev := 0
	for _, mt := range matches {
		if mt[0] != prev {
			parts = append(parts, span{prev, mt[0], invert})
		}
		parts = append(parts, span{mt[0], mt[1], !invert})
		prev = mt[1]
	}
	if prev != len(s) {
		parts = append(parts, span{prev, len(s), invert})
	}
	switch behavior {
	case splitIsolated:
		return parts, matches, nil
	case splitRemoved:
		out := parts[:0]
		for _, p := range parts {
			if !p.isMatch {
				out = append(out, p)
			}
		}
		return out, matches, nil
	case splitContiguous:
		var out []span
		prevMatch := false
		for _, p := range parts {
			if p.isMatch == prevMatch && len(out) > 0 {
				out[len(out)-1].hi = p.hi
			} else {
				out = append(out, span{p.lo, p.hi, false})
			}
			prevMatch = p.isMatch
		}
		return out, matches, nil
	case splitMergedWithPrevious:
		var out []span
		prevMatch := false
		for _, p := range parts {
			if p.isMatch && !prevMatch && len(out) > 0 {
				out[len(out)-1].hi = p.hi
			} else {
				out = append(out, span{p.lo, p.hi, false})
			}
			prevMatch = p.isMatch
		}
		return out, matches, nil
	case splitMergedWithNext:
		var out []span
		prevMatch := false
		for k := len(parts) - 1; k >= 0; k-- {
			p := parts[k]
			if p.isMatch && !prevMatch && len(out) > 0 {
				out[len(out)-1].lo = p.lo
			} else {
				out = append(out, span{p.lo, p.hi, false})
			}
			prevMatch = p.isMatch
		}
		for a, b := 0, len(out)-1; a < b; a, b = a+1, b-1 {
			out[a], out[b] = out[b], out[a]
		}
		return out, matches, nil
	}
	return nil, matches, fmt.Errorf("bad split behavior %d", behavior)
}

// splitPre is HF's Split pre-tokenizer (and the regex step of ByteLevel).
type splitPre struct {
	m        matcher
	behavior splitBehavior
	invert   bool
}

func (p *splitPre) preTokenize(in []piece) ([]piece, error) {
	out := make([]piece, 0, len(in)*4)
	var scratch [][2]int
	for _, pc := range in {
		if pc.id >= 0 {
			out = append(out, pc)
			continue
		}
		text := pc.text
		if pc.byteLevel {
			// A split after ByteLevel sees the byte-level alphabet.
			text = byteLevelString(text)
			pc.byteLevel = false
		}
		spans, sc, err := splitSpans(text, p.m, p.behavior, p.invert, scratch)
		scratch = sc
		if err != nil {
			return nil, err
		}
		for k, sp := range spans {
			if sp.hi == sp.lo {
				continue
			}
			out = append(out, piece{text: text[sp.lo:sp.hi], id: -1, first: pc.first && k == 0 && sp.lo == 0})
		}
	}
	return out, nil
}

// byteLevelPre is HF's ByteLevel pre-tokenizer.
type byteLevelPre struct {
	addPrefixSpace bool
	split          *splitPre // nil unless use_regex
}

func (p *byteLevelPre) preTokenize(in []piece) ([]piece, error) {
	if p.addPrefixSpace {
		for i := range in {
			if in[i].id < 0 && !in[i].byteLevel && !strings.HasPrefix(in[i].text, " ") {
				in[i].text = " " + in[i].text
			}
		}
	}
	out := in
	if p.split != nil {
		var err error
		if out, err = p.split.preTokenize(in); err != nil {
			return nil, err
		}
	}
	for i := range out {
		if out[i].id < 0 {
			out[i].byteLevel = true
		}
	}
	return out, nil
}

// metaspacePre is HF's Metaspace pre-tokenizer.
type metaspacePre struct {
	replacement string
	prepend     string // "always", "first" or "never"
	split       bool
}

func (p *metaspacePre) preTokenize(in []piece) ([]piece, error) {
	out := make([]piece, 0, len(in))
	for _, pc := range in {
		if pc.id >= 0 {
			out = append(out, pc)
			continue
		}
		text := pc.text
		if pc.byteLevel {
			text = byteLevelString(text)
		}
		text = strings.ReplaceAll(text, " ", p.replacement)
		if !strings.HasPrefix(text, p.replacement) && (p.prepend == "always" || (p.prepend == "first" && pc.first)) {
			text = p.replacement + text
		}
		if !p.split {
			out = append(out, piece{text: text, id: -1, first: pc.first})
			continue
		}
		spans, _, err := splitSpans(text, literalMatcher{p.replacement}, splitMergedWithNext, false, nil)
		if err != nil {
			return nil, err
		}
		for k, sp := range spans {
			if sp.hi > sp.lo {
				out = append(out, piece{text: text[sp.lo:sp.hi], id: -1, first: pc.first && k == 0})
			}
		}
	}
	return out, nil
}

// sequencePre runs pre-tokenizers one after the other.
type sequencePre []preTokenizer

func (s sequencePre) preTokenize(in []piece) ([]piece, error) {
	var err error
	for _, p := range s {
		if in, err = p.preTokenize(in); err != nil {
			return nil, err
		}
	}
	return in, nil
}

// newPatternMatcher returns the fast matcher for the known patterns, or the
// regexp2 engine.
func newPatternMatcher(pattern string) (matcher, error) {
	if m := fastMatcherFor(pattern); m != nil {
		return m, nil
	}
	return compileRegex(pattern)
}
