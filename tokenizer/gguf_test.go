package tokenizer

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"testing"
)

func readQwen3JSON(t testing.TB) []byte {
	t.Helper()
	f, err := os.Open("testdata/qwen3/tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	js, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestGGUFQwen2MatchesHF rebuilds the arrays a GGUF file stores for Qwen3
// (tokens by id, "a b" merges, control / user-defined types, pre "qwen2")
// and checks that FromGGUFBPE tokenizes the golden corpus like the HF
// reference does.
func TestGGUFQwen2MatchesHF(t *testing.T) {
	tokens, types, merges := vocabArrays(t, readQwen3JSON(t))
	tok, err := FromGGUFBPE(tokens, merges, types, "qwen2", Config{EOS: "<|im_end|>"})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := loadGolden(t)
	bad := 0
	for _, c := range g.Cases {
		if got := tok.Encode(c.Text, false, true); fmt.Sprint(got) != fmt.Sprint(c.IDs) {
			bad++
			if bad < 10 {
				t.Errorf("encode(%+q):\n gguf %v\n want %v", c.Text, got, c.IDs)
			}
		}
		if c.IDsNoSpecial != nil {
			if got := tok.Encode(c.Text, false, false); fmt.Sprint(got) != fmt.Sprint(c.IDsNoSpecial) {
				bad++
				if bad < 10 {
					t.Errorf("encode nospecial(%+q):\n gguf %v\n want %v", c.Text, got, c.IDsNoSpecial)
				}
			}
		}
		if got := tok.Decode(c.IDs); got != c.Decoded {
			bad++
			if bad < 10 {
				t.Errorf("decode(%v) = %+q, want %+q", c.IDs, got, c.Decoded)
			}
		}
	}
	if sp := tok.SpecialIDs(); sp.EOS != 151645 {
		t.Errorf("EOS = %d", sp.EOS)
	}
	if got := tok.Encode("hi", true, true); len(got) != 1 {
		t.Errorf("addSpecial added tokens without AddBOS: %v", got)
	}
}

func TestGGUFErrors(t *testing.T) {
	if _, err := FromGGUFBPE([]string{"a"}, nil, nil, "no-such-pre", Config{}); err == nil {
		t.Error("unknown pre accepted")
	}
	if _, err := FromGGUFBPE(nil, nil, nil, "gpt2", Config{}); err == nil {
		t.Error("empty vocab accepted")
	}
	if _, err := FromGGUFBPE([]string{"a"}, []string{"ab"}, nil, "gpt2", Config{}); err == nil {
		t.Error("merge without space accepted")
	}
	if _, err := FromGGUFBPE([]string{"a"}, nil, []int32{1, 1}, "gpt2", Config{}); err == nil {
		t.Error("type count mismatch accepted")
	}
	// Merges naming unknown tokens are skipped, like llama.cpp does.
	if _, err := FromGGUFBPE([]string{"a"}, []string{"x y"}, nil, "gpt2", Config{}); err != nil {
		t.Errorf("bad merge not skipped: %v", err)
	}
	// Every known pre name builds.
	for _, pre := range []string{"qwen2", "qwen35", "llama-bpe", "gpt2", "starcoder", "default", "dbrx"} {
		if _, err := FromGGUFBPE([]string{"a", "b"}, []string{"a b"}, nil, pre, Config{}); err != nil {
			t.Errorf("pre %q: %v", pre, err)
		}
	}
}
