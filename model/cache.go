package model

import (
	"fmt"

	"github.com/cortiq/cortiq/backend"
)

// Cache is one sequence's state on the model's device (the keys and values
// of every layer for up to its context length of positions) and the
// buffers a Forward on it uses. A Cache is used by one goroutine at a
// time; different caches of one model may run concurrently.
type Cache struct {
	m      *Model
	seq    backend.Seq
	logits []float32 // (vocab): last position

	// One-sequence batch of Forward, kept to step without allocating.
	b       backend.Batch
	seqs    [1]backend.Seq
	toks    [1][]int
	ropeLen [1]int
}

// CacheBytes returns the state bytes a cache of ctxLen positions takes
// (what NewCache allocates on the device).
func (m *Model) CacheBytes(ctxLen int) int64 { return m.spec.KVBytes(ctxLen) }

// NewCache allocates the state of one sequence of up to ctxLen positions.
// A context longer than max_position_embeddings is allowed (the caller
// decides); Forward refuses prompts longer than ctxLen.
func (m *Model) NewCache(ctxLen int) (*Cache, error) {
	s, err := m.dev.NewSeq(m.spec, ctxLen)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	c := &Cache{m: m, seq: s, logits: make([]float32, m.cfg.vocab)}
	c.seqs[0] = s
	return c, nil
}

// Close returns the cache's state to the device (a GPU's K/V slot); the
// cache must not be used after.
func (c *Cache) Close() {
	if c.seq != nil {
		backend.Release(c.m.dev, c.seq)
		c.seq = nil
	}
}

// Bytes returns the memory of the cache's state.
func (c *Cache) Bytes() int64 { return c.seq.Bytes() }

// Len returns the number of positions the cache holds.
func (c *Cache) Len() int { return c.seq.Len() }

// Cap returns the context length: the most positions the cache can hold.
func (c *Cache) Cap() int { return c.seq.Cap() }

// Reset empties the cache.
func (c *Cache) Reset() { _ = c.seq.Truncate(0) }

// Truncate keeps the first n positions (to roll a conversation back to a
// shared prefix); the next Forward starts at position n.
func (c *Cache) Truncate(n int) error {
	if err := c.seq.Truncate(n); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	return nil
}
