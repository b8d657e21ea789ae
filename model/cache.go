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
func (m *Model) CacheBytes(ctxLen int) int64 { return m.spec.KVBytes(ctxLen) + m.spec.StateBytes() }

// SessionBytes returns what a session of ctxLen positions allocates: the
// sequence's state (CacheBytes) and, on the CPU, the run state of one
// prefill step (min(Batch, ctxLen) rows), the attention scores of every
// worker and the logits row. Callers compare it with the memory available
// before allocating.
func (m *Model) SessionBytes(ctxLen int) int64 {
	c := &m.cfg
	B := int64(min(m.batch, ctxLen))
	qd, kvd := int64(c.heads*c.headDim), int64(c.kvHeads*c.headDim)
	h2 := int64(float64(c.headDim)*max(m.Arch.PartialRotaryFactor, 0)) / 2
	if m.Arch.PartialRotaryFactor == 0 {
		h2 = int64(c.headDim) / 2
	}
	workers := int64(1)
	if t, ok := m.dev.(interface{ Threads() int }); ok {
		workers = int64(t.Threads())
	}
	state := B*(3*int64(c.dim)+2*qd+2*kvd+2*int64(c.hidden)+2*h2) + h2
	scores := workers * int64(ctxLen)
	return m.CacheBytes(ctxLen) + 4*(state+scores+int64(c.vocab))
}

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
// shared prefix); the next Forward starts at position n. A hybrid model's
// linear-attention state summarises the whole prefix in a fixed size and
// cannot be rolled back: there only 0 and Len() are allowed, other lengths
// are an error wrapping ErrNotRewindable.
func (c *Cache) Truncate(n int) error {
	if err := c.seq.Truncate(n); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	return nil
}

// Snapshot is a host copy of a hybrid cache's linear-attention state at
// one length (its K/V rows stay in the cache: a snapshot is only valid for
// the cache it was taken from while positions [0, Len) keep their tokens).
type Snapshot struct {
	Len   int
	state []float32
}

// Bytes returns the memory the snapshot holds.
func (s *Snapshot) Bytes() int64 { return 4 * int64(len(s.state)) }

// HasState reports whether the model keeps a fixed-size linear-attention
// state per sequence (hybrid models): its caches cannot be truncated into
// the middle, only snapshotted and restored.
func (m *Model) HasState() bool { return len(m.spec.DeltaNet) > 0 }

// SnapshotBytes is the size of one snapshot (0 for models without state).
func (m *Model) SnapshotBytes() int64 { return m.spec.StateBytes() }

// Snapshot copies the cache's linear-attention state at its current
// length, into reuse's buffer when it is given.
func (c *Cache) Snapshot(reuse *Snapshot) (*Snapshot, error) {
	ss, ok := c.seq.(backend.StateSaver)
	if !ok || !c.m.HasState() {
		return nil, fmt.Errorf("model: %s keeps no linear-attention state to snapshot", c.m.Arch.ArchName)
	}
	s := reuse
	if s == nil {
		s = &Snapshot{}
	}
	s.Len, s.state = c.Len(), ss.SaveState(s.state)
	return s, nil
}

// Restore sets the cache back to a snapshot taken from it: length
// s.Len, the linear-attention state as it was then, the K/V rows of
// [0, s.Len) as they are (the caller guarantees they still hold the same
// tokens: nothing was written below s.Len since the snapshot).
func (c *Cache) Restore(s *Snapshot) error {
	ss, ok := c.seq.(backend.StateSaver)
	if !ok || !c.m.HasState() {
		return fmt.Errorf("model: %s keeps no linear-attention state to restore", c.m.Arch.ArchName)
	}
	if err := ss.RestoreState(s.state, s.Len); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	return nil
}

// RestoreFrom sets the cache to a snapshot taken from another cache src of
// the same model: it copies src's K/V rows of [0, s.Len) and restores the
// state. src's positions below s.Len must hold the tokens the snapshot
// was taken after and must not change during the call.
func (c *Cache) RestoreFrom(src *Cache, s *Snapshot) error {
	if src.m != c.m {
		return fmt.Errorf("model: restore from a cache of another model")
	}
	ss, ok := c.seq.(backend.StateSaver)
	if !ok || !c.m.HasState() {
		return fmt.Errorf("model: %s keeps no linear-attention state to restore", c.m.Arch.ArchName)
	}
	if err := ss.CopyPrefix(src.seq, s.Len); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	return c.Restore(s)
}
