package engine

import (
	"errors"
	"slices"
	"sync"

	"github.com/cortiq/cortiq/model"
)

// Prefix reuse for hybrid models. Their linear-attention state summarises
// the whole prefix in a fixed size and cannot be truncated to a shorter
// prefix, so a session keeps snapshots of it (model.Snapshot: the conv and
// recurrent state, ~75 MiB for Qwen3-Next-80B) at every SnapshotInterval
// tokens of a prefill and at the end of each prompt and of each reply. The
// next Prefill resumes from the latest snapshot inside the prompt's common
// prefix with the session's tokens (the K/V rows of the attention layers
// below it are still in the cache) instead of prefilling from the start.
// Snapshots live in one host-memory LRU per engine with a byte budget.

// Defaults of Options.SnapshotInterval and Options.SnapshotBudget.
const (
	DefaultSnapshotInterval = 256
	DefaultSnapshotBudget   = 1 << 30
)

// snapStore is the engine's LRU of snapshots.
type snapStore struct {
	mu       sync.Mutex
	budget   int64
	interval int
	bytes    int64
	clock    uint64
	entries  []*snapEntry
}

type snapEntry struct {
	s    *Session
	ids  []int // the tokens the snapshot was taken after
	snap *model.Snapshot
	used uint64
}

// SnapshotStats returns the number of snapshots held and their bytes.
func (e *Engine) SnapshotStats() (n int, bytes int64) {
	st := &e.snaps
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.entries), st.bytes
}

// take snapshots s's cache at its current length unless one exists, then
// evicts the least recently used snapshots (of any session) over budget.
func (st *snapStore) take(s *Session) error {
	n := s.cache.Len()
	if n == 0 {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.clock++
	for _, e := range st.entries {
		if e.s == s && e.snap.Len == n {
			e.used = st.clock
			return nil
		}
	}
	snap, err := s.cache.Snapshot(nil)
	if err != nil {
		return err
	}
	if snap.Bytes() > st.budget {
		return nil
	}
	st.entries = append(st.entries, &snapEntry{s: s, ids: slices.Clone(s.ids[:n]), snap: snap, used: st.clock})
	st.bytes += snap.Bytes()
	for st.bytes > st.budget {
		lru := 0
		for i, e := range st.entries {
			if e.used < st.entries[lru].used {
				lru = i
			}
		}
		st.remove(lru)
	}
	return nil
}

func (st *snapStore) remove(i int) {
	st.bytes -= st.entries[i].snap.Bytes()
	st.entries = append(st.entries[:i], st.entries[i+1:]...)
}

// drop removes s's snapshots longer than n (all of them for n < 0).
func (st *snapStore) drop(s *Session, n int) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for i := 0; i < len(st.entries); {
		if e := st.entries[i]; e.s == s && (n < 0 || e.snap.Len > n) {
			st.remove(i)
			continue
		}
		i++
	}
}

// resume sets s's cache to the longest usable prefix of prompt and
// returns its length: the cache itself when it holds exactly keep tokens
// (the common prefix with the session's tokens), else the longest of s's
// own snapshots within keep, or another session's snapshot of a prefix of
// prompt (its K/V rows copied from that session's cache), else nothing
// (the cache is reset). Everything happens under the store's lock: a
// session drops its snapshots here before it overwrites their positions,
// so a source's rows cannot change during the copy. s's snapshots past
// the resume point, and those its rows below it no longer hold (after a
// restore from another session's rows), are dropped.
func (st *snapStore) resume(s *Session, prompt []int, keep int) (int, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	var own, other *snapEntry
	for _, e := range st.entries {
		switch n := e.snap.Len; {
		case e.s == s:
			if n <= keep && (own == nil || n > own.snap.Len) {
				own = e
			}
		case n < len(prompt) && (other == nil || n > other.snap.Len) && slices.Equal(e.ids, prompt[:n]):
			other = e
		}
	}
	at := 0
	var err error
	switch {
	case keep == s.cache.Len() && (other == nil || other.snap.Len <= keep):
		at = keep
	case other != nil && (own == nil || other.snap.Len > own.snap.Len):
		err, at = s.cache.RestoreFrom(other.s.cache, other.snap), other.snap.Len
		st.clock++
		other.used = st.clock
	case own != nil:
		err, at = s.cache.Restore(own.snap), own.snap.Len
		st.clock++
		own.used = st.clock
	}
	if err != nil || at == 0 {
		s.cache.Reset()
		at = 0
	}
	// s's positions from at on are about to be rewritten, and below at they
	// now hold prompt[:at] (restoring from another session copies its rows):
	// keep only the snapshots of s that are a prefix of that.
	for i := 0; i < len(st.entries); {
		if e := st.entries[i]; e.s == s && (e.snap.Len > at || !slices.Equal(e.ids, prompt[:e.snap.Len])) {
			st.remove(i)
			continue
		}
		i++
	}
	return at, err
}

// prefillState is Prefill for a model with linear-attention state: keep is
// the prompt's common prefix with the session's tokens. The cache resumes
// at keep if it is exactly there, else at the latest snapshot within keep,
// else from the start; the rest is prefilled in pieces that end on the
// snapshot interval, with a snapshot at each boundary and at the end.
func (s *Session) prefillState(prompt []int, keep int) ([]float32, int, error) {
	st := &s.e.snaps
	keep, err := st.resume(s, prompt, keep)
	if err != nil {
		s.ids = s.ids[:0]
		return nil, 0, err
	}
	// The resumed prefix is prompt[:keep] in every case.
	s.ids = append(s.ids[:0], prompt...)
	iv := st.interval
	marks := s.marks
	s.marks = nil
	var logits []float32
	for pos := keep; pos < len(prompt); {
		end := len(prompt)
		if iv > 0 {
			end = min(end, (pos/iv+1)*iv)
		}
		for _, m := range marks {
			if m > pos && m < end {
				end = m
			}
		}
		want := model.NoLogits
		if end == len(prompt) {
			want = model.LastLogits
		}
		l, err := s.e.Model.Forward(s.cache, prompt[pos:end], pos, want)
		if err != nil {
			// The state may be part-way through the piece: start over
			// next time.
			s.cache.Reset()
			s.ids = s.ids[:0]
			st.drop(s, -1)
			return nil, keep, err
		}
		logits, pos = l, end
		if iv > 0 && pos%iv == 0 || pos == len(prompt) || slices.Contains(marks, pos) {
			if err := st.take(s); err != nil {
				return nil, keep, err
			}
		}
	}
	return logits, keep, nil
}

// SnapshotAt asks the next Prefill of a hybrid session to snapshot the
// state at position n too (if it prefills past n): chat marks where the
// conversation's history ends, the prefix the next turn shares even when
// the template rewrites the assistant turns after it.
func (s *Session) SnapshotAt(n int) {
	if s.e.Model.HasState() && n > 0 {
		s.marks = append(s.marks, n)
	}
}

var errNoSnapshots = errors.New("engine: the model keeps no linear-attention state")

// Snapshot takes a snapshot of a hybrid session at its current length
// (Generate does so at the end of each reply).
func (s *Session) Snapshot() error {
	if !s.e.Model.HasState() {
		return errNoSnapshots
	}
	return s.e.snaps.take(s)
}
