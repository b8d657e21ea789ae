package cuda

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/quant"
)

// state is the device-side run state of the steps: named scratch buffers
// grown to the largest step seen (fixed addresses between growths, which
// a captured graph needs) and the staged per-step inputs.
type state struct {
	d    *Device
	c    *driver.Ctx
	b    *backend.Batch
	err  error
	rows int
	last []int // per sequence: its last row
	args driver.Args

	bufs map[string]devBuf
	in   driver.DevicePtr // ids | pos | slot, int32 [MaxRows] each
	H    int              // residual width (set by Embed)

	out       driver.DevicePtr // the step's logits (set by Head)
	outN      int              // floats of them
	capturing bool             // recording a graph: no syncs, no allocations
	dynamic   bool             // the step used dynamic RoPE (never captured)
}

// graphKey identifies the steps one captured graph serves: decode steps
// (one token per sequence) of the same number of rows and logits kind.
// Everything that varies between such steps (ids, positions, slots) is
// read by the kernels from the staged inputs.
type graphKey struct {
	rows   int
	logits backend.Logits
}

type graph struct {
	exec driver.GraphExec
	H    int
	out  driver.DevicePtr
	outN int
}

type devBuf struct {
	p driver.DevicePtr
	n int64
}

// scratchBytes estimates a step's scratch for maxRows rows of width at
// most widest floats (x, xb, qkv/gate|up, attention partials, logits).
func scratchBytes(maxRows, widest int, spec backend.SeqSpec) int64 {
	return int64(maxRows) * int64(widest) * 4 * 8
}

// buf returns the named scratch buffer of at least n bytes.
func (st *state) buf(name string, n int64) driver.DevicePtr {
	if st.err != nil {
		return 0
	}
	if b, ok := st.bufs[name]; ok && b.n >= n {
		return b.p
	}
	if st.capturing {
		st.fail(fmt.Errorf("cuda: scratch %s would grow while recording a graph", name))
		return 0
	}
	if b, ok := st.bufs[name]; ok {
		if err := st.c.Free(b.p); err != nil {
			st.fail(err)
			return 0
		}
	}
	p, err := st.c.Alloc(n)
	if err != nil {
		st.fail(fmt.Errorf("cuda: scratch %s of %d bytes: %w", name, n, err))
		return 0
	}
	st.bufs[name] = devBuf{p, n}
	return p
}

func (st *state) fail(err error) {
	if st.err == nil {
		st.err = err
	}
}

// launch runs a kernel with the packed arguments on the device's stream.
func (st *state) launch(name string, grid, block driver.Dim3, shared int) {
	if st.err != nil {
		return
	}
	if err := st.args.Err(); err != nil {
		st.fail(fmt.Errorf("cuda: %s: %w", name, err))
		return
	}
	cfg := driver.Config{Grid: grid, Block: block, Shared: shared, Stream: st.d.strm}
	if err := st.d.mod.Launch(st.c, name, cfg, &st.args); err != nil {
		st.fail(err)
		return
	}
	if st.d.opt.Eager && !st.capturing {
		if err := st.c.StreamSync(st.d.strm); err != nil {
			st.fail(fmt.Errorf("cuda: %s: %w", name, err))
		}
	}
}

func (st *state) a() *driver.Args { return st.args.Reset() }

// Run runs step over b's rows on the GPU.
func (d *Device) Run(b *backend.Batch, step func(backend.Ops)) error {
	if len(b.Seqs) != len(b.Tokens) {
		return fmt.Errorf("cuda: %d sequences but %d token lists", len(b.Seqs), len(b.Tokens))
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
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.st == nil {
		d.st = &state{d: d, bufs: map[string]devBuf{}}
	}
	st := d.st
	st.b, st.err, st.rows = b, nil, rows
	st.last = st.last[:0]
	err := d.dev.Do(func(c *driver.Ctx) error {
		st.c = c
		defer func() { st.c = nil }()
		// Stage ids, positions and slots: one host-to-device copy.
		stage := d.stage.Bytes()
		M := d.opt.MaxRows
		r := 0
		for i, toks := range b.Tokens {
			s := b.Seqs[i].(*seq)
			for t, tok := range toks {
				binary.LittleEndian.PutUint32(stage[4*r:], uint32(int32(tok)))
				binary.LittleEndian.PutUint32(stage[4*(M+r):], uint32(int32(s.n+t)))
				binary.LittleEndian.PutUint32(stage[4*(2*M+r):], uint32(int32(s.slot)))
				r++
			}
			st.last = append(st.last, r-1)
		}
		st.in = st.buf("inputs", int64(12*M))
		if st.err != nil {
			return st.err
		}
		if err := c.HtoDAsync(st.in, d.stage, 0, 12*M, d.strm); err != nil {
			return err
		}
		key, decode := graphKey{rows: rows, logits: b.Logits}, rows == len(b.Seqs)
		if g, ok := d.graphs[key]; ok && decode && !d.opt.Eager {
			// Replay: the whole step is one launch.
			st.H, st.out, st.outN = g.H, g.out, g.outN
			if err := c.GraphLaunch(g.exec, d.strm); err != nil {
				return err
			}
			d.replays++
		} else {
			st.dynamic, st.outN = false, 0
			step(st)
			if st.err != nil {
				return st.err
			}
			if decode && d.opt.Graphs && !st.dynamic {
				// The step ran eagerly once with these shapes (its scratch
				// is sized); record it for the next steps of this shape.
				if err := d.capture(c, st, key, step); err != nil {
					return err
				}
			}
		}
		if st.outN > 0 {
			if err := st.copyLogits(); err != nil {
				return err
			}
		}
		return c.StreamSync(d.strm)
	})
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	for i, s := range b.Seqs {
		s.(*seq).n += len(b.Tokens[i])
	}
	return nil
}

// capture records step on the device's stream as a graph for key.
func (d *Device) capture(c *driver.Ctx, st *state, key graphKey, step func(backend.Ops)) error {
	// The eager step must finish before recording starts on its stream.
	if err := c.StreamSync(d.strm); err != nil {
		return err
	}
	if err := c.BeginCapture(d.strm, driver.CaptureThreadLocal); err != nil {
		return err
	}
	st.capturing = true
	step(st)
	st.capturing = false
	g, err := c.EndCapture(d.strm)
	if st.err != nil {
		if err == nil {
			c.DestroyGraph(g)
		}
		return st.err
	}
	if err != nil {
		return err
	}
	exec, err := c.Instantiate(g)
	c.DestroyGraph(g)
	if err != nil {
		return err
	}
	if d.graphs == nil {
		d.graphs = map[graphKey]graph{}
	}
	d.graphs[key] = graph{exec: exec, H: st.H, out: st.out, outN: st.outN}
	return nil
}

// Replays returns how many steps ran as a replayed graph.
func (d *Device) Replays() int { return d.replays }

func (st *state) ids() driver.DevicePtr  { return st.in }
func (st *state) pos() driver.DevicePtr  { return st.in.Add(int64(4 * st.d.opt.MaxRows)) }
func (st *state) slot() driver.DevicePtr { return st.in.Add(int64(8 * st.d.opt.MaxRows)) }

func ptrOf(v backend.Vec) driver.DevicePtr {
	if v == nil {
		return 0
	}
	return v.(*vec).p
}

// Embed gathers the tokens' embedding rows into x.
func (st *state) Embed(table backend.Mat) {
	m := table.(*mat)
	f, err := kernelFormat(m.dt)
	if err != nil {
		st.fail(err)
		return
	}
	if m.dt == quant.Q82F {
		f = "q82f"
	}
	st.H = m.cols
	x := st.buf("x", int64(st.d.opt.MaxRows*m.cols*4))
	st.a().Ptr(m.p).Int(m.rows).Int(m.cols).Ptr(st.ids()).Ptr(x).Int(m.cols)
	st.launch("embed_"+f, driver.D1(st.rows), driver.D1(256), 0)
}

// rmsnorm writes norm(x[r]) to y[r] for n rows of width H.
func (st *state) rmsnorm(x driver.DevicePtr, y driver.DevicePtr, rows, H int, n *backend.Norm) {
	st.a().Ptr(x).Int(H).Ptr(ptrOf(n.W)).Ptr(y).Int(H).Int(H).F32(n.Eps).Int(b2i(n.OnePlus))
	st.launch("rmsnorm", driver.D1(rows), driver.D1(256), 0)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// mv computes y[r] (=|+=) m·x[r] (+ bias) for rows activation rows: the
// batched matvec up to 8 rows (each weight read once for all rows), the
// tensor-core GEMM above that for quantized weights (prefill chunks).
func (st *state) mv(m *mat, x driver.DevicePtr, ldx int, y driver.DevicePtr, ldy int, bias driver.DevicePtr, accumulate bool, rows int) {
	f, err := kernelFormat(m.dt)
	if err != nil {
		st.fail(err)
		return
	}
	if m.dt == quant.Q82F {
		// Activations prescaled by the column field, then q8_row's kernel.
		xs := st.buf("xs", int64(st.d.opt.MaxRows*m.cols*4))
		st.a().Ptr(m.p).I64(m.colOff).Int(m.cols).Ptr(x).Int(ldx).Ptr(xs).Int(m.cols)
		st.launch("q82f_prescale", driver.D2((m.cols+255)/256, rows), driver.D1(256), 0)
		x, ldx = xs, m.cols
	}
	if rows > 8 && m.dt != quant.F32 && m.dt != quant.F16 && m.dt != quant.BF16 {
		// Prefill over quantized weights: the tensor-core GEMM (bf16
		// activations, exact int8 weights, f32 accumulation: within the
		// formats' own error). Float weights keep the exact f32 matvec.
		st.a().Ptr(m.p).Int(m.rows).Int(m.cols).Ptr(x).Int(ldx).Ptr(y).Int(ldy).Int(rows).Ptr(bias).Int(b2i(accumulate))
		st.launch("gemm_"+f, driver.D2((m.rows+63)/64, (rows+63)/64), driver.D1(128), 0)
		return
	}
	for r0 := 0; r0 < rows; r0 += 8 {
		R := min(8, rows-r0)
		st.a().Ptr(m.p).Int(m.rows).Int(m.cols).Ptr(x.Add(int64(4 * r0 * ldx))).Int(ldx).
			Ptr(y.Add(int64(4 * r0 * ldy))).Int(ldy).Ptr(bias).Int(b2i(accumulate))
		st.launch(fmt.Sprintf("mv_%s_r%d", f, R), driver.D1((m.rows+7)/8), driver.D1(128), 0)
	}
}

// Attention adds layer's attention block to x.
func (st *state) Attention(w *backend.Attention, layer int) {
	if st.err != nil {
		return
	}
	if w.Gated {
		st.fail(fmt.Errorf("cuda: gated attention (layer %d): %w", layer, backend.ErrUnsupported))
		return
	}
	d, R, H, hd := st.d, st.rows, st.H, w.HeadDim
	M := d.opt.MaxRows
	nq, nkv := w.Heads, w.KVHeads
	qd, kvd := nq*hd, nkv*hd
	ld := qd + 2*kvd
	x := st.buf("x", int64(M*H*4))
	xb := st.buf("xb", int64(M*H*4))
	qkv := st.buf("qkv", int64(M*ld*4))
	att := st.buf("att", int64(M*qd*4))
	r := w.Rope.(*ropeTab)
	if r.t.Dynamic() {
		st.dynamic = true
		st.dynamicRope(r)
	}
	// xb = input_layernorm(x); q|k|v = W·xb (+ bias), side by side per row.
	st.rmsnorm(x, xb, R, H, &w.Norm)
	st.mv(w.Q.(*mat), xb, H, qkv, ld, ptrOf(w.BQ), false, R)
	st.mv(w.K.(*mat), xb, H, qkv.Add(int64(4*qd)), ld, ptrOf(w.BK), false, R)
	st.mv(w.V.(*mat), xb, H, qkv.Add(int64(4*(qd+kvd))), ld, ptrOf(w.BV), false, R)
	// q/k norm per head, then RoPE and the K/V append at each row's slot.
	if w.QNorm != nil {
		st.a().Ptr(qkv).Int(ld).Ptr(ptrOf(w.QNorm.W)).Int(hd).F32(w.QNorm.Eps).Int(b2i(w.QNorm.OnePlus))
		st.launch("head_rmsnorm", driver.D2(nq, R), driver.D1(32), 0)
	}
	if w.KNorm != nil {
		st.a().Ptr(qkv.Add(int64(4 * qd))).Int(ld).Ptr(ptrOf(w.KNorm.W)).Int(hd).F32(w.KNorm.Eps).Int(b2i(w.KNorm.OnePlus))
		st.launch("head_rmsnorm", driver.D2(nkv, R), driver.D1(32), 0)
	}
	ctx := d.opt.Ctx
	st.a().Ptr(qkv).Int(ld).Int(nq).Int(nkv).Int(hd).Int(r.Dim()).Ptr(r.inv).F32(r.mscale).
		Ptr(st.pos()).Ptr(st.slot()).Ptr(d.kc[layer]).Ptr(d.vc[layer]).Int(ctx)
	st.launch("rope_qk_append", driver.D2(nq+nkv, R), driver.D1(64), 0)
	// Causal attention: row r sees positions ≤ pos[r] (its chunk's earlier
	// rows were appended above), split over nsplit chunks of the length.
	nsplit := max(1, min(64, 2*d.info.SMs/max(1, nkv*R)))
	part := st.buf("part", int64(M*nq*nsplit*(hd+2)*4))
	scale := float32(1 / math.Sqrt(float64(hd)))
	st.a().Ptr(qkv).Int(ld).Ptr(d.kc[layer]).Ptr(d.vc[layer]).Ptr(st.pos()).Ptr(st.slot()).Ptr(part).
		Int(nq).Int(nkv).Int(hd).Int(ctx).Int(nsplit).F32(scale)
	st.launch("attn_split", driver.D3(nsplit, nkv, R), driver.D1(128), 4*8*(hd+2)*4)
	st.a().Ptr(part).Ptr(att).Int(qd).Int(nq).Int(hd).Int(nsplit)
	st.launch("attn_merge", driver.D2(nq, R), driver.D1(128), 0)
	// x += o_proj(att) (+ bias): the residual add in the matvec's epilogue.
	st.mv(w.O.(*mat), att, qd, x, H, ptrOf(w.BO), true, R)
}

// dynamicRope recomputes dynamic-NTK frequencies for the step's sequence
// length and uploads them (one sequence per step: each sequence's
// frequencies differ).
func (st *state) dynamicRope(r *ropeTab) {
	b := st.b
	if len(b.Seqs) != 1 {
		st.fail(fmt.Errorf("cuda: dynamic RoPE scaling with %d sequences in one step is not supported yet", len(b.Seqs)))
		return
	}
	n := b.Seqs[0].Len() + len(b.Tokens[0])
	if b.RopeLen != nil && b.RopeLen[0] > 0 {
		n = b.RopeLen[0]
	}
	inv, scale := r.t.Freqs(n, make([]float32, r.Dim()/2))
	r.mscale = scale
	if err := st.c.HtoD(r.inv, f32Bytes(inv)); err != nil {
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
	x := st.buf("x", int64(M*H*4))
	xb := st.buf("xb", int64(M*H*4))
	gu := st.buf("gateup", int64(M*2*I*4))
	h := st.buf("h", int64(M*I*4))
	st.rmsnorm(x, xb, R, H, &w.Norm)
	st.mv(w.Gate.(*mat), xb, H, gu, 2*I, ptrOf(w.BGate), false, R)
	st.mv(w.Up.(*mat), xb, H, gu.Add(int64(4*I)), 2*I, ptrOf(w.BUp), false, R)
	st.a().Ptr(gu).Ptr(gu.Add(int64(4 * I))).Int(2 * I).Ptr(h).Int(I).Int(I)
	st.launch("silu_mul", driver.D2((I+255)/256, R), driver.D1(256), 0)
	st.mv(w.Down.(*mat), h, I, x, H, ptrOf(w.BDown), true, R)
}

// Head computes the logits the batch asks for and copies them to b.Out.
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
	if len(b.Out) < n*V {
		st.fail(fmt.Errorf("cuda: logits buffer of %d for %d rows of %d", len(b.Out), n, V))
		return
	}
	x := st.buf("x", int64(M*H*4))
	src := x
	if b.Logits == backend.LastLogits && n != st.rows {
		// Gather each sequence's last row.
		src = st.buf("xlast", int64(M*H*4))
		for i, r := range st.last {
			if err := st.c.DtoDAsync(src.Add(int64(4*i*H)), x.Add(int64(4*r*H)), int64(4*H), st.d.strm); err != nil {
				st.fail(err)
				return
			}
		}
	}
	xb := st.buf("xb", int64(M*H*4))
	logits := st.buf("logits", int64(n*V*4))
	st.rmsnorm(src, xb, n, H, &w.Norm)
	st.mv(w.W.(*mat), xb, H, logits, V, 0, false, n)
	st.out, st.outN = logits, n*V
}

// copyLogits brings the step's logits back through the pinned stage, in
// pieces that fit it, into b.Out.
func (st *state) copyLogits() error {
	out := st.b.Out[:st.outN]
	for off := 0; off < len(out); off += stageBytes / 4 {
		k := min(stageBytes/4, len(out)-off)
		if err := st.c.DtoHAsync(st.d.stage, 0, st.out.Add(int64(4*off)), 4*k, st.d.strm); err != nil {
			return err
		}
		if err := st.c.StreamSync(st.d.strm); err != nil {
			return err
		}
		sb := st.d.stage.Bytes()
		for i := range k {
			out[off+i] = math.Float32frombits(binary.LittleEndian.Uint32(sb[4*i:]))
		}
	}
	return nil
}
