package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"unicode/utf8"
)

type goldenCase struct {
	Text          string  `json:"text"`
	IDsAddSpecial []int   `json:"ids_addspecial"` // HF file only
	IDs           []int   `json:"ids"`
	IDsNoSpecial  []int   `json:"ids_nospecial"`
	Decoded       string  `json:"decoded"`
	DecodedSkip   *string `json:"decoded_skip"`
}

type goldenFile struct {
	Source string       `json:"source"`
	Cases  []goldenCase `json:"cases"`
}

// loadGolden returns the HF golden file when it is present in testdata, and
// the JS one otherwise.
func loadGolden(t *testing.T) (goldenFile, bool) {
	t.Helper()
	path, hf := "testdata/golden_qwen3_hf.json", true
	if _, err := os.Stat(path); err != nil {
		path, hf = "testdata/golden_qwen3_js.json", false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var g goldenFile
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var strs []string
	sb, err := os.ReadFile("testdata/golden_strings.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(sb, &strs); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) != len(strs) {
		t.Fatalf("%s has %d cases, golden_strings.json %d strings: regenerate it", path, len(g.Cases), len(strs))
	}
	for i := range strs {
		if g.Cases[i].Text != strs[i] {
			t.Fatalf("%s case %d is for %+q, golden_strings.json says %+q: regenerate it", path, i, g.Cases[i].Text, strs[i])
		}
	}
	t.Logf("golden reference: %s (%s, %d cases)", path, g.Source, len(g.Cases))
	return g, hf
}

func TestGoldenQwen3(t *testing.T) {
	tok := loadQwen3(t)
	g, _ := loadGolden(t)
	bad := 0
	report := func(format string, args ...any) {
		bad++
		if bad <= 25 {
			t.Errorf(format, args...)
		}
	}
	for _, c := range g.Cases {
		got := tok.Encode(c.Text, false, true)
		if fmt.Sprint(got) != fmt.Sprint(c.IDs) {
			report("encode(%+q, parseSpecial):\n go   %v\n want %v", c.Text, got, c.IDs)
		}
		if c.IDsAddSpecial != nil {
			got := tok.Encode(c.Text, true, true)
			if fmt.Sprint(got) != fmt.Sprint(c.IDsAddSpecial) {
				report("encode(%+q, addSpecial, parseSpecial):\n go   %v\n want %v", c.Text, got, c.IDsAddSpecial)
			}
		}
		if c.IDsNoSpecial != nil {
			got := tok.Encode(c.Text, false, false)
			if fmt.Sprint(got) != fmt.Sprint(c.IDsNoSpecial) {
				report("encode(%+q, no special parsing):\n go   %v\n want %v", c.Text, got, c.IDsNoSpecial)
			}
		}
		if d := tok.Decode(c.IDs); d != c.Decoded {
			report("decode(%v) = %+q, want %+q", c.IDs, d, c.Decoded)
		}
		if c.DecodedSkip != nil {
			if d := tok.DecodeWith(c.IDs, DecodeOptions{SkipSpecial: true}); d != *c.DecodedSkip {
				report("decode(%v, skip special) = %+q, want %+q", c.IDs, d, *c.DecodedSkip)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d mismatches against %s", bad, g.Source)
	}
}

// TestRoundTripQwen3 checks Decode(Encode(s)) == s on the corpus, with and
// without special-token parsing, and the same through the streaming decoder
// fed one id at a time, which must never emit broken UTF-8.
func TestRoundTripQwen3(t *testing.T) {
	tok := loadQwen3(t)
	var strs []string
	b, err := os.ReadFile("testdata/golden_strings.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &strs); err != nil {
		t.Fatal(err)
	}
	for _, s := range strs {
		want := nfc(s) // the normalizer is NFC: the round trip gives the NFC form
		for _, parse := range []bool{true, false} {
			ids := tok.Encode(s, false, parse)
			if got := tok.Decode(ids); got != want {
				t.Errorf("Decode(Encode(%+q, parse=%v)) = %+q", s, parse, got)
			}
			d := NewDecoder(tok)
			var out []byte
			for _, id := range ids {
				piece := d.Push(id)
				if !utf8.ValidString(piece) {
					t.Fatalf("streaming decoder emitted broken UTF-8 %+q for %+q", piece, s)
				}
				out = append(out, piece...)
			}
			out = append(out, d.Flush()...)
			if string(out) != want {
				t.Errorf("streaming decode of %+q = %+q", s, out)
			}
		}
	}
}
