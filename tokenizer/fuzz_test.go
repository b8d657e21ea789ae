package tokenizer

import (
	"testing"
	"unicode/utf8"
)

// FuzzEncodeDecodeRoundTrip: for any valid UTF-8 text, the real Qwen3
// tokenizer must give back the text (in NFC, its normalizer) from Decode and
// from the streaming decoder, which must never emit broken UTF-8.
func FuzzEncodeDecodeRoundTrip(f *testing.F) {
	for _, s := range []string{"Hello, world!", "  \t\n\r\n x", "e\u0301'LL 123456", "<|im_start|>a<|im_end|>", "中文😀👨\u200d👩\u200d👧", ""} {
		f.Add(s)
	}
	tok := loadQwen3(f)
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			// Invalid bytes are encoded as bytes and come back as U+FFFD:
			// the output must at least be valid UTF-8.
			if d := tok.Decode(tok.Encode(s, true, true)); !utf8.ValidString(d) {
				t.Fatalf("Decode(Encode(%+q)) = %+q is not valid UTF-8", s, d)
			}
			return
		}
		want := nfc(s)
		for _, parse := range []bool{false, true} {
			ids := tok.Encode(s, false, parse)
			if got := tok.Decode(ids); got != want {
				t.Fatalf("Decode(Encode(%+q, %v)) = %+q, want %+q (ids %v)", s, parse, got, want, ids)
			}
			d := NewDecoder(tok)
			var out []byte
			for _, id := range ids {
				p := d.Push(id)
				if !utf8.ValidString(p) {
					t.Fatalf("streaming decoder emitted %+q", p)
				}
				out = append(out, p...)
			}
			out = append(out, d.Flush()...)
			if string(out) != want {
				t.Fatalf("stream of %+q = %+q", s, out)
			}
		}
	})
}

// FuzzFromHFJSON: arbitrary bytes must not panic, and a tokenizer that
// does build must encode and decode without panicking.
func FuzzFromHFJSON(f *testing.F) {
	f.Add(tinyHFJSON(f, false, nil))
	f.Add(tinyHFJSON(f, true, map[string]string{
		"normalizer":    `{"type":"Sequence","normalizers":[{"type":"NFC"},{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]}`,
		"pre_tokenizer": `{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\s+(?!\\S)|\\p{N}"},"behavior":"MergedWithNext","invert":false},{"type":"Digits","individual_digits":true},{"type":"ByteLevel","add_prefix_space":true,"use_regex":false}]}`,
		"added_tokens":  `[{"id":300,"content":"<x>","single_word":true,"lstrip":true,"rstrip":true,"normalized":false,"special":true},{"id":301,"content":"y","normalized":true}]`,
		"decoder":       `{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]}`,
	}))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":[["a","b"]]}}`))
	f.Add([]byte(`{"model":{"vocab":{},"merges":[]},"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"first"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := FromHFJSON(data, Config{})
		if err != nil {
			return
		}
		for _, s := range []string{"", "hello world", "a<x>y 12 \n", "héllo😀"} {
			ids := tok.Encode(s, true, true)
			_ = tok.Decode(ids)
			_ = tok.DecodeWith(ids, DecodeOptions{SkipSpecial: true})
			d := NewDecoder(tok)
			for _, id := range ids {
				d.Push(id)
			}
			d.Flush()
		}
		_ = tok.Decode([]int{-1, 0, 1, 1 << 30})
	})
}

// FuzzFromSentencePiece: arbitrary vocabularies must not panic.
func FuzzFromSentencePiece(f *testing.F) {
	f.Add("▁a,b,▁ab,<0x41>,<s>", "hello ab", uint8(3))
	f.Fuzz(func(t *testing.T, vocab, text string, seed uint8) {
		var tokens []string
		start := 0
		for i := 0; i <= len(vocab); i++ {
			if i == len(vocab) || vocab[i] == ',' {
				tokens = append(tokens, vocab[start:i])
				start = i + 1
			}
		}
		scores := make([]float32, len(tokens))
		types := make([]int32, len(tokens))
		for i := range tokens {
			scores[i] = float32((int(seed)*31+i*7)%13) - 6
			types[i] = int32((int(seed)+i)%6 + 1)
		}
		tok, err := FromSentencePiece(tokens, scores, types, Config{})
		if err != nil {
			return
		}
		ids := tok.Encode(text, true, true)
		_ = tok.Decode(ids)
		d := NewDecoder(tok)
		for _, id := range ids {
			d.Push(id)
		}
		d.Flush()
	})
}
