// Package engine runs models: it loads a CMF file into a runnable model and
// its tokenizer, renders chat prompts, and generates text with sampling,
// stop conditions and streaming.
package engine

import (
	"encoding/json"
	"fmt"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/tokenizer"
)

// LoadTokenizer builds the tokenizer embedded in a CMF model.
func LoadTokenizer(m *cmf.Model) (*tokenizer.Tokenizer, error) {
	tc := m.Header.TokenizerConfig
	if tc == nil {
		return nil, fmt.Errorf("engine: %s carries no tokenizer (use --ids)", m.Path)
	}
	_, blob, err := m.TensorData(tc.Blob)
	if err != nil {
		return nil, fmt.Errorf("engine: tokenizer blob: %w", err)
	}
	return TokenizerFrom(tc, blob)
}

// TokenizerFrom builds a tokenizer from a CMF tokenizer config and its blob.
func TokenizerFrom(tc *cmf.TokenizerConfig, blob []byte) (*tokenizer.Tokenizer, error) {
	cfg := tokenizer.Config{BOS: tc.BOSToken, EOS: tc.EOSToken, PAD: tc.PadToken}
	switch tc.Kind {
	case "hf_json":
		t, err := tokenizer.FromHFJSON(blob, cfg)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		return t, nil
	case "gguf_bpe", "sentencepiece":
		var v struct {
			Model  string    `json:"model"`
			Pre    string    `json:"pre"`
			Tokens []string  `json:"tokens"`
			Merges []string  `json:"merges"`
			Scores []float32 `json:"scores"`
			Types  []int32   `json:"types"`
		}
		if err := json.Unmarshal(blob, &v); err != nil {
			return nil, fmt.Errorf("engine: tokenizer blob %q: %w", tc.Blob, err)
		}
		addBOS, addEOS := tc.AddBOS, tc.AddEOS
		cfg.AddBOS, cfg.AddEOS = &addBOS, &addEOS
		var t *tokenizer.Tokenizer
		var err error
		if tc.Kind == "gguf_bpe" {
			t, err = tokenizer.FromGGUFBPE(v.Tokens, v.Merges, v.Types, v.Pre, cfg)
		} else {
			t, err = tokenizer.FromSentencePiece(v.Tokens, v.Scores, v.Types, cfg)
		}
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		return t, nil
	}
	return nil, fmt.Errorf("engine: unknown tokenizer kind %q", tc.Kind)
}
