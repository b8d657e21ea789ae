package cuda

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/quant"
)

// The hybrid models' blocks on the device: the MoE block (moe.cu, experts
// stored as q8_row or q4tp) and the Gated DeltaNet block (deltanet.cu,
// sequential delta rule; the chunked WY form of prefill is not written).

// moeMaxSlots bounds rows × TopK of one expert launch (the prologue's
// 64 rows); longer steps run in chunks of rows.
const moeMaxSlots = 64

// MoE adds the mixture-of-experts block to x: RMSNorm, the router, the
// routing on the device (moe_route), each (row, slot)'s gate, up and down
// products over the selected expert (mv_moe_*: the expert is looked up in
// a device table of base pointers, so the choice never leaves the device),
// the shared expert with its sigmoid gate, and the weighted sum into x
// (moe_combine). Only the selected experts' bytes are read; a step of more
// than moeGroupRows rows groups its (row, slot) pairs by expert, so that
// each expert is read once a tile of kern.MoETile pairs (moeGrouped).
func (st *state) MoE(w *backend.MoE) {
	if st.err != nil {
		return
	}
	R, H, M := st.rows, st.H, st.d.opt.MaxRows
	E, k := len(w.Experts), w.TopK
	if E == 0 || k < 1 || k > E || k > moeMaxSlots {
		st.fail(fmt.Errorf("cuda: mixture of %d experts with top %d (the device takes 1..%d of at least as many)", E, k, moeMaxSlots))
		return
	}
	g0 := w.Experts[0].Gate.(*mat)
	dt, I := g0.dt, g0.rows
	fam := kern.MoEExpertFamily(dt)
	for e, ex := range w.Experts {
		g, u, d := ex.Gate.(*mat), ex.Up.(*mat), ex.Down.(*mat)
		if fam == "" || g.dt != dt || u.dt != dt || d.dt != dt {
			st.fail(fmt.Errorf("cuda: expert %d of the mixture-of-experts block in %s/%s/%s (the device runs experts stored as q8_row, q4tp, f32, f16 or bf16, all alike): %w",
				e, g.dt, u.dt, d.dt, backend.ErrUnsupported))
			return
		}
		if g.rows != I || u.rows != I || g.cols != H || u.cols != H || d.rows != H || d.cols != I {
			st.fail(fmt.Errorf("cuda: expert %d: gate %d×%d, up %d×%d, down %d×%d for width %d, inner %d", e, g.rows, g.cols, u.rows, u.cols, d.rows, d.cols, H, I))
			return
		}
	}
	if dt == quant.Q4TP && (H%32 != 0 || I%32 != 0) {
		st.fail(fmt.Errorf("cuda: q4tp experts of %d×%d: %w", I, H, backend.ErrUnsupported))
		return
	}
	x := st.buf("x", int64(M)*int64(H)*4)
	xb := st.buf("xb", int64(M)*int64(H)*4)
	logits := st.buf("moe_logits", int64(M)*int64(E)*4)
	ids := st.buf("moe_ids", int64(M)*int64(k)*4)
	wts := st.buf("moe_w", int64(M)*int64(k)*4)
	gu := st.buf("moe_gu", int64(M)*int64(k)*int64(2*I)*4)
	yd := st.buf("moe_y", int64(M)*int64(k)*int64(H)*4)
	tabs := st.moeTables(w)
	if E > kern.MoEMaxExperts {
		st.fail(fmt.Errorf("cuda: mixture of %d experts (the device routes at most %d)", E, kern.MoEMaxExperts))
		return
	}
	grouped := R > moeGroupRows && st.moeGroupable(w, dt, H, I, R*k)
	// Decode steps (not grouped, quantized experts): the norm, the router
	// and the routing in one launch (moe_router_f32), the down products
	// and the combine in another (mv_moe_dc_*): 3 launches a block where
	// the general path takes 6. Options.NoFusion keeps the general path.
	fused := !grouped && st.moeFusable(w, dt, H)
	routerGate := false // moe_router_f32 computes the shared expert's gate
	var join func()     // the branch's join, before the down launch (not Options.NoBranch)
	if fused && w.Shared != nil && !st.d.opt.NoBranch && !st.timeKernels && st.d.prof == nil {
		join = st.sharedBranch(w, x, R, H)
	}
	if fused {
		r := w.Router.(*mat)
		cnt := st.bufZeroed("moe_cnt", int64(M)*4)
		calls := kern.MoERouterArgs{X: x, Ldx: H, Norm: ptrOf(w.Norm.W), Eps: w.Norm.Eps, OnePlus: w.Norm.OnePlus, Router: r.p,
			H: H, E: E, K: k, Renorm: w.Renorm, Logits: logits, Ldl: E, IDs: ids, W8: wts, XB: xb, Ldxb: H, Cnt: cnt, R: R}
		if g, ok := w.SharedGate.(*mat); ok && w.Shared != nil && g.dt == quant.F32 && g.rows == 1 && g.cols == H && g.p%16 == 0 {
			// The shared expert's gate logit as the router's row E.
			calls.SGW, calls.SG = g.p, st.buf("moe_sg", int64(M)*4)
			routerGate = true
		}
		calls.Pack(st.a())
		st.launch("moe_router_f32", calls.Grid(), calls.Block(), 0)
	} else {
		st.rmsnorm(x, xb, R, H, &w.Norm)
		st.mv(w.Router.(*mat), xb, H, logits, E, 0, false, R)
		st.a().Ptr(logits).Int(E).Int(E).Int(k).Int(b2i(w.Renorm)).Ptr(ids).Ptr(wts)
		st.launch("moe_route", driver.D1(R), driver.D1(256), 0)
	}
	var inv driver.DevicePtr
	switch {
	case grouped:
		yd, inv = st.moeGrouped(w, fam, dt, tabs, xb, ids, R, H, I, E, k)
	case !fused:
		st.moeSlots(dt, tabs, xb, ids, gu, yd, R, H, I, E, k, nil)
	}
	var ys, sg driver.DevicePtr
	if join != nil {
		ys, sg = st.buf("moe_ys", int64(M)*int64(H)*4), st.buf("moe_sg", int64(M)*4)
	} else if w.Shared != nil {
		sI, _ := w.Shared.Gate.Dims()
		sgu := st.buf("moe_sgu", int64(M)*int64(2*sI)*4)
		sh := st.buf("moe_sh", int64(M)*int64(sI)*4)
		ys = st.buf("moe_ys", int64(M)*int64(H)*4)
		sg = st.buf("moe_sg", int64(M)*4)
		sgm, sum, sdm := w.Shared.Gate.(*mat), w.Shared.Up.(*mat), w.Shared.Down.(*mat)
		if st.fusable(sgm, sum) && st.fusable(sdm) && sum.rows == sI && sdm.cols == sI {
			// Decode: gate|up stacked in one matvec, SwiGLU in the down
			// projection's prologue (the dense MLP's fusion): 2 launches, not 4.
			st.mq(sgm.dt, kern.MQ{W: [3]driver.DevicePtr{sgm.p, sum.p}, Rows: [3]int{sI, sI}, Cols: H, X: xb, Ldx: H,
				Y: sgu, Ldy: 2 * sI, Pro: kern.ProPlain}, R)
			st.sharedDown(sdm, sgu, sI, ys, H, R)
		} else {
			st.mv(sgm, xb, H, sgu, 2*sI, 0, false, R)
			st.mv(sum, xb, H, sgu.Add(int64(4*sI)), 2*sI, 0, false, R)
			st.a().Ptr(sgu).Ptr(sgu.Add(int64(4 * sI))).Int(2 * sI).Ptr(sh).Int(sI).Int(sI)
			st.launch("silu_mul", driver.D2((sI+255)/256, R), driver.D1(256), 0)
			st.mv(sdm, sh, sI, ys, H, 0, false, R)
		}
		if !routerGate {
			st.mv(w.SharedGate.(*mat), xb, H, sg, 1, 0, false, R)
		}
	}
	if fused {
		st.moeSlots(dt, tabs, xb, ids, gu, yd, R, H, I, E, k, &moeComb{wts, x, ys, sg, join})
		return
	}
	st.a().Ptr(x).Int(H).Ptr(yd).Int(H).Ptr(wts).Int(k).Ptr(ys).Ptr(sg).Int(H).Ptr(inv)
	st.launch("moe_combine", driver.D2((H+255)/256, R), driver.D1(256), 0)
}

// moeFusable reports whether a decode step's MoE block takes the fused
// launches: at most maxMatvecRows rows, q4tp or q8_row experts, a float32
// router moe_router_f32 takes, not Options.NoFusion.
func (st *state) moeFusable(w *backend.MoE, dt quant.DType, H int) bool {
	r, ok := w.Router.(*mat)
	return ok && st.rows <= maxMatvecRows && !st.d.opt.NoFusion && (dt == quant.Q4TP || dt == quant.Q8Row) &&
		r.dt == quant.F32 && r.cols == H && r.rows == len(w.Experts) && kern.MoERouterFits(r.rows, H, r.p)
}

// moeGroupRows: steps of more rows than this (prefill chunks, large
// batches) run the experts grouped (moeGrouped); smaller ones one matvec
// per (row, slot) (moeSlots).
const moeGroupRows = 8

// moeGroupable reports whether w's experts can run grouped on the int8
// tensor cores (kern.MoEGroupedSupported; Options.NoMoEGroups keeps the
// per-slot matvecs, whose arithmetic is the same).
func (st *state) moeGroupable(w *backend.MoE, dt quant.DType, H, I, nslot int) bool {
	if st.d.opt.NoMoEGroups {
		return false
	}
	ptrs := make([]kern.Ptr, 0, 3*len(w.Experts))
	for _, ex := range w.Experts {
		ptrs = append(ptrs, ex.Gate.(*mat).p, ex.Up.(*mat).p, ex.Down.(*mat).p)
	}
	return kern.MoEGroupedSupported(dt, H, nslot, len(w.Experts), ptrs) && kern.MoEGroupedSupported(dt, I, nslot, len(w.Experts), nil)
}

// moeGrouped runs the experts of an R-row step grouped by expert: moe_sort
// orders the R·k (row, slot) pairs by expert in tiles of kern.MoETile rows;
// the rows' activations are quantized once (gemmq_actq) and gathered into
// that order (moe_gather_q); gemmq_moe_* multiplies each tile by its
// expert's gate and up weights, gemmq_actq_pro quantizes their SwiGLU for
// the down product in the same order, and gemmq_moe_* the down weights.
// Each selected expert's weights are read once a tile, not once a row.
// It returns the down outputs (sorted rows) and the map from a slot
// to its sorted row, for moe_combine.
func (st *state) moeGrouped(w *backend.MoE, fam string, dt quant.DType, tabs [3]driver.DevicePtr, xb, ids driver.DevicePtr,
	R, H, I, E, k int) (yd, inv driver.DevicePtr) {
	M := st.d.opt.MaxRows
	nslot := R * k
	ntile, tmax := kern.MoETiles(nslot, E), kern.MoETiles(M*k, E)
	rows := ntile * kern.MoETile
	perm := st.buf("moeg_perm", int64(tmax*kern.MoETile)*4)
	inv = st.buf("moeg_inv", int64(M*k)*4)
	tileE := st.buf("moeg_tile", int64(tmax)*4)
	nq, ns := kern.GemmQScratch(H, M)
	xq, xd := st.buf("moeg_xq", nq), st.buf("moeg_xd", ns)
	gq, gd := kern.GemmQScratch(max(H, I), tmax*kern.MoETile)
	sq, sd := st.buf("moeg_q", gq), st.buf("moeg_d", gd)
	gu := st.buf("moeg_gu", int64(tmax*kern.MoETile)*int64(2*I)*4)
	yd = st.buf("moeg_y", int64(tmax*kern.MoETile)*int64(H)*4)
	perm4 := b2i(dt == quant.Q4TP)

	st.a().Ptr(ids).Int(nslot).Int(E).Ptr(perm).Ptr(inv).Ptr(tileE).Int(ntile)
	sg, sb := kern.MoESortLaunch(E)
	st.launch("moe_sort", sg, sb, 0)
	cfg := kern.ActQuantLaunch(H, R)
	st.a().Ptr(xb).Int(H).Int(H).Ptr(xq).Ptr(xd).Int(perm4)
	st.launch("gemmq_actq", cfg.Grid, cfg.Block, 0)
	st.a().Ptr(xq).Ptr(xd).Int(H).Int(k).Ptr(perm).Ptr(tileE).Ptr(sq).Ptr(sd)
	st.launch("moe_gather_q", driver.D1(rows), driver.D1(128), 0)
	grid, block := kern.GemmQMoELaunch(I, ntile)
	for j, t := range tabs[:2] { // gate, up: [gate | up] rows of 2I
		st.a().Ptr(t).Ptr(tileE).Int(I).Int(H).Ptr(sq).Ptr(sd).Ptr(gu.Add(int64(4 * j * I))).Int(2 * I).Int(rows)
		st.launch("gemmq_moe_"+fam, grid, block, 0)
	}
	// SwiGLU in the down product's quantizer (gemmq_actq_pro: silu_mul's
	// values, bit for bit), no silu_mul launch.
	kern.GemmQ{X: gu, Ldx: 2 * I, Cols: I, Quants: sq, Scales: sd}.PackQuantPro(st.a(), perm4, kern.ProSilu, gu.Add(int64(4*I)), 0, 0)
	cfg = kern.ActProLaunch(I, rows, kern.ProSilu)
	st.launch("gemmq_actq_pro", cfg.Grid, cfg.Block, 0)
	grid, block = kern.GemmQMoELaunch(H, ntile)
	st.a().Ptr(tabs[2]).Ptr(tileE).Int(H).Int(I).Ptr(sq).Ptr(sd).Ptr(yd).Int(H).Int(rows)
	st.launch("gemmq_moe_"+fam, grid, block, 0)
	return yd, inv
}

// moeSlots runs the experts of a small step one matvec per (row, slot)
// over the selected expert (mv_moe_*: gate and up in one launch, then
// down into yd), in chunks of moeMaxSlots slots. With comb (fused decode
// steps) the down launch is mv_moe_dc_*: the down products summed by their
// weights (and the gated shared expert) straight into the residual; with
// Options.MoEFF both are one launch, mv_moe_ff_* (a grid barrier between
// the phases, the down rows prefetched under the gate|up phase).
func (st *state) moeSlots(dt quant.DType, tabs [3]driver.DevicePtr, xb, ids, gu, yd driver.DevicePtr, R, H, I, E, k int, comb *moeComb) {
	chunk := max(1, moeMaxSlots/k)
	for c0 := 0; c0 < R; c0 += chunk {
		n := min(chunk, R-c0)
		sl := int64(c0 * k)
		// A decode step's down launch over SwiGLU rows the gate|up launch
		// wrote itself (kern.MoEXGLU: half the bytes, no SiLU in every
		// block of the down launch's prologue), where the experts take it.
		glu := comb != nil && !st.d.opt.MoEFF && !st.d.opt.NoFusion && kern.MoEGLUFits(dt, H)
		switch {
		case glu:
			st.moeLaunch(dt, tabs[0], E, 2, ids.Add(4*sl), n*k, k, I, H, xb.Add(4*int64(c0)*int64(H)), H, 0, kern.MoEXGLU,
				gu.Add(4*sl*int64(I)), I, kern.ProPlain, n)
		case comb == nil || !st.d.opt.MoEFF:
			st.moeLaunch(dt, tabs[0], E, 2, ids.Add(4*sl), n*k, k, I, H, xb.Add(4*int64(c0)*int64(H)), H, 0, kern.MoEXRow,
				gu.Add(4*sl*int64(2*I)), 2*I, kern.ProPlain, n)
		}
		if comb == nil {
			st.moeLaunch(dt, tabs[2], E, 1, ids.Add(4*sl), n*k, k, H, I, gu.Add(4*sl*int64(2*I)), 2*I, I, kern.MoEXSlot,
				yd.Add(4*sl*int64(H)), H, kern.ProSilu, n*k)
			continue
		}
		if comb.join != nil {
			comb.join() // the shared expert's rows, from the side stream
			comb.join = nil
		}
		if st.d.opt.MoEFF {
			// The whole expert FFN in one launch (a grid barrier between
			// gate|up and down).
			ff := kern.MoEFFArgs{TGU: tabs[0], TD: tabs[2], E: E, IDs: ids.Add(4 * sl), NSlot: n * k, K: k, I: I, H: H,
				X: xb.Add(4 * int64(c0) * int64(H)), Ldx: H, GU: gu.Add(4 * sl * int64(2*I)), Ldgu: 2 * I,
				Y: comb.x.Add(4 * int64(c0) * int64(H)), Ldy: H, W8: comb.wts.Add(4 * sl), Bar: st.bufZeroed("moe_bar", 8)}
			if comb.ys != 0 {
				ff.YS, ff.G = comb.ys.Add(4*int64(c0)*int64(H)), comb.sg.Add(4*int64(c0))
			}
			if err := ff.Check(dt); err != nil && !(st.stale && ff.Bar == 0) { // (a check pass before the barrier's first allocation)
				st.fail(fmt.Errorf("cuda: %w", err))
				return
			}
			ff.Pack(st.a())
			st.launch("mv_moe_ff_"+kern.MoEExpertFamily(dt), kern.MoEFFGrid(n*k, k, I, H, st.d.info.SMs), driver.D1(512), kern.MoEFFShared(n*k, k, I, H))
			continue
		}
		dc := kern.MoEDownCombineArgs{Table: tabs[2], E: E, IDs: ids.Add(4 * sl), NSlot: n * k, K: k, Rows: H, Cols: I,
			X: gu.Add(4 * sl * int64(2*I)), Ldx: 2 * I, Xoff: I, Y: comb.x.Add(4 * int64(c0) * int64(H)), Ldy: H, W8: comb.wts.Add(4 * sl)}
		if glu {
			dc.X, dc.Ldx, dc.Xoff, dc.GLU = gu.Add(4*sl*int64(I)), I, 0, true
		}
		if comb.ys != 0 {
			dc.YS, dc.G = comb.ys.Add(4*int64(c0)*int64(H)), comb.sg.Add(4*int64(c0))
		}
		if err := dc.Check(dt); err != nil {
			st.fail(fmt.Errorf("cuda: %w", err))
			return
		}
		dc.Pack(st.a())
		st.launch("mv_moe_dc_"+kern.MoEExpertFamily(dt), kern.MoEDownCombineGrid(n, H, st.d.info.SMs), driver.D1(512), kern.MatvecShared(I, n*k))
	}
}

// moeComb is the combine mv_moe_dc_* folds into a decode step's down
// launches: the routing weights, the residual rows, the shared expert's
// output and gate logits (0: none), and the join to make before the first
// down launch when the shared expert runs on the side stream (nil: none).
type moeComb struct {
	wts, x, ys, sg driver.DevicePtr
	join           func()
}

// sharedBranch queues a decode step's shared expert on the side stream
// (unless Options.NoBranch): gate|up stacked with the block's norm in the
// prologue (from x itself, so it starts with the router), then down with
// SwiGLU in its prologue into moe_ys; the step's launches resume on its
// own stream. It returns the join for the down launch that adds moe_ys,
// or nil (nothing queued) when the shared expert does not take the fused
// matvecs.
func (st *state) sharedBranch(w *backend.MoE, x driver.DevicePtr, R, H int) func() {
	M := st.d.opt.MaxRows
	sgm, sum, sdm := w.Shared.Gate.(*mat), w.Shared.Up.(*mat), w.Shared.Down.(*mat)
	sI := sgm.rows
	g, ok := w.SharedGate.(*mat)
	if !st.fusable(sgm, sum) || !st.fusable(sdm) || sum.rows != sI || sdm.cols != sI || sgm.cols != H ||
		!ok || g.dt != quant.F32 || g.rows != 1 || g.cols != H || g.p%16 != 0 {
		return nil
	}
	sgu := st.buf("moe_sgu", int64(M)*int64(2*sI)*4)
	ys := st.buf("moe_ys", int64(M)*int64(H)*4)
	st.fork()
	st.mvNorm([]backend.Mat{sgm, sum}, []driver.DevicePtr{0, 0}, x, H, sgu, 2*sI, &w.Norm, R)
	st.sharedDown(sdm, sgu, sI, ys, H, R)
	st.unfork()
	return st.join
}

// sharedDown queues the shared expert's fused down projection of a decode
// step: SwiGLU of the gate|up rows sgu (2·sI wide) in its prologue, into ys.
func (st *state) sharedDown(sdm *mat, sgu driver.DevicePtr, sI int, ys driver.DevicePtr, H, R int) {
	st.mq(sdm.dt, kern.MQ{W: [3]driver.DevicePtr{sdm.p}, Rows: [3]int{sdm.rows}, Cols: sI, X: sgu, Ldx: 2 * sI, XOff: sI,
		Y: ys, Ldy: H, Pro: kern.ProSilu}, R)
}

// moeLaunch queues mv_moe_<fam> over nslot slots of nmat rowsE×cols
// matrices of E experts from table, nx activation rows quantized in the
// prologue.
func (st *state) moeLaunch(dt quant.DType, table driver.DevicePtr, E, nmat int, ids driver.DevicePtr, nslot, k, rowsE, cols int, x driver.DevicePtr, ldx, xoff, xmode int,
	y driver.DevicePtr, ldy, pro, nx int) {
	fam := kern.MoEExpertFamily(dt)
	shared := kern.MoEMatvecSharedFor(dt, cols, nx)
	if shared > 200<<10 {
		st.fail(fmt.Errorf("cuda: expert matvec of %d columns over %d rows needs %d bytes of shared memory: %w", cols, nx, shared, backend.ErrUnsupported))
		return
	}
	st.a().Ptr(table).Int(E).Int(nmat).Ptr(ids).Int(nslot).Int(k).Int(rowsE).Int(cols).Ptr(x).Int(ldx).Int(xoff).Int(xmode).Ptr(y).Int(ldy).
		Int(pro).Ptr(0).F32(0)
	st.launch("mv_moe_"+fam, kern.MoEMatvecGrid(nslot, nmat, rowsE, st.d.info.SMs), driver.D1(512), shared)
}

// moeTables returns the device tables of w's expert base pointers (gate,
// up, down), written once by the first eager step that uses them (a
// recorded graph reads them as they are).
func (st *state) moeTables(w *backend.MoE) [3]driver.DevicePtr {
	E := len(w.Experts)
	var t [3]driver.DevicePtr
	name, ok := st.d.moeNames[w]
	if !ok {
		name = fmt.Sprintf("moe_table_%p", w)
		if st.d.moeNames == nil {
			st.d.moeNames = map[*backend.MoE]string{}
		}
		st.d.moeNames[w] = name
	}
	p := st.buf(name, int64(3*E*8))
	if st.err != nil || p == 0 {
		return t
	}
	for j := range t {
		t[j] = p.Add(int64(8 * E * j))
	}
	if st.mode != modeRun {
		return t
	}
	ptrs := make([]driver.DevicePtr, 0, 3*E)
	for j := range 3 {
		for _, ex := range w.Experts {
			ptrs = append(ptrs, []backend.Mat{ex.Gate, ex.Up, ex.Down}[j].(*mat).p)
		}
	}
	if slices.Equal(st.d.moeDone[name], ptrs) {
		return t // written with these weights (a new block at a reused address is rewritten)
	}
	stage := st.r.stage()
	off := len(stage) - 3*E*8 // the stage's end: inputs, dynamic RoPE and logits copies start at 0
	for i, q := range ptrs {
		binary.LittleEndian.PutUint64(stage[off+8*i:], uint64(q))
	}
	if err := st.r.htod(p, off, 3*E*8); err != nil {
		st.fail(err)
		return t
	}
	if err := st.r.sync(); err != nil { // the stage region is reused by the next table
		st.fail(err)
		return t
	}
	if st.d.moeDone == nil {
		st.d.moeDone = map[string][]driver.DevicePtr{}
	}
	st.d.moeDone[name] = ptrs
	return t
}

// DeltaChunkMin is the fewest rows of one sequence in a step for which its
// Gated DeltaNet rule runs in chunks (dn_chunk_*) rather than row by row
// (dn_rule): below it the three launches cost more than the rows.
const DeltaChunkMin = 16

// deltaChunks reports whether this step's DeltaNet rule runs chunked: not
// a decode step, some sequence with at least DeltaChunkMin rows, heads the
// chunked kernels take, and not Options.NoDeltaChunks.
func (st *state) deltaChunks(k kern.DeltaNet) bool {
	if st.d.opt.NoDeltaChunks || st.rows == len(st.b.Seqs) || !k.ChunkFits() {
		return false
	}
	for _, t := range st.b.Tokens {
		if len(t) >= DeltaChunkMin {
			return true
		}
	}
	return false
}

// DeltaNet adds layer's Gated DeltaNet block to x: the input RMSNorm and
// the projections (st.mv / the fused decode matvec) into one row per token
// of ProjWidth floats (the model's layout kept: dn_* read either), the
// causal conv over each sequence's carried inputs (dn_conv, then
// dn_conv_state advances them), the delta rule with its gates, L2 norms
// and gated RMSNorm (dn_rule: one block per sequence and value head,
// walking the sequence's rows in order; a decode step's sequences are its
// rows, so the launch shape is the graph key's; prefill steps the chunked
// form, deltaChunks), and x += out_proj(o). Every
// launch reads the rows' slots from the staged inputs: decode steps replay
// from a graph.
func (st *state) DeltaNet(w *backend.DeltaNet, layer int) {
	if st.err != nil {
		return
	}
	d, R, H, M := st.d, st.rows, st.H, st.d.opt.MaxRows
	s := w.Shape
	if d.spec == nil || layer < 0 || layer >= len(d.ls) || d.ls[layer] == 0 || d.spec.DeltaNetShape != s {
		st.fail(fmt.Errorf("cuda: layer %d (Gated DeltaNet %+v) has no linear-attention state in the pool", layer, s))
		return
	}
	kd, vd, cd := s.Dims()
	nv := s.ValueHeads
	k := kern.DeltaNet{KeyHeads: s.KeyHeads, ValueHeads: nv, KeyDim: s.KeyDim, ValueDim: s.ValueDim, ConvKernel: s.ConvKernel,
		Grouped: w.QKVZ != nil, ConvW: ptrOf(w.Conv), State: d.ls[layer], Slot: st.slot(),
		ALog: ptrOf(w.ALog), Dt: ptrOf(w.DtBias), NormW: ptrOf(w.GateNorm.W), Eps: w.GateNorm.Eps}
	pw := k.ProjWidth()
	k.Ldp, k.Ldc, k.Ldo = pw, cd, vd
	if err := k.Check(); err != nil {
		st.fail(fmt.Errorf("cuda: layer %d: %w", layer, err))
		return
	}
	dims := func(m backend.Mat, r, c int) bool {
		if m == nil {
			return false
		}
		mr, mc := m.Dims()
		return mr == r && mc == c
	}
	vlen := func(v backend.Vec, n int) bool { return v != nil && v.Len() == n }
	var ms []backend.Mat
	if k.Grouped {
		ms = []backend.Mat{w.QKVZ, w.BA}
		if !dims(w.QKVZ, 2*kd+2*vd, H) || !dims(w.BA, 2*nv, H) || w.QKV != nil {
			st.fail(fmt.Errorf("cuda: layer %d: in_proj_qkvz/in_proj_ba shapes for width %d (or both layouts set)", layer, H))
			return
		}
	} else {
		ms = []backend.Mat{w.QKV, w.Z, w.B, w.A}
		if !dims(w.QKV, cd, H) || !dims(w.Z, vd, H) || !dims(w.B, nv, H) || !dims(w.A, nv, H) {
			st.fail(fmt.Errorf("cuda: layer %d: in_proj_qkv/z/b/a shapes for width %d", layer, H))
			return
		}
	}
	if !vlen(w.Conv, cd*s.ConvKernel) || !vlen(w.ALog, nv) || !vlen(w.DtBias, nv) || !vlen(w.GateNorm.W, s.ValueDim) || !dims(w.Out, H, vd) {
		st.fail(fmt.Errorf("cuda: layer %d: conv/A_log/dt_bias/norm/out_proj shapes", layer))
		return
	}
	x := st.buf("x", int64(M)*int64(H)*4)
	xb := st.buf("xb", int64(M)*int64(H)*4)
	k.Proj = st.buf("dn_proj", int64(M)*int64(pw)*4)
	k.Conv = st.buf("dn_conv", int64(M)*int64(cd)*4)
	k.Out = st.buf("dn_o", int64(M)*int64(vd)*4)
	// Column of each projection in a row: grouped [qkvz | ba], split
	// [qkv | z | b | a].
	cols := []int{0, 2*kd + 2*vd}
	if !k.Grouped {
		cols = []int{0, cd, cd + vd, cd + vd + nv}
	}
	if st.fusable(ms...) {
		// Decode: the norm in the matvecs' prologue, up to three stacked
		// tensors a launch (their rows land side by side, as cols says).
		for i := 0; i < len(ms); i += 3 {
			j := min(len(ms), i+3)
			st.mvNorm(ms[i:j], make([]driver.DevicePtr, j-i), x, H, k.Proj.Add(int64(4*cols[i])), pw, &w.Norm, R)
		}
	} else {
		st.rmsnorm(x, xb, R, H, &w.Norm)
		for i, m := range ms {
			st.mv(m.(*mat), xb, H, k.Proj.Add(int64(4*cols[i])), pw, 0, false, R)
		}
	}
	cc, rc := k.ConvLaunch(R), k.RuleLaunch(len(st.b.Seqs))
	k.PackConv(st.a())
	if R == len(st.b.Seqs) && !st.d.opt.NoFusion {
		// Decode (each row a sequence of its own): the conv and the
		// carried inputs' shift in one launch.
		st.launch("dn_conv_step", cc.Grid, cc.Block, 0)
	} else {
		st.launch("dn_conv", cc.Grid, cc.Block, 0)
		k.PackConvState(st.a())
		st.launch("dn_conv_state", cc.Grid, cc.Block, 0)
	}
	if st.deltaChunks(k) {
		// Prefill: the chunked rule (every chunk's S-free part in
		// parallel, then S carried chunk to chunk, then the gated norm).
		X := st.buf("dn_chunk", k.ChunkScratch(M))
		p, sc, nc := k.ChunkLaunches(R, len(st.b.Seqs))
		for _, c := range []struct {
			name string
			cfg  driver.Config
		}{{"dn_chunk_prep", p}, {"dn_chunk_state", sc}, {"dn_gnorm", nc}} {
			k.PackChunk(st.a(), R, X)
			st.launch(c.name, c.cfg.Grid, c.cfg.Block, c.cfg.Shared)
		}
	} else {
		k.PackRule(st.a(), R)
		st.launch("dn_rule", rc.Grid, rc.Block, rc.Shared)
	}
	// x += out_proj(o): the residual add in the matvec's epilogue.
	st.mv(w.Out.(*mat), k.Out, vd, x, H, 0, true, R)
}
