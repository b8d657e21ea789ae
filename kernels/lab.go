package kernels

import (
	"sync/atomic"
)

// Hooks for the kernel lab (package lab): alternative dispatches of the
// decode matvecs over the same weights, timed against the production path.

// Stream reads every byte of m's stored weights, split over the workers
// in MatVec's contiguous shares of rows, and does no arithmetic: the
// loads-only ceiling of a matvec over m. It returns a checksum.
func (p *Pool) Stream(m *Mat) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := &streamTask{data: m.Data, rows: m.Rows}
	p.run(m.Rows, 4, m.Rows*m.Cols, t)
	return t.sum.Load()
}

type streamTask struct {
	data []byte
	rows int
	sum  atomic.Uint64
}

func (t *streamTask) Run(lo, hi, _ int) {
	n := len(t.data)
	a, b := lo*n/t.rows, hi*n/t.rows
	s := streamRead(t.data[a:b])
	for {
		v := t.sum.Load()
		if t.sum.CompareAndSwap(v, v^s) {
			return
		}
	}
}
