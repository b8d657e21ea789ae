package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestLossyUTF8 checks the replacement of ill-formed sequences against what
// Rust's String::from_utf8_lossy produces (one U+FFFD per maximal subpart).
func TestLossyUTF8(t *testing.T) {
	cases := []struct{ in, want string }{
		{"abc", "abc"},
		{"\xF0\x9F\x98A", "\uFFFDA"},           // truncated 4-byte sequence: one U+FFFD
		{"\xED\xA0\x80", "\uFFFD\uFFFD\uFFFD"}, // surrogate: ED then two stray bytes
		{"\xC0\x80", "\uFFFD\uFFFD"},           // overlong lead
		{"\xE2\x82", "\uFFFD"},                 // truncated at the end
		{"\xE2\x82\xAC", "€"},                  // valid
		{"\x80\x80", "\uFFFD\uFFFD"},           // stray continuations
		{"\xF4\x90\x80\x80", "\uFFFD\uFFFD\uFFFD\uFFFD"},
		{"a\xFFb", "a\uFFFDb"},
	}
	for _, c := range cases {
		if got := string(appendLossy(nil, []byte(c.in))); got != c.want {
			t.Errorf("lossy(%+q) = %+q, want %+q", c.in, got, c.want)
		}
	}
}

func TestIncompleteSuffix(t *testing.T) {
	cases := []struct {
		in   string
		want int
	}{
		{"", 0}, {"a", 0}, {"\xE2", 1}, {"\xE2\x82", 2}, {"\xE2\x82\xAC", 0}, {"a\xF0\x9F\x98", 3},
		{"\xF0\x9F\x98\x80", 0}, {"\xED\xA0", 0}, {"\xC0", 0}, {"\x80", 0}, {"\xF5", 0},
	}
	for _, c := range cases {
		if got := incompleteSuffixLen([]byte(c.in)); got != c.want {
			t.Errorf("incompleteSuffixLen(%+q) = %d, want %d", c.in, got, c.want)
		}
	}
}

// TestStreamingSplitCharacters feeds byte tokens one at a time so that
// multi-byte characters arrive in pieces.
func TestStreamingSplitCharacters(t *testing.T) {
	tok := loadQwen3(t)
	text := "a😀é中\xF0\x9Fb" // includes an ill-formed sequence
	var ids []int
	for i := 0; i < len(text); i++ {
		id, ok := tok.ID(string(byteToRune[text[i]]))
		if !ok {
			t.Fatalf("no byte token for %#x", text[i])
		}
		ids = append(ids, id)
	}
	d := NewDecoder(tok)
	var got []string
	for _, id := range ids {
		p := d.Push(id)
		if !utf8.ValidString(p) {
			t.Fatalf("broken UTF-8 %+q", p)
		}
		got = append(got, p)
	}
	got = append(got, d.Flush())
	want := []string{"a", "", "", "", "😀", "", "é", "", "", "中", "", "", "\uFFFDb", ""}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("pieces %+q\nwant   %+q", got, want)
	}
	if strings.Join(got, "") != tok.Decode(ids) {
		t.Errorf("stream %+q != Decode %+q", strings.Join(got, ""), tok.Decode(ids))
	}
	// A trailing incomplete character comes out of Flush as U+FFFD.
	d = NewDecoder(tok)
	d.Push(ids[1])
	if f := d.Flush(); f != "\uFFFD" {
		t.Errorf("Flush = %+q", f)
	}
	// SkipSpecial in the stream.
	d = NewDecoderWith(tok, DecodeOptions{SkipSpecial: true})
	im, _ := tok.ID("<|im_start|>")
	if p := d.Push(im) + d.Push(ids[0]) + d.Flush(); p != "a" {
		t.Errorf("skip special stream %+q", p)
	}
}
