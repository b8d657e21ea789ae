package tokenizer

import (
	"fmt"
	"testing"
	"unicode/utf8"
)

// tinySP builds a SentencePiece vocabulary by hand: <unk> <s> </s>, the 256
// byte tokens (ids 3..258), then a few pieces with chosen scores, and one
// user-defined token.
func tinySP(t *testing.T, cfg Config) (*Tokenizer, map[string]int) {
	t.Helper()
	tokens := []string{"<unk>", "<s>", "</s>"}
	types := []int32{TokenUnknown, TokenControl, TokenControl}
	scores := []float32{0, 0, 0}
	for b := 0; b < 256; b++ {
		tokens = append(tokens, fmt.Sprintf("<0x%02X>", b))
		types = append(types, TokenByte)
		scores = append(scores, 0)
	}
	pieces := []struct {
		s     string
		score float32
	}{
		{"▁", -1}, {"h", -30}, {"e", -30}, {"l", -30}, {"o", -30}, {"w", -30}, {"r", -30}, {"d", -30},
		{"he", -10}, {"ll", -5}, {"llo", -3}, {"hello", -2}, {"▁hello", -1},
		{"▁w", -20}, {"or", -8}, {"▁wor", -12}, {"▁world", -11}, {"ld", -15},
	}
	for _, p := range pieces {
		tokens = append(tokens, p.s)
		types = append(types, TokenNormal)
		scores = append(scores, p.score)
	}
	tokens = append(tokens, "<sep>")
	types = append(types, TokenUserDefined)
	scores = append(scores, 0)
	tok, err := FromSentencePiece(tokens, scores, types, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int{}
	for i, s := range tokens {
		ids[s] = i
	}
	return tok, ids
}

func TestSentencePieceByHand(t *testing.T) {
	tok, id := tinySP(t, Config{})
	b := func(c byte) int { return 3 + int(c) } // byte token id
	cases := []struct {
		text         string
		add, special bool
		want         []int
	}{
		// ▁ h e l l o: ll (-5), then llo (-3), he (-10), hello (-2), ▁hello (-1).
		{"hello", false, true, []int{id["▁hello"]}},
		{"hello", true, true, []int{1, id["▁hello"]}},
		// H is not in the vocabulary: byte fallback <0x48>; "world" merges
		// or, ld, ▁w, ▁wor, ▁world.
		{"Hello world", false, true, []int{id["▁"], b('H'), id["e"], id["llo"], id["▁world"]}},
		// é is two bytes.
		{"é", false, true, []int{id["▁"], b(0xC3), b(0xA9)}},
		// User-defined tokens are always matched; each stretch of text after
		// one gets its own ▁ (llama.cpp and HF legacy Llama behaviour).
		{"a<sep>b", false, false, []int{id["▁"], b('a'), id["<sep>"], id["▁"], b('b')}},
		// Control tokens only with parseSpecial.
		{"<s>hello", false, true, []int{1, id["▁hello"]}},
		{"<s>hello", false, false, []int{id["▁"], b('<'), b('s'), b('>'), id["hello"]}},
		{"", false, true, nil},
		{"", true, true, []int{1}},
		// Spaces become ▁.
		{"  hello", false, true, []int{id["▁"], id["▁"], id["▁hello"]}},
	}
	for _, c := range cases {
		got := tok.Encode(c.text, c.add, c.special)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("Encode(%q, add=%v, special=%v) = %v, want %v", c.text, c.add, c.special, got, c.want)
		}
	}
	if got := tok.Decode([]int{1, id["▁"], b('H'), id["e"], id["llo"], id["▁world"]}); got != "<s> Hello world" {
		t.Errorf("Decode = %q", got)
	}
	if got := tok.DecodeWith([]int{1, id["▁"], b('H'), id["e"], id["llo"], id["▁world"], 2}, DecodeOptions{SkipSpecial: true}); got != "Hello world" {
		t.Errorf("Decode skip special = %q", got)
	}
	// A byte run that is not valid UTF-8 decodes to one U+FFFD per byte (HF
	// ByteFallback).
	if got := tok.Decode([]int{id["▁hello"], b(0xC3), id["▁world"]}); got != "hello\uFFFD world" {
		t.Errorf("Decode invalid bytes = %q", got)
	}
	sp := tok.SpecialIDs()
	if sp.BOS != 1 || sp.EOS != 2 || sp.UNK != 0 || sp.PAD != -1 {
		t.Errorf("SpecialIDs = %+v", sp)
	}
	if s, ok := tok.TokenString(id["▁world"]); !ok || s != "▁world" {
		t.Errorf("TokenString = %q %v", s, ok)
	}
	if tok.VocabSize() != len(id) {
		t.Errorf("VocabSize = %d, want %d", tok.VocabSize(), len(id))
	}
}

func TestSentencePieceOptions(t *testing.T) {
	no, yes := false, true
	tok, id := tinySP(t, Config{AddDummyPrefix: &no, AddBOS: &no, AddEOS: &yes})
	got := tok.Encode("hello world", true, true)
	want := []int{id["hello"], id["▁world"], 2}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Encode = %v, want %v", got, want)
	}
	if d := tok.Decode(got); d != "hello world</s>" {
		t.Errorf("Decode = %q", d)
	}
}

func TestSentencePieceRoundTripAndStream(t *testing.T) {
	tok, _ := tinySP(t, Config{})
	// Text after an added token gets a ▁ of its own, so "a<sep>b" comes back
	// as "a<sep> b" (as with HF's legacy Llama tokenizer); it is left out.
	for _, s := range []string{"hello world", "Hello, wörld! 😀 中文", "  spaced  out  ", "\t\n", "<s>"} {
		ids := tok.Encode(s, false, true)
		if got := tok.Decode(ids); got != s {
			t.Errorf("round trip %q -> %v -> %q", s, ids, got)
		}
		d := NewDecoder(tok)
		var out string
		for _, id := range ids {
			p := d.Push(id)
			if !utf8.ValidString(p) {
				t.Fatalf("broken UTF-8 %q", p)
			}
			out += p
		}
		out += d.Flush()
		if out != s {
			t.Errorf("stream %q -> %q", s, out)
		}
	}
}

func TestSentencePieceErrors(t *testing.T) {
	if _, err := FromSentencePiece(nil, nil, nil, Config{}); err == nil {
		t.Error("empty vocab accepted")
	}
	if _, err := FromSentencePiece([]string{"a", "b"}, []float32{0}, nil, Config{}); err == nil {
		t.Error("score count mismatch accepted")
	}
	if _, err := FromSentencePiece([]string{"a"}, []float32{0}, []int32{1, 1}, Config{}); err == nil {
		t.Error("type count mismatch accepted")
	}
}
