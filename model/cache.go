package model

import (
	"fmt"

	"github.com/cortiq/cortiq/kernels"
)

// Cache is one sequence's state: the keys and values of every layer for
// up to its context length of positions (f32; K stored after k_norm and
// RoPE, V as projected) and the run-state buffers Forward works in, all
// allocated once by NewCache. A Cache is used by one goroutine at a time;
// different caches of one model may run concurrently.
type Cache struct {
	m   *Model
	ctx int         // positions the cache can hold
	n   int         // positions it holds
	k   [][]float32 // per layer: (kvHeads, ctx, headDim)
	v   [][]float32
	rs  runState
	// Hybrid models: the conv and recurrent state of each linear-attention
	// layer (zero value for the others; those have no k, v) and the
	// scratch of hybridStep.
	gdn []kernels.GDNState
	hy  *hybridRun
}

// runState holds the activations of one Forward step of up to batch
// positions, allocated once.
type runState struct {
	x, xb, xb2 []float32   // (batch, dim): residual stream, normed input, block output
	q, att     []float32   // (batch, heads*headDim): queries, attention output
	k, v       []float32   // (batch, kvHeads*headDim)
	hb, hb2    []float32   // (batch, hidden): gate and up projections
	cos, sin   []float32   // (batch, rotary/2)
	invFreq    []float32   // (rotary/2): dynamic RoPE frequencies of a call
	scores     [][]float32 // per worker: (ctx) attention weights
	logits     []float32   // (vocab): last position
	attn       attnTask
}

// maxContext bounds a cache's context length.
const maxContext = 1 << 24

// CacheBytes returns the key/value bytes a cache of ctxLen positions
// takes (what NewCache allocates, besides the run state).
func (m *Model) CacheBytes(ctxLen int) int64 {
	c := &m.cfg
	var n int64
	for l := range c.layers {
		if m.hy != nil && m.hy[l].gdn != nil {
			n += m.hy[l].gdn.StateBytes()
			continue
		}
		n += 2 * int64(c.kvHeads) * int64(ctxLen) * int64(c.headDim) * 4
	}
	return n
}

// NewCache allocates the key/value cache for ctxLen positions and the run
// state. A context longer than max_position_embeddings is allowed (the
// caller decides); Forward refuses prompts longer than ctxLen.
func (m *Model) NewCache(ctxLen int) (*Cache, error) {
	if ctxLen <= 0 || ctxLen > maxContext {
		return nil, fmt.Errorf("model: context length %d outside 1..%d", ctxLen, maxContext)
	}
	c := &Cache{m: m, ctx: ctxLen, k: make([][]float32, m.cfg.layers), v: make([][]float32, m.cfg.layers)}
	per := m.cfg.kvHeads * ctxLen * m.cfg.headDim
	if m.hy != nil {
		c.gdn, c.hy = make([]kernels.GDNState, m.cfg.layers), &hybridRun{}
	}
	for l := range c.k {
		if m.hy != nil && m.hy[l].gdn != nil {
			c.gdn[l] = m.hy[l].gdn.NewState()
			continue
		}
		c.k[l] = make([]float32, per)
		c.v[l] = make([]float32, per)
	}
	cfg, B := &m.cfg, min(m.batch, ctxLen)
	qd, kvd, h2 := cfg.heads*cfg.headDim, cfg.kvHeads*cfg.headDim, m.rope.Dim()/2
	c.rs = runState{
		x: make([]float32, B*cfg.dim), xb: make([]float32, B*cfg.dim), xb2: make([]float32, B*cfg.dim),
		q: make([]float32, B*qd), att: make([]float32, B*qd), k: make([]float32, B*kvd), v: make([]float32, B*kvd),
		hb: make([]float32, B*cfg.hidden), hb2: make([]float32, B*cfg.hidden),
		cos: make([]float32, B*h2), sin: make([]float32, B*h2), invFreq: make([]float32, h2),
		scores: make([][]float32, m.pool.Workers()), logits: make([]float32, cfg.vocab),
	}
	for i := range c.rs.scores {
		c.rs.scores[i] = make([]float32, ctxLen)
	}
	return c, nil
}

// Bytes returns the memory of the key/value cache (and of the
// linear-attention state of a hybrid model).
func (c *Cache) Bytes() int64 { return c.m.CacheBytes(c.ctx) }

// Len returns the number of positions the cache holds.
func (c *Cache) Len() int { return c.n }

// Cap returns the context length: the most positions the cache can hold.
func (c *Cache) Cap() int { return c.ctx }

// Reset empties the cache.
func (c *Cache) Reset() {
	c.n = 0
	for _, s := range c.gdn {
		clear(s.Conv)
		clear(s.S)
	}
}

// Truncate keeps the first n positions (to roll a conversation back to a
// shared prefix); the next Forward starts at position n. A hybrid model's
// linear-attention state holds the whole prefix in a fixed size and cannot
// be rolled back: there only n == 0 (Reset) and n == Len() are allowed,
// other lengths are ErrNotRewindable.
func (c *Cache) Truncate(n int) error {
	if n < 0 || n > c.n {
		return fmt.Errorf("model: truncate to %d positions, the cache holds %d", n, c.n)
	}
	if c.gdn != nil && n != c.n {
		if n != 0 {
			return fmt.Errorf("model: truncate to %d of %d positions: %w", n, c.n, ErrNotRewindable)
		}
		c.Reset()
	}
	c.n = n
	return nil
}

// head returns layer l's keys (or values) of kv head h: (ctx, headDim).
func (c *Cache) head(l, h int, values bool) []float32 {
	per := c.ctx * c.m.cfg.headDim
	if values {
		return c.v[l][h*per : (h+1)*per]
	}
	return c.k[l][h*per : (h+1)*per]
}

// kv returns the slot of position pos in head(l, h, values).
func (c *Cache) kv(l, h, pos int, values bool) []float32 {
	hd := c.m.cfg.headDim
	return c.head(l, h, values)[pos*hd : (pos+1)*hd]
}
