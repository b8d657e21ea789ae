package tokenizer

// The GPT-2 byte-level alphabet: every byte maps to a printable rune so that
// arbitrary bytes can be spelled with vocabulary strings. Bytes that are
// printable Latin-1 map to themselves; the rest map to U+0100 onwards, in
// byte order.
var (
	byteToRune [256]rune
	// runeToByte maps a rune of the alphabet (all below 0x144) back to its
	// byte, or -1.
	runeToByte [0x144]int16
)

func init() {
	n := rune(0)
	for i := range runeToByte {
		runeToByte[i] = -1
	}
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = 256 + n
			n++
		}
		runeToByte[byteToRune[b]] = int16(b)
	}
}

// byteLevelString spells the bytes of s with the byte-level alphabet.
func byteLevelString(s string) string {
	out := make([]rune, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = byteToRune[s[i]]
	}
	return string(out)
}

// byteLevelBytes appends the bytes that the byte-level token tok spells. When
// a rune of tok is outside the alphabet, the raw UTF-8 of tok is appended
// instead (as HF's ByteLevel decoder does).
func byteLevelBytes(dst []byte, tok string) []byte {
	start := len(dst)
	for _, r := range tok {
		if r >= rune(len(runeToByte)) || runeToByte[r] < 0 {
			return append(dst[:start], tok...)
		}
		dst = append(dst, byte(runeToByte[r]))
	}
	return dst
}
