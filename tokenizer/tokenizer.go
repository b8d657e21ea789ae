package tokenizer

import (
	"fmt"
	"log/slog"
)

// Tokenizer encodes text to token ids and back. It is safe for concurrent
// use.
type Tokenizer struct {
	idToToken []string
	hasID     []bool
	tokenToID map[string]int
	special   []bool // by id: skipped by DecodeOptions.SkipSpecial

	model wordModel
	added *addedVocab
	norm  normalizer   // nil: none
	pre   preTokenizer // nil: none
	post  []templateItem
	dec   decoder // nil: tokens joined with spaces

	ids SpecialIDs

	// fused is set when the pre-tokenizer is exactly "split with this fast
	// matcher, then ByteLevel without prefix space": Encode then walks the
	// matches without materializing pieces.
	fused *fastMatcher
	// With a plain ByteLevel decoder, the bytes of every token, precomputed:
	// token id's bytes are decBytes[decOff[id]:decOff[id+1]].
	decBytes []byte
	decOff   []uint32
}

// SpecialIDs are the ids of the well-known special tokens, -1 when absent.
type SpecialIDs struct {
	BOS, EOS, PAD, UNK int
}

// Config carries the settings that live outside tokenizer.json (in
// tokenizer_config.json or GGUF metadata).
type Config struct {
	// Names of the special tokens ("" when not declared).
	BOS, EOS, PAD, UNK string
	// AddBOS and AddEOS, when either is set, replace the post-processor:
	// Encode with addSpecial then adds BOS / EOS exactly as these say (nil
	// counts as false). When both are nil, the tokenizer's own
	// post-processor decides (tokenizer.json), or the format's default
	// (SentencePiece: BOS only; GGUF BPE: nothing).
	AddBOS, AddEOS *bool
	// AddDummyPrefix (SentencePiece only) prepends a space to the input;
	// nil means true.
	AddDummyPrefix *bool
}

// wordModel tokenizes one pre-token.
type wordModel interface {
	tokenize(p piece, dst []int) []int
	unknownID() int // -1: none
}

type templateItem struct {
	seq bool  // the input sequence
	ids []int // or these special ids
}

// VocabSize returns one more than the largest token id.
func (t *Tokenizer) VocabSize() int { return len(t.idToToken) }

// TokenString returns the vocabulary string of id (e.g. "Ġhello" for a
// byte-level vocabulary), and false for an unknown id.
func (t *Tokenizer) TokenString(id int) (string, bool) {
	if id < 0 || id >= len(t.idToToken) || !t.hasID[id] {
		return "", false
	}
	return t.idToToken[id], true
}

// ID looks up a token by its vocabulary string.
func (t *Tokenizer) ID(s string) (int, bool) {
	id, ok := t.tokenToID[s]
	return id, ok
}

// SpecialIDs returns the ids of BOS/EOS/PAD/UNK.
func (t *Tokenizer) SpecialIDs() SpecialIDs { return t.ids }

// IsSpecial reports whether id is a special token.
func (t *Tokenizer) IsSpecial(id int) bool { return t.isSpecial(id) }

func (t *Tokenizer) isSpecial(id int) bool { return id >= 0 && id < len(t.special) && t.special[id] }

// AddedTokens returns the tokens matched verbatim before the model runs.
func (t *Tokenizer) AddedTokens() []AddedToken {
	if t.added == nil {
		return nil
	}
	return append([]AddedToken(nil), t.added.tokens...)
}

// Encode tokenizes text. addSpecial adds the post-processor's tokens (BOS
// etc.); parseSpecial matches special tokens written in the text (non-special
// added tokens are always matched, as in HF tokenizers). Errors (only
// possible with general regex pre-tokenizers, e.g. a match timeout) are
// logged and the ids produced so far are returned; use EncodeChecked to see
// them.
func (t *Tokenizer) Encode(text string, addSpecial, parseSpecial bool) []int {
	ids, err := t.EncodeChecked(text, addSpecial, parseSpecial)
	if err != nil {
		slog.Error("tokenizer: encode", "err", err)
	}
	return ids
}

// EncodeChecked is Encode with the error returned.
func (t *Tokenizer) EncodeChecked(text string, addSpecial, parseSpecial bool) ([]int, error) {
	pieces := make([]piece, 0, 8)
	if t.added != nil && t.added.anyRaw {
		pieces = t.added.split(text, t.added.raw, parseSpecial, true, pieces)
	} else if text != "" {
		pieces = append(pieces, piece{text: text, id: -1, first: true})
	}
	if t.norm != nil || (t.added != nil && t.added.anyNorm) {
		out := make([]piece, 0, len(pieces))
		for _, p := range pieces {
			if p.id >= 0 {
				out = append(out, p)
				continue
			}
			if t.norm != nil {
				s, err := t.norm.normalize(p.text)
				if err != nil {
					return nil, fmt.Errorf("tokenizer: normalize: %w", err)
				}
				p.text = s
			}
			if t.added != nil && t.added.anyNorm {
				out = t.added.split(p.text, t.added.norm, parseSpecial, p.first, out)
			} else if p.text != "" {
				out = append(out, p)
			}
		}
		pieces = out
	}
	if t.fused != nil {
		ids := make([]int, 0, len(text)/3+4)
		for _, p := range pieces {
			if p.id >= 0 {
				ids = append(ids, p.id)
				continue
			}
			for i := 0; i < len(p.text); {
				j := t.fused.next(p.text, i)
				ids = t.model.tokenize(piece{text: p.text[i:j], id: -1, byteLevel: true}, ids)
				i = j
			}
		}
		return t.postProcess(ids, addSpecial), nil
	}
	if t.pre != nil {
		var err error
		if pieces, err = t.pre.preTokenize(pieces); err != nil {
			return nil, fmt.Errorf("tokenizer: pre-tokenize: %w", err)
		}
	}
	ids := make([]int, 0, len(text)/3+4)
	for _, p := range pieces {
		if p.id >= 0 {
			ids = append(ids, p.id)
			continue
		}
		if p.text == "" {
			continue
		}
		ids = t.model.tokenize(p, ids)
	}
	return t.postProcess(ids, addSpecial), nil
}

func (t *Tokenizer) postProcess(ids []int, addSpecial bool) []int {
	if addSpecial && len(t.post) > 0 {
		out := make([]int, 0, len(ids)+4)
		for _, it := range t.post {
			if it.seq {
				out = append(out, ids...)
			} else {
				out = append(out, it.ids...)
			}
		}
		ids = out
	}
	return ids
}

// finish fills the id tables and the special ids once vocab, added tokens
// and the post-processor are in place.
func (t *Tokenizer) finish(vocab map[string]int, added []AddedToken, cfg Config) error {
	maxID := -1
	for _, id := range vocab {
		maxID = max(maxID, id)
	}
	for _, a := range added {
		maxID = max(maxID, a.ID)
	}
	if maxID >= 1<<24 {
		return fmt.Errorf("token id %d out of range", maxID)
	}
	t.idToToken = make([]string, maxID+1)
	t.hasID = make([]bool, maxID+1)
	t.special = make([]bool, maxID+1)
	t.tokenToID = make(map[string]int, len(vocab)+len(added))
	for s, id := range vocab {
		if id < 0 {
			return fmt.Errorf("token %q: negative id %d", s, id)
		}
		t.idToToken[id] = s
		t.hasID[id] = true
		t.tokenToID[s] = id
	}
	for _, a := range added {
		if a.ID < 0 {
			return fmt.Errorf("added token %q: negative id %d", a.Content, a.ID)
		}
		t.idToToken[a.ID] = a.Content
		t.hasID[a.ID] = true
		t.tokenToID[a.Content] = a.ID
		if a.Special {
			t.special[a.ID] = true
		}
	}
	look := func(name string) int {
		if name == "" {
			return -1
		}
		if id, ok := t.tokenToID[name]; ok {
			return id
		}
		return -1
	}
	t.ids = SpecialIDs{BOS: look(cfg.BOS), EOS: look(cfg.EOS), PAD: look(cfg.PAD), UNK: look(cfg.UNK)}
	if t.ids.UNK < 0 && t.model != nil {
		t.ids.UNK = t.model.unknownID()
	}
	if t.ids.BOS < 0 && len(t.post) > 0 && !t.post[0].seq && len(t.post[0].ids) == 1 {
		t.ids.BOS = t.post[0].ids[0]
	}
	t.setupFastPaths()
	if cfg.AddBOS != nil || cfg.AddEOS != nil {
		var post []templateItem
		if cfg.AddBOS != nil && *cfg.AddBOS {
			if t.ids.BOS < 0 {
				return fmt.Errorf("AddBOS is set but the BOS token %q is not in the vocabulary", cfg.BOS)
			}
			post = append(post, templateItem{ids: []int{t.ids.BOS}})
		}
		post = append(post, templateItem{seq: true})
		if cfg.AddEOS != nil && *cfg.AddEOS {
			if t.ids.EOS < 0 {
				return fmt.Errorf("AddEOS is set but the EOS token %q is not in the vocabulary", cfg.EOS)
			}
			post = append(post, templateItem{ids: []int{t.ids.EOS}})
		}
		t.post = post
	}
	return nil
}

// setupFastPaths recognizes the common pipeline shapes.
func (t *Tokenizer) setupFastPaths() {
	switch p := t.pre.(type) {
	case sequencePre:
		if len(p) == 2 {
			sp, ok1 := p[0].(*splitPre)
			bl, ok2 := p[1].(*byteLevelPre)
			if ok1 && ok2 && !sp.invert && sp.behavior == splitIsolated && !bl.addPrefixSpace && bl.split == nil {
				if fm, ok := sp.m.(*fastMatcher); ok {
					t.fused = fm
				}
			}
		}
	case *byteLevelPre:
		if !p.addPrefixSpace && p.split != nil && !p.split.invert && p.split.behavior == splitIsolated {
			if fm, ok := p.split.m.(*fastMatcher); ok {
				t.fused = fm
			}
		}
	}
	if _, ok := t.dec.(byteLevelDec); ok {
		t.decOff = make([]uint32, len(t.idToToken)+1)
		var buf []byte
		for id, s := range t.idToToken {
			buf = byteLevelBytes(buf, s)
			t.decOff[id+1] = uint32(len(buf))
		}
		t.decBytes = buf
	}
}

// appendTokenBytes appends the bytes of id under a ByteLevel decoder.
func (t *Tokenizer) appendTokenBytes(dst []byte, id int) []byte {
	return append(dst, t.decBytes[t.decOff[id]:t.decOff[id+1]]...)
}
