package tokenizer

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
)

// TestFastPathsEqualGeneric checks the fused pre-tokenize loop and the
// precomputed byte-level decode against the generic pipeline on the golden
// corpus, random strings and random id sequences.
func TestFastPathsEqualGeneric(t *testing.T) {
	tok := loadQwen3(t)
	if tok.fused == nil || tok.decOff == nil {
		t.Fatal("Qwen3 should take the fast paths")
	}
	plain := *tok
	plain.fused, plain.decOff, plain.decBytes = nil, nil, nil

	var strs []string
	b, err := os.ReadFile("testdata/golden_strings.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &strs); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 3000; i++ {
		strs = append(strs, randomSplitString(r))
	}
	for _, s := range strs {
		for _, parse := range []bool{false, true} {
			a, b := tok.Encode(s, true, parse), plain.Encode(s, true, parse)
			if fmt.Sprint(a) != fmt.Sprint(b) {
				t.Fatalf("Encode(%+q): fused %v, generic %v", s, a, b)
			}
		}
	}
	for i := 0; i < 3000; i++ {
		ids := make([]int, r.IntN(12))
		for k := range ids {
			switch r.IntN(3) {
			case 0:
				ids[k] = r.IntN(256) // single byte tokens (often broken UTF-8)
			case 1:
				ids[k] = r.IntN(tok.VocabSize()+10) - 5 // includes invalid ids
			default:
				ids[k] = 151643 + r.IntN(26) // added tokens
			}
		}
		for _, o := range []DecodeOptions{{}, {SkipSpecial: true}} {
			a, b := tok.DecodeWith(ids, o), plain.DecodeWith(ids, o)
			if a != b {
				t.Fatalf("DecodeWith(%v, %+v): fast %+q, generic %+q", ids, o, a, b)
			}
			// The byte-level streaming decoder adds up to Decode exactly.
			d := NewDecoderWith(tok, o)
			var out string
			for _, id := range ids {
				out += d.Push(id)
			}
			out += d.Flush()
			if out != a {
				t.Fatalf("stream(%v) = %+q, Decode %+q", ids, out, a)
			}
		}
	}
}
