package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// normalizer rewrites the text between added tokens (HF Normalizer, without
// offset tracking).
type normalizer interface {
	normalize(s string) (string, error)
}

type nfcNorm struct{}

func (nfcNorm) normalize(s string) (string, error) { return nfc(s), nil }

type nfdNorm struct{}

func (nfdNorm) normalize(s string) (string, error) { return nfd(s), nil }

type lowercaseNorm struct{}

func (lowercaseNorm) normalize(s string) (string, error) { return strings.ToLower(s), nil }

type prependNorm struct{ prefix string }

// normalize prepends unless s is empty (HF: an empty string stays empty).
func (p prependNorm) normalize(s string) (string, error) {
	if s == "" {
		return s, nil
	}
	return p.prefix + s, nil
}

// replaceNorm replaces every match of a pattern with content.
type replaceNorm struct {
	m       matcher
	content string
}

func (r replaceNorm) normalize(s string) (string, error) {
	if lm, ok := r.m.(literalMatcher); ok {
		if lm.lit == "" {
			return s, nil
		}
		return strings.ReplaceAll(s, lm.lit, r.content), nil
	}
	spans, err := r.m.findAll(s, nil)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	prev := 0
	for _, sp := range spans {
		b.WriteString(s[prev:sp[0]])
		b.WriteString(r.content)
		prev = sp[1]
	}
	b.WriteString(s[prev:])
	return b.String(), nil
}

type stripNorm struct{ left, right bool }

func (p stripNorm) normalize(s string) (string, error) {
	if p.left {
		s = strings.TrimLeftFunc(s, isSpace)
	}
	if p.right {
		s = strings.TrimRightFunc(s, isSpace)
	}
	return s, nil
}

type sequenceNorm []normalizer

func (q sequenceNorm) normalize(s string) (string, error) {
	var err error
	for _, n := range q {
		if s, err = n.normalize(s); err != nil {
			return "", err
		}
	}
	return s, nil
}

// nfd returns the canonical decomposition of s (Normalization Form D).
func nfd(s string) string {
	if isNFC(s) {
		ascii := true
		for i := 0; i < len(s); i++ {
			if s[i] >= 0xC0 {
				ascii = false
				break
			}
		}
		if ascii {
			return s
		}
	}
	rs := make([]rune, 0, len(s))
	var out []byte
	flush := func() {
		rs = canonicalOrder(rs)
		for _, r := range rs {
			out = utf8.AppendRune(out, r)
		}
		rs = rs[:0]
	}
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			flush()
			out = append(out, s[i])
			i++
			continue
		}
		rs = appendDecomposed(rs, r)
		i += n
	}
	flush()
	return string(out)
}
