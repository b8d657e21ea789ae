package sample

import (
	"strings"
	"unicode/utf8"
)

// StopReason says why generation stopped.
type StopReason int

const (
	// NotStopped: keep generating.
	NotStopped StopReason = iota
	// StoppedEOS: an end-of-sequence token id was produced.
	StoppedEOS
	// StoppedString: the text produced one of the stop strings.
	StoppedString
)

func (r StopReason) String() string {
	switch r {
	case NotStopped:
		return "not stopped"
	case StoppedEOS:
		return "eos"
	case StoppedString:
		return "stop string"
	}
	return "unknown"
}

// StopChecker applies end-of-sequence token ids and stop strings to a stream
// of decoded token pieces, with the semantics of OpenAI's stop parameter:
// the text before the first occurrence of any stop string is returned and
// the stop string itself (and anything after it) never is.
//
// Because a stop string can straddle token boundaries, Push holds back the
// longest tail of the text that is still a prefix of some stop string, and
// releases it once it can no longer become one. It also holds back an
// incomplete UTF-8 sequence at the end of the text (byte-level tokens can
// split a character), so every emitted chunk is whole characters unless the
// model produced invalid bytes.
type StopChecker struct {
	eos     []int32
	stops   []string
	held    string
	reason  StopReason
	matched string
}

// NewStopChecker returns a checker for the given end-of-sequence ids and
// stop strings. Empty stop strings are ignored.
func NewStopChecker(eos []int32, stops []string) *StopChecker {
	c := &StopChecker{eos: append([]int32(nil), eos...)}
	for _, s := range stops {
		if s != "" {
			c.stops = append(c.stops, s)
		}
	}
	return c
}

// Push feeds the next token and its decoded text. It returns the text that
// is now safe to emit and whether generation has stopped. An EOS token's own
// text is not emitted; the text held back before it is. Once stopped, Push
// returns "" and the same reason.
func (c *StopChecker) Push(tok int32, piece string) (emit string, reason StopReason) {
	if c.reason != NotStopped {
		return "", c.reason
	}
	for _, e := range c.eos {
		if tok == e {
			c.reason = StoppedEOS
			emit, c.held = c.held, ""
			return emit, c.reason
		}
	}
	buf := c.held + piece
	if at, s := c.firstStop(buf); at >= 0 {
		c.reason, c.matched, c.held = StoppedString, s, ""
		return buf[:at], c.reason
	}
	keep := max(c.stopPrefixLen(buf), partialUTF8Len(buf))
	c.held = buf[len(buf)-keep:]
	return buf[:len(buf)-keep], NotStopped
}

// Flush returns the held-back text when generation ends for a reason the
// checker does not see (length limit, cancellation). After a stop it
// returns "".
func (c *StopChecker) Flush() string {
	h := c.held
	c.held = ""
	return h
}

// Reason reports whether and why generation stopped.
func (c *StopChecker) Reason() StopReason { return c.reason }

// Matched returns the stop string that ended generation, or "".
func (c *StopChecker) Matched() string { return c.matched }

// firstStop returns the earliest position of any stop string in buf (ties go
// to the stop listed first) and that stop string, or -1.
func (c *StopChecker) firstStop(buf string) (int, string) {
	at, which := -1, ""
	for _, s := range c.stops {
		if i := strings.Index(buf, s); i >= 0 && (at < 0 || i < at) {
			at, which = i, s
		}
	}
	return at, which
}

// stopPrefixLen returns the length of the longest proper suffix of buf that
// is a prefix of some stop string.
func (c *StopChecker) stopPrefixLen(buf string) int {
	best := 0
	for _, s := range c.stops {
		for k := min(len(s)-1, len(buf)); k > best; k-- {
			if strings.HasSuffix(buf, s[:k]) {
				best = k
				break
			}
		}
	}
	return best
}

// partialUTF8Len returns the length of an incomplete UTF-8 sequence at the
// end of s (0 if s ends on a character boundary or with invalid bytes).
func partialUTF8Len(s string) int {
	for k := 1; k <= utf8.UTFMax-1 && k <= len(s); k++ {
		b := s[len(s)-k]
		if utf8.RuneStart(b) {
			if b >= utf8.RuneSelf && !utf8.FullRuneInString(s[len(s)-k:]) {
				return k
			}
			return 0
		}
	}
	return 0
}
