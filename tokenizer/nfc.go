package tokenizer

import (
	"sort"
	"unicode/utf8"
)

//go:generate sh -c "python3.12 gen_nfc_tables.py > nfc_tables.go && gofmt -w nfc_tables.go"

type cccRange struct {
	lo, hi rune
	ccc    uint8
}

type runeRange struct{ lo, hi rune }

type decompEntry struct {
	r      rune
	off, n uint16
}

type compEntry struct {
	pair uint64
	r    rune
}

const (
	hangulSBase  = 0xAC00
	hangulLBase  = 0x1100
	hangulVBase  = 0x1161
	hangulTBase  = 0x11A7
	hangulLCount = 19
	hangulVCount = 21
	hangulTCount = 28
	hangulNCount = hangulVCount * hangulTCount
	hangulSCount = hangulLCount * hangulNCount
)

// combiningClass returns the canonical combining class of r.
func combiningClass(r rune) uint8 {
	if r < 0x300 {
		return 0
	}
	i := sort.Search(len(cccTable), func(i int) bool { return cccTable[i].hi >= r })
	if i < len(cccTable) && cccTable[i].lo <= r {
		return cccTable[i].ccc
	}
	return 0
}

// needsNFC reports whether r may be changed or combined by NFC.
func needsNFC(r rune) bool {
	if r < 0x300 {
		return false
	}
	i := sort.Search(len(needsNFCTable), func(i int) bool { return needsNFCTable[i].hi >= r })
	return i < len(needsNFCTable) && needsNFCTable[i].lo <= r
}

// isNFC reports whether s is certainly already in NFC (a quick check: false
// means "maybe not").
func isNFC(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0xCC { // all runes below U+0300 encode with a lead byte < 0xCC
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if needsNFC(r) {
			return false
		}
		i += n - 1
	}
	return true
}

// appendDecomposed appends the full canonical decomposition of r.
func appendDecomposed(dst []rune, r rune) []rune {
	if r >= hangulSBase && r < hangulSBase+hangulSCount {
		s := r - hangulSBase
		dst = append(dst, hangulLBase+s/hangulNCount, hangulVBase+(s%hangulNCount)/hangulTCount)
		if t := s % hangulTCount; t != 0 {
			dst = append(dst, hangulTBase+t)
		}
		return dst
	}
	if r >= 0xC0 {
		i := sort.Search(len(decompTable), func(i int) bool { return decompTable[i].r >= r })
		if i < len(decompTable) && decompTable[i].r == r {
			e := decompTable[i]
			return append(dst, decompData[e.off:e.off+e.n]...)
		}
	}
	return append(dst, r)
}

// compose returns the primary composite of a and b, if any.
func compose(a, b rune) (rune, bool) {
	// Hangul L+V and LV+T.
	if a >= hangulLBase && a < hangulLBase+hangulLCount && b >= hangulVBase && b < hangulVBase+hangulVCount {
		return hangulSBase + ((a-hangulLBase)*hangulVCount+(b-hangulVBase))*hangulTCount, true
	}
	if a >= hangulSBase && a < hangulSBase+hangulSCount && (a-hangulSBase)%hangulTCount == 0 &&
		b > hangulTBase && b < hangulTBase+hangulTCount {
		return a + (b - hangulTBase), true
	}
	key := uint64(a)<<32 | uint64(b)
	i := sort.Search(len(compTable), func(i int) bool { return compTable[i].pair >= key })
	if i < len(compTable) && compTable[i].pair == key {
		return compTable[i].r, true
	}
	return 0, false
}

// nfc returns the Unicode Normalization Form C of s. Invalid UTF-8 bytes are
// kept as they are.
func nfc(s string) string {
	if isNFC(s) {
		return s
	}
	out := make([]byte, 0, len(s)+8)
	// Process segment by segment: a segment starts at a rune that does not
	// need NFC work and extends over the runes that follow it and do.
	i := 0
	var buf []rune
	for i < len(s) {
		// Copy the stretch that is certainly unaffected, but keep its last
		// rune: it may be a starter that composes with what follows.
		start := i
		last := i
		for i < len(s) {
			r, n := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && n == 1 {
				// Invalid byte: copy through, it breaks any composition.
				i++
				last = i
				continue
			}
			if needsNFC(r) {
				break
			}
			last = i
			i += n
		}
		if i >= len(s) {
			out = append(out, s[start:]...)
			break
		}
		// s[last:i] is a possible starter (or empty if last == i).
		out = append(out, s[start:last]...)
		segStart := last
		// Extend over runes that need work, and any valid runes up to the
		// next rune that is a starter not needing work.
		j := i
		for j < len(s) {
			r, n := utf8.DecodeRuneInString(s[j:])
			if r == utf8.RuneError && n == 1 {
				break
			}
			if !needsNFC(r) {
				break
			}
			j += n
		}
		buf = buf[:0]
		for k := segStart; k < j; {
			r, n := utf8.DecodeRuneInString(s[k:])
			buf = appendDecomposed(buf, r)
			k += n
		}
		buf = canonicalOrder(buf)
		buf = canonicalCompose(buf)
		for _, r := range buf {
			out = utf8.AppendRune(out, r)
		}
		i = j
	}
	return string(out)
}

// canonicalOrder sorts each run of non-starters by combining class (stable).
func canonicalOrder(rs []rune) []rune {
	for i := 1; i < len(rs); i++ {
		c := combiningClass(rs[i])
		if c == 0 {
			continue
		}
		j := i
		for j > 0 {
			p := combiningClass(rs[j-1])
			if p == 0 || p <= c {
				break
			}
			rs[j-1], rs[j] = rs[j], rs[j-1]
			j--
		}
	}
	return rs
}

// canonicalCompose applies the canonical composition algorithm in place.
func canonicalCompose(rs []rune) []rune {
	if len(rs) == 0 {
		return rs
	}
	starter := -1
	if combiningClass(rs[0]) == 0 {
		starter = 0
	}
	out := 1
	var lastCCC int = -1
	if starter == 0 {
		lastCCC = 0
	} else {
		lastCCC = int(combiningClass(rs[0]))
	}
	for i := 1; i < len(rs); i++ {
		r := rs[i]
		c := int(combiningClass(r))
		if starter >= 0 {
			// Blocked if a previous kept character has ccc 0 or >= c,
			// unless it is the starter itself (adjacent).
			blocked := out-1 != starter && (lastCCC == 0 || lastCCC >= c)
			if !blocked {
				if comp, ok := compose(rs[starter], r); ok {
					rs[starter] = comp
					continue
				}
			}
		}
		if c == 0 {
			starter = out
		}
		lastCCC = c
		rs[out] = r
		out++
	}
	return rs[:out]
}
