package tokenizer

import "unicode/utf8"

// appendLossy appends b to dst, replacing each maximal ill-formed subsequence
// with U+FFFD, as Rust's String::from_utf8_lossy (and so HF tokenizers) does.
func appendLossy(dst []byte, b []byte) []byte {
	for len(b) > 0 {
		if b[0] < utf8.RuneSelf {
			dst = append(dst, b[0])
			b = b[1:]
			continue
		}
		r, n := utf8.DecodeRune(b)
		if r != utf8.RuneError || n > 1 {
			dst = append(dst, b[:n]...)
			b = b[n:]
			continue
		}
		n = invalidPrefixLen(b)
		dst = append(dst, "\uFFFD"...)
		b = b[n:]
	}
	return dst
}

// invalidPrefixLen returns how many bytes at the start of b (which does not
// start with a valid rune) form one maximal subpart of an ill-formed
// sequence: the longest prefix that could start a valid sequence, or 1.
func invalidPrefixLen(b []byte) int {
	lo, hi, need := seqInfo(b[0])
	if need == 0 {
		return 1
	}
	n := 1
	for n <= need && n < len(b) {
		c := b[n]
		if c < lo || c > hi {
			break
		}
		lo, hi = 0x80, 0xBF
		n++
	}
	return n
}

// seqInfo returns, for a lead byte, the allowed range of the second byte and
// the number of continuation bytes (0 for a byte that cannot lead).
func seqInfo(b byte) (lo, hi byte, need int) {
	switch {
	case b >= 0xC2 && b <= 0xDF:
		return 0x80, 0xBF, 1
	case b == 0xE0:
		return 0xA0, 0xBF, 2
	case b >= 0xE1 && b <= 0xEC, b == 0xEE, b == 0xEF:
		return 0x80, 0xBF, 2
	case b == 0xED:
		return 0x80, 0x9F, 2
	case b == 0xF0:
		return 0x90, 0xBF, 3
	case b >= 0xF1 && b <= 0xF3:
		return 0x80, 0xBF, 3
	case b == 0xF4:
		return 0x80, 0x8F, 3
	}
	return 0, 0, 0
}

// incompleteSuffixLen returns the length of a trailing sequence of b that is
// a proper prefix of a valid UTF-8 encoding (so more bytes could complete
// it), or 0.
func incompleteSuffixLen(b []byte) int {
	for k := 1; k <= 3 && k <= len(b); k++ {
		i := len(b) - k
		c := b[i]
		if c < 0x80 {
			return 0
		}
		if c >= 0xC0 {
			lo, hi, need := seqInfo(c)
			if need < k {
				return 0
			}
			// Check the continuation bytes present so far.
			for j := i + 1; j < len(b); j++ {
				if b[j] < lo || b[j] > hi {
					return 0
				}
				lo, hi = 0x80, 0xBF
			}
			return k
		}
	}
	return 0
}
