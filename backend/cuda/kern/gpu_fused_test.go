package kern_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/kernels"
	"github.com/cortiq/cortiq/quant"
)

// TestGPUMoERouter: moe_router_f32 (the norm, the router's float32
// logits and the routing in one launch) against the unfused launches
// (rmsnorm, mv_f32, moe_route) on the same rows: the normalised rows xb to
// 1e-6, the probabilities written back to 2e-6, ids the top k of the
// device's own probabilities (ties to the lower index) and the weights
// those probabilities (renormalised when asked), the counters back to
// zero, a second launch bitwise the same, and the shared expert's gate
// logit (the router's extra row) as mv_f32's to 1e-5 of Σ|w|. Shapes: Qwen3-30B-A3B's
// router (128 × 2048, top 8), Qwen3-Next's (512 × 2048, top 10), and one
// of 10 experts of 2304 (rows past the prefetch, a partial block).
func TestGPUMoERouter(t *testing.T) {
	g := newGPU(t)
	r := rng(47)
	for _, c := range []struct {
		E, H, k, R int
		renorm     bool
		onePlus    bool
	}{{128, 2048, 8, 1, true, false}, {512, 2048, 10, 2, true, true}, {10, 2304, 3, 3, false, false}} {
		E, H, k, R := c.E, c.H, c.k, c.R
		x, nw, W := r.vec(R*H, 1), r.vec(H, 0.2), r.vec(E*H, 0.05)
		for i := range nw {
			if !c.onePlus {
				nw[i] += 1
			}
		}
		dx, dnw, dW := g.f32(x), g.f32(nw), g.f32(W)
		xb1, lg1, ids1, w1 := g.zeros(R*H), g.zeros(R*E), g.zeros(R*k), g.zeros(R*k)
		xb2, lg2, ids2, w2, cnt := g.zeros(R*H), g.zeros(R*E), g.zeros(R*k), g.zeros(R*k), g.zeros(R)
		const eps = 1e-6
		g.run(func(l *kern.Launcher) error {
			return errorsJoin(l.RMSNorm(dx, H, dnw, xb1, H, H, R, eps, c.onePlus),
				l.Matvec(quant.F32, dW, E, H, xb1, H, lg1, E, R, 0, false),
				l.MoERoute(lg1, E, E, k, c.renorm, ids1, w1, R))
		})
		// The shared expert's gate (one row of H) beside the router on
		// every case but the last.
		sgw := r.vec(H, 0.05)
		dsgw, sg1, sg2 := g.f32(sgw), g.zeros(R), g.zeros(R)
		withGate := E != 10
		if withGate {
			g.run(func(l *kern.Launcher) error { return l.Matvec(quant.F32, dsgw, 1, H, xb1, H, sg1, 1, R, 0, false) })
		}
		m := kern.MoERouterArgs{X: dx, Ldx: H, Norm: dnw, Eps: eps, OnePlus: c.onePlus, Router: dW, H: H, E: E, K: k,
			Renorm: c.renorm, Logits: lg2, Ldl: E, IDs: ids2, W8: w2, XB: xb2, Ldxb: H, Cnt: cnt, R: R}
		if withGate {
			m.SGW, m.SG = dsgw, sg2
		}
		g.run(func(l *kern.Launcher) error { return l.MoERouter(m) })
		if withGate {
			want, got := g.readF32(sg1, R), g.readF32(sg2, R)
			var mag float64
			for i := range H {
				mag += math.Abs(float64(sgw[i]))
			}
			for i := range want {
				if math.Abs(float64(want[i]-got[i])) > 1e-5*mag {
					t.Fatalf("E %d: the shared gate's logit of row %d %g, mv_f32 %g", E, i, got[i], want[i])
				}
			}
		}
		refXB, gotXB := g.readF32(xb1, R*H), g.readF32(xb2, R*H)
		exact := 0
		for i := range refXB {
			if refXB[i] == gotXB[i] {
				exact++
			}
			if math.Abs(float64(refXB[i]-gotXB[i])) > 1e-6*(1+math.Abs(float64(refXB[i]))) {
				t.Fatalf("E %d H %d: xb[%d] %g, rmsnorm %g", E, H, i, gotXB[i], refXB[i])
			}
		}
		refP, gotP := g.readF32(lg1, R*E), g.readF32(lg2, R*E)
		for i := range refP {
			if math.Abs(float64(refP[i]-gotP[i])) > 2e-6*(float64(refP[i])+1e-3) {
				t.Fatalf("E %d H %d: probability %d %g, unfused %g", E, H, i, gotP[i], refP[i])
			}
		}
		gotIDs, gotW := g.readI32(ids2, R*k), g.readF32(w2, R*k)
		refIDs := g.readI32(ids1, R*k)
		same := 0
		for row := range R {
			idx, w := make([]int, k), make([]float32, k)
			kernels.TopK(gotP[row*E:(row+1)*E], c.renorm, idx, w)
			for j := range k {
				if int(gotIDs[row*k+j]) != idx[j] {
					t.Fatalf("E %d row %d slot %d: expert %d, the top %d of its probabilities has %d", E, row, j, gotIDs[row*k+j], k, idx[j])
				}
				if math.Abs(float64(gotW[row*k+j]-w[j])) > 1e-6*float64(w[j]) {
					t.Fatalf("E %d row %d slot %d: weight %g, want %g", E, row, j, gotW[row*k+j], w[j])
				}
				if refIDs[row*k+j] == gotIDs[row*k+j] {
					same++
				}
			}
		}
		if cn := g.readI32(cnt, R); cn[0] != 0 || cn[R-1] != 0 {
			t.Fatalf("E %d: counters %v after the launch, not zeros", E, cn)
		}
		g.run(func(l *kern.Launcher) error { return l.MoERouter(m) })
		again, againIDs := g.readF32(lg2, R*E), g.readI32(ids2, R*k)
		for i := range again {
			if math.Float32bits(again[i]) != math.Float32bits(gotP[i]) {
				t.Fatalf("E %d: the second launch's probability %d is %g, the first's %g", E, i, again[i], gotP[i])
			}
		}
		for i := range againIDs {
			if againIDs[i] != gotIDs[i] {
				t.Fatalf("E %d: the second launch routes slot %d to %d, the first to %d", E, i, againIDs[i], gotIDs[i])
			}
		}
		t.Logf("router %d×%d top %d, %d rows: xb %d/%d bitwise rmsnorm's, %d/%d ids the unfused launches'", E, H, k, R, exact, len(refXB), same, R*k)
	}
}

// TestGPUMoEDownCombine: mv_moe_dc_* (the down products of every slot,
// their weighted sum and the gated shared expert added to the residual)
// against mv_moe_* (xmode 1, SwiGLU prologue) then moe_combine on the
// same inputs, q8_row and q4tp: Qwen3-30B-A3B's down shape (2048 × 768,
// top 8, one row; 24 experts, not 128: the encoding is the test's cost) and a shared-expert case of top 10 (not a multiple of the
// kernel's 8 slots at once) over 3 rows.
func TestGPUMoEDownCombine(t *testing.T) {
	g := newGPU(t)
	r := rng(53)
	for _, dt := range []quant.DType{quant.Q4TP, quant.Q8Row} {
		for _, c := range []struct {
			E, k, R, H, I int
			shared        bool
		}{{24, 8, 1, 2048, 768, false}, {16, 10, 3, 256, 96, true}, {8, 8, 8, 128, 64, true}} {
			E, k, R, H, I := c.E, c.k, c.R, c.H, c.I
			td := make([]byte, 8*E)
			for e := range E {
				binary.LittleEndian.PutUint64(td[8*e:], uint64(g.randomMat(&r, dt, H, I)))
			}
			ids, wv := moeRouting(&r, R, k, E, 7)
			x0, gu := r.vec(R*H, 1), r.vec(R*k*2*I, 1)
			ys, sg := r.vec(R*H, 1), r.vec(R, 1)
			dtd, dids, dw, dgu := g.upload(td), g.i32(ids), g.f32(wv), g.f32(gu)
			dx1, dx2, yd := g.f32(x0), g.f32(x0), g.zeros(R*k*H)
			var dys, dsg kern.Ptr
			if c.shared {
				dys, dsg = g.f32(ys), g.f32(sg)
			}
			g.run(func(l *kern.Launcher) error {
				return errorsJoin(l.MoEMatvec(dt, dtd, E, 1, dids, R*k, k, H, I, dgu, 2*I, I, 1, yd, H, kern.ProSilu),
					l.MoECombine(dx1, H, yd, H, dw, k, dys, dsg, H, R, 0))
			})
			g.run(func(l *kern.Launcher) error {
				return l.MoEDownCombine(dt, kern.MoEDownCombineArgs{Table: dtd, E: E, IDs: dids, NSlot: R * k, K: k, Rows: H, Cols: I,
					X: dgu, Ldx: 2 * I, Xoff: I, Y: dx2, Ldy: H, W8: dw, YS: dys, G: dsg})
			})
			want, got := g.readF32(dx1, R*H), g.readF32(dx2, R*H)
			exact := 0
			for i := range want {
				if want[i] == got[i] {
					exact++
				}
				if math.Abs(float64(want[i]-got[i])) > 2e-6*(1+math.Abs(float64(want[i]))) {
					t.Fatalf("%s E %d k %d R %d: y[%d] %g, mv_moe + moe_combine %g", dt, E, k, R, i, got[i], want[i])
				}
			}
			t.Logf("%s down %d×%d top %d, %d rows, shared %v: %d/%d outputs bitwise the unfused launches'", dt, H, I, k, R, c.shared, exact, len(want))
		}
	}
}

// TestGPURopeQKNorm: rope_qk_append with the q/k norms folded in equals
// head_rmsnorm on the q and k heads then rope_qk_append without them,
// bitwise (the same sums in the same order), f32 and f16 caches, plain and
// zero-centred norm weights.
func TestGPURopeQKNorm(t *testing.T) {
	g := newGPU(t)
	r := rng(59)
	const nq, nkv, hd, R, ctx = 8, 2, 128, 3, 16
	ld := (nq + 2*nkv) * hd
	for _, f16 := range []bool{false, true} {
		for _, onePlus := range []bool{false, true} {
			qkv := r.vec(R*ld, 1)
			qw, kw := r.vec(hd, 0.3), r.vec(hd, 0.3)
			inv := invFreq(hd, 1e6)
			dqw, dkw, dinv := g.f32(qw), g.f32(kw), g.f32(inv)
			pos, slot := g.i32([]int32{0, 5, 9}), g.i32([]int32{0, 1, 2})
			per := 3 * nkv * ctx * hd
			a1, a2 := g.f32(qkv), g.f32(qkv)
			kc1, vc1, kc2, vc2 := g.zeros(per), g.zeros(per), g.zeros(per), g.zeros(per)
			const eps = 1e-6
			g.run(func(l *kern.Launcher) error {
				return errorsJoin(l.HeadRMSNorm(a1, ld, dqw, nq, hd, R, eps, onePlus),
					l.HeadRMSNorm(a1.Add(4*nq*hd), ld, dkw, nkv, hd, R, eps, onePlus),
					l.RopeQKAppend(a1, ld, nq, nkv, hd, hd, dinv, 1, pos, slot, kc1, vc1, ctx, R, f16, kern.HeadNorms{}))
			})
			g.run(func(l *kern.Launcher) error {
				return l.RopeQKAppend(a2, ld, nq, nkv, hd, hd, dinv, 1, pos, slot, kc2, vc2, ctx, R, f16,
					kern.HeadNorms{Q: dqw, K: dkw, Eps: eps, OnePlus: onePlus})
			})
			for _, p := range [][2]kern.Ptr{{a1, a2}, {kc1, kc2}, {vc1, vc2}} {
				n := R * ld
				if p[0] != a1 {
					n = per
				}
				want, got := g.readBytes(p[0], 4*n), g.readBytes(p[1], 4*n)
				for i := range want {
					if want[i] != got[i] {
						t.Fatalf("f16 %v onePlus %v: byte %d of %d differs (fused %d, unfused %d)", f16, onePlus, i, len(want), got[i], want[i])
					}
				}
			}
		}
	}
}

// moeFFCase is one decode step's expert FFN on the device: E experts'
// gate|up table ([gate E | up E], I×H each) and down table (H×I) of
// format dt, top-k routing of R rows (moeRouting's weights at scale ws),
// the normalised rows xb, the residual y0, and with shared the shared
// expert's rows and gate logits (else 0).
type moeFFCase struct {
	dt                          quant.DType
	E, k, R, H, I               int
	tgu, td, ids, w, xb, ys, sg kern.Ptr
	y0                          []float32
}

func newMoEFFCase(g *gpu, r *rng, dt quant.DType, E, k, R, H, I int, shared bool, ws int) moeFFCase {
	tgu, td := make([]byte, 16*E), make([]byte, 8*E)
	for e := range E {
		binary.LittleEndian.PutUint64(tgu[8*e:], uint64(g.randomMat(r, dt, I, H)))
		binary.LittleEndian.PutUint64(tgu[8*(E+e):], uint64(g.randomMat(r, dt, I, H)))
		binary.LittleEndian.PutUint64(td[8*e:], uint64(g.randomMat(r, dt, H, I)))
	}
	ids, wv := moeRouting(r, R, k, E, ws)
	xb, y0 := r.vec(R*H, 1), r.vec(R*H, 1)
	ys, sg := r.vec(R*H, 1), r.vec(R, 1)
	f := moeFFCase{dt: dt, E: E, k: k, R: R, H: H, I: I, tgu: g.upload(tgu), td: g.upload(td), ids: g.i32(ids), w: g.f32(wv), xb: g.f32(xb), y0: y0}
	if shared {
		f.ys, f.sg = g.f32(ys), g.f32(sg)
	}
	return f
}

// unfused runs the default two launches (mv_moe_* gate|up, xmode 0, then
// mv_moe_dc_* with its SiLU prologue) and returns the gate|up rows and the
// residual after them.
func (f moeFFCase) unfused(g *gpu) (gu, y []float32) {
	E, k, R, H, I := f.E, f.k, f.R, f.H, f.I
	dgu, dy := g.zeros(R*k*2*I), g.f32(f.y0)
	g.run(func(l *kern.Launcher) error {
		return errorsJoin(l.MoEMatvec(f.dt, f.tgu, E, 2, f.ids, R*k, k, I, H, f.xb, H, 0, kern.MoEXRow, dgu, 2*I, kern.ProPlain),
			l.MoEDownCombine(f.dt, kern.MoEDownCombineArgs{Table: f.td, E: E, IDs: f.ids, NSlot: R * k, K: k, Rows: H, Cols: I,
				X: dgu, Ldx: 2 * I, Xoff: I, Y: dy, Ldy: H, W8: f.w, YS: f.ys, G: f.sg}))
	})
	return g.readF32(dgu, R*k*2*I), g.readF32(dy, R*H)
}

// TestGPUMoEFF: mv_moe_ff_* (a decode step's expert FFN in one launch:
// gate|up, a grid barrier, down and combine) against mv_moe_* (gate|up,
// xmode 0) then mv_moe_dc_* on the same inputs, q8_row and q4tp, bitwise:
// the gate|up rows and the residual; launched three times in a row (the
// barrier's counters left as they were found) with the same result.
// Shapes: top 8 of 8 experts of 384 × 1024 over one row (a full grid of
// one block an SM), top 10 with a shared expert over 3 rows, 8 rows.
func TestGPUMoEFF(t *testing.T) {
	g := newGPU(t)
	r := rng(59)
	for _, dt := range []quant.DType{quant.Q4TP, quant.Q8Row} {
		for _, c := range []struct {
			E, k, R, H, I int
			shared        bool
		}{{8, 8, 1, 1024, 384, false}, {16, 10, 3, 256, 96, true}, {8, 8, 8, 128, 64, true}} {
			E, k, R, H, I := c.E, c.k, c.R, c.H, c.I
			f := newMoEFFCase(g, &r, dt, E, k, R, H, I, c.shared, 3)
			dtgu, dtd, dids, dw, dxb, dys, dsg, y0 := f.tgu, f.td, f.ids, f.w, f.xb, f.ys, f.sg, f.y0
			wantGU, wantY := f.unfused(g)
			bar := g.zeros(2)
			for rep := range 3 {
				gu2, y2 := g.zeros(R*k*2*I), g.f32(y0)
				g.run(func(l *kern.Launcher) error {
					return l.MoEFF(dt, kern.MoEFFArgs{TGU: dtgu, TD: dtd, E: E, IDs: dids, NSlot: R * k, K: k, I: I, H: H, X: dxb, Ldx: H,
						GU: gu2, Ldgu: 2 * I, Y: y2, Ldy: H, W8: dw, YS: dys, G: dsg, Bar: bar})
				})
				gotGU, gotY := g.readF32(gu2, R*k*2*I), g.readF32(y2, R*H)
				for i := range wantGU {
					if math.Float32bits(wantGU[i]) != math.Float32bits(gotGU[i]) {
						t.Fatalf("%s E %d k %d R %d launch %d: gate|up[%d] %g, mv_moe %g", dt, E, k, R, rep, i, gotGU[i], wantGU[i])
					}
				}
				for i := range wantY {
					if math.Float32bits(wantY[i]) != math.Float32bits(gotY[i]) {
						t.Fatalf("%s E %d k %d R %d launch %d: y[%d] %g, mv_moe + mv_moe_dc %g", dt, E, k, R, rep, i, gotY[i], wantY[i])
					}
				}
				if b := g.readI32(bar, 2); b[0] != 0 || b[1] != int32(rep+1) {
					t.Fatalf("%s launch %d: barrier counters %v, want [0 %d]", dt, rep, b, rep+1)
				}
			}
			t.Logf("%s FFN %d×%d top %d of %d, %d rows, shared %v: bitwise mv_moe + mv_moe_dc, 3 launches", dt, I, H, k, E, R, c.shared)
		}
	}
}

// TestGPUMoEGLU: mv_moe_q4tp's SwiGLU epilogue (xmode MoEXGLU: y[s][o] =
// silu(gate)·up) then mv_moe_dc_q4tp over those rows (GLU: no SiLU in its
// prologue) against the gate|up rows (xmode 0) then mv_moe_dc_q4tp's own
// SiLU, on the same inputs: the SwiGLU rows equal silu(gate)·up of the
// gate|up rows to float32 rounding, and the residual is bitwise the same
// (the epilogue computes what the down launch's prologue did). Widths of
// 32, 64 and 128 groups (segments of 4, 8 and 16 lanes, two a warp's
// output), the 30B-A3B and Qwen3-Next expert shapes (fewer experts), and 8
// rows of 4096 (dynamic shared memory that passes 48 KB only with the
// kernel's static expert table: the launch must opt in).
func TestGPUMoEGLU(t *testing.T) {
	g := newGPU(t)
	r := rng(61)
	dt := quant.Q4TP
	for _, c := range []struct {
		E, k, R, H, I int
		shared        bool
	}{{8, 8, 1, 2048, 768, false}, {10, 10, 1, 2048, 512, true}, {16, 4, 3, 1024, 96, true}, {8, 8, 8, 4096, 64, false}} {
		E, k, R, H, I := c.E, c.k, c.R, c.H, c.I
		if !kern.MoEGLUFits(dt, H) {
			t.Fatalf("H %d: MoEGLUFits false", H)
		}
		f := newMoEFFCase(g, &r, dt, E, k, R, H, I, c.shared, 5)
		dtgu, dtd, dids, dw, dxb, dys, dsg := f.tgu, f.td, f.ids, f.w, f.xb, f.ys, f.sg
		gotGU, wantY := f.unfused(g)
		h, y2 := g.zeros(R*k*I), g.f32(f.y0)
		g.run(func(l *kern.Launcher) error {
			return errorsJoin(l.MoEMatvec(dt, dtgu, E, 2, dids, R*k, k, I, H, dxb, H, 0, kern.MoEXGLU, h, I, kern.ProPlain),
				l.MoEDownCombine(dt, kern.MoEDownCombineArgs{Table: dtd, E: E, IDs: dids, NSlot: R * k, K: k, Rows: H, Cols: I,
					X: h, Ldx: I, GLU: true, Y: y2, Ldy: H, W8: dw, YS: dys, G: dsg}))
		})
		gotH := g.readF32(h, R*k*I)
		for s := range R * k {
			for o := range I {
				gv, uv := float64(gotGU[s*2*I+o]), float64(gotGU[s*2*I+I+o])
				hw := gv / (1 + math.Exp(-gv)) * uv
				if d := math.Abs(float64(gotH[s*I+o]) - hw); d > 1e-6*math.Abs(hw)+1e-30 {
					t.Fatalf("E %d k %d R %d H %d: h[%d][%d] %g, silu(gate)·up of the gate|up rows %g", E, k, R, H, s, o, gotH[s*I+o], hw)
				}
			}
		}
		got := g.readF32(y2, R*H)
		for i := range wantY {
			if math.Float32bits(wantY[i]) != math.Float32bits(got[i]) {
				t.Fatalf("E %d k %d R %d H %d: y[%d] %g over the SwiGLU rows, %g with the down launch's SiLU", E, k, R, H, i, got[i], wantY[i])
			}
		}
		t.Logf("q4tp experts %d×%d top %d of %d, %d rows, shared %v: SwiGLU epilogue, down bitwise the unfused prologue's", I, H, k, E, R, c.shared)
	}
}

// TestGPUAttentionRopeTiles: attn_rope_tiles(_h) (the rotation, the q/k
// norms and the K/V append inside the attention launch) against
// rope_qk_append(_h) then attn_tiles(_h) on a copy of the same q|k|v rows,
// bitwise: the output, both caches (the appended rows and the history
// around them), and the q|k|v rows left as they were. Three rows of three
// sequences at positions 0, 37 and 200 over caches holding random history
// (one split and several), f32 and f16 caches; heads of 128 with q/k norms
// (zero-centred) and full rotation in a GQA group of 8, of 256 with a
// quarter rotated and a group of 16 (two passes of 8 heads), of 64 with
// plain norms and no norm on q.
func TestGPUAttentionRopeTiles(t *testing.T) {
	g := newGPU(t)
	r := rng(61)
	const R, ctx, nseq = 3, 256, 4
	for _, tc := range []struct {
		nq, nkv, hd, rot int
		qn, kn, onePlus  bool
		nsplit           int
	}{{16, 2, 128, 128, true, true, true, 0}, {32, 2, 256, 64, true, true, true, 0}, {8, 2, 64, 64, false, true, false, 0},
		{16, 2, 128, 128, true, true, true, 1}} {
		ld := (tc.nq + 2*tc.nkv) * tc.hd
		for _, f16 := range []bool{false, true} {
			qkv := r.vec(R*ld, 1)
			per := nseq * tc.nkv * ctx * tc.hd
			hist := func() kern.Ptr {
				v := r.vec(per, 1)
				if !f16 {
					return g.f32(v)
				}
				b := make([]byte, 4*per) // halves in the first half, as zeros(per) sizes an f16 cache
				for i, x := range v {
					binary.LittleEndian.PutUint16(b[2*i:], half.F32ToF16(x))
				}
				return g.upload(b)
			}
			kc1, vc1 := hist(), hist()
			kc2, vc2 := g.upload(g.readBytes(kc1, 4*per)), g.upload(g.readBytes(vc1, 4*per))
			qw, kw := r.vec(tc.hd, 0.3), r.vec(tc.hd, 0.3)
			norms := kern.HeadNorms{Eps: 1e-6, OnePlus: tc.onePlus}
			if tc.qn {
				norms.Q = g.f32(qw)
			}
			if tc.kn {
				norms.K = g.f32(kw)
			}
			dinv := g.f32(invFreq(tc.rot, 1e6))
			pos, slot := g.i32([]int32{0, 37, 200}), g.i32([]int32{2, 0, 3})
			nsplit := tc.nsplit
			if nsplit == 0 {
				nsplit = kern.AttnTilesSplits(132, tc.nkv, R)
			}
			part := g.zeros(R * tc.nq * nsplit * (tc.hd + 2))
			cnt1, cnt2 := g.zeros(R*tc.nkv), g.zeros(R*tc.nkv)
			a1, a2 := g.f32(qkv), g.f32(qkv)
			out1, out2 := g.zeros(R*tc.nq*tc.hd), g.zeros(R*tc.nq*tc.hd)
			scale := float32(1 / math.Sqrt(float64(tc.hd)))
			g.run(func(l *kern.Launcher) error {
				return errorsJoin(l.RopeQKAppend(a1, ld, tc.nq, tc.nkv, tc.hd, tc.rot, dinv, 1, pos, slot, kc1, vc1, ctx, R, f16, norms),
					l.AttentionTiles(a1, ld, kc1, vc1, pos, slot, part, cnt1, out1, tc.nq*tc.hd, R, tc.nq, tc.nkv, tc.hd, ctx, nsplit, scale, f16, 0))
			})
			g.run(func(l *kern.Launcher) error {
				return l.AttentionRopeTiles(a2, ld, kc2, vc2, pos, slot, part, cnt2, out2, tc.nq*tc.hd, R, tc.nq, tc.nkv, tc.hd, ctx, nsplit, scale, f16,
					kern.RopeArgs{Inv: dinv, MScale: 1, Rot: tc.rot, Norms: norms})
			})
			label := fmt.Sprintf("hd %d rot %d G %d splits %d f16 %v", tc.hd, tc.rot, tc.nq/tc.nkv, nsplit, f16)
			same := func(what string, a, b kern.Ptr, n int) {
				t.Helper()
				x, y := g.readBytes(a, n), g.readBytes(b, n)
				for i := range x {
					if x[i] != y[i] {
						t.Fatalf("%s: %s: byte %d of %d differs (folded %d, apart %d)", label, what, i, n, y[i], x[i])
					}
				}
			}
			same("output", out1, out2, 4*R*tc.nq*tc.hd)
			same("k cache", kc1, kc2, 4*per)
			same("v cache", vc1, vc2, 4*per)
			same("counters", cnt1, cnt2, 4*R*tc.nkv)
			if got := g.readF32(a2, R*ld); !slices.Equal(got, qkv) {
				t.Fatalf("%s: attn_rope_tiles changed its q|k|v rows", label)
			}
		}
	}
}
