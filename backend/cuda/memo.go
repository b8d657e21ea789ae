package cuda

import (
	"slices"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/cuda/driver"
)

// replayMemo is the last decode step replayed after a full check (its
// launches packed and compared with the graph's recording). A later step
// of the same caller's step function (Batch.Step, non-zero), the same
// sequences in the same order, one token each and the same logits request
// packs the same launches (Batch.Step's promise: token values and
// positions reach the kernels only through the staged inputs), so while
// nothing on the device has changed since (Device.gen: weights, sequences,
// scratch buffers) it is replayed without packing it again: the host's
// check cost a decode step 0.24 ms of 3.7 on Qwen3-30B-A3B and 0.88 of 6.0
// on Qwen3-Next (cortiq bench's host line, H200, stop 25 run 1; 13 and 27 µs
// with the memo, run 2: docs/benchmarks.md).
type replayMemo struct {
	ok       bool
	key      graphKey
	step     uint64
	gen      uint64
	seqs     []backend.Seq
	logitsOf []int
	outRows  int // len(OutRows) (nil: -1)
	// What the checked step left in the state for the copies after the
	// launches (Head, Embed).
	H, embedRows    int
	out, next, rows driver.DevicePtr
	outN, nextN, V  int
}

func newReplayMemo(key graphKey, b *backend.Batch, gen uint64, st *state) replayMemo {
	if b.Step == 0 {
		return replayMemo{}
	}
	m := replayMemo{ok: true, key: key, step: b.Step, gen: gen, seqs: slices.Clone(b.Seqs), logitsOf: slices.Clone(b.LogitsOf), outRows: -1,
		H: st.H, embedRows: st.embedRows, out: st.out, next: st.next, rows: st.rowsOf, outN: st.outN, nextN: st.nextN, V: st.vocab}
	if b.OutRows != nil {
		m.outRows = len(b.OutRows)
	}
	return m
}

// matches reports whether b is the memo's step again with nothing on the
// device changed (generation gen).
func (m *replayMemo) matches(key graphKey, b *backend.Batch, gen uint64) bool {
	if !m.ok || b.Step == 0 || b.Step != m.step || key != m.key || gen != m.gen || !slices.Equal(b.Seqs, m.seqs) || !slices.Equal(b.LogitsOf, m.logitsOf) {
		return false
	}
	if (b.OutRows == nil) != (m.outRows < 0) || b.OutRows != nil && len(b.OutRows) != m.outRows {
		return false
	}
	for _, t := range b.Tokens {
		if len(t) != 1 {
			return false
		}
	}
	return true
}

// restore sets what the checked step set in st for the copies after its
// launches, validating what its ops would have validated (token ids
// against the embedding table, the logits buffers' sizes); false: pack
// the step to have its own error.
func (m *replayMemo) restore(st *state) bool {
	for _, t := range st.b.Tokens {
		if t[0] < 0 || t[0] >= m.embedRows {
			return false
		}
	}
	b := st.b
	want, V := 0, m.V // rows of logits to the host, their width
	switch {
	case m.nextN > 0:
		want = len(b.LogitsOf)
	case m.outN > 0:
		want, V = len(st.last), m.outN/len(st.last)
	}
	if b.OutRows != nil {
		if len(b.OutRows) < want {
			return false
		}
		for _, r := range b.OutRows[:want] {
			if len(r) < V {
				return false
			}
		}
	} else if m.outN > 0 && len(b.Out) < m.outN || m.nextN > 0 && (len(b.Next) < m.nextN || len(b.Out) < want*V) {
		return false
	}
	st.H, st.embedRows = m.H, m.embedRows
	st.out, st.outN, st.next, st.nextN, st.rowsOf, st.vocab = m.out, m.outN, m.next, m.nextN, m.rows, m.V
	return true
}
