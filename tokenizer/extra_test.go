package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestExtraModels compares other real tokenizers against HF tokenizers
// golden files, for the models whose files are too large (or not licensed)
// to commit. It runs only when CORTIQ_TOKENIZER_EXTRA names a directory
// holding NAME.json (a tokenizer.json) and golden_NAME_hf.json (written by
// tools/refgen/tokgolden.py --tokenizer NAME.json --name NAME), for NAME in
// llama3 (byte-level, ignore_merges) and llama2 (SentencePiece-style BPE
// with byte fallback). For llama3 it also checks FromGGUFBPE(pre
// "llama-bpe"), and for llama2 FromSentencePiece, on vocabularies rebuilt
// from the same file the way a GGUF converter stores them.
func TestExtraModels(t *testing.T) {
	dir := os.Getenv("CORTIQ_TOKENIZER_EXTRA")
	if dir == "" {
		t.Skip("CORTIQ_TOKENIZER_EXTRA not set")
	}
	for _, name := range []string{"llama3", "llama2"} {
		t.Run(name, func(t *testing.T) {
			js, err := os.ReadFile(filepath.Join(dir, name+".json"))
			if err != nil {
				t.Skip(err)
			}
			gb, err := os.ReadFile(filepath.Join(dir, "golden_"+name+"_hf.json"))
			if err != nil {
				t.Fatal(err)
			}
			var g struct {
				Cases []goldenCase `json:"cases"`
			}
			if err := json.Unmarshal(gb, &g); err != nil {
				t.Fatal(err)
			}
			hf, err := FromHFJSON(js, Config{})
			if err != nil {
				t.Fatal(err)
			}
			toks := map[string]*Tokenizer{"FromHFJSON": hf}
			if name == "llama3" {
				toks["FromGGUFBPE"] = ggufFromHFJSON(t, js, "llama-bpe")
			} else {
				toks["FromSentencePiece"] = spFromHFJSON(t, js)
			}
			keys := make([]string, 0, len(toks))
			for k := range toks {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				tok := toks[k]
				bad := 0
				for _, c := range g.Cases {
					check := func(what string, got, want any) {
						if fmt.Sprint(got) != fmt.Sprint(want) {
							bad++
							if bad <= 10 {
								t.Errorf("%s %s(%+q):\n go   %v\n want %v", k, what, c.Text, got, want)
							}
						}
					}
					check("encode", tok.Encode(c.Text, false, true), c.IDs)
					check("encode nospecial", tok.Encode(c.Text, false, false), c.IDsNoSpecial)
					check("encode addspecial", tok.Encode(c.Text, true, true), c.IDsAddSpecial)
					check("decode", tok.Decode(c.IDs), c.Decoded)
					check("decode skip", tok.DecodeWith(c.IDs, DecodeOptions{SkipSpecial: true}), *c.DecodedSkip)
				}
				t.Logf("%s %s: %d mismatches in %d cases", name, k, bad, len(g.Cases))
			}
		})
	}
}

type hfVocabDump struct {
	AddedTokens []hfAddedToken `json:"added_tokens"`
	Model       struct {
		Vocab  map[string]int    `json:"vocab"`
		Merges []json.RawMessage `json:"merges"`
	} `json:"model"`
}

func vocabArrays(t testing.TB, js []byte) (tokens []string, types []int32, merges []string) {
	var d hfVocabDump
	if err := json.Unmarshal(js, &d); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, id := range d.Model.Vocab {
		n = max(n, id+1)
	}
	for _, a := range d.AddedTokens {
		n = max(n, *a.ID+1)
	}
	tokens = make([]string, n)
	types = make([]int32, n)
	for s, id := range d.Model.Vocab {
		tokens[id] = s
		types[id] = TokenNormal
		if _, ok := parseByteToken(s); ok {
			types[id] = TokenByte
		}
	}
	for _, a := range d.AddedTokens {
		tokens[*a.ID] = a.Content
		types[*a.ID] = TokenUserDefined
		if a.Special {
			types[*a.ID] = TokenControl
		}
	}
	pairs, err := parseMerges(d.Model.Merges)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pairs {
		merges = append(merges, p[0]+" "+p[1])
	}
	return tokens, types, merges
}

// ggufFromHFJSON rebuilds the GGUF arrays of a byte-level tokenizer.json.
func ggufFromHFJSON(t testing.TB, js []byte, pre string) *Tokenizer {
	tokens, types, merges := vocabArrays(t, js)
	tok, err := FromGGUFBPE(tokens, merges, types, pre, Config{})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// spFromHFJSON rebuilds SentencePiece arrays from a Llama-2 style
// tokenizer.json. HF's converter orders the merges by the score of the
// merged piece, so minus the rank of the first merge producing a piece
// stands in for its score; <unk> is the unknown token.
func spFromHFJSON(t testing.TB, js []byte) *Tokenizer {
	tokens, types, merges := vocabArrays(t, js)
	ids := map[string]int{}
	for i, s := range tokens {
		ids[s] = i
	}
	scores := make([]float32, len(tokens))
	for i := range scores {
		scores[i] = -1e9
	}
	for rank := len(merges) - 1; rank >= 0; rank-- {
		if id, ok := ids[strings.Replace(merges[rank], " ", "", 1)]; ok {
			scores[id] = -float32(rank)
		}
	}
	for i, s := range tokens {
		if s == "<unk>" {
			types[i] = TokenUnknown
		}
	}
	tok, err := FromSentencePiece(tokens, scores, types, Config{})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
