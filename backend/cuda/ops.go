package cuda

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/quant"
)

// runner is what a step needs of the device: the GPU (gpuRunner) or, in
// the CPU tests, a fake that checks every launch against the manifest and
// every pointer against the allocations it handed out.
type runner interface {
	memInfo() (free, total int64, err error)
	alloc(n int64) (driver.DevicePtr, error)
	free(p driver.DevicePtr) error
	// launch queues kernel name on the step's stream.
	launch(name string, cfg driver.Config, a *driver.Args) error
	// sync waits for the step's stream.
	sync() error
	// stage is the pinned staging memory; htod and dtoh queue copies
	// between it and device memory on the step's stream.
	stage() []byte
	htod(dst driver.DevicePtr, off, n int) error
	dtoh(off int, src driver.DevicePtr, n int) error
	dtod(dst, src driver.DevicePtr, n int64) error
	// zero queues n zero bytes at p on the step's stream.
	zero(p driver.DevicePtr, n int64) error
	beginCapture() error
	endCapture() (driver.GraphExec, error) // the instantiated graph
	graphLaunch(g driver.GraphExec) error
	destroyGraph(g driver.GraphExec) error
	// profStart marks a step's start and profEnd collects its kernel
	// times after the final sync (with Options.Profile; no-ops otherwise).
	profStart() error
	profEnd() error
	// record records timing event i (created on first use) on the
	// step's stream; since returns the milliseconds from event i to j,
	// both recorded and completed (after sync).
	record(i int) error
	since(i, j int) (float32, error)
	// side(true) makes the side stream wait for the step's stream here
	// and routes later launches to it, side(false) routes them back to the
	// step's stream; join makes the step's stream wait for the work queued
	// on the side stream so far (the shared expert's branch: Options.NoBranch).
	side(on bool) error
	join() error
}

// gpuRunner runs a step on the device's stream.
type gpuRunner struct {
	c *driver.Ctx
	d *Device
}

func (g gpuRunner) memInfo() (free, total int64, err error) { return g.c.MemInfo() }
func (g gpuRunner) alloc(n int64) (driver.DevicePtr, error) { return g.c.Alloc(n) }
func (g gpuRunner) free(p driver.DevicePtr) error           { return g.c.Free(p) }
func (g gpuRunner) launch(name string, cfg driver.Config, a *driver.Args) error {
	// PDL for steps of at most Options.PDLRows rows: in a prefill step the
	// next GEMM's early blocks would hold multiprocessors the current one
	// needs (measured: pp512 1531 vs 1830 tok/s on an H200; tg128 308 vs 280).
	cfg.Stream, cfg.PDL = g.d.strm, g.d.opt.PDL && g.d.st != nil && g.d.st.rows <= max(g.d.opt.PDLRows, 1)
	if g.d.onSide {
		cfg.Stream = g.d.side
	}
	if cfg.Shared > 0 && g.d.optin[name] < cfg.Shared {
		// Dynamic and static shared memory beyond 48 KB together need the
		// kernel's opt-in; static sizes reach 17 KB (mv_moe_*'s expert
		// table), so any dynamic size asks for it (once a kernel and size).
		fn, err := g.d.mod.Func(name)
		if err != nil {
			return err
		}
		if err := g.c.SetMaxDynamicShared(fn, cfg.Shared); err != nil {
			return fmt.Errorf("cuda: %s: %w", name, err)
		}
		if g.d.optin == nil {
			g.d.optin = map[string]int{}
		}
		g.d.optin[name] = cfg.Shared
	}
	if err := g.d.mod.Launch(g.c, name, cfg, a); err != nil {
		return err
	}
	if g.d.prof != nil {
		return g.d.prof.mark(g.c, g.d.strm, name)
	}
	return nil
}
func (g gpuRunner) profStart() error {
	if g.d.prof == nil {
		return nil
	}
	g.d.prof.skip = g.d.prof.rows > 0 && (g.d.st == nil || g.d.st.rows != g.d.prof.rows)
	return g.d.prof.mark(g.c, g.d.strm, "")
}
func (g gpuRunner) profEnd() error {
	if g.d.prof == nil {
		return nil
	}
	return g.d.prof.collect(g.c)
}
func (g gpuRunner) side(on bool) error {
	g.d.onSide = on
	if !on {
		return nil
	}
	if err := g.c.Record(g.d.forkEv, g.d.strm); err != nil {
		return err
	}
	return g.c.WaitEvent(g.d.side, g.d.forkEv)
}
func (g gpuRunner) join() error {
	if err := g.c.Record(g.d.joinEv, g.d.side); err != nil {
		return err
	}
	return g.c.WaitEvent(g.d.strm, g.d.joinEv)
}
func (g gpuRunner) sync() error   { return g.c.StreamSync(g.d.strm) }
func (g gpuRunner) stage() []byte { return g.d.stage.Bytes() }
func (g gpuRunner) htod(dst driver.DevicePtr, off, n int) error {
	return g.c.HtoDAsync(dst, g.d.stage, off, n, g.d.strm)
}
func (g gpuRunner) dtoh(off int, src driver.DevicePtr, n int) error {
	return g.c.DtoHAsync(g.d.stage, off, src, n, g.d.strm)
}
func (g gpuRunner) dtod(dst, src driver.DevicePtr, n int64) error {
	return g.c.DtoDAsync(dst, src, n, g.d.strm)
}
func (g gpuRunner) zero(p driver.DevicePtr, n int64) error {
	return g.c.MemsetD8Async(p, 0, n, g.d.strm)
}
func (g gpuRunner) beginCapture() error {
	return g.c.BeginCapture(g.d.strm, driver.CaptureThreadLocal)
}
func (g gpuRunner) endCapture() (driver.GraphExec, error) {
	gr, err := g.c.EndCapture(g.d.strm)
	if err != nil {
		return 0, err
	}
	exec, err := g.c.Instantiate(gr)
	g.c.DestroyGraph(gr)
	return exec, err
}
func (g gpuRunner) graphLaunch(e driver.GraphExec) error  { return g.c.GraphLaunch(e, g.d.strm) }
func (g gpuRunner) destroyGraph(e driver.GraphExec) error { return g.c.DestroyGraphExec(e) }
func (g gpuRunner) record(i int) error {
	for len(g.d.events) <= i {
		e, err := g.c.NewEvent(0)
		if err != nil {
			return err
		}
		g.d.events = append(g.d.events, e)
	}
	return g.c.Record(g.d.events[i], g.d.strm)
}
func (g gpuRunner) since(i, j int) (float32, error) {
	if i >= len(g.d.events) || j >= len(g.d.events) {
		return 0, fmt.Errorf("cuda: timing events %d and %d: only %d recorded", i, j, len(g.d.events))
	}
	return g.c.Elapsed(g.d.events[i], g.d.events[j])
}

// Step modes: run the kernels, record them into a graph, or only pack
// them (to compare with a graph's recording before replaying it).
const (
	modeRun = iota
	modeCapture
	modeCheck
)

// state is the device-side run state of the steps: named scratch buffers
// grown to the largest step seen and the staged per-step inputs.
type state struct {
	d    *Device
	r    runner
	b    *backend.Batch
	err  error
	rows int
	last []int // per sequence: its last row
	args driver.Args

	bufs map[string]devBuf
	in   driver.DevicePtr // ids | pos | slot, int32 [MaxRows] each
	H    int              // residual width (set by Embed)

	out     driver.DevicePtr // the step's logits (set by Head)
	outN    int              // floats of them
	next    driver.DevicePtr // the step's greedy ids (Batch.Next; set by Head)
	nextN   int              // ids of them
	rowsOf  driver.DevicePtr // with next: the logits rows Batch.LogitsOf copies from
	vocab   int              // their width
	mode    int
	dynamic bool // the step used dynamic RoPE (never captured)
	stale   bool // modeCheck: a buffer would have to grow (no replay)
	dynOf   *ropeTab
	dynInv  driver.DevicePtr
	dynMS   []float32 // per sequence: the mscale of its frequencies
	// sig is the step's launches as packed (names, shapes, argument
	// bytes, copies): everything a captured graph bakes in. A graph is
	// replayed only for a step whose signature equals its recording's.
	sig []byte
	// timeKernels: modeRun launches are each put between timing events
	// 2+2k and 3+2k (StepTimer); timed counts them.
	timeKernels bool
	timed       int
	// actq is the last activation quantization (gemmq_actq) st.mv queued:
	// a following int8 GEMM over the same rows of the same input reuses its
	// quants (q, k, v of one input; gate and up). Any other launch or copy
	// may write that input, so it clears ok (st.launch, st.copyD).
	actq   actqKey
	inGEMM bool // st.mv is queuing its GEMM launches (they keep actq)
	// partMemo: partRows by (attn_tiles?, kv heads).
	partMemo map[[2]int]int
	// embedRows is the embedding table's rows (set by Embed).
	embedRows int
}

type actqKey struct {
	x, xq, xd             driver.DevicePtr
	ldx, cols, rows, perm int
	pro                   actPro // the prologue gemmq_actq_pro applied
	ok                    bool
}

// graphKey identifies the steps one captured graph may serve: decode
// steps (one token per sequence) of the same number of rows and logits
// kind. Ids, positions, slots and lengths are read by the kernels from
// the staged inputs; everything else is in the graph's signature.
type graphKey struct {
	rows   int
	logits backend.Logits
	next   bool // greedy ids picked on the device (Batch.Next)
}

type graph struct {
	exec driver.GraphExec
	sig  []byte
	H    int
	out  driver.DevicePtr
	outN int
}

type devBuf struct {
	p driver.DevicePtr
	n int64
}

// scratchBytes bounds a step's scratch for maxRows rows of width at most
// widest floats: the staged inputs; x, xb, xlast, qkv, att, gate|up, h,
// xs, logits and the dynamic-RoPE frequencies (each at most maxRows ×
// widest floats); the int8 GEMM's quants and scales (unless Options.NoMMQ: 1.125
// bytes an element, counted as 2); the attention partials (attnPartRows rows of at most
// widest + 2·heads floats, bounded by 2·widest, for the larger of the two
// kernels' split counts) and attn_tiles' counters; a Gated DeltaNet layer's
// projections, conv output and rule output, and the chunked rule's scratch.
func scratchBytes(maxRows, widest int, spec backend.SeqSpec, sms int, mmq bool) int64 {
	M, w := int64(maxRows), int64(widest)
	parts := max(attnPartRows(sms, spec.KVHeads, maxRows, attnSplits), attnPartRows(sms, spec.KVHeads, maxRows, kern.AttnTilesSplits))
	n := 12*M + 4*M*w*10 + 4*int64(parts)*w*2 + 4*M*int64(max(spec.KVHeads, 1))
	if mmq {
		n += 2 * M * w
	}
	if len(spec.DeltaNet) > 0 {
		// dn_proj, dn_conv, dn_o (hybrid.go), and dn_chunk (the chunked
		// rule's scratch) where its kernels take the heads.
		g := spec.DeltaNetShape
		kd, vd, cd := g.Dims()
		n += 4 * M * int64(2*kd+2*vd+2*g.ValueHeads+cd+vd)
		if k := (kern.DeltaNet{KeyHeads: g.KeyHeads, ValueHeads: g.ValueHeads, KeyDim: g.KeyDim, ValueDim: g.ValueDim}); k.ChunkFits() {
			n += k.ChunkScratch(maxRows)
		}
	}
	if e := spec.MoE; e.Experts > 0 && e.TopK > 0 {
		n += moeScratchBytes(M, w, e)
	}
	return n
}

// moeScratchBytes bounds the mixture-of-experts block's scratch (hybrid.go)
// for M rows of width at most w: the router logits, ids and weights, the
// per-slot gate|up and down outputs, the shared expert's buffers, and the
// grouped path's sorted rows (kern.MoETiles tiles of kern.MoETile: their
// gate|up and down outputs, int8 quants and scales, the sort's maps) with
// the rows' own quants.
func moeScratchBytes(M, w int64, e backend.MoEShape) int64 {
	E, k, I, S := int64(e.Experts), int64(e.TopK), int64(e.Inter), int64(e.SharedInter)
	n := 4*M*E + 8*M*k + 4*M*k*(2*I+w)
	if S > 0 {
		n += 4*M*(3*S) + 4*M*w + 4*M
	}
	rows := int64(kern.MoETiles(int(M*k), int(E))) * kern.MoETile
	wq := max(w, I)
	n += 4*rows*(2*I+w) + rows*wq + 4*rows*(wq/32+1) // gu, y; quants and scales
	n += 4*rows + 4*M*k + 4*rows/kern.MoETile        // perm, inv, tiles
	n += M*w + 4*M*(w/32+1)                          // the rows' own quants
	return n
}

// buf returns the named scratch buffer of at least n bytes. A buffer
// grows only when no graph is being recorded; the old one is freed after
// the stream's queued work (which may read it) has finished.
func (st *state) buf(name string, n int64) driver.DevicePtr {
	if st.err != nil {
		return 0
	}
	if b, ok := st.bufs[name]; ok && b.n >= n {
		return b.p
	}
	switch st.mode {
	case modeCapture:
		st.fail(fmt.Errorf("cuda: scratch %s would grow while recording a graph", name))
		return 0
	case modeCheck:
		st.stale = true
		return 0
	}
	if b, ok := st.bufs[name]; ok {
		if err := st.r.sync(); err != nil {
			st.fail(err)
			return 0
		}
		if err := st.r.free(b.p); err != nil {
			st.fail(err)
			return 0
		}
		delete(st.bufs, name)
	}
	p, err := st.r.alloc(n)
	if err != nil {
		st.fail(fmt.Errorf("cuda: scratch %s of %d bytes: %w", name, n, err))
		return 0
	}
	st.bufs[name] = devBuf{p, n}
	return p
}

// bufZeroed is buf for scratch that must start as zeros (attn_tiles'
// counters, which the kernel itself returns to zero): a new allocation is
// cleared on the step's stream before its first use.
func (st *state) bufZeroed(name string, n int64) driver.DevicePtr {
	b, had := st.bufs[name]
	p := st.buf(name, n)
	if st.err != nil || p == 0 || (had && b.p == p) {
		return p
	}
	if err := st.r.zero(p, n); err != nil {
		st.fail(fmt.Errorf("cuda: clearing scratch %s: %w", name, err))
		return 0
	}
	return p
}

func (st *state) fail(err error) {
	if st.err == nil {
		st.err = err
	}
}

func (st *state) sigAppend(vals ...uint64) {
	for _, v := range vals {
		st.sig = binary.LittleEndian.AppendUint64(st.sig, v)
	}
}

// launch runs a kernel with the packed arguments on the device's stream
// (in modeCheck it only records it).
func (st *state) launch(name string, grid, block driver.Dim3, shared int) {
	if st.err != nil {
		return
	}
	if err := st.args.Err(); err != nil {
		st.fail(fmt.Errorf("cuda: %s: %w", name, err))
		return
	}
	if !st.inGEMM {
		st.actq.ok = false
	}
	st.sig = append(st.sig, name...)
	st.sigAppend(uint64(grid.X), uint64(grid.Y), uint64(grid.Z), uint64(block.X), uint64(block.Y), uint64(block.Z), uint64(shared))
	st.sig = append(st.sig, st.args.Bytes()...)
	if st.mode == modeCheck {
		return
	}
	cfg := driver.Config{Grid: grid, Block: block, Shared: shared}
	timed := st.timeKernels && st.mode == modeRun
	if timed {
		if err := st.r.record(2 + 2*st.timed); err != nil {
			st.fail(fmt.Errorf("cuda: timing %s: %w", name, err))
			return
		}
	}
	if err := st.r.launch(name, cfg, &st.args); err != nil {
		st.fail(err)
		return
	}
	if timed {
		if err := st.r.record(3 + 2*st.timed); err != nil {
			st.fail(fmt.Errorf("cuda: timing %s: %w", name, err))
			return
		}
		st.timed++
	}
	if st.d.opt.Eager && st.mode == modeRun {
		if err := st.r.sync(); err != nil {
			st.fail(fmt.Errorf("cuda: %s: %w", name, err))
		}
	}
}

// fork, unfork and join place launches on the side stream beside the
// step's (the shared expert's branch: Options.NoBranch): fork where they may start (later launches go
// to the side stream), unfork where the step's own launches resume, join
// where the step's later launches need the side's done. All three are
// part of the step's signature, so a replay compares them too.
func (st *state) fork()   { st.branch("fork", func() error { return st.r.side(true) }) }
func (st *state) unfork() { st.branch("unfork", func() error { return st.r.side(false) }) }
func (st *state) join()   { st.branch("join", st.r.join) }

func (st *state) branch(what string, f func() error) {
	if st.err != nil {
		return
	}
	st.actq.ok = false
	st.sig = append(st.sig, what...)
	if st.mode == modeCheck {
		return
	}
	if err := f(); err != nil {
		st.fail(fmt.Errorf("cuda: %s: %w", what, err))
	}
}

// copyD queues a device-to-device copy of n bytes.
func (st *state) copyD(dst, src driver.DevicePtr, n int64) {
	if st.err != nil {
		return
	}
	st.actq.ok = false
	st.sig = append(st.sig, "dtod"...)
	st.sigAppend(uint64(dst), uint64(src), uint64(n))
	if st.mode == modeCheck {
		return
	}
	if err := st.r.dtod(dst, src, n); err != nil {
		st.fail(err)
	}
}

func (st *state) a() *driver.Args { return st.args.Reset() }

// begin resets the per-step state for a pass of step in mode.
func (st *state) begin(mode int) {
	st.mode, st.err, st.dynamic, st.stale, st.dynOf = mode, nil, false, false, nil
	st.actq = actqKey{}
	st.outN, st.out, st.sig = 0, 0, st.sig[:0]
	st.next, st.nextN, st.rowsOf, st.vocab = 0, 0, 0, 0
}

// Run runs step over b's rows on the GPU.
func (d *Device) Run(b *backend.Batch, step func(backend.Ops)) error {
	if err := d.check(b); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	t0 := time.Now()
	d.hostTimed = false
	err := d.do(func(r runner) error { return d.runStep(r, b, step) })
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if d.hostTimed {
		d.timing.HostRun += time.Since(t0)
		d.hostTimed = false
	}
	for i, s := range b.Seqs {
		s.(*seq).n += len(b.Tokens[i])
	}
	return nil
}

// check validates a batch against the device and its sequences.
func (d *Device) check(b *backend.Batch) error {
	if len(b.Seqs) != len(b.Tokens) {
		return fmt.Errorf("cuda: %d sequences but %d token lists", len(b.Seqs), len(b.Tokens))
	}
	if b.RopeLen != nil && len(b.RopeLen) != len(b.Seqs) {
		return fmt.Errorf("cuda: %d RoPE lengths for %d sequences", len(b.RopeLen), len(b.Seqs))
	}
	if b.Logits < backend.NoLogits || b.Logits > backend.AllLogits {
		return fmt.Errorf("cuda: unknown logits kind %d", b.Logits)
	}
	rows := b.Rows()
	if rows > d.opt.MaxRows {
		return fmt.Errorf("cuda: a step of %d rows exceeds the %d the device was opened for", rows, d.opt.MaxRows)
	}
	seen := map[*seq]bool{}
	for i, s := range b.Seqs {
		c, ok := s.(*seq)
		if !ok || c.d != d || c.slot < 0 {
			return fmt.Errorf("cuda: sequence %d is not a live sequence of this device", i)
		}
		if seen[c] {
			return fmt.Errorf("cuda: sequence %d appears twice in one step", i)
		}
		seen[c] = true
		if n := len(b.Tokens[i]); n == 0 || c.n+n > c.ctx {
			return fmt.Errorf("cuda: sequence %d: %d tokens at position %d, context %d", i, n, c.n, c.ctx)
		}
	}
	return nil
}

// runStep stages the inputs, runs step (a graph replay when a decode
// step's launches equal a recorded graph's) and copies the logits back.
func (d *Device) runStep(r runner, b *backend.Batch, step func(backend.Ops)) error {
	if d.st == nil {
		d.st = &state{d: d, bufs: map[string]devBuf{}}
	}
	st := d.st
	st.r, st.b, st.rows = r, b, b.Rows()
	// A step that failed between a fork and its unfork left launches
	// routed to the side stream: every step starts on its own stream.
	d.onSide = false
	defer func() { st.r, st.b = nil, nil }()
	st.last = st.last[:0]
	// Stage ids, positions and slots: one host-to-device copy. The stage
	// is free: the previous step ended with a sync after its last copy.
	stage := r.stage()
	M := d.opt.MaxRows
	row := 0
	for i, toks := range b.Tokens {
		s := b.Seqs[i].(*seq)
		for t, tok := range toks {
			binary.LittleEndian.PutUint32(stage[4*row:], uint32(int32(tok)))
			binary.LittleEndian.PutUint32(stage[4*(M+row):], uint32(int32(s.n+t)))
			binary.LittleEndian.PutUint32(stage[4*(2*M+row):], uint32(int32(s.slot)))
			row++
		}
		st.last = append(st.last, row-1)
	}
	st.begin(modeRun)
	st.in = st.buf("inputs", int64(12*M))
	if st.err != nil {
		return st.err
	}
	if err := r.htod(st.in, 0, 12*M); err != nil {
		return err
	}
	if err := r.profStart(); err != nil {
		return err
	}
	key := graphKey{rows: st.rows, logits: b.Logits, next: b.Next != nil}
	decode := st.rows == len(b.Seqs)
	graphs := decode && d.opt.Graphs && !d.opt.Eager
	// StepTimer: the first decode step runs eagerly, kernel by kernel
	// between events; later decode steps are timed whole (events 0, 1).
	timeKernels := d.timing != nil && decode && d.timing.Kernels == 0
	timeStep := d.timing != nil && decode && !timeKernels
	replayed := false
	if g, ok := d.graphs[key]; ok && graphs && !timeKernels {
		// Pack the step without launching it: replay only if it equals
		// the recording (same weights, buffers, shapes and scalars), or,
		// when the caller vouches for its step (Batch.Step), if it is the
		// step last replayed with nothing on the device changed since.
		t0 := time.Now()
		same := !d.opt.CheckEveryStep && d.memo.matches(key, b, d.gen.Load())
		if same {
			st.begin(modeCheck)
			same = d.memo.restore(st)
		}
		if !same {
			st.begin(modeCheck)
			step(st)
			if st.err != nil {
				return st.err
			}
		}
		if timeStep {
			d.timing.HostCheck += time.Since(t0)
		}
		if same || !st.dynamic && !st.stale && bytes.Equal(st.sig, g.sig) {
			if !same {
				d.memo = newReplayMemo(key, b, d.gen.Load(), st)
			} else {
				d.unchecked++
				if timeStep {
					d.timing.Unchecked++
				}
			}
			if timeStep {
				if err := r.record(0); err != nil {
					return err
				}
			}
			if err := r.graphLaunch(g.exec); err != nil {
				return err
			}
			if timeStep {
				if err := r.record(1); err != nil {
					return err
				}
			}
			d.replays++
			replayed = true
		}
	}
	if !replayed {
		// An eager step may grow scratch buffers (and re-records its
		// graph): the next replay packs its step again.
		d.gen.Add(1)
		st.begin(modeRun)
		if timeStep {
			if err := r.record(0); err != nil {
				return err
			}
		}
		st.timeKernels, st.timed = timeKernels, 0
		step(st)
		st.timeKernels = false
		if st.err != nil {
			return st.err
		}
		if timeStep {
			if err := r.record(1); err != nil {
				return err
			}
		}
		if graphs && !st.dynamic {
			// The step ran eagerly with these shapes (its scratch is
			// sized); record it for the next steps of this shape.
			if err := d.capture(st, key, step); err != nil {
				return err
			}
		}
	}
	tWait := time.Now()
	if timeStep {
		defer func() { d.timing.HostWait += time.Since(tWait) }()
		d.hostTimed = true
	}
	if st.outN > 0 {
		if err := st.copyLogits(); err != nil {
			return err
		}
	}
	if st.nextN > 0 {
		if err := r.dtoh(0, st.next, 4*st.nextN); err != nil {
			return err
		}
		if err := r.sync(); err != nil {
			return err
		}
		copy(b.Next[:st.nextN], unsafe.Slice((*int32)(unsafe.Pointer(&r.stage()[0])), st.nextN))
		if err := st.copyRows(); err != nil {
			return err
		}
	}
	if err := r.sync(); err != nil {
		return err
	}
	if err := r.profEnd(); err != nil {
		return err
	}
	if timeStep || timeKernels {
		return d.collectTimes(r, timeStep, replayed, timeKernels, st.timed)
	}
	return nil
}

// collectTimes adds a completed step's event times to d.timing: the step
// whole (events 0 and 1) and/or its n kernels one by one.
func (d *Device) collectTimes(r runner, whole, graph, kernels bool, n int) error {
	ms := func(i, j int) (time.Duration, error) {
		v, err := r.since(i, j)
		if err != nil {
			return 0, fmt.Errorf("cuda: step timing: %w", err)
		}
		return time.Duration(float64(v) * float64(time.Millisecond)), nil
	}
	if whole {
		t, err := ms(0, 1)
		if err != nil {
			return err
		}
		d.timing.Steps++
		d.timing.StepTime += t
		if graph {
			d.timing.Graphs++
		}
	}
	if kernels && n > 0 {
		var sum time.Duration
		for k := range n {
			t, err := ms(2+2*k, 3+2*k)
			if err != nil {
				return err
			}
			sum += t
		}
		d.timing.Kernels, d.timing.KernelTime = n, sum
	}
	return nil
}

// TimeSteps starts (discarding earlier figures) or stops timing decode
// steps on the device (backend.StepTimer): while on, the first decode step
// runs eagerly with each kernel between a pair of events (not replayed
// from a graph), and every later decode step is timed whole by an event
// pair around its launches: the replayed graph, or the eager launches
// where there is none. Copies inside a step are not kernels: their time
// counts as gaps.
func (d *Device) TimeSteps(on bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.timing = nil
	if on {
		d.timing = &backend.StepTimes{}
	}
}

// StepTimes returns what was measured since TimeSteps(true).
func (d *Device) StepTimes() backend.StepTimes {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timing == nil {
		return backend.StepTimes{}
	}
	return *d.timing
}

// capture records step on the device's stream as the graph for key.
func (d *Device) capture(st *state, key graphKey, step func(backend.Ops)) error {
	r := st.r
	// The eager step must finish before recording starts on its stream.
	if err := r.sync(); err != nil {
		return err
	}
	H, out, outN := st.H, st.out, st.outN
	if err := r.beginCapture(); err != nil {
		return err
	}
	st.begin(modeCapture)
	step(st)
	st.mode = modeRun
	exec, err := r.endCapture()
	if st.err != nil {
		if err == nil {
			r.destroyGraph(exec)
		}
		return st.err
	}
	if err != nil {
		return err
	}
	if st.H != H || st.out != out || st.outN != outN {
		r.destroyGraph(exec)
		return fmt.Errorf("cuda: the recorded step differs from the eager one (logits at %#x/%d, then %#x/%d)", out, outN, st.out, st.outN)
	}
	if d.graphs == nil {
		d.graphs = map[graphKey]graph{}
	}
	if old, ok := d.graphs[key]; ok {
		if err := r.destroyGraph(old.exec); err != nil {
			return err
		}
	}
	d.graphs[key] = graph{exec: exec, sig: bytes.Clone(st.sig), H: st.H, out: st.out, outN: st.outN}
	return nil
}

// Replays returns how many steps ran as a replayed graph.
func (d *Device) Replays() int { return d.replays }

// Unchecked returns how many of those replayed without packing the step
// again (the last checked replay's step and shape, Batch.Step).
func (d *Device) Unchecked() int { return d.unchecked }

func (st *state) ids() driver.DevicePtr  { return st.in }
func (st *state) pos() driver.DevicePtr  { return st.in.Add(int64(4 * st.d.opt.MaxRows)) }
func (st *state) slot() driver.DevicePtr { return st.in.Add(int64(8 * st.d.opt.MaxRows)) }

func ptrOf(v backend.Vec) driver.DevicePtr {
	if v == nil {
		return 0
	}
	return v.(*vec).p
}

// Embed gathers the tokens' embedding rows into x. A token outside the
// table is an error (as on the CPU; the kernel would write zeros).
func (st *state) Embed(table backend.Mat) {
	if st.err != nil {
		return
	}
	m := table.(*mat)
	f, err := kernelFormat(m.dt)
	if err != nil {
		st.fail(err)
		return
	}
	if m.dt == quant.Q82F {
		f = "q82f"
	}
	for _, toks := range st.b.Tokens {
		for _, tok := range toks {
			if tok < 0 || tok >= m.rows {
				st.fail(fmt.Errorf("cuda: token %d outside the %d-row embedding table", tok, m.rows))
				return
			}
		}
	}
	st.H, st.embedRows = m.cols, m.rows
	x := st.buf("x", int64(st.d.opt.MaxRows)*int64(m.cols)*4)
	st.a().Ptr(m.p).Int(m.rows).Int(m.cols).Ptr(st.ids()).Ptr(x).Int(m.cols)
	st.launch("embed_"+f, driver.D1(st.rows), driver.D1(256), 0)
}

// rmsnorm writes norm(x[r]) to y[r] for n rows of width H.
func (st *state) rmsnorm(x driver.DevicePtr, y driver.DevicePtr, rows, H int, n *backend.Norm) {
	if n.W == nil || n.W.Len() != H {
		st.fail(fmt.Errorf("cuda: a norm over %d values needs a weight of %d", H, H))
		return
	}
	st.a().Ptr(x).Int(H).Ptr(ptrOf(n.W)).Ptr(y).Int(H).Int(H).F32(n.Eps).Int(b2i(n.OnePlus))
	st.launch("rmsnorm", driver.D1(rows), driver.D1(256), 0)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// maxMatvecRows is the most activation rows one mv_* launch serves.
const maxMatvecRows = 8

// mv computes y[r] (=|+=) m·x[r] (+ bias) for rows activation rows: the
// batched matvec up to 8 rows (each weight read once for all rows), the
// tensor-core GEMM above that for quantized weights (prefill chunks).
func (st *state) mv(m *mat, x driver.DevicePtr, ldx int, y driver.DevicePtr, ldy int, bias driver.DevicePtr, accumulate bool, rows int) {
	if st.err != nil {
		return
	}
	f, err := kernelFormat(m.dt)
	if err != nil {
		st.fail(err)
		return
	}
	if m.dt == quant.Q82F {
		// Activations prescaled by the column field, then q8_row's kernel.
		xs := st.buf("xs", int64(st.d.opt.MaxRows)*int64(m.cols)*4)
		st.a().Ptr(m.p).I64(m.colOff).Int(m.cols).Ptr(x).Int(ldx).Ptr(xs).Int(m.cols)
		st.launch("q82f_prescale", driver.D2((m.cols+255)/256, rows), driver.D1(256), 0)
		x, ldx = xs, m.cols
	}
	if rows > maxMatvecRows && m.dt != quant.F32 && m.dt != quant.F16 && m.dt != quant.BF16 {
		// Prefill over quantized weights: the tensor-core GEMM (bf16
		// activations, exact int8 weights, f32 accumulation: within the
		// formats' own error). Float weights keep the exact f32 matvec.
		// By default (not Options.NoMMQ): the int8 GEMM, on activations
		// quantized into scratch first.
		if !st.d.opt.NoMMQ && kern.GemmQSupported(m.dt, m.p, m.cols) {
			st.gemmq(kern.GemmQ{W: m.p, Rows: m.rows, Cols: m.cols, X: x, Ldx: ldx, Y: y, Ldy: ldy, Bias: bias, Accumulate: accumulate}, m.dt, rows)
			return
		}
		st.a().Ptr(m.p).Int(m.rows).Int(m.cols).Ptr(x).Int(ldx).Ptr(y).Int(ldy).Int(rows).Ptr(bias).Int(b2i(accumulate))
		name, grid, block := kern.GemmKernel(f, m.rows, rows)
		st.launch(name, grid, block, 0)
		return
	}
	if m.dt == quant.Q8Row || m.dt == quant.Q82F || m.dt == quant.Q4TP {
		st.mq(m.dt, kern.MQ{W: [3]driver.DevicePtr{m.p}, Rows: [3]int{m.rows}, Bias: [3]driver.DevicePtr{bias}, Cols: m.cols,
			X: x, Ldx: ldx, Y: y, Ldy: ldy, Accumulate: accumulate}, rows)
		return
	}
	if rows > maxMatvecRows {
		// Float weights over many rows (a float32 router over a prefill
		// chunk): the float32-exact product, the weights read once a tile
		// rather than once every 8 rows.
		st.a().Ptr(m.p).Int(m.rows).Int(m.cols).Ptr(x).Int(ldx).Ptr(y).Int(ldy).Int(rows).Ptr(bias).Int(b2i(accumulate))
		name, grid, block := kern.FloatMatmulLaunch(m.dt, m.rows, rows, st.d.info.SMs)
		st.launch(name, grid, block, 0)
		return
	}
	name, cfg, err := kern.MatvecLaunch(m.dt, m.rows, m.cols, rows, st.d.info.SMs)
	if err != nil {
		st.fail(fmt.Errorf("cuda: %w", err))
		return
	}
	st.a().Ptr(m.p).Int(m.rows).Int(m.cols).Ptr(x).Int(ldx).Ptr(y).Int(ldy).Ptr(bias).Int(b2i(accumulate))
	st.launch(name, cfg.Grid, cfg.Block, cfg.Shared)
}

// actPro is a prologue gemmq_actq_pro applies to the GEMM's input before
// quantizing it: kern.ProNorm / ProNorm1 (RMSNorm by w, eps), ProSilu
// (silu(x)·u, u at the input's stride); the zero value is none.
type actPro struct {
	kind int
	u, w driver.DevicePtr
	eps  float32
}

// proFusable reports whether a step's GEMM over ms can take its input's
// RMSNorm or SwiGLU in its activation quantizer (gemmq_actq_pro, or
// gemmh_acth for the half wide tiles): the stacked wide tiles' steps
// (stackable).
func (st *state) proFusable(rows int, ms ...backend.Mat) bool { return st.stackable(rows, ms...) }

// normPro is the gemmq_actq_pro prologue of norm n over H values.
func (st *state) normPro(n *backend.Norm, H int) actPro {
	if n.W == nil || n.W.Len() != H {
		st.fail(fmt.Errorf("cuda: a norm over %d values needs a weight of %d", H, H))
		return actPro{}
	}
	k := kern.ProNorm
	if n.OnePlus {
		k = kern.ProNorm1
	}
	return actPro{kind: k, w: ptrOf(n.W), eps: n.Eps}
}

// gemmq queues the int8 GEMM g (its tensors of format dt) over rows
// activation rows: gemmq_actq into scratch unless the last one quantized
// the same rows of the same input in the same order (q, k, v of one
// input; gate and up), then the tile kern.GemmQSuffix picks.
func (st *state) gemmq(g kern.GemmQ, dt quant.DType, rows int) { st.gemmqPro(g, dt, rows, actPro{}) }

// gemmqPro is gemmq with the input's prologue pro done by the quantizer
// (gemmq_actq_pro, gemmh_acth).
func (st *state) gemmqPro(g kern.GemmQ, dt quant.DType, rows int, pro actPro) {
	f, err := kernelFormat(dt)
	if err != nil {
		st.fail(err)
		return
	}
	suffix := g.Suffix(f, rows)
	// The quantizer and the GEMM: the int8 tiles, or for q4tp with
	// Options.F16Wide the half wide tiles (their activations in f16; perm
	// -1 keeps the two apart in the sharing key).
	g.F16 = st.halfGEMM(dt, rows)
	var key actqKey
	var name string
	var gcfg driver.Config
	if g.F16 {
		g.Quants = st.buf("xh16", kern.GemmHScratch(g.Cols, st.d.opt.MaxRows))
		key = actqKey{x: g.X, xq: g.Quants, ldx: g.Ldx, cols: g.Cols, rows: rows, perm: -1, pro: pro, ok: true}
		name, gcfg, err = g.HalfLaunch(kern.GemmHSuffix(g.StackedRows(), g.Cols, rows), rows)
	} else if g.SwiGLU != 0 {
		err = fmt.Errorf("a SwiGLU epilogue on the int8 tiles")
	} else {
		nq, ns := kern.GemmQScratch(g.Cols, st.d.opt.MaxRows)
		g.Quants, g.Scales = st.buf("xq", nq), st.buf("xqd", ns)
		key = actqKey{x: g.X, xq: g.Quants, xd: g.Scales, ldx: g.Ldx, cols: g.Cols, rows: rows, perm: kern.GemmQPerm(f, suffix), pro: pro, ok: true}
		name, gcfg, err = g.Launch(f, suffix, rows)
	}
	if err != nil {
		st.fail(fmt.Errorf("cuda: %w", err))
		return
	}
	wide := kern.WideParams(suffix)
	if len(g.More) > 0 && !wide {
		st.fail(fmt.Errorf("cuda: stacked int8 GEMM on tile %s", name))
		return
	}
	st.inGEMM = true
	defer func() { st.inGEMM = false }()
	if st.actq != key {
		qname := "gemmq_actq"
		switch {
		case g.F16:
			qname = "gemmh_acth"
			g.PackF16(st.a(), pro.kind, pro.u, pro.w, pro.eps)
		case pro.kind != 0:
			qname = "gemmq_actq_pro"
			g.PackQuantPro(st.a(), key.perm, pro.kind, pro.u, pro.w, pro.eps)
		default:
			g.PackQuant(st.a(), key.perm)
		}
		cfg := kern.ActProLaunch(g.Cols, rows, pro.kind)
		st.launch(qname, cfg.Grid, cfg.Block, 0)
	}
	switch {
	case g.F16:
		g.PackWideF16(st.a(), rows)
	case wide:
		g.PackWide(st.a(), rows)
	default:
		g.Pack(st.a(), rows)
	}
	st.launch(name, gcfg.Grid, gcfg.Block, gcfg.Shared)
	st.actq = key
	if x, y := g.X, g.Y; y < x+driver.DevicePtr(4*int64(rows)*int64(g.Ldx)) && x < y+driver.DevicePtr(4*int64(rows)*int64(g.Ldy)) {
		st.actq.ok = false // the GEMM wrote its own input (cannot happen for a projection; kept safe)
	}
}

// halfGEMM reports whether a GEMM over weights of format dt and rows
// activation rows takes the half wide tiles (Options.F16Wide): q4tp, 33
// to 64 rows (at 9-32 the int8 tiles were as fast or faster on the H200,
// stop 21).
func (st *state) halfGEMM(dt quant.DType, rows int) bool {
	return dt == quant.Q4TP && rows > 32 && rows <= 64 && st.d.opt.F16Wide
}

// halfInput is the half wide tiles' activation scratch when st.mv's GEMM
// over m and rows activation rows would take them (so that a producer can
// write its output there as well: attn_tiles for o_proj), else 0.
func (st *state) halfInput(m *mat, rows int) driver.DevicePtr {
	if rows <= maxMatvecRows || st.d.opt.NoMMQ || !kern.GemmQSupported(m.dt, m.p, m.cols) || !st.halfGEMM(m.dt, rows) {
		return 0
	}
	return st.buf("xh16", kern.GemmHScratch(m.cols, st.d.opt.MaxRows))
}

// gemmqHalfOn queues the half wide GEMM g over rows activation rows on
// the f16 activations already in g.Quants (written by the producer: the
// SwiGLU gate|up launch), with no gemmh_acth.
func (st *state) gemmqHalfOn(g kern.GemmQ, dt quant.DType, rows int) {
	if !st.halfGEMM(dt, rows) || g.Quants == 0 {
		st.fail(fmt.Errorf("cuda: a half GEMM of %s over %d rows on ready activations", dt, rows))
		return
	}
	g.F16 = true
	name, gcfg, err := g.HalfLaunch(kern.GemmHSuffix(g.StackedRows(), g.Cols, rows), rows)
	if err != nil {
		st.fail(fmt.Errorf("cuda: %w", err))
		return
	}
	g.PackWideF16(st.a(), rows)
	st.launch(name, gcfg.Grid, gcfg.Block, gcfg.Shared)
}

// swigluHalf is the down projection's f16 input scratch when an MLP's
// step of rows rows can run gate|up on the half wide tiles with SwiGLU in
// their epilogue (kern.GemmQ.SwiGLU) and down on the half tiles from it,
// else 0.
func (st *state) swigluHalf(w *backend.MLP, rows int) driver.DevicePtr {
	gate, up, dn := w.Gate.(*mat), w.Up.(*mat), w.Down.(*mat)
	I := gate.rows
	if !st.proFusable(rows, w.Gate, w.Up) || !st.proFusable(rows, w.Down) || !st.halfGEMM(gate.dt, rows) || up.rows != I || dn.cols != I ||
		I%32 != 0 || st.halfInput(dn, rows) == 0 {
		return 0
	}
	return st.buf("xh16h", kern.GemmHScratch(I, st.d.opt.MaxRows))
}

// stackable reports whether ms (q|k|v, gate|up) can run as one int8 GEMM
// over rows rows written side by side (the wide tiles up to 64 rows,
// kern.GemmQStacked above), or one tensor with its input's prologue in the
// quantizer (proFusable): more than 8 rows, the int8 GEMM on, all of one
// format (q8_row or q4tp) and width.
func (st *state) stackable(rows int, ms ...backend.Mat) bool {
	if rows <= maxMatvecRows || st.d.opt.NoMMQ || st.d.opt.NoFusion {
		return false
	}
	m0 := ms[0].(*mat)
	for _, w := range ms {
		m := w.(*mat)
		if m.dt != m0.dt || m.cols != m0.cols || (m.dt != quant.Q8Row && m.dt != quant.Q4TP) || !kern.GemmQSupported(m.dt, m.p, m.cols) {
			return false
		}
		// Above 64 rows tensors stack on the 64-token tile
		// (kern.GemmQStacked) only where each alone would take that tile
		// (a prefill's q|k|v of the MoE shapes; not an 8B model's gate and
		// up, each on the 128 × 128 tile).
		if f, _ := kernelFormat(m.dt); rows > 64 && len(ms) > 1 && kern.GemmQSuffix(f, m.rows, m.cols, rows) != "_t64" {
			return false
		}
	}
	return true
}

// gemmqStack queues y[:, Σ rows] = [W_0; W_1; ...]·x for the stacked
// tensors ms with their biases (one wide launch).
func (st *state) gemmqStack(ms []backend.Mat, biases []driver.DevicePtr, x driver.DevicePtr, ldx int, y driver.DevicePtr, ldy, rows int, pro actPro) {
	m0 := ms[0].(*mat)
	g := kern.GemmQ{W: m0.p, Rows: m0.rows, Cols: m0.cols, X: x, Ldx: ldx, Y: y, Ldy: ldy, Bias: biases[0]}
	for j, w := range ms[1:] {
		g.More = append(g.More, kern.GemmQPart{W: w.(*mat).p, Rows: w.(*mat).rows, Bias: biases[j+1]})
	}
	st.gemmqPro(g, m0.dt, rows, pro)
}

// mq queues a quantized-activation matvec (kern.MQ) over rows activation
// rows (q8_2f: its quants on activations already prescaled).
func (st *state) mq(dt quant.DType, m kern.MQ, rows int) {
	if dt == quant.Q82F {
		dt = quant.Q8Row
	}
	per := kern.MatvecRowsPerLaunch(dt, m.Cols)
	for r0 := 0; r0 < rows; r0 += per {
		name, cfg, err := kern.MatvecLaunch(dt, m.Rows[0]+m.Rows[1]+m.Rows[2], m.Cols, min(per, rows-r0), st.d.info.SMs)
		if err != nil {
			st.fail(fmt.Errorf("cuda: %w", err))
			return
		}
		m.Pack(st.a(), r0)
		st.launch(name, cfg.Grid, cfg.Block, cfg.Shared)
	}
}

// fusable reports whether a decode step's matvecs over ms can run as one
// quantized-activation launch with a fused prologue: at most
// maxMatvecRows rows (prefill takes the GEMM), all q8_row or all q4tp
// (q8_2f needs its prescale), of one width.
func (st *state) fusable(ms ...backend.Mat) bool {
	if st.rows > maxMatvecRows || st.d.opt.NoFusion {
		return false
	}
	m0 := ms[0].(*mat)
	for _, w := range ms {
		m := w.(*mat)
		if m.dt != m0.dt || m.cols != m0.cols || (m.dt != quant.Q8Row && m.dt != quant.Q4TP) {
			return false
		}
	}
	return true
}

// mvNorm queues y = W_j·norm(x) for the stacked tensors ms (q|k|v,
// gate|up, the head): the RMSNorm in the matvec's prologue.
func (st *state) mvNorm(ms []backend.Mat, biases []driver.DevicePtr, x driver.DevicePtr, ldx int, y driver.DevicePtr, ldy int, n *backend.Norm, rows int) {
	if n.W == nil || n.W.Len() != ms[0].(*mat).cols {
		st.fail(fmt.Errorf("cuda: a norm over %d values needs a weight of %d", ms[0].(*mat).cols, ms[0].(*mat).cols))
		return
	}
	m := kern.MQ{Cols: ms[0].(*mat).cols, X: x, Ldx: ldx, Y: y, Ldy: ldy, Norm: ptrOf(n.W), Eps: n.Eps, Pro: kern.ProNorm}
	if n.OnePlus {
		m.Pro = kern.ProNorm1
	}
	for j, w := range ms {
		m.W[j], m.Rows[j], m.Bias[j] = w.(*mat).p, w.(*mat).rows, biases[j]
	}
	st.mq(ms[0].(*mat).dt, m, rows)
}

// Attention kernel limits (attn.cu): ATT_MAXD·32 head dimensions, and the
// dynamic shared memory of attn_split per head dimension.
const (
	attnMaxHeadDim = 256
	attnWarps      = 4
	attnMaxG       = 8
)

// attnSplits is the number of splits of the attention over a row's
// positions for rows rows: enough blocks to fill the device twice.
func attnSplits(sms, nkv, rows int) int {
	return max(1, min(64, 2*sms/max(1, nkv*rows)))
}

// attnPartRows bounds rows·splits(rows) over every rows ≤ maxRows, so that
// one partials buffer serves every step (a fixed address between steps of
// different shapes).
func attnPartRows(sms, nkv, maxRows int, splits func(sms, nkv, rows int) int) int {
	n := 0
	for r := 1; r <= maxRows; r++ {
		n = max(n, r*splits(sms, nkv, r))
	}
	return n
}

// partRows is attnPartRows for this device's step (MaxRows rows, its
// SMs), memoised per kernel family and kv heads: a step asks once per
// attention layer.
func (st *state) partRows(tiles bool, nkv int) int {
	k := [2]int{b2i(tiles), nkv}
	if n, ok := st.partMemo[k]; ok {
		return n
	}
	splits := attnSplits
	if tiles {
		splits = kern.AttnTilesSplits
	}
	n := attnPartRows(st.d.info.SMs, nkv, st.d.opt.MaxRows, splits)
	if st.partMemo == nil {
		st.partMemo = map[[2]int]int{}
	}
	st.partMemo[k] = n
	return n
}

// Attention adds layer's attention block to x.
func (st *state) Attention(w *backend.Attention, layer int) {
	if st.err != nil {
		return
	}
	if w.Gated && w.BQ != nil {
		st.fail(fmt.Errorf("cuda: gated attention with a q bias (layer %d): %w", layer, backend.ErrUnsupported))
		return
	}
	d, R, H, hd := st.d, st.rows, st.H, w.HeadDim
	M := d.opt.MaxRows
	nq, nkv := w.Heads, w.KVHeads
	if nkv < 1 || nq < nkv || nq%nkv != 0 || hd < 2 || hd > attnMaxHeadDim {
		st.fail(fmt.Errorf("cuda: attention with %d query heads, %d kv heads of %d dimensions (the kernels take a multiple of the kv heads, at most %d dimensions)", nq, nkv, hd, attnMaxHeadDim))
		return
	}
	if d.spec == nil || layer < 0 || layer >= len(d.kc) || d.kc[layer] == 0 || nkv != d.spec.KVHeads || hd != d.spec.HeadDim {
		st.fail(fmt.Errorf("cuda: layer %d (%d kv heads of %d) has no K/V cache in the pool", layer, nkv, hd))
		return
	}
	qd, kvd := nq*hd, nkv*hd
	ld := qd + 2*kvd
	x := st.buf("x", int64(M)*int64(H)*4)
	xb := st.buf("xb", int64(M)*int64(H)*4)
	qkv := st.buf("qkv", int64(M)*int64(ld)*4)
	att := st.buf("att", int64(M)*int64(qd)*4)
	r := w.Rope.(*ropeTab)
	if r.Dim() > hd || r.Dim()%2 != 0 {
		st.fail(fmt.Errorf("cuda: RoPE over %d dimensions of a %d-dimension head", r.Dim(), hd))
		return
	}
	// xb = input_layernorm(x); q|k|v = W·xb (+ bias), side by side per row
	// (decode: one launch, the norm in its prologue). A gated q_proj writes
	// [q_h ; gate_h] per head into a wider row, split afterwards.
	dst, ldd, qrows := qkv, ld, qd
	var gate driver.DevicePtr
	if w.Gated {
		qrows, ldd = 2*qd, ld+qd
		dst = st.buf("qkvg", int64(M)*int64(ldd)*4)
		gate = st.buf("gate", int64(M)*int64(qd)*4)
	}
	if st.fusable(w.Q, w.K, w.V) {
		st.mvNorm([]backend.Mat{w.Q, w.K, w.V}, []driver.DevicePtr{ptrOf(w.BQ), ptrOf(w.BK), ptrOf(w.BV)}, x, H, dst, ldd, &w.Norm, R)
	} else if st.proFusable(R, w.Q, w.K, w.V) && w.Q.(*mat).rows == qrows && w.K.(*mat).rows == kvd {
		// More than 8 rows: q|k|v in one launch (the wide tiles; above 64
		// rows kern.GemmQStacked), input_layernorm in its quantizer.
		st.gemmqStack([]backend.Mat{w.Q, w.K, w.V}, []driver.DevicePtr{ptrOf(w.BQ), ptrOf(w.BK), ptrOf(w.BV)}, x, H, dst, ldd, R, st.normPro(&w.Norm, H))
	} else {
		st.rmsnorm(x, xb, R, H, &w.Norm)
		if st.stackable(R, w.Q, w.K, w.V) && w.Q.(*mat).rows == qrows && w.K.(*mat).rows == kvd {
			st.gemmqStack([]backend.Mat{w.Q, w.K, w.V}, []driver.DevicePtr{ptrOf(w.BQ), ptrOf(w.BK), ptrOf(w.BV)}, xb, H, dst, ldd, R, actPro{})
		} else {
			st.mv(w.Q.(*mat), xb, H, dst, ldd, ptrOf(w.BQ), false, R)
			st.mv(w.K.(*mat), xb, H, dst.Add(int64(4*qrows)), ldd, ptrOf(w.BK), false, R)
			st.mv(w.V.(*mat), xb, H, dst.Add(int64(4*(qrows+kvd))), ldd, ptrOf(w.BV), false, R)
		}
	}
	if w.Gated {
		st.a().Ptr(dst).Int(ldd).Ptr(qkv).Int(ld).Ptr(gate).Int(qd).Int(nq).Int(hd).Int(2 * kvd)
		st.launch("gate_split", driver.D2((qd+2*kvd+255)/256, R), driver.D1(256), 0)
	}
	// q/k norm per head, then RoPE and the K/V append at each row's slot:
	// the norms inside rope_qk_append where they share eps and centring
	// (Options.NoFusion: head_rmsnorm launches first).
	hn := st.headNorms(w, hd)
	if st.err != nil {
		return
	}
	if w.QNorm != nil && hn.Q == 0 {
		st.a().Ptr(qkv).Int(ld).Ptr(ptrOf(w.QNorm.W)).Int(hd).F32(w.QNorm.Eps).Int(b2i(w.QNorm.OnePlus))
		st.launch("head_rmsnorm", driver.D2(nq, R), driver.D1(32), 0)
	}
	if w.KNorm != nil && hn.K == 0 {
		st.a().Ptr(qkv.Add(int64(4 * qd))).Int(ld).Ptr(ptrOf(w.KNorm.W)).Int(hd).F32(w.KNorm.Eps).Int(b2i(w.KNorm.OnePlus))
		st.launch("head_rmsnorm", driver.D2(nkv, R), driver.D1(32), 0)
	}
	ctx := d.opt.Ctx
	scale := float32(1 / math.Sqrt(float64(hd)))
	if d.kvHalf && !kern.AttnTilesFits(hd, ld, true) {
		st.fail(fmt.Errorf("cuda: a float16 K/V cache for heads of %d dimensions (q rows of %d)", hd, ld))
		return
	}
	tiles := kern.AttnTilesFits(hd, ld, d.kvHalf)
	// o_proj on the half wide tiles: the attention also writes their f16
	// activations, so o_proj needs no gemmh_acth.
	var outh driver.DevicePtr
	if o := w.O.(*mat); tiles && !w.Gated && o.cols == qd && qd%32 == 0 {
		outh = st.halfInput(o, R)
	}
	// A half-GEMM step (its activations are f16 anyway) or a prefill chunk
	// of more than 64 rows whose o_proj quantizes the output to int8 blocks
	// next: the tensor-core attention, same parameters and outputs
	// (`cortiq bench -p 512` of the 30B-A3B synth on the H200, against
	// attn_tiles_h in the same call: 8,862 → 10,924 tok/s; attn_tiles_h, a
	// row a block on CUDA cores, took 302 µs a layer: docs/benchmarks.md,
	// stop 27 run 2).
	o := w.O.(*mat)
	prefill := R > attnMMAPrefillRows && (o.dt == quant.Q4TP || o.dt == quant.Q8Row || o.dt == quant.Q82F)
	mma := tiles && (outh != 0 || prefill || d.opt.AttnMMAAll) && d.kvHalf && kern.AttnMMAFits(hd, ld, nq/nkv) && !d.opt.NoAttnMMA
	// Options.RopeFold: decode steps (each row a sequence of its own) on
	// attn_tiles rotate and append inside the attention launch
	// (attn_rope_tiles), one launch fewer a layer.
	fold := tiles && !mma && !r.t.Dynamic() && st.rows == len(st.b.Seqs) && !d.opt.NoFusion && d.opt.RopeFold
	if fold {
		// Nothing to launch here: the attention below rotates and appends.
	} else if r.t.Dynamic() {
		// Each sequence's own frequencies: one launch per sequence over
		// its rows (consecutive), each with its table.
		st.dynamicRope(r)
		if st.err != nil || st.mode == modeCheck {
			return // a dynamic step is never replayed: nothing more to compare
		}
		r0 := 0
		for i, last := range st.last {
			n := last + 1 - r0
			st.a().Ptr(qkv.Add(4 * int64(r0) * int64(ld))).Int(ld).Int(nq).Int(nkv).Int(hd).Int(r.Dim()).
				Ptr(st.dynInv.Add(int64(4 * i * (r.Dim() / 2)))).F32(st.dynMS[i]).
				Ptr(st.pos().Add(int64(4 * r0))).Ptr(st.slot().Add(int64(4 * r0))).Ptr(d.kc[layer]).Ptr(d.vc[layer]).Int(ctx)
			hn.Pack(&st.args)
			st.launch(kern.RopeQKAppendKernel(d.kvHalf), driver.D2(nq+nkv, n), driver.D1(64), 0)
			r0 = last + 1
		}
	} else {
		st.a().Ptr(qkv).Int(ld).Int(nq).Int(nkv).Int(hd).Int(r.Dim()).Ptr(r.inv).F32(r.mscale).
			Ptr(st.pos()).Ptr(st.slot()).Ptr(d.kc[layer]).Ptr(d.vc[layer]).Int(ctx)
		hn.Pack(&st.args)
		st.launch(kern.RopeQKAppendKernel(d.kvHalf), driver.D2(nq+nkv, R), driver.D1(64), 0)
	}
	// Causal attention: row r sees positions ≤ pos[r] (its chunk's earlier
	// rows were appended above), split over nsplit chunks of the length:
	// attn_tiles (split and merge in one launch) where the head fits,
	// else attn_split + attn_merge.
	if tiles {
		nsplit := kern.AttnTilesSplits(d.info.SMs, nkv, R)
		part := st.buf("part", int64(st.partRows(true, nkv))*int64(nq)*int64(hd+2)*4)
		cnt := st.bufZeroed("attn_cnt", int64(M)*int64(nkv)*4)
		st.a().Ptr(qkv).Int(ld).Ptr(d.kc[layer]).Ptr(d.vc[layer]).Ptr(st.pos()).Ptr(st.slot()).Ptr(part).Ptr(cnt).Ptr(att).Int(qd).
			Int(nq).Int(nkv).Int(hd).Int(ctx).Int(nsplit).F32(scale).Ptr(outh)
		switch {
		case mma:
			st.launch(kern.AttnMMAKernel(hd), driver.D3(nsplit, nkv, R), driver.D1(32*kern.AttnMMAWarps(hd)), kern.AttnMMAShared(hd))
		case fold:
			st.args.Ptr(r.inv).F32(r.mscale).Int(r.Dim())
			hn.Pack(&st.args)
			st.launch(kern.AttnRopeTilesKernel(d.kvHalf), driver.D3(nsplit, nkv, R), driver.D1(128), kern.AttnTilesShared(hd, d.kvHalf))
		default:
			st.launch(kern.AttnTilesKernel(d.kvHalf), driver.D3(nsplit, nkv, R), driver.D1(128), kern.AttnTilesShared(hd, d.kvHalf))
		}
		if outh != 0 {
			st.actq = actqKey{x: att, xq: outh, ldx: qd, cols: qd, rows: R, perm: -1, ok: true}
		}
	} else {
		nsplit := attnSplits(d.info.SMs, nkv, R)
		part := st.buf("part", int64(st.partRows(false, nkv))*int64(nq)*int64(hd+2)*4)
		st.a().Ptr(qkv).Int(ld).Ptr(d.kc[layer]).Ptr(d.vc[layer]).Ptr(st.pos()).Ptr(st.slot()).Ptr(part).
			Int(nq).Int(nkv).Int(hd).Int(ctx).Int(nsplit).F32(scale)
		st.launch("attn_split", driver.D3(nsplit, nkv, R), driver.D1(128), attnWarps*attnMaxG*(hd+2)*4)
		st.a().Ptr(part).Ptr(att).Int(qd).Int(nq).Int(hd).Int(nsplit)
		st.launch("attn_merge", driver.D2(nq, R), driver.D1(128), 0)
	}
	if w.Gated {
		// att ⊙ σ(gate) before o_proj.
		st.a().Ptr(att).Int(qd).Ptr(gate).Int(qd).Int(qd)
		st.launch("gate_mul", driver.D2((qd+255)/256, R), driver.D1(256), 0)
	}
	// x += o_proj(att) (+ bias): the residual add in the matvec's epilogue.
	st.mv(w.O.(*mat), att, qd, x, H, ptrOf(w.BO), true, R)
}

// attnMMAPrefillRows: steps of more rows than this over a quantized
// o_proj take attn_mma_h (the wide GEMM tiles' steps, up to 64 rows, take
// it only with their f16 activations).
const attnMMAPrefillRows = 64

// headNorms returns the q/k norms rope_qk_append applies itself: both
// (or the one present) when they share eps and centring, none under
// Options.NoFusion or when they differ (head_rmsnorm then runs first).
func (st *state) headNorms(w *backend.Attention, hd int) kern.HeadNorms {
	var n kern.HeadNorms
	for _, hn := range []*backend.Norm{w.QNorm, w.KNorm} {
		if hn != nil && (hn.W == nil || hn.W.Len() != hd) {
			st.fail(fmt.Errorf("cuda: a q/k norm over heads of %d needs a weight of %d", hd, hd))
			return n
		}
	}
	q, k := w.QNorm, w.KNorm
	if st.d.opt.NoFusion || (q == nil && k == nil) || (q != nil && k != nil && (q.Eps != k.Eps || q.OnePlus != k.OnePlus)) {
		return n
	}
	if q != nil {
		n.Q, n.Eps, n.OnePlus = ptrOf(q.W), q.Eps, q.OnePlus
	}
	if k != nil {
		n.K, n.Eps, n.OnePlus = ptrOf(k.W), k.Eps, k.OnePlus
	}
	return n
}

// dynamicRope computes, once per step, each sequence's dynamic-NTK
// frequencies for its length and queues their upload (through the stage,
// after the staged inputs, on the step's stream: kernels queued before it
// still read the previous values, kernels after it the new ones).
func (st *state) dynamicRope(r *ropeTab) {
	st.dynamic = true
	if st.dynOf == r {
		return
	}
	if st.dynOf != nil {
		st.fail(fmt.Errorf("cuda: two dynamic RoPE tables in one step"))
		return
	}
	st.dynOf = r
	b, half, M := st.b, r.Dim()/2, st.d.opt.MaxRows
	n := int64(len(b.Seqs)) * int64(half) * 4
	st.dynInv = st.buf("dyninv", int64(M)*int64(max(half, 1))*4)
	if st.err != nil || st.mode == modeCheck {
		return
	}
	off := 12 * M
	stage := st.r.stage()
	if int64(off)+n > int64(len(stage)) {
		st.fail(fmt.Errorf("cuda: dynamic RoPE frequencies for %d sequences do not fit the stage", len(b.Seqs)))
		return
	}
	st.dynMS = st.dynMS[:0]
	buf := make([]float32, half)
	for i, s := range b.Seqs {
		n := s.Len() + len(b.Tokens[i])
		if b.RopeLen != nil && b.RopeLen[i] > 0 {
			n = b.RopeLen[i]
		}
		inv, scale := r.t.Freqs(n, buf)
		for j, v := range inv {
			binary.LittleEndian.PutUint32(stage[off+4*(i*half+j):], math.Float32bits(v))
		}
		st.dynMS = append(st.dynMS, scale)
	}
	if err := st.r.htod(st.dynInv, off, int(n)); err != nil {
		st.fail(err)
	}
}

// MLP adds the SwiGLU block to x.
func (st *state) MLP(w *backend.MLP) {
	if st.err != nil {
		return
	}
	M, R, H := st.d.opt.MaxRows, st.rows, st.H
	I, _ := w.Gate.Dims()
	x := st.buf("x", int64(M)*int64(H)*4)
	xb := st.buf("xb", int64(M)*int64(H)*4)
	gu := st.buf("gateup", int64(M)*int64(2*I)*4)
	h := st.buf("h", int64(M)*int64(I)*4)
	// Decode: gate|up in one launch with the norm in its prologue, and
	// SwiGLU in the down projection's prologue.
	if st.fusable(w.Gate, w.Up) {
		st.mvNorm([]backend.Mat{w.Gate, w.Up}, []driver.DevicePtr{ptrOf(w.BGate), ptrOf(w.BUp)}, x, H, gu, 2*I, &w.Norm, R)
	} else if hh := st.swigluHalf(w, R); hh != 0 {
		// 33-64 rows on the half tiles: gate|up with the norm in its
		// quantizer and SwiGLU in its epilogue writes down's f16 input.
		gate, up, dn := w.Gate.(*mat), w.Up.(*mat), w.Down.(*mat)
		st.gemmqPro(kern.GemmQ{W: gate.p, Rows: I, Cols: gate.cols, X: x, Ldx: H, Y: gu, Ldy: 2 * I, Bias: ptrOf(w.BGate),
			More: []kern.GemmQPart{{W: up.p, Rows: I, Bias: ptrOf(w.BUp)}}, SwiGLU: hh, Ldh: I}, gate.dt, R, st.normPro(&w.Norm, H))
		st.gemmqHalfOn(kern.GemmQ{W: dn.p, Rows: dn.rows, Cols: I, Quants: hh, Y: x, Ldy: H, Bias: ptrOf(w.BDown), Accumulate: true}, dn.dt, R)
		return
	} else if st.proFusable(R, w.Gate, w.Up) && w.Gate.(*mat).rows == I {
		// More than 8 rows: gate|up in one launch where stackable,
		// post_attention_layernorm in its quantizer.
		st.gemmqStack([]backend.Mat{w.Gate, w.Up}, []driver.DevicePtr{ptrOf(w.BGate), ptrOf(w.BUp)}, x, H, gu, 2*I, R, st.normPro(&w.Norm, H))
	} else {
		st.rmsnorm(x, xb, R, H, &w.Norm)
		if st.stackable(R, w.Gate, w.Up) && w.Gate.(*mat).rows == I {
			st.gemmqStack([]backend.Mat{w.Gate, w.Up}, []driver.DevicePtr{ptrOf(w.BGate), ptrOf(w.BUp)}, xb, H, gu, 2*I, R, actPro{})
		} else {
			st.mv(w.Gate.(*mat), xb, H, gu, 2*I, ptrOf(w.BGate), false, R)
			st.mv(w.Up.(*mat), xb, H, gu.Add(int64(4*I)), 2*I, ptrOf(w.BUp), false, R)
		}
	}
	if dn := w.Down.(*mat); st.fusable(w.Down) && dn.cols == I {
		st.mq(dn.dt, kern.MQ{W: [3]driver.DevicePtr{dn.p}, Rows: [3]int{dn.rows}, Bias: [3]driver.DevicePtr{ptrOf(w.BDown)}, Cols: I,
			X: gu, Ldx: 2 * I, XOff: I, Y: x, Ldy: H, Accumulate: true, Pro: kern.ProSilu}, R)
		return
	}
	if dn := w.Down.(*mat); st.proFusable(R, w.Down) && dn.cols == I {
		// More than 8 rows: SwiGLU in the down projection's quantizer.
		st.gemmqPro(kern.GemmQ{W: dn.p, Rows: dn.rows, Cols: I, X: gu, Ldx: 2 * I, Y: x, Ldy: H, Bias: ptrOf(w.BDown), Accumulate: true},
			dn.dt, R, actPro{kind: kern.ProSilu, u: gu.Add(int64(4 * I))})
		return
	}
	st.a().Ptr(gu).Ptr(gu.Add(int64(4 * I))).Int(2 * I).Ptr(h).Int(I).Int(I)
	st.launch("silu_mul", driver.D2((I+255)/256, R), driver.D1(256), 0)
	st.mv(w.Down.(*mat), h, I, x, H, ptrOf(w.BDown), true, R)
}

// Head computes the logits the batch asks for; Run copies them to b.Out.
func (st *state) Head(w *backend.Head) {
	if st.err != nil {
		return
	}
	b, M, H := st.b, st.d.opt.MaxRows, st.H
	V, _ := w.W.Dims()
	n := st.rows
	switch b.Logits {
	case backend.NoLogits:
		return
	case backend.LastLogits:
		n = len(st.last)
	}
	greedy := b.Next != nil
	switch {
	case greedy && (b.Logits != backend.LastLogits || len(b.Next) < n):
		st.fail(fmt.Errorf("cuda: greedy ids for %d sequences need LastLogits and %d entries (have %d)", n, n, len(b.Next)))
		return
	}
	want := n // rows of logits to the host
	if greedy {
		want = len(b.LogitsOf)
	}
	if b.OutRows != nil {
		if b.Logits != backend.LastLogits || len(b.OutRows) < want {
			st.fail(fmt.Errorf("cuda: %d logits rows for %d sequences (LastLogits only)", len(b.OutRows), want))
			return
		}
		for k, r := range b.OutRows[:want] {
			if len(r) < V {
				st.fail(fmt.Errorf("cuda: logits row %d of %d for a vocabulary of %d", k, len(r), V))
				return
			}
		}
	} else if len(b.Out) < want*V {
		st.fail(fmt.Errorf("cuda: logits buffer of %d for %d rows of %d", len(b.Out), want, V))
		return
	}
	for k, i := range b.LogitsOf {
		if !greedy || i < 0 || i >= n || (k > 0 && i <= b.LogitsOf[k-1]) {
			st.fail(fmt.Errorf("cuda: LogitsOf %v: want ascending sequence indices below %d, with Next", b.LogitsOf, n))
			return
		}
	}
	x := st.buf("x", int64(M)*int64(H)*4)
	src := x
	if b.Logits == backend.LastLogits && n != st.rows {
		// Gather each sequence's last row.
		src = st.buf("xlast", int64(M)*int64(H)*4)
		for i, r := range st.last {
			st.copyD(src.Add(4*int64(i)*int64(H)), x.Add(4*int64(r)*int64(H)), 4*int64(H))
		}
	}
	xb := st.buf("xb", int64(M)*int64(H)*4)
	logits := st.buf("logits", int64(n)*int64(V)*4)
	if n <= maxMatvecRows && st.fusable(w.W) {
		st.mvNorm([]backend.Mat{w.W}, []driver.DevicePtr{0}, src, H, logits, V, &w.Norm, n)
	} else {
		st.rmsnorm(src, xb, n, H, &w.Norm)
		st.mv(w.W.(*mat), xb, H, logits, V, 0, false, n)
	}
	if greedy {
		// Only the ids come back: argmax of each row on the device.
		next := st.buf("next", int64(M)*4)
		st.a().Ptr(logits).Int(V).Int(V).Ptr(next)
		st.launch("argmax", driver.D1(n), driver.D1(1024), 0)
		st.next, st.nextN = next, n
		st.rowsOf, st.vocab = logits, V
		return
	}
	st.out, st.outN = logits, n*V
}

// Argmaxes reports that the device picks greedy tokens itself
// (backend.Argmaxer, Batch.Next).
func (d *Device) Argmaxes() bool { return true }

// copyLogits brings the step's logits back through the pinned stage, in
// pieces that fit it, into b.Out; each piece is read on the host only
// after its copy has completed, and the stage is reused only then.
func (st *state) copyLogits() error {
	if st.b.OutRows != nil {
		// Head checked them: LastLogits, a row of vocab floats per sequence.
		return st.copyOut(sink{rows: st.b.OutRows, V: st.outN / len(st.last)}, 0, st.outN, st.out)
	}
	if len(st.b.Out) < st.outN {
		return fmt.Errorf("cuda: logits buffer of %d for %d logits", len(st.b.Out), st.outN)
	}
	return st.copyOut(sink{flat: st.b.Out}, 0, st.outN, st.out)
}

// copyRows brings the logits rows Batch.LogitsOf names (of a step that
// picked greedy ids) into b.Out or b.OutRows, one copy per run of
// consecutive rows.
func (st *state) copyRows() error {
	rows, V := st.b.LogitsOf, st.vocab
	for k := 0; k < len(rows); {
		e := k + 1
		for e < len(rows) && rows[e] == rows[e-1]+1 {
			e++
		}
		src := st.rowsOf.Add(4 * int64(rows[k]) * int64(V))
		dst := sink{flat: st.b.Out, rows: st.b.OutRows, V: V}
		if err := st.copyOut(dst, k*V, (e-k)*V, src); err != nil {
			return err
		}
		k = e
	}
	return nil
}

// sink is where logits go on the host: one block (Batch.Out), or rows of
// V floats (Batch.OutRows) seen as one block of consecutive rows.
type sink struct {
	flat []float32
	rows [][]float32
	V    int
}

// put copies x to the sink's floats from offset off on.
func (s sink) put(off int, x []float32) {
	if s.rows == nil {
		copy(s.flat[off:off+len(x)], x)
		return
	}
	for len(x) > 0 {
		r, c := off/s.V, off%s.V
		k := copy(s.rows[r][c:s.V], x)
		x, off = x[k:], off+k
	}
}

// copyOut copies n floats at src to dst's floats from off on, through the
// pinned stage, in pieces that fit it.
func (st *state) copyOut(dst sink, off, n int, src driver.DevicePtr) error {
	sb := st.r.stage()
	piece := len(sb) / 4
	for done := 0; done < n; done += piece {
		k := min(piece, n-done)
		if err := st.r.dtoh(0, src.Add(int64(4*done)), 4*k); err != nil {
			return err
		}
		if err := st.r.sync(); err != nil {
			return err
		}
		// The device and the host are little-endian: the stage's bytes
		// are the floats (one copy, not a decode per element).
		dst.put(off+done, unsafe.Slice((*float32)(unsafe.Pointer(&sb[0])), k))
	}
	return nil
}
