package tokenizer

import (
	"fmt"
	"sync"
	"unicode/utf8"
)

// merge is one BPE merge rule: the pair it applies to is the map key.
type merge struct {
	rank  int32
	newID int32
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// bpeModel is HF's BPE model (no dropout).
type bpeModel struct {
	vocab        map[string]int
	merges       map[uint64]merge
	unkID        int // -1: none
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	contPrefix   string     // continuing_subword_prefix
	wordSuffix   string     // end_of_word_suffix
	byteIDs      [256]int32 // id of the byte-level rune of each byte, -1 if absent
	fallbackIDs  [256]int32 // id of <0xNN>, -1 if absent
	cache        wordCache
}

const (
	cacheMaxWordLen = 256
	cacheMaxEntries = 1 << 16
)

// wordCache maps a pre-token to its ids. It is bounded: when full, it is
// emptied and refilled.
type wordCache struct {
	mu sync.RWMutex
	m  map[string][]int32
}

func (c *wordCache) get(k string) ([]int32, bool) {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	return v, ok
}

func (c *wordCache) put(k string, v []int32) {
	c.mu.Lock()
	if c.m == nil || len(c.m) >= cacheMaxEntries {
		c.m = make(map[string][]int32, 1024)
	}
	c.m[k] = v
	c.mu.Unlock()
}

// bpeOptions are the BPE model settings besides vocabulary and merges.
type bpeOptions struct {
	unk          string
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	contPrefix   string
	wordSuffix   string
	// skipBadMerges drops merges whose parts are not in the vocabulary
	// instead of failing (llama.cpp tolerates them in GGUF files).
	skipBadMerges bool
}

func newBPEModel(vocab map[string]int, merges [][2]string, o bpeOptions) (*bpeModel, error) {
	m := &bpeModel{vocab: vocab, merges: make(map[uint64]merge, len(merges)), unkID: -1,
		fuseUnk: o.fuseUnk, byteFallback: o.byteFallback, ignoreMerges: o.ignoreMerges,
		contPrefix: o.contPrefix, wordSuffix: o.wordSuffix}
	if o.unk != "" {
		id, ok := vocab[o.unk]
		if !ok {
			return nil, fmt.Errorf("unk token %q not in vocab", o.unk)
		}
		m.unkID = id
	}
	for i, mg := range merges {
		a, ok1 := vocab[mg[0]]
		b, ok2 := vocab[mg[1]]
		if !ok1 || !ok2 {
			if o.skipBadMerges {
				continue
			}
			return nil, fmt.Errorf("merge %d (%q %q): token not in vocab", i, mg[0], mg[1])
		}
		nt := mg[0] + mg[1][min(len(m.contPrefix), len(mg[1])):]
		id, ok := vocab[nt]
		if !ok {
			if o.skipBadMerges {
				continue
			}
			return nil, fmt.Errorf("merge %d (%q %q): merged token %q not in vocab", i, mg[0], mg[1], nt)
		}
		m.merges[pairKey(int32(a), int32(b))] = merge{rank: int32(i), newID: int32(id)}
	}
	m.initByteTables()
	return m, nil
}

func (m *bpeModel) unknownID() int { return m.unkID }

func (m *bpeModel) initByteTables() {
	for b := 0; b < 256; b++ {
		m.byteIDs[b], m.fallbackIDs[b] = -1, -1
		if id, ok := m.vocab[string(byteToRune[b])]; ok {
			m.byteIDs[b] = int32(id)
		}
		if id, ok := m.vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.fallbackIDs[b] = int32(id)
		}
	}
}

// symbol is a node of the doubly linked list of parts of a word.
type symbol struct {
	id         int32
	prev, next int32
	size       int32 // 0 once merged into its left neighbour
}

type mergeCand struct {
	rank, pos, newID int32
}

// candHeap is a binary min-heap on (rank, pos).
type candHeap []mergeCand

func (h candHeap) less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}

func (h *candHeap) push(c mergeCand) {
	*h = append(*h, c)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *candHeap) pop() mergeCand {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(s) {
			break
		}
		c := l
		if r := l + 1; r < len(s) && s.less(r, l) {
			c = r
		}
		if !s.less(c, i) {
			break
		}
		s[i], s[c] = s[c], s[i]
		i = c
	}
	*h = s
	return top
}

type bpeScratch struct {
	syms []symbol
	heap candHeap
}

var bpeScratchPool = sync.Pool{New: func() any { return new(bpeScratch) }}

// tokenize appends the ids of one pre-token.
func (m *bpeModel) tokenize(p piece, dst []int) []int {
	key := p.text
	if !p.byteLevel {
		key = "\x00" + key // keep the two spellings apart in the cache
	}
	if ids, ok := m.cache.get(key); ok {
		for _, id := range ids {
			dst = append(dst, int(id))
		}
		return dst
	}
	ids := m.tokenizeWord(p)
	if len(p.text) < cacheMaxWordLen {
		m.cache.put(key, ids)
	}
	for _, id := range ids {
		dst = append(dst, int(id))
	}
	return dst
}

func (m *bpeModel) tokenizeWord(p piece) []int32 {
	if m.ignoreMerges {
		w := p.text
		if p.byteLevel {
			w = byteLevelString(w)
		}
		if id, ok := m.vocab[w]; ok {
			return []int32{int32(id)}
		}
	}
	sc := bpeScratchPool.Get().(*bpeScratch)
	defer bpeScratchPool.Put(sc)
	syms := sc.syms[:0]
	add := func(id int32, size int) {
		n := int32(len(syms))
		syms = append(syms, symbol{id: id, prev: n - 1, next: n + 1, size: int32(size)})
	}
	simple := p.byteLevel && m.contPrefix == "" && m.wordSuffix == ""
	if simple {
		for i := 0; i < len(p.text); i++ {
			if id := m.byteIDs[p.text[i]]; id >= 0 {
				add(id, 1)
			} else {
				syms = m.unknownPart(syms, string(byteToRune[p.text[i]]), 1, add)
			}
		}
	} else {
		text := p.text
		if p.byteLevel {
			text = byteLevelString(text)
		}
		unk := int32(-1)
		unkLen := 0
		for i := 0; i < len(text); {
			_, n := utf8.DecodeRuneInString(text[i:])
			s := text[i : i+n]
			if i > 0 && m.contPrefix != "" {
				s = m.contPrefix + s
			}
			if i+n == len(text) && m.wordSuffix != "" {
				s += m.wordSuffix
			}
			if id, ok := m.vocab[s]; ok {
				if unk >= 0 {
					add(unk, unkLen)
					unk = -1
				}
				add(int32(id), n)
			} else if fb, ok := m.byteFallbackIDs(text[i : i+n]); ok {
				for _, id := range fb {
					add(id, 1)
				}
			} else if m.unkID >= 0 {
				if unk >= 0 && m.fuseUnk {
					unkLen += n
				} else {
					if unk >= 0 {
						add(unk, unkLen)
					}
					unk, unkLen = int32(m.unkID), n
				}
			}
			i += n
		}
		if unk >= 0 {
			add(unk, unkLen)
		}
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	sc.heap = m.mergeAll(syms, sc.heap[:0])
	sc.syms = syms
	out := make([]int32, 0, len(syms))
	for i := 0; i < len(syms); i++ {
		if syms[i].size != 0 {
			out = append(out, syms[i].id)
		}
	}
	return out
}

// unknownPart handles a byte-level rune missing from the vocabulary.
func (m *bpeModel) unknownPart(syms []symbol, s string, size int, add func(int32, int)) []symbol {
	// Rare: only for vocabularies without the full byte alphabet. Use the
	// unk token when there is one; otherwise drop the byte (as HF does).
	if m.unkID >= 0 {
		add(int32(m.unkID), size)
	}
	_ = s
	return syms
}

func (m *bpeModel) byteFallbackIDs(s string) ([]int32, bool) {
	if !m.byteFallback {
		return nil, false
	}
	out := make([]int32, 0, len(s))
	for i := 0; i < len(s); i++ {
		id := m.fallbackIDs[s[i]]
		if id < 0 {
			return nil, false
		}
		out = append(out, id)
	}
	return out, true
}

// mergeAll applies merges by rank, leftmost first, exactly like HF's
// Word::merge_all.
func (m *bpeModel) mergeAll(syms []symbol, h candHeap) candHeap {
	for i := 0; i+1 < len(syms); i++ {
		if mg, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			h.push(mergeCand{rank: mg.rank, pos: int32(i), newID: mg.newID})
		}
	}
	for len(h) > 0 {
		top := h.pop()
		cur := &syms[top.pos]
		if cur.size == 0 || cur.next < 0 {
			continue
		}
		nextPos := cur.next
		right := syms[nextPos]
		if mg, ok := m.merges[pairKey(cur.id, right.id)]; !ok || mg.newID != top.newID {
			continue // stale candidate
		}
		cur.id = top.newID
		cur.size += right.size
		cur.next = right.next
		syms[nextPos].size = 0
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if cur.prev >= 0 {
			prev := syms[cur.prev]
			if mg, ok := m.merges[pairKey(prev.id, cur.id)]; ok {
				h.push(mergeCand{rank: mg.rank, pos: cur.prev, newID: mg.newID})
			}
		}
		if cur.next >= 0 {
			if mg, ok := m.merges[pairKey(cur.id, syms[cur.next].id)]; ok {
				h.push(mergeCand{rank: mg.rank, pos: top.pos, newID: mg.newID})
			}
		}
	}
	return h
}

func (c *wordCache) reset() {
	c.mu.Lock()
	c.m = nil
	c.mu.Unlock()
}
