package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

type hfFile struct {
	AddedTokens   []hfAddedToken  `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         json.RawMessage `json:"model"`
}

type hfAddedToken struct {
	ID         *int   `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized *bool  `json:"normalized"`
	Special    bool   `json:"special"`
}

type hfModel struct {
	Type                    string            `json:"type"`
	Vocab                   map[string]int    `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
	UnkToken                *string           `json:"unk_token"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	Dropout                 *float64          `json:"dropout"`
}

// hfComponent is any typed normalizer / pre-tokenizer / post-processor /
// decoder object; only the fields of the types we support are read.
type hfComponent struct {
	Type string `json:"type"`
	// Sequences.
	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	Decoders      []json.RawMessage `json:"decoders"`
	// Split / Replace.
	Pattern  *hfPattern `json:"pattern"`
	Behavior string     `json:"behavior"`
	Invert   bool       `json:"invert"`
	Content  *string    `json:"content"`
	// ByteLevel.
	AddPrefixSpace *bool `json:"add_prefix_space"`
	UseRegex       *bool `json:"use_regex"`
	// Metaspace.
	Replacement   string `json:"replacement"`
	PrependScheme string `json:"prepend_scheme"`
	Split         *bool  `json:"split"`
	// Prepend.
	Prepend *string `json:"prepend"`
	// Strip (normalizer and decoder).
	StripLeft  bool `json:"strip_left"`
	StripRight bool `json:"strip_right"`
	Start      int  `json:"start"`
	Stop       int  `json:"stop"`
	// Digits.
	IndividualDigits bool `json:"individual_digits"`
	// TemplateProcessing.
	Single        []map[string]hfTemplatePart `json:"single"`
	SpecialTokens map[string]hfTemplateToken  `json:"special_tokens"`
	// RobertaProcessing / BertProcessing.
	Sep []json.RawMessage `json:"sep"`
	Cls []json.RawMessage `json:"cls"`
}

type hfPattern struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

type hfTemplatePart struct {
	ID string `json:"id"`
}

type hfTemplateToken struct {
	ID  string `json:"id"`
	IDs []int  `json:"ids"`
}

// FromHFJSON builds a tokenizer from the bytes of a Hugging Face
// tokenizer.json (BPE models: byte-level ones such as GPT-2, Llama-3 and
// Qwen, and SentencePiece-converted ones with byte fallback). cfg adds what
// tokenizer_config.json says (see ParseHFConfig).
func FromHFJSON(tokenizerJSON []byte, cfg Config) (*Tokenizer, error) {
	var f hfFile
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if len(f.Model) == 0 || isNull(f.Model) {
		return nil, errors.New("tokenizer.json: no model")
	}
	var m hfModel
	if err := json.Unmarshal(f.Model, &m); err != nil {
		return nil, fmt.Errorf("tokenizer.json: model: %w", err)
	}
	if m.Type == "" && m.Merges != nil {
		m.Type = "BPE"
	}
	if m.Type != "BPE" {
		return nil, fmt.Errorf("tokenizer.json: model type %q is not supported (only BPE)", m.Type)
	}
	if m.Dropout != nil && *m.Dropout > 0 {
		return nil, fmt.Errorf("tokenizer.json: BPE dropout %v is not supported", *m.Dropout)
	}
	merges, err := parseMerges(m.Merges)
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if m.Vocab == nil {
		return nil, errors.New("tokenizer.json: model has no vocab")
	}
	opts := bpeOptions{fuseUnk: m.FuseUnk, byteFallback: m.ByteFallback, ignoreMerges: m.IgnoreMerges}
	if m.UnkToken != nil {
		opts.unk = *m.UnkToken
	}
	if m.ContinuingSubwordPrefix != nil {
		opts.contPrefix = *m.ContinuingSubwordPrefix
	}
	if m.EndOfWordSuffix != nil {
		opts.wordSuffix = *m.EndOfWordSuffix
	}
	model, err := newBPEModel(m.Vocab, merges, opts)
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: BPE: %w", err)
	}
	t := &Tokenizer{model: model}
	if t.norm, err = parseNormalizer(f.Normalizer, 0); err != nil {
		return nil, fmt.Errorf("tokenizer.json: normalizer: %w", err)
	}
	if t.pre, err = parsePreTokenizer(f.PreTokenizer, 0); err != nil {
		return nil, fmt.Errorf("tokenizer.json: pre_tokenizer: %w", err)
	}
	if t.post, err = parsePostProcessor(f.PostProcessor, 0); err != nil {
		return nil, fmt.Errorf("tokenizer.json: post_processor: %w", err)
	}
	if t.dec, err = parseDecoder(f.Decoder, 0); err != nil {
		return nil, fmt.Errorf("tokenizer.json: decoder: %w", err)
	}
	added := make([]AddedToken, 0, len(f.AddedTokens))
	for i, a := range f.AddedTokens {
		if a.ID == nil {
			return nil, fmt.Errorf("tokenizer.json: added token %d (%q): no id", i, a.Content)
		}
		norm := true
		if a.Normalized != nil {
			norm = *a.Normalized
		}
		added = append(added, AddedToken{ID: *a.ID, Content: a.Content, Special: a.Special,
			SingleWord: a.SingleWord, LStrip: a.LStrip, RStrip: a.RStrip, Normalized: norm})
	}
	if err := checkIDRange(m.Vocab, added); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	var normFn func(string) string
	if t.norm != nil {
		normFn = func(s string) string {
			out, err := t.norm.normalize(s)
			if err != nil {
				return s
			}
			return out
		}
	}
	if len(added) > 0 {
		t.added = newAddedVocab(added, normFn)
	}
	if err := t.finish(m.Vocab, added, cfg); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	return t, nil
}

// checkIDRange rejects ids that are negative or so sparse that the id table
// would be unreasonably large for the number of tokens.
func checkIDRange(vocab map[string]int, added []AddedToken) error {
	n := len(vocab) + len(added)
	limit := 4*n + 65536
	for s, id := range vocab {
		if id < 0 || id > limit {
			return fmt.Errorf("token %q: id %d out of range [0, %d]", s, id, limit)
		}
	}
	for _, a := range added {
		if a.ID < 0 || a.ID > limit {
			return fmt.Errorf("added token %q: id %d out of range [0, %d]", a.Content, a.ID, limit)
		}
	}
	return nil
}

func isNull(raw json.RawMessage) bool {
	return len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

// parseMerges accepts both "a b" strings and ["a", "b"] pairs.
func parseMerges(raw []json.RawMessage) ([][2]string, error) {
	out := make([][2]string, 0, len(raw))
	for i, r := range raw {
		r = bytes.TrimSpace(r)
		if len(r) > 0 && r[0] == '"' {
			var s string
			if err := json.Unmarshal(r, &s); err != nil {
				return nil, fmt.Errorf("merge %d: %w", i, err)
			}
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return nil, fmt.Errorf("merge %d: %q is not two tokens separated by a space", i, s)
			}
			out = append(out, [2]string{a, b})
			continue
		}
		var p []string
		if err := json.Unmarshal(r, &p); err != nil {
			return nil, fmt.Errorf("merge %d: %w", i, err)
		}
		if len(p) != 2 {
			return nil, fmt.Errorf("merge %d: want a pair, got %d strings", i, len(p))
		}
		out = append(out, [2]string{p[0], p[1]})
	}
	return out, nil
}

const maxNesting = 16

func parseComponent(raw json.RawMessage, depth int) (*hfComponent, error) {
	if isNull(raw) {
		return nil, nil
	}
	if depth > maxNesting {
		return nil, errors.New("sequences nested too deeply")
	}
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

func patternMatcher(p *hfPattern, allowFast bool) (matcher, error) {
	switch {
	case p == nil:
		return nil, errors.New("missing pattern")
	case p.String != nil:
		return literalMatcher{*p.String}, nil
	case p.Regex != nil:
		if allowFast {
			return newPatternMatcher(*p.Regex)
		}
		return compileRegex(*p.Regex)
	}
	return nil, errors.New("pattern is neither String nor Regex")
}

func parseNormalizer(raw json.RawMessage, depth int) (normalizer, error) {
	c, err := parseComponent(raw, depth)
	if c == nil || err != nil {
		return nil, err
	}
	switch c.Type {
	case "NFC":
		return nfcNorm{}, nil
	case "NFD":
		return nfdNorm{}, nil
	case "Lowercase":
		return lowercaseNorm{}, nil
	case "Prepend":
		if c.Prepend == nil {
			return nil, errors.New("Prepend: missing prepend")
		}
		return prependNorm{*c.Prepend}, nil
	case "Replace":
		m, err := patternMatcher(c.Pattern, false)
		if err != nil {
			return nil, fmt.Errorf("Replace: %w", err)
		}
		content := ""
		if c.Content != nil {
			content = *c.Content
		}
		return replaceNorm{m: m, content: content}, nil
	case "Strip":
		return stripNorm{left: c.StripLeft, right: c.StripRight}, nil
	case "Sequence":
		var seq sequenceNorm
		for i, r := range c.Normalizers {
			n, err := parseNormalizer(r, depth+1)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		if len(seq) == 0 {
			return nil, nil
		}
		return seq, nil
	}
	return nil, fmt.Errorf("normalizer type %q is not supported", c.Type)
}

func parsePreTokenizer(raw json.RawMessage, depth int) (preTokenizer, error) {
	c, err := parseComponent(raw, depth)
	if c == nil || err != nil {
		return nil, err
	}
	switch c.Type {
	case "Split":
		m, err := patternMatcher(c.Pattern, true)
		if err != nil {
			return nil, fmt.Errorf("Split: %w", err)
		}
		b, err := parseSplitBehavior(c.Behavior)
		if err != nil {
			return nil, fmt.Errorf("Split: %w", err)
		}
		return &splitPre{m: m, behavior: b, invert: c.Invert}, nil
	case "ByteLevel":
		p := &byteLevelPre{addPrefixSpace: c.AddPrefixSpace == nil || *c.AddPrefixSpace}
		if c.UseRegex == nil || *c.UseRegex {
			p.split = &splitPre{m: fastMatcherFor(patGPT2), behavior: splitIsolated}
		}
		return p, nil
	case "Metaspace":
		p := &metaspacePre{replacement: c.Replacement, prepend: c.PrependScheme, split: c.Split == nil || *c.Split}
		if utf8.RuneCountInString(p.replacement) != 1 {
			return nil, fmt.Errorf("Metaspace: replacement %q is not one character", p.replacement)
		}
		if p.prepend == "" {
			p.prepend = "always"
			if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
				p.prepend = "never"
			}
		}
		if p.prepend != "always" && p.prepend != "first" && p.prepend != "never" {
			return nil, fmt.Errorf("Metaspace: unknown prepend_scheme %q", p.prepend)
		}
		return p, nil
	case "Digits":
		if c.IndividualDigits {
			return &splitPre{m: runeClassMatcher{isNumber}, behavior: splitIsolated}, nil
		}
		return &splitPre{m: runeClassMatcher{isNumber}, behavior: splitContiguous}, nil
	case "Whitespace":
		re, err := compileRegex(`\w+|[^\w\s]+`)
		if err != nil {
			return nil, err
		}
		return &splitPre{m: re, behavior: splitRemoved, invert: true}, nil
	case "WhitespaceSplit":
		return &splitPre{m: runeClassMatcher{isSpace}, behavior: splitRemoved}, nil
	case "Sequence":
		var seq sequencePre
		for i, r := range c.Pretokenizers {
			p, err := parsePreTokenizer(r, depth+1)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			if p != nil {
				seq = append(seq, p)
			}
		}
		if len(seq) == 0 {
			return nil, nil
		}
		return seq, nil
	}
	return nil, fmt.Errorf("pre-tokenizer type %q is not supported", c.Type)
}

func parsePostProcessor(raw json.RawMessage, depth int) ([]templateItem, error) {
	c, err := parseComponent(raw, depth)
	if c == nil || err != nil {
		return nil, err
	}
	switch c.Type {
	case "ByteLevel":
		return nil, nil
	case "TemplateProcessing":
		var out []templateItem
		for i, part := range c.Single {
			if len(part) != 1 {
				return nil, fmt.Errorf("TemplateProcessing: single[%d]: want one of Sequence/SpecialToken", i)
			}
			for kind, p := range part {
				switch kind {
				case "Sequence":
					out = append(out, templateItem{seq: true})
				case "SpecialToken":
					st, ok := c.SpecialTokens[p.ID]
					if !ok {
						return nil, fmt.Errorf("TemplateProcessing: special token %q not in special_tokens", p.ID)
					}
					for _, id := range st.IDs {
						if id < 0 {
							return nil, fmt.Errorf("TemplateProcessing: special token %q: negative id %d", p.ID, id)
						}
					}
					out = append(out, templateItem{ids: append([]int(nil), st.IDs...)})
				default:
					return nil, fmt.Errorf("TemplateProcessing: single[%d]: unknown part %q", i, kind)
				}
			}
		}
		return out, nil
	case "RobertaProcessing", "BertProcessing":
		cls, err := tokenPairID(c.Cls)
		if err != nil {
			return nil, fmt.Errorf("%s: cls: %w", c.Type, err)
		}
		sep, err := tokenPairID(c.Sep)
		if err != nil {
			return nil, fmt.Errorf("%s: sep: %w", c.Type, err)
		}
		return []templateItem{{ids: []int{cls}}, {seq: true}, {ids: []int{sep}}}, nil
	case "Sequence":
		var out []templateItem
		for i, r := range c.Processors {
			p, err := parsePostProcessor(r, depth+1)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			if p != nil {
				out = p
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("post-processor type %q is not supported", c.Type)
}

// tokenPairID reads the id of a ["token", id] pair.
func tokenPairID(p []json.RawMessage) (int, error) {
	if len(p) != 2 {
		return 0, errors.New("want [token, id]")
	}
	var id int
	if err := json.Unmarshal(p[1], &id); err != nil {
		return 0, err
	}
	if id < 0 {
		return 0, fmt.Errorf("negative id %d", id)
	}
	return id, nil
}

func parseDecoder(raw json.RawMessage, depth int) (decoder, error) {
	c, err := parseComponent(raw, depth)
	if c == nil || err != nil {
		return nil, err
	}
	switch c.Type {
	case "ByteLevel":
		return byteLevelDec{}, nil
	case "Replace":
		m, err := patternMatcher(c.Pattern, false)
		if err != nil {
			return nil, fmt.Errorf("Replace: %w", err)
		}
		content := ""
		if c.Content != nil {
			content = *c.Content
		}
		return replaceDec{m: m, content: content}, nil
	case "ByteFallback":
		return byteFallbackDec{}, nil
	case "Fuse":
		return fuseDec{}, nil
	case "Strip":
		if c.Content == nil || utf8.RuneCountInString(*c.Content) != 1 {
			return nil, errors.New("Strip: content must be one character")
		}
		if c.Start < 0 || c.Stop < 0 {
			return nil, errors.New("Strip: negative start/stop")
		}
		r, _ := utf8.DecodeRuneInString(*c.Content)
		return stripDec{content: r, start: c.Start, stop: c.Stop}, nil
	case "Metaspace":
		if utf8.RuneCountInString(c.Replacement) != 1 {
			return nil, fmt.Errorf("Metaspace: replacement %q is not one character", c.Replacement)
		}
		r, _ := utf8.DecodeRuneInString(c.Replacement)
		prepend := c.PrependScheme != "never"
		if c.PrependScheme == "" && c.AddPrefixSpace != nil {
			prepend = *c.AddPrefixSpace
		}
		return metaspaceDec{replacement: r, prepend: prepend}, nil
	case "Sequence":
		var seq sequenceDec
		for i, r := range c.Decoders {
			d, err := parseDecoder(r, depth+1)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			if d != nil {
				seq = append(seq, d)
			}
		}
		if len(seq) == 0 {
			return nil, nil
		}
		return seq, nil
	}
	return nil, fmt.Errorf("decoder type %q is not supported", c.Type)
}

// ParseHFConfig reads the fields of tokenizer_config.json that FromHFJSON
// needs: the names of bos/eos/pad/unk tokens (strings or AddedToken objects)
// and, for the Llama-family tokenizer classes that honour them,
// add_bos_token / add_eos_token.
func ParseHFConfig(tokenizerConfigJSON []byte) (Config, error) {
	var raw struct {
		BOS    json.RawMessage `json:"bos_token"`
		EOS    json.RawMessage `json:"eos_token"`
		PAD    json.RawMessage `json:"pad_token"`
		UNK    json.RawMessage `json:"unk_token"`
		AddBOS *bool           `json:"add_bos_token"`
		AddEOS *bool           `json:"add_eos_token"`
		Class  string          `json:"tokenizer_class"`
	}
	if err := json.Unmarshal(tokenizerConfigJSON, &raw); err != nil {
		return Config{}, fmt.Errorf("tokenizer_config.json: %w", err)
	}
	var cfg Config
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		dst  *string
	}{{"bos_token", raw.BOS, &cfg.BOS}, {"eos_token", raw.EOS, &cfg.EOS}, {"pad_token", raw.PAD, &cfg.PAD}, {"unk_token", raw.UNK, &cfg.UNK}} {
		s, err := tokenName(f.raw)
		if err != nil {
			return Config{}, fmt.Errorf("tokenizer_config.json: %s: %w", f.name, err)
		}
		*f.dst = s
	}
	// Only the Llama-family fast tokenizers of transformers rebuild their
	// post-processor from add_bos_token / add_eos_token; for the others
	// (Qwen2TokenizerFast, PreTrainedTokenizerFast, ...) tokenizer.json's
	// post-processor alone decides.
	switch raw.Class {
	case "LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer", "CodeLlamaTokenizerFast",
		"GemmaTokenizer", "GemmaTokenizerFast":
		cfg.AddBOS, cfg.AddEOS = raw.AddBOS, raw.AddEOS
	}
	return cfg, nil
}

func tokenName(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", err
	}
	return obj.Content, nil
}
