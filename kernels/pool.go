package kernels

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Task is work over the index range [0, n) that a Pool splits into
// contiguous chunks, several per worker, handed out in order. Run handles
// [lo, hi) and may be called several times per operation; worker (0 ..
// Workers()-1) lets a task keep per-worker scratch without locking.
type Task interface {
	Run(lo, hi, worker int)
}

// Pool is a fixed set of worker goroutines, started once, that run the
// kernels over contiguous chunks of rows. The calling goroutine takes the
// first block itself. One operation runs at a time; concurrent callers
// queue on a mutex. Close stops the workers.
//
// Dispatch is a generation counter: the caller publishes the task and
// bumps it, workers spinning on it join the operation at once, and the
// caller, once every unit is claimed, closes the operation to late
// joiners and spins until the workers that joined have left. A worker
// that finds no work for spinTime parks on a channel (so an idle pool
// costs no CPU) and is woken by the next dispatch. A token's decode runs
// ~130 operations; parking and waking a thread for each costs tens of
// microseconds, spinning well under one.
//
// The caller never waits for a worker that has not started: a worker that
// is parked, or descheduled by a busy machine, when an operation begins
// (waking one took 60–100 µs on the 2-core test machine) joins whichever
// operation is current when it runs, and the caller meanwhile takes its
// share from the back. A MoE decode layer is three operations of 3–300 µs,
// so waiting for such a worker cost the first layer of every token ~150
// µs, and a blocked caller then itself took as long to be rescheduled.
type Pool struct {
	mu       sync.Mutex
	n        int
	closed   bool
	gen      uint32        // the current operation's generation (caller only)
	op       atomic.Uint64 // gen<<32 | opClosed | workers inside the operation
	closing  atomic.Bool
	waiting  atomic.Uint64 // 1 + the generation whose caller blocks on done; 0: none
	done     chan struct{} // wakes a blocked caller
	workers  []poolWorker
	task     Task
	total    int         // the operation's range [0, total)
	unit     int         // indexes per unit (ranges are split at multiples)
	grain    int         // units claimed at a time
	active   int         // workers with a share
	spans    []span      // per worker: its unclaimed units
	scratch  [][]float32 // per worker: decoded weight rows for MatMul
	bscratch [][]byte    // per worker: unpacked weight blocks for MatMul
	xc       []float32   // q8_2f: inputs times the column field
	qb       qbatch      // int8 inputs of the quantized formats

	mv  matvecTask
	mm  matmulTask
	mvs matvecsTask
}

type poolWorker struct {
	parked atomic.Bool
	wake   chan struct{}
	_      [48]byte // keep workers' flags on separate cache lines
}

// spinTime is how long an idle worker spins before it parks; waitSpin how
// long the caller spins for the workers before it blocks.
const (
	spinTime = 50 * time.Microsecond
	waitSpin = 50 * time.Microsecond
)

// minParallelWork is the number of multiply-adds below which an operation
// runs on the calling goroutine alone.
const minParallelWork = 1 << 15

// NewPool starts a pool of n workers (n <= 0: DefaultThreads()).
func NewPool(n int) *Pool {
	if n <= 0 {
		n = DefaultThreads()
	}
	p := &Pool{n: n, workers: make([]poolWorker, n), spans: make([]span, n), scratch: make([][]float32, n), bscratch: make([][]byte, n), done: make(chan struct{}, 1)}
	for i := 1; i < n; i++ {
		p.workers[i].wake = make(chan struct{}, 1)
		go p.worker(i)
	}
	return p
}

func (p *Pool) worker(i int) {
	w := &p.workers[i]
	var seen uint32
	for {
		seen = p.await(w, seen)
		if p.closing.Load() {
			return
		}
		if p.join(seen) {
			p.drain(i)
			p.leave()
		}
	}
}

// opClosed marks an operation whose units are all claimed: no worker may
// join it any more. The low bits below it count the workers inside.
const (
	opClosed = 1 << 31
	opCount  = opClosed - 1
)

// join enters operation g unless it has been closed or replaced.
func (p *Pool) join(g uint32) bool {
	for {
		v := p.op.Load()
		if uint32(v>>32) != g || v&opClosed != 0 {
			return false
		}
		if p.op.CompareAndSwap(v, v+1) {
			return true
		}
	}
}

// leave marks a worker's part of the operation done and wakes a caller
// blocked in wait when it was the last one inside a closed operation.
func (p *Pool) leave() {
	// The generation in the flag keeps a worker delayed here from waking
	// the caller of a later operation.
	if v := p.op.Add(^uint64(0)); v&opClosed != 0 && v&opCount == 0 && p.waiting.CompareAndSwap(1+v>>32, 0) {
		p.done <- struct{}{}
	}
}

// await returns the generation after seen, spinning for spinTime and then
// parking until the next dispatch.
func (p *Pool) await(w *poolWorker, seen uint32) uint32 {
	for {
		t0 := time.Now()
		for i := 1; ; i++ {
			if g := uint32(p.op.Load() >> 32); g != seen {
				return g
			}
			spinPause()
			if i%256 == 0 && time.Since(t0) > spinTime {
				break
			}
		}
		w.parked.Store(true)
		if g := uint32(p.op.Load() >> 32); g != seen {
			if !w.parked.CompareAndSwap(true, false) {
				<-w.wake // the dispatcher saw the flag and sends a wake-up
			}
			return g
		}
		<-w.wake
	}
}

// start publishes the current task to the workers: a new generation,
// open, nobody inside (the previous operation has been closed and left).
func (p *Pool) start() {
	p.gen++
	p.op.Store(uint64(p.gen) << 32)
	for i := 1; i < p.n; i++ {
		if w := &p.workers[i]; w.parked.CompareAndSwap(true, false) {
			w.wake <- struct{}{}
		}
	}
}

// wait closes the current operation, whose units have all been claimed,
// and spins until the workers inside it have finished theirs; it blocks
// if that takes longer than waitSpin: a worker thread the OS has
// descheduled in the middle of its units (a busy machine) then gets the
// core back sooner.
func (p *Pool) wait() {
	if p.op.Add(opClosed)&opCount == 0 {
		return
	}
	t0 := time.Now()
	for i := 1; p.op.Load()&opCount != 0; i++ {
		spinPause()
		if i%256 == 0 && time.Since(t0) > waitSpin {
			w := 1 + uint64(p.gen)
			p.waiting.Store(w)
			if p.op.Load()&opCount == 0 && p.waiting.CompareAndSwap(w, 0) {
				return
			}
			<-p.done
			return
		}
	}
}

// Workers returns the number of workers, the calling goroutine included.
func (p *Pool) Workers() int { return p.n }

// Close stops the worker goroutines. The pool must not be used afterwards.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.closing.Store(true)
	p.start()
}

// For runs t over [0, n) split into contiguous chunks, in parallel when
// work (an estimate of the multiply-adds in total) is worth it.
func (p *Pool) For(n int, work int, t Task) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.run(n, 1, work, t)
}

// run splits [0, n) into at most Workers() blocks whose bounds are
// multiples of unit and runs them; the caller holds p.mu.
func (p *Pool) run(n, unit, work int, t Task) {
	if p.closed {
		panic("kernels: use of a closed Pool")
	}
	if n <= 0 {
		return
	}
	units := (n + unit - 1) / unit
	k := min(p.n, units)
	if work < minParallelWork {
		k = 1
	}
	if k == 1 {
		t.Run(0, n, 0)
		return
	}
	// Each worker owns a contiguous share and streams it from the front,
	// one grain at a time; a worker that runs out (less memory bandwidth
	// or CPU time went to the others) takes grains from the back of the
	// others' shares, which leaves their streams undisturbed.
	p.task, p.total, p.unit, p.active = t, n, unit, k
	p.grain = max(1, units/(k*grainsPerWorker))
	for i := range p.spans {
		var lo, hi uint64
		if i < k {
			lo, hi = uint64(i*units/k), uint64((i+1)*units/k)
		}
		p.spans[i].v.Store(lo<<32 | hi)
	}
	p.start()
	p.drain(0)
	p.wait()
	p.task = nil
}

// grainsPerWorker is how finely a share is claimed.
const grainsPerWorker = 16

// span is a worker's unclaimed units [lo, hi) of the current operation,
// lo in the high half, so that the owner (claiming from lo) and helpers
// (claiming from hi) update it with one compare-and-swap.
type span struct {
	v atomic.Uint64
	_ [56]byte // one cache line per span
}

// claim takes up to g units from the front (back: from the back) and
// returns them, or n = 0 when the span is empty.
func (s *span) claim(g uint64, back bool) (lo, n uint64) {
	for {
		v := s.v.Load()
		a, b := v>>32, v&0xffffffff
		if a >= b {
			return 0, 0
		}
		n = min(g, b-a)
		w := (a+n)<<32 | b
		if back {
			w = a<<32 | (b - n)
		}
		if s.v.CompareAndSwap(v, w) {
			if back {
				return b - n, n
			}
			return a, n
		}
	}
}

// drain runs the worker's own share, then helps the others.
func (p *Pool) drain(worker int) {
	g := uint64(p.grain)
	for {
		lo, n := p.spans[worker].claim(g, false)
		if n == 0 {
			break
		}
		p.runUnits(lo, n, worker)
	}
	for helped := true; helped; {
		helped = false
		for v := range p.active {
			if v == worker {
				continue
			}
			if lo, n := p.spans[v].claim(g, true); n > 0 {
				p.runUnits(lo, n, worker)
				helped = true
			}
		}
	}
}

func (p *Pool) runUnits(lo, n uint64, worker int) {
	a := int(lo) * p.unit
	p.task.Run(a, min(a+int(n)*p.unit, p.total), worker)
}

// prescale returns x (n rows of m.Cols) multiplied by the q8_2f column
// field in a pool buffer, or x itself for other formats.
func (p *Pool) prescale(m *Mat, x []float32, n int) []float32 {
	if m.col == nil {
		return x
	}
	c := m.Cols
	if cap(p.xc) < n*c {
		p.xc = make([]float32, n*c)
	}
	xc := p.xc[:n*c]
	for j := 0; j < n; j++ {
		xr, dr := x[j*c:(j+1)*c], xc[j*c:(j+1)*c]
		for i, v := range m.col {
			dr[i] = xr[i] * v
		}
	}
	return xc
}

func mustPrepare(m *Mat) *dtypeKernel {
	if err := m.Prepare(); err != nil {
		panic(err)
	}
	return kernelFor(m.DType)
}

// MatVec computes y = W·x: y[r] = Σ_i W[r,i]·x[i], len(x) >= Cols,
// len(y) >= Rows. Rows are split in contiguous chunks over the workers.
func (p *Pool) MatVec(m *Mat, x, y []float32) {
	k := mustPrepare(m)
	if len(x) < m.Cols || len(y) < m.Rows {
		panic(fmt.Sprintf("kernels: MatVec %d×%d with len(x)=%d, len(y)=%d", m.Rows, m.Cols, len(x), len(y)))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mv = matvecTask{k: k, m: m, x: p.prescale(m, x[:m.Cols], 1), y: y}
	if k.qx != qNone {
		p.qb.reset(k.qx, m.Cols, 1)
		p.qb.quantize(p.mv.x)
		p.mv.q = &p.qb
	}
	p.run(m.Rows, 4, m.Rows*m.Cols, &p.mv)
	p.mv = matvecTask{}
}

type matvecTask struct {
	k    *dtypeKernel
	m    *Mat
	x, y []float32
	q    *qbatch // the quantized x when k.qx != qNone
}

func (t *matvecTask) Run(lo, hi, _ int) {
	if t.q != nil {
		t.k.qrows(t.m, lo, hi, t.q.pos(0), t.y)
		return
	}
	dot, dot4, m, x, y := t.k.dot, t.k.dot4, t.m, t.x, t.y
	r := lo
	for ; r+4 <= hi; r += 4 {
		y[r], y[r+1], y[r+2], y[r+3] = dot4(m, r, x)
	}
	for ; r < hi; r++ {
		y[r] = dot(m, r, x)
	}
}

// MatMul computes Y = X·Wᵀ for n input rows: X is n×Cols row-major, Y is
// n×Rows row-major (Y[j*Rows+r] = W[r,:]·X[j,:]). Each weight row is
// decoded once per tile of positions and reused across them (batched
// prefill); n == 1 is MatVec.
func (p *Pool) MatMul(m *Mat, X []float32, n int, Y []float32) {
	if n == 1 {
		p.MatVec(m, X, Y)
		return
	}
	k := mustPrepare(m)
	if n < 0 || len(X) < n*m.Cols || len(Y) < n*m.Rows {
		panic(fmt.Sprintf("kernels: MatMul %d×%d, n=%d with len(X)=%d, len(Y)=%d", m.Rows, m.Cols, n, len(X), len(Y)))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.scratch {
		if len(p.scratch[i]) < 4*m.Cols {
			p.scratch[i] = make([]float32, 4*m.Cols)
		}
	}
	p.mm = matmulTask{k: k, m: m, x: p.prescale(m, X[:n*m.Cols], n), n: n, y: Y, scratch: p.scratch, bscratch: p.bscratch}
	if k.qx != qNone {
		p.qb.reset(k.qx, m.Cols, n)
		p.qb.quantize(p.mm.x)
		p.mm.q = &p.qb
	}
	p.run(m.Rows, 4, n*m.Rows*m.Cols, &p.mm)
	p.mm = matmulTask{}
}

// matmulTile is the number of positions a decoded block of rows serves
// before the next block is decoded: the tile's inputs stay in cache.
const matmulTile = 32

type matmulTask struct {
	k        *dtypeKernel
	m        *Mat
	x        []float32
	n        int
	y        []float32
	scratch  [][]float32
	q        *qbatch // the quantized X when k.qx != qNone
	bscratch [][]byte
}

func (t *matmulTask) Run(lo, hi, worker int) {
	m, c, rows := t.m, t.m.Cols, t.m.Rows
	if t.q != nil && t.k.qmm != nil {
		t.k.qmm(m, lo, hi, t.q, t.y, &t.bscratch[worker])
		return
	}
	if t.q != nil {
		// Four weight rows stay in L1 while every position passes by.
		for r := lo; r < hi; r += 4 {
			r1 := min(r+4, hi)
			for j := range t.n {
				t.k.qrows(m, r, r1, t.q.pos(j), t.y[j*rows:(j+1)*rows])
			}
		}
		return
	}
	buf := t.scratch[worker][:4*c]
	w0, w1, w2, w3 := buf[:c], buf[c:2*c], buf[2*c:3*c], buf[3*c:]
	for j0 := 0; j0 < t.n; j0 += matmulTile {
		j1 := min(j0+matmulTile, t.n)
		r := lo
		for ; r+4 <= hi; r += 4 {
			p0 := t.k.decode(m, r, w0)
			p1 := t.k.decode(m, r+1, w1)
			p2 := t.k.decode(m, r+2, w2)
			p3 := t.k.decode(m, r+3, w3)
			for j := j0; j < j1; j++ {
				a, b, cc, d := dot4f(w0, w1, w2, w3, t.x[j*c:(j+1)*c])
				yr := t.y[j*rows+r : j*rows+r+4 : j*rows+r+4]
				yr[0], yr[1], yr[2], yr[3] = a*p0, b*p1, cc*p2, d*p3
			}
		}
		for ; r < hi; r++ {
			p0 := t.k.decode(m, r, w0)
			for j := j0; j < j1; j++ {
				t.y[j*rows+r] = Dot(w0, t.x[j*c:(j+1)*c]) * p0
			}
		}
	}
}
