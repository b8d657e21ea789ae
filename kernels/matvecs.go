package kernels

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// MatVecJob is one product y = W·x of a MatVecs call.
type MatVecJob struct {
	M    *Mat
	X, Y []float32 // len(X) ≥ M.Cols, len(Y) ≥ M.Rows
	// Up, when set (len ≥ M.Cols), makes the input SiLU(X)⊙Up, written
	// into X by the first worker to reach the job, inside the operation:
	// a MoE expert's down product takes its SwiGLU without a serial step
	// on the caller before the operation (SiLUMul's values, then the
	// activation quantization of every other job).
	Up []float32
}

// MatVecs computes several independent matrix-vector products as one
// pool operation: the rows of all jobs are split over the workers
// together, so many small products (the selected experts of a MoE layer
// in decode) cost one dispatch instead of one each. Each job's result is
// the one MatVec gives (the same kernels and activation quantization);
// jobs with the same input slice and format share one quantized input.
// The outputs must not overlap the inputs.
func (p *Pool) MatVecs(jobs []MatVecJob) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := &p.mvs
	n := len(jobs)
	t.jobs = jobs
	t.k = growSlice(t.k, n)
	t.x = growSlice(t.x, n)
	t.qv = growSlice(t.qv, n)
	t.start = growSlice(t.start, n+1)
	t.ready = growSlice(t.ready, n)
	if len(t.qb) < n {
		t.qb = append(t.qb, make([]qbatch, n-len(t.qb))...)
	}
	if len(t.xc) < n {
		t.xc = append(t.xc, make([][]float32, n-len(t.xc))...)
	}
	total, work := 0, 0
	for i, j := range jobs {
		k := mustPrepare(j.M)
		m := j.M
		if len(j.X) < m.Cols || len(j.Y) < m.Rows || (j.Up != nil && len(j.Up) < m.Cols) {
			panic(fmt.Sprintf("kernels: MatVecs job %d: %d×%d with len(x)=%d, len(y)=%d, len(up)=%d", i, m.Rows, m.Cols, len(j.X), len(j.Y), len(j.Up)))
		}
		t.k[i] = k
		t.ready[i].Store(0)
		if j.Up == nil {
			t.input(i, true)
			t.ready[i].Store(2)
		}
		t.start[i] = total
		total += (m.Rows + 3) / 4
		work += m.Rows * m.Cols
	}
	t.start[n] = total
	p.run(total, 1, work, t)
	t.jobs = nil
}

// input readies job i's input: SiLU(X)⊙Up first for a job with Up,
// then X times the column field (q8_2f) and the quantized activations,
// shared with an earlier job of the same input slice and layout when
// share is set (never with a job with Up: its input is written later).
func (t *matvecsTask) input(i int, share bool) {
	j, k := t.jobs[i], t.k[i]
	m := j.M
	x := j.X[:m.Cols]
	if j.Up != nil {
		SiLUMul(x, j.Up[:m.Cols])
	}
	if m.col != nil {
		xc := growSlice(t.xc[i], m.Cols)
		t.xc[i] = xc
		for c, v := range m.col {
			xc[c] = x[c] * v
		}
		x = xc
	}
	t.x[i] = x
	if k.qx == qNone {
		return
	}
	if share {
		for prev := range i {
			if t.jobs[prev].Up == nil && t.k[prev].qx == k.qx && sameSlice(t.x[prev], x) {
				t.qv[i] = t.qv[prev]
				return
			}
		}
	}
	t.qb[i].reset(k.qx, m.Cols, 1)
	t.qb[i].quantize(x)
	t.qv[i] = t.qb[i].pos(0)
}

// await returns once job i's input is ready: the first worker to reach a
// job with Up computes it, later ones spin until it has (the one
// computing it is inside the operation, so it finishes).
func (t *matvecsTask) await(i int) {
	r := &t.ready[i]
	if r.Load() == 2 {
		return
	}
	if r.CompareAndSwap(0, 1) {
		t.input(i, false)
		r.Store(2)
		return
	}
	for r.Load() != 2 {
		spinPause()
	}
}

func sameSlice(a, b []float32) bool {
	return len(a) == len(b) && len(a) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b)
}

func growSlice[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// matvecsTask is MatVecs' operation over the blocks of 4 rows of all jobs,
// numbered job by job.
type matvecsTask struct {
	jobs  []MatVecJob
	k     []*dtypeKernel
	x     [][]float32
	qv    []qvec
	start []int // per job: its first block; start[len(jobs)] = all blocks
	qb    []qbatch
	xc    [][]float32
	ready []atomic.Int32 // per job: 0 input not ready, 1 being readied, 2 ready
}

func (t *matvecsTask) Run(lo, hi, _ int) {
	i := 0
	for t.start[i+1] <= lo {
		i++
	}
	for b := lo; b < hi; i++ {
		e := min(hi, t.start[i+1])
		t.await(i)
		m, k, y := t.jobs[i].M, t.k[i], t.jobs[i].Y
		r0, r1 := 4*(b-t.start[i]), min(4*(e-t.start[i]), m.Rows)
		b = e
		if k.qx != qNone {
			k.qrows(m, r0, r1, t.qv[i], y)
			continue
		}
		x := t.x[i]
		r := r0
		for ; r+4 <= r1; r += 4 {
			y[r], y[r+1], y[r+2], y[r+3] = k.dot4(m, r, x)
		}
		for ; r < r1; r++ {
			y[r] = k.dot(m, r, x)
		}
	}
}
