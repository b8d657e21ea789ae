package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// Hand-written matchers for the pre-tokenizer regexes that nearly every
// byte-level BPE model uses. They return the same matches as the regexp2
// engine on the pattern text (see fastsplit_test.go), an order of magnitude
// faster.

const (
	// Qwen2 / Qwen3.
	patQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// Llama-3 (also DBRX, Smaug, ChatGLM-4, ...).
	patLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// Qwen3.5: letters absorb combining marks.
	patQwen35 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// GPT-2, as used by the ByteLevel pre-tokenizer with use_regex.
	patGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// fastMatcher finds successive matches of one of the patterns above.
type fastMatcher struct {
	gpt2      bool // GPT-2 shape; otherwise the Llama-3/Qwen shape
	maxDigits int  // Llama-3/Qwen shape: \p{N} repeated at most this often
	marks     bool // letters are [\p{L}\p{M}] (Qwen3.5)
	// foldCase: the contractions are in (?i:...). Oniguruma (which HF
	// tokenizers uses) folds case with Unicode simple case folding, so 's
	// also matches 'S and 'ſ (U+017F LATIN SMALL LETTER LONG S).
	foldCase bool
}

func fastMatcherFor(pattern string) *fastMatcher {
	switch pattern {
	case patQwen2:
		return &fastMatcher{maxDigits: 1, foldCase: true}
	case patLlama3:
		return &fastMatcher{maxDigits: 3, foldCase: true}
	case patQwen35:
		return &fastMatcher{maxDigits: 1, marks: true, foldCase: true}
	case patGPT2:
		return &fastMatcher{gpt2: true}
	}
	return nil
}

func isLetter(r rune) bool {
	if r < utf8.RuneSelf {
		return (r|0x20) >= 'a' && (r|0x20) <= 'z'
	}
	return unicode.IsLetter(r)
}

func isNumber(r rune) bool {
	if r < utf8.RuneSelf {
		return r >= '0' && r <= '9'
	}
	return unicode.IsNumber(r)
}

func isSpace(r rune) bool {
	if r < utf8.RuneSelf {
		return r == ' ' || (r >= '\t' && r <= '\r')
	}
	return unicode.IsSpace(r)
}

func isMark(r rune) bool {
	return r >= 0x300 && unicode.Is(unicode.M, r)
}

func decodeAt(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

func (m *fastMatcher) letter(r rune) bool {
	if isLetter(r) {
		return true
	}
	return m.marks && isMark(r)
}

// other reports whether r is in [^\s\p{L}\p{N}] ([^\s\p{L}\p{M}\p{N}] with marks).
func (m *fastMatcher) other(r rune) bool {
	return r >= 0 && !isSpace(r) && !isLetter(r) && !isNumber(r) && !(m.marks && isMark(r))
}

// contraction returns the length of a contraction match at s[i:], or 0.
func (m *fastMatcher) contraction(s string, i int) int {
	if i+1 >= len(s) || s[i] != '\'' {
		return 0
	}
	r1, n1 := decodeAt(s, i+1)
	r2, n2 := decodeAt(s, i+1+n1)
	lower := func(r rune) rune {
		if !m.foldCase {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 32
		}
		if r == 0x17F { // ſ folds to s
			return 's'
		}
		return r
	}
	a, b := lower(r1), lower(r2)
	switch a {
	case 's', 't', 'm', 'd':
		return 1 + n1
	case 'r', 'v':
		if b == 'e' {
			return 1 + n1 + n2
		}
	case 'l':
		if b == 'l' {
			return 1 + n1 + n2
		}
	}
	return 0
}

// next returns the end of the match that starts at s[i:] (i < len(s)). Every
// position starts a match for these patterns (their last alternatives
// cover any rune), so matches tile the string.
func (m *fastMatcher) next(s string, i int) int {
	if m.gpt2 {
		return m.nextGPT2(s, i)
	}
	if n := m.contraction(s, i); n > 0 {
		return i + n
	}
	r0, n0 := decodeAt(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if m.letter(r0) {
		return m.letterRun(s, i+n0)
	}
	if r0 != '\r' && r0 != '\n' && !isNumber(r0) {
		if r1, n1 := decodeAt(s, i+n0); m.letter(r1) {
			return m.letterRun(s, i+n0+n1)
		}
	}
	// \p{N}{1,k}
	if isNumber(r0) {
		j := i + n0
		for k := 1; k < m.maxDigits; k++ {
			r, n := decodeAt(s, j)
			if !isNumber(r) {
				break
			}
			j += n
		}
		return j
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	j := i
	if r0 == ' ' {
		j++
	}
	if r, _ := decodeAt(s, j); m.other(r) {
		for {
			r, n := decodeAt(s, j)
			if !m.other(r) {
				break
			}
			j += n
		}
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// Whitespace alternatives; r0 is whitespace here.
	return m.spaces(s, i, true)
}

func (m *fastMatcher) letterRun(s string, j int) int {
	for {
		r, n := decodeAt(s, j)
		if !m.letter(r) {
			return j
		}
		j += n
	}
}

// spaces matches \s*[\r\n]+ (when newline is set) | \s+(?!\S) | \s+ at s[i:].
func (m *fastMatcher) spaces(s string, i int, newline bool) int {
	j := i
	lastNL := -1
	lastStart := i
	for {
		r, n := decodeAt(s, j)
		if n == 0 || !isSpace(r) {
			break
		}
		if r == '\r' || r == '\n' {
			lastNL = j
		}
		lastStart = j
		j += n
	}
	if j == i {
		// Not whitespace: cannot happen for valid input, but consume one
		// rune so that callers always progress.
		_, n := decodeAt(s, i)
		return i + n
	}
	if newline && lastNL >= 0 {
		return lastNL + 1
	}
	if j == len(s) || lastStart == i {
		return j
	}
	return lastStart
}

func (m *fastMatcher) nextGPT2(s string, i int) int {
	if n := m.contraction(s, i); n > 0 {
		return i + n
	}
	r0, n0 := decodeAt(s, i)
	j := i
	r := r0
	if r0 == ' ' {
		j += n0
		r, _ = decodeAt(s, j)
	}
	switch {
	case isLetter(r):
		for {
			r, n := decodeAt(s, j)
			if !isLetter(r) {
				return j
			}
			j += n
		}
	case isNumber(r):
		for {
			r, n := decodeAt(s, j)
			if !isNumber(r) {
				return j
			}
			j += n
		}
	case m.other(r):
		for {
			r, n := decodeAt(s, j)
			if !m.other(r) {
				return j
			}
			j += n
		}
	}
	return m.spaces(s, i, false)
}
