package tokenizer

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// decoder turns token strings back into text (HF Decoder::decode_chain).
type decoder interface {
	decodeChain(tokens []string) []string
}

// byteLevelDec maps byte-level runes back to bytes, then to text with
// invalid sequences replaced by U+FFFD.
type byteLevelDec struct{}

func (byteLevelDec) decodeChain(tokens []string) []string {
	var b []byte
	for _, t := range tokens {
		b = byteLevelBytes(b, t)
	}
	return []string{string(appendLossy(nil, b))}
}

type replaceDec struct {
	m       matcher
	content string
}

func (r replaceDec) decodeChain(tokens []string) []string {
	n := replaceNorm(r)
	out := make([]string, len(tokens))
	for i, t := range tokens {
		s, err := n.normalize(t)
		if err != nil {
			s = t
		}
		out[i] = s
	}
	return out
}

// byteFallbackDec turns runs of <0xNN> tokens into text; a run that is not
// valid UTF-8 becomes one U+FFFD per byte.
type byteFallbackDec struct{}

func parseByteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	v, err := strconv.ParseUint(t[3:5], 16, 8)
	if err != nil {
		return 0, false
	}
	return byte(v), true
}

func (byteFallbackDec) decodeChain(tokens []string) []string {
	out := make([]string, 0, len(tokens))
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range tokens {
		if b, ok := parseByteToken(t); ok {
			pending = append(pending, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

type fuseDec struct{}

func (fuseDec) decodeChain(tokens []string) []string {
	return []string{strings.Join(tokens, "")}
}

// stripDec removes up to start leading and stop trailing copies of content
// from each token.
type stripDec struct {
	content     rune
	start, stop int
}

func (d stripDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		rs := []rune(t)
		lo := 0
		for lo < d.start && lo < len(rs) && rs[lo] == d.content {
			lo++
		}
		hi := len(rs)
		for k := 0; k < d.stop && hi > lo && rs[hi-1] == d.content; k++ {
			hi--
		}
		out[i] = string(rs[lo:hi])
	}
	return out
}

// metaspaceDec turns the replacement rune back into spaces; in the first
// token it is dropped when a prefix was added on encode.
type metaspaceDec struct {
	replacement rune
	prepend     bool
}

func (d metaspaceDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		var b strings.Builder
		for _, r := range t {
			if r == d.replacement {
				if i == 0 && d.prepend {
					continue
				}
				b.WriteByte(' ')
				continue
			}
			b.WriteRune(r)
		}
		out[i] = b.String()
	}
	return out
}

type sequenceDec []decoder

func (q sequenceDec) decodeChain(tokens []string) []string {
	for _, d := range q {
		tokens = d.decodeChain(tokens)
	}
	return tokens
}

// DecodeOptions control Decode.
type DecodeOptions struct {
	// SkipSpecial drops special tokens (added tokens marked special, and
	// control/unknown tokens of SentencePiece vocabularies).
	SkipSpecial bool
}

// Decode turns ids back into text, skipping nothing. Unknown ids are
// ignored.
func (t *Tokenizer) Decode(ids []int) string {
	return t.DecodeWith(ids, DecodeOptions{})
}

// DecodeWith turns ids back into text.
func (t *Tokenizer) DecodeWith(ids []int, o DecodeOptions) string {
	if t.decOff != nil {
		buf := make([]byte, 0, len(ids)*4)
		for _, id := range ids {
			if id < 0 || id >= len(t.idToToken) || !t.hasID[id] || (o.SkipSpecial && t.isSpecial(id)) {
				continue
			}
			buf = t.appendTokenBytes(buf, id)
		}
		if utf8.Valid(buf) {
			return string(buf)
		}
		return string(appendLossy(nil, buf))
	}
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		if id < 0 || id >= len(t.idToToken) || !t.hasID[id] {
			continue
		}
		if o.SkipSpecial && t.isSpecial(id) {
			continue
		}
		toks = append(toks, t.idToToken[id])
	}
	if t.dec == nil {
		return strings.Join(toks, " ")
	}
	return strings.Join(t.dec.decodeChain(toks), "")
}

// Decoder decodes a stream of ids incrementally, returning only complete
// UTF-8 text: a multi-byte character split across tokens is held back until
// its last byte arrives. The concatenation of everything Push and Flush
// return equals Decode of all the ids pushed.
type Decoder struct {
	tok  *Tokenizer
	opts DecodeOptions
	// Byte-level path: pending holds undecoded trailing bytes.
	pending []byte
	// General path (HF DecodeStream): ids is the window that is re-decoded,
	// prefix its text before the ids not yet emitted.
	ids       []int
	prefix    string
	prefixIdx int
}

// NewDecoder returns a streaming decoder that skips nothing.
func NewDecoder(tok *Tokenizer) *Decoder { return NewDecoderWith(tok, DecodeOptions{}) }

// NewDecoderWith returns a streaming decoder with options.
func NewDecoderWith(tok *Tokenizer, o DecodeOptions) *Decoder {
	return &Decoder{tok: tok, opts: o}
}

// Push adds one id and returns the text that became complete.
func (d *Decoder) Push(id int) string {
	t := d.tok
	if t.decOff != nil {
		if id < 0 || id >= len(t.idToToken) || !t.hasID[id] || (d.opts.SkipSpecial && t.isSpecial(id)) {
			return ""
		}
		d.pending = t.appendTokenBytes(d.pending, id)
		keep := incompleteSuffixLen(d.pending)
		ready := d.pending[:len(d.pending)-keep]
		if len(ready) == 0 {
			return ""
		}
		var out string
		if utf8.Valid(ready) {
			out = string(ready)
		} else {
			out = string(appendLossy(nil, ready))
		}
		d.pending = append(d.pending[:0], d.pending[len(ready):]...)
		return out
	}
	// General path, after HF tokenizers' DecodeStream::step: re-decode a
	// window that starts one emitted token back (for context such as a
	// leading space), and emit what was added once it no longer ends with
	// U+FFFD (a possibly incomplete character).
	d.ids = append(d.ids, id)
	s := t.DecodeWith(d.ids, d.opts)
	if len(s) > len(d.prefix) && !strings.HasSuffix(s, "\uFFFD") && strings.HasPrefix(s, d.prefix) {
		out := s[len(d.prefix):]
		newIdx := len(d.ids) - d.prefixIdx
		d.ids = append(d.ids[:0], d.ids[d.prefixIdx:]...)
		d.prefix = t.DecodeWith(d.ids, d.opts)
		d.prefixIdx = newIdx
		return out
	}
	return ""
}

// Flush returns whatever is held back (incomplete characters come out as
// U+FFFD) and resets the decoder.
func (d *Decoder) Flush() string {
	var out string
	if len(d.pending) > 0 {
		out = string(appendLossy(nil, d.pending))
	} else if len(d.ids) > 0 {
		s := d.tok.DecodeWith(d.ids, d.opts)
		if strings.HasPrefix(s, d.prefix) {
			out = s[len(d.prefix):]
		} else {
			out = s
		}
	}
	d.pending = d.pending[:0]
	d.ids = d.ids[:0]
	d.prefix = ""
	d.prefixIdx = 0
	return out
}
