package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// AddedToken is a token matched verbatim in the input before the model runs
// (HF tokenizers' AddedToken).
type AddedToken struct {
	ID         int
	Content    string
	Special    bool // skipped by DecodeOptions.SkipSpecial; not matched when Encode's parseSpecial is false
	SingleWord bool // only match when not inside a word
	LStrip     bool // absorb whitespace on the left
	RStrip     bool // absorb whitespace on the right
	Normalized bool // match against the normalized text
}

// trie is a byte trie over added-token contents, for leftmost-longest search.
type trie struct {
	nodes []trieNode
	first [256]bool
}

type trieNode struct {
	next  map[byte]int32
	token int32 // index into the tokens slice, or -1
}

func newTrie() *trie {
	return &trie{nodes: []trieNode{{token: -1}}}
}

func (t *trie) insert(s string, tok int) {
	if s == "" {
		return
	}
	t.first[s[0]] = true
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		nx, ok := t.nodes[n].next[c]
		if !ok {
			if t.nodes[n].next == nil {
				t.nodes[n].next = map[byte]int32{}
			}
			t.nodes = append(t.nodes, trieNode{token: -1})
			nx = int32(len(t.nodes) - 1)
			t.nodes[n].next[c] = nx
		}
		n = int(nx)
	}
	if t.nodes[n].token < 0 { // first insertion wins on duplicates
		t.nodes[n].token = int32(tok)
	}
}

// longestAt returns the token with the longest content starting at s[i:].
func (t *trie) longestAt(s string, i int) (tok, end int) {
	tok, end = -1, -1
	n := 0
	for j := i; j < len(s); j++ {
		nx, ok := t.nodes[n].next[s[j]]
		if !ok {
			break
		}
		n = int(nx)
		if t.nodes[n].token >= 0 {
			tok, end = int(t.nodes[n].token), j+1
		}
	}
	return tok, end
}

// addedVocab matches added tokens like HF's AddedVocabulary.
type addedVocab struct {
	tokens  []AddedToken
	raw     *trie // tokens with Normalized == false
	norm    *trie // tokens with Normalized == true, keyed by normalized content
	byID    map[int]int
	anyRaw  bool
	anyNorm bool
}

func newAddedVocab(tokens []AddedToken, normalize func(string) string) *addedVocab {
	a := &addedVocab{tokens: tokens, raw: newTrie(), norm: newTrie(), byID: map[int]int{}}
	// HF puts special tokens first, then the others, in the given order.
	order := make([]int, 0, len(tokens))
	for i, t := range tokens {
		if t.Special {
			order = append(order, i)
		}
	}
	for i, t := range tokens {
		if !t.Special {
			order = append(order, i)
		}
	}
	for _, i := range order {
		t := tokens[i]
		if t.Content == "" {
			continue
		}
		a.byID[t.ID] = i
		if t.Normalized {
			c := t.Content
			if normalize != nil {
				c = normalize(c)
			}
			a.norm.insert(c, i)
			a.anyNorm = true
		} else {
			a.raw.insert(t.Content, i)
			a.anyRaw = true
		}
	}
	return a
}

func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.In(r, unicode.M, unicode.Pc, unicode.Nl) || r == 0x200C || r == 0x200D
}

// split cuts s at the added tokens of tr, as HF's find_matches does.
// Special tokens are skipped when parseSpecial is false.
func (a *addedVocab) split(s string, tr *trie, parseSpecial bool, first bool, out []piece) []piece {
	if s == "" {
		return out
	}
	start := 0 // end of the previous match
	for i := 0; i < len(s); {
		if !tr.first[s[i]] {
			i++
			continue
		}
		tok, end := tr.longestAt(s, i)
		if tok < 0 {
			i++
			continue
		}
		t := a.tokens[tok]
		mStart, mEnd := i, end
		i = end // the search resumes after this match, used or not
		if t.Special && !parseSpecial {
			continue
		}
		if t.SingleWord {
			if r, _ := utf8.DecodeLastRuneInString(s[:mStart]); mStart > 0 && isWordRune(r) {
				continue
			}
			if r, _ := utf8.DecodeRuneInString(s[mEnd:]); mEnd < len(s) && isWordRune(r) {
				continue
			}
		}
		if t.LStrip {
			k := len(strings.TrimRightFunc(s[:mStart], unicode.IsSpace))
			mStart = max(k, start)
		}
		if t.RStrip {
			mEnd = len(s) - len(strings.TrimLeftFunc(s[mEnd:], unicode.IsSpace))
			i = max(i, mEnd)
		}
		if start < mStart {
			out = append(out, piece{text: s[start:mStart], id: -1, first: first && start == 0})
		}
		out = append(out, piece{text: s[mStart:mEnd], id: t.ID})
		start = mEnd
	}
	if start < len(s) {
		out = append(out, piece{text: s[start:], id: -1, first: first && start == 0})
	}
	return out
}
