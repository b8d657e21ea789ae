package tokenizer

import (
	"fmt"
	"strings"
)

// ggufPre describes the HF pre-tokenization that a GGUF tokenizer.ggml.pre
// name stands for.
type ggufPre struct {
	patterns     []string // Split(Isolated) regexes, applied in order
	nfc          bool     // the HF tokenizer has an NFC normalizer
	ignoreMerges bool
}

// ggufPreTypes maps tokenizer.ggml.pre names (as written by llama.cpp's
// convert_hf_to_gguf.py) to the regexes of the model's tokenizer.json. Where
// llama.cpp rewrote a pattern for its own regex engine (e.g. (?i:'s) into
// '[sS]), the original HF pattern is used, so that a GGUF model tokenizes
// like its tokenizer.json.
func ggufPreFor(name string) (ggufPre, error) {
	digitsThenGPT2 := []string{`\p{N}`, patGPT2}
	switch name {
	case "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "hunyuan":
		return ggufPre{patterns: []string{patQwen2}, nfc: name != "stablelm2" && name != "hunyuan"}, nil
	case "qwen35":
		return ggufPre{patterns: []string{patQwen35}, nfc: true}, nil
	case "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2":
		return ggufPre{patterns: []string{patLlama3}, ignoreMerges: true}, nil
	case "dbrx", "smaug-bpe", "chatglm-bpe", "glm4":
		return ggufPre{patterns: []string{patLlama3}}, nil
	case "gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "roberta-bpe", "jina-es", "jina-de",
		"jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code", "gigachat", "a.x-4.0", "mellum", "granite-docling":
		return ggufPre{patterns: []string{patGPT2}}, nil
	case "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva", "mellum2":
		return ggufPre{patterns: digitsThenGPT2}, nil
	case "default", "":
		// llama.cpp's fallback for BPE vocabularies without a known name.
		return ggufPre{patterns: []string{
			`[\p{P}\$\+<=>\^~\|]+`,
			`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`,
			`\p{N}+`,
			`[0-9][0-9][0-9]`,
		}}, nil
	}
	return ggufPre{}, fmt.Errorf("tokenizer.ggml.pre %q is not supported", name)
}

// FromGGUFBPE builds a byte-level BPE tokenizer from a GGUF "gpt2"-model
// vocabulary: tokenizer.ggml.tokens, .merges ("a b" strings), .token_type
// and .pre (the pre-tokenizer name: "qwen2", "llama-bpe", "gpt2", ...).
// Control tokens become special added tokens, user-defined tokens
// non-special added tokens. Merges naming tokens outside the vocabulary are
// skipped. Encode with addSpecial adds only what cfg.AddBOS / AddEOS say
// (tokenizer.ggml.add_bos_token / add_eos_token).
func FromGGUFBPE(tokens []string, merges []string, types []int32, pre string, cfg Config) (*Tokenizer, error) {
	if len(tokens) == 0 {
		return nil, fmt.Errorf("gguf bpe: empty vocabulary")
	}
	if types != nil && len(types) != len(tokens) {
		return nil, fmt.Errorf("gguf bpe: %d token types for %d tokens", len(types), len(tokens))
	}
	p, err := ggufPreFor(pre)
	if err != nil {
		return nil, fmt.Errorf("gguf bpe: %w", err)
	}
	vocab := make(map[string]int, len(tokens))
	var added []AddedToken
	for id, s := range tokens {
		if _, dup := vocab[s]; !dup {
			vocab[s] = id
		}
		if types == nil {
			continue
		}
		switch types[id] {
		case TokenControl:
			added = append(added, AddedToken{ID: id, Content: s, Special: true})
		case TokenUserDefined:
			added = append(added, AddedToken{ID: id, Content: s})
		}
	}
	pairs := make([][2]string, 0, len(merges))
	for i, mg := range merges {
		a, b, ok := strings.Cut(mg, " ")
		if !ok {
			return nil, fmt.Errorf("gguf bpe: merge %d: %q is not two tokens separated by a space", i, mg)
		}
		pairs = append(pairs, [2]string{a, b})
	}
	model, err := newBPEModel(vocab, pairs, bpeOptions{ignoreMerges: p.ignoreMerges, skipBadMerges: true})
	if err != nil {
		return nil, fmt.Errorf("gguf bpe: %w", err)
	}
	t := &Tokenizer{model: model, dec: byteLevelDec{}}
	if p.nfc {
		t.norm = nfcNorm{}
	}
	var seq sequencePre
	for _, pat := range p.patterns {
		m, err := newPatternMatcher(pat)
		if err != nil {
			return nil, fmt.Errorf("gguf bpe: %w", err)
		}
		seq = append(seq, &splitPre{m: m, behavior: splitIsolated})
	}
	seq = append(seq, &byteLevelPre{})
	t.pre = seq
	if len(added) > 0 {
		t.added = newAddedVocab(added, nil)
	}
	if err := t.finish(vocab, added, cfg); err != nil {
		return nil, fmt.Errorf("gguf bpe: %w", err)
	}
	return t, nil
}
