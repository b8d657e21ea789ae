package kernels

import (
	"fmt"
	"sync/atomic"
)

// Hooks for the kernel lab (package lab): alternative dispatches of the
// decode matvecs over the same weights, timed against the production path.

// MatVecGroup computes ys[i] = ms[i]·x for matrices that share their input
// (q|k|v, gate|up) in ONE pool dispatch over their rows together, instead
// of one dispatch each: the merged-launch variant. The matrices must have
// the same format and column count. The arithmetic per row is MatVec's
// (results are bitwise equal). It allocates its inputs per call (a lab
// variant, not a production path).
func (p *Pool) MatVecGroup(ms []*Mat, x []float32, ys [][]float32) {
	if len(ms) == 0 {
		return
	}
	if len(ms) != len(ys) {
		panic(fmt.Sprintf("kernels: MatVecGroup of %d matrices with %d outputs", len(ms), len(ys)))
	}
	k := mustPrepare(ms[0])
	t := &groupTask{k: k, ms: ms, ys: ys, starts: make([]int, len(ms)+1)}
	for i, m := range ms {
		mustPrepare(m)
		if m.DType != ms[0].DType || m.Cols != ms[0].Cols || len(ys[i]) < m.Rows {
			panic(fmt.Sprintf("kernels: MatVecGroup of %s %d×%d with %s %d×%d (len(y)=%d)", m.DType, m.Rows, m.Cols, ms[0].DType, ms[0].Rows, ms[0].Cols, len(ys[i])))
		}
		// Each matrix starts at a multiple of 4 rows so no 4-row block
		// straddles two matrices.
		t.starts[i+1] = t.starts[i] + (m.Rows+3)&^3
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t.xs, t.qs = make([][]float32, len(ms)), make([]*qbatch, len(ms))
	for i, m := range ms {
		if i > 0 && m.col == nil {
			// The same input serves every matrix without a column field.
			t.xs[i], t.qs[i] = t.xs[0], t.qs[0]
			continue
		}
		// q8_2f: each matrix prescales the input by its own column field.
		t.xs[i] = append([]float32(nil), p.prescale(m, x[:m.Cols], 1)...)
		if k.qx != qNone {
			t.qs[i] = &qbatch{}
			t.qs[i].reset(k.qx, m.Cols, 1)
			t.qs[i].quantize(t.xs[i])
		}
	}
	total := t.starts[len(ms)]
	p.run(total, 4, total*ms[0].Cols, t)
}

type groupTask struct {
	k      *dtypeKernel
	ms     []*Mat
	ys     [][]float32
	starts []int       // row offset of each matrix in the combined range
	xs     [][]float32 // per matrix: its (prescaled) input
	qs     []*qbatch   // per matrix: the input quantized, when the format runs on int8
}

func (t *groupTask) Run(lo, hi, worker int) {
	for i, m := range t.ms {
		a, b := max(lo, t.starts[i]), min(hi, t.starts[i]+m.Rows)
		if a >= b {
			continue
		}
		mv := matvecTask{k: t.k, m: m, x: t.xs[i], y: t.ys[i], q: t.qs[i]}
		mv.Run(a-t.starts[i], b-t.starts[i], worker)
	}
}

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
