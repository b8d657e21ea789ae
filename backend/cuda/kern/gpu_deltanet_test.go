package kern_test

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/kernels"
)

// dnReference is the plain CPU form of one step of the three dn_* kernels:
// per sequence (consecutive rows of one slot) the projections ungrouped,
// kernels.CausalConv1D on the pool's conv state, the L2 norms and
// kernels.DeltaGates, kernels.DeltaRule.Recurrent on the pool's S, and
// kernels.GatedRMSNorm per value head. It returns the conv output (rows ×
// cd) and the block's output (rows × vd), advancing pool.
func dnReference(k kern.DeltaNet, proj []float32, slots []int32, pool, convW, aLog, dtBias, normW []float32) (conv, out []float32) {
	kd, vd, cd := k.Dims()
	nk, nv, dk, dv, K := k.KeyHeads, k.ValueHeads, k.KeyDim, k.ValueDim, k.ConvKernel
	r, pw, stride := nv/nk, k.ProjWidth(), k.StateFloats()
	R := len(slots)
	conv, out = make([]float32, R*cd), make([]float32, R*vd)
	rule := kernels.DeltaRule{KeyHeads: nk, ValueHeads: nv, KeyDim: dk, ValueDim: dv}
	for r0 := 0; r0 < R; {
		r1 := r0 + 1
		for r1 < R && slots[r1] == slots[r0] {
			r1++
		}
		n, s := r1-r0, int(slots[r0])
		st := pool[s*stride : (s+1)*stride]
		mixed, z := make([]float32, n*cd), make([]float32, n*vd)
		a, b := make([]float32, n*nv), make([]float32, n*nv)
		for t := range n {
			row := proj[(r0+t)*pw : (r0+t+1)*pw]
			for c := range cd {
				mixed[t*cd+c] = row[k.ConvColumn(c)]
			}
			for h := range nv {
				zc, bc, ac := cd+h*dv, cd+vd+h, cd+vd+nv+h
				if k.Grouped {
					per, g, hi := 2*dk+2*r*dv, h/r, h%r
					ba := nk*per + g*2*r
					zc, bc, ac = g*per+2*dk+r*dv+hi*dv, ba+hi, ba+r+hi
				}
				copy(z[t*vd+h*dv:t*vd+(h+1)*dv], row[zc:zc+dv])
				b[t*nv+h], a[t*nv+h] = row[bc], row[ac]
			}
		}
		cv := conv[r0*cd : r1*cd]
		kernels.CausalConv1D(cv, mixed, n, cd, convW, K, st[:(K-1)*cd])
		q, kk, v := make([]float32, n*kd), make([]float32, n*kd), make([]float32, n*vd)
		g, beta := make([]float32, n*nv), make([]float32, n*nv)
		qs := float32(1 / math.Sqrt(float64(dk)))
		for t := range n {
			c := cv[t*cd : (t+1)*cd]
			copy(q[t*kd:(t+1)*kd], c[:kd])
			copy(kk[t*kd:(t+1)*kd], c[kd:2*kd])
			copy(v[t*vd:(t+1)*vd], c[2*kd:])
			for h := range nk {
				qh := q[t*kd+h*dk : t*kd+(h+1)*dk]
				kernels.L2Norm(qh, 1e-6)
				for i := range qh {
					qh[i] *= qs
				}
				kernels.L2Norm(kk[t*kd+h*dk:t*kd+(h+1)*dk], 1e-6)
			}
			kernels.DeltaGates(g[t*nv:(t+1)*nv], beta[t*nv:(t+1)*nv], a[t*nv:(t+1)*nv], b[t*nv:(t+1)*nv], aLog, dtBias)
		}
		o := out[r0*vd : r1*vd]
		rule.Recurrent(st[(K-1)*cd:], q, kk, v, g, beta, o, n)
		for i := 0; i < n*vd; i += dv {
			kernels.GatedRMSNorm(o[i:i+dv], z[i:i+dv], normW, k.Eps)
		}
		r0 = r1
	}
	return conv, out
}

// dnClose fails unless got is within rel·max|want| of want everywhere.
func dnClose(t *testing.T, what string, got, want []float32, rel float64) {
	t.Helper()
	var scale, worst float64
	for _, w := range want {
		scale = max(scale, math.Abs(float64(w)))
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d values from the device, %d in the reference", what, len(got), len(want))
	}
	at := -1
	for i, w := range want {
		if d := math.Abs(float64(got[i]) - float64(w)); d > worst || math.IsNaN(d) {
			worst, at = d, i
		}
	}
	if math.IsNaN(worst) || worst > rel*max(scale, 1e-30) {
		t.Fatalf("%s: worst |Δ| %.3g at %d (device %g, reference %g; scale %.3g)", what, worst, at, got[at], want[at], scale)
	}
}

// dnLayer is a DeltaNet layer's geometry (conv kernel 4, strides the
// rows' widths) and random host parameters: the conv weights, A_log
// (shifted down by 1.5), dt_bias and the gated norm's weight (around 1).
func dnLayer(r *rng, nk, nv, dk, dv int, grouped bool) (k kern.DeltaNet, convW, aLog, dtBias, normW []float32) {
	k = kern.DeltaNet{KeyHeads: nk, ValueHeads: nv, KeyDim: dk, ValueDim: dv, ConvKernel: 4, Grouped: grouped, Eps: 1e-6}
	_, vd, cd := k.Dims()
	k.Ldp, k.Ldc, k.Ldo = k.ProjWidth(), cd, vd
	convW, aLog, dtBias = r.vec(cd*k.ConvKernel, 0.3), r.vec(nv, 0.5), r.vec(nv, 0.5)
	normW = r.vec(dv, 0.1)
	for i := range aLog {
		aLog[i] -= 1.5
	}
	for i := range normW {
		normW[i]++
	}
	return k, convW, aLog, dtBias, normW
}

// TestGPUDeltaNet: dn_conv, dn_conv_state and dn_rule over steps that mix
// sequences (prefill runs shorter and longer than the conv window, decode
// rows, slots out of order) on a pool with a non-zero carried state match
// dnReference (the CPU kernels: CausalConv1D, L2Norm, DeltaGates,
// DeltaRule.Recurrent, GatedRMSNorm), for both projection layouts, at the
// parity suite's shape and at Qwen3-Next's heads (dk = dv = 128: dn_rule's
// 66 KB of shared memory needs the opt-in).
func TestGPUDeltaNet(t *testing.T) {
	g := newGPU(t)
	steps := [][]int32{
		{1, 1, 1, 1, 1, 3, 0, 0},             // prefill 5 (≥ K−1), decode, prefill 2 (< K−1)
		{1, 3, 0},                            // decode ×3
		{2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 1, 1}, // a new sequence's prefill 9, decode, prefill 2
		{2, 0, 1, 3},                         // decode ×4
	}
	const seqs = 4
	for _, shape := range []struct{ nk, nv, dk, dv int }{{2, 4, 16, 8}, {2, 4, 128, 128}} {
		for _, grouped := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d×%d_%d×%d_grouped=%v", shape.nk, shape.dk, shape.nv, shape.dv, grouped), func(t *testing.T) {
				r := rng(41 + shape.dk)
				k, convW, aLog, dtBias, normW := dnLayer(&r, shape.nk, shape.nv, shape.dk, shape.dv, grouped)
				_, vd, cd := k.Dims()
				pw, stride := k.ProjWidth(), k.StateFloats()
				pool := r.vec(seqs*stride, 0.2) // a carried state in every slot
				pool2 := append([]float32(nil), pool...)
				k.ConvW, k.ALog, k.Dt, k.NormW, k.State = g.f32(convW), g.f32(aLog), g.f32(dtBias), g.f32(normW), g.f32(pool)
				for si, slots := range steps {
					R := len(slots)
					proj := r.vec(R*pw, 1)
					k.Proj, k.Slot, k.Conv, k.Out = g.f32(proj), g.i32(slots), g.zeros(R*cd), g.zeros(R*vd)
					nseq := stepSeqs(slots) // sequences in this step (seqs is the pool's slots)
					g.run(func(l *kern.Launcher) error { return l.DeltaNet(k, R, nseq) })
					wantConv, wantOut := dnReference(k, proj, slots, pool2, convW, aLog, dtBias, normW)
					dnClose(t, fmt.Sprintf("step %d: dn_conv", si), g.readF32(k.Conv, R*cd), wantConv, 1e-5)
					dnClose(t, fmt.Sprintf("step %d: dn_rule output", si), g.readF32(k.Out, R*vd), wantOut, 1e-4)
					dnClose(t, fmt.Sprintf("step %d: state pool", si), g.readF32(k.State, seqs*stride), pool2, 1e-5)
				}
			})
		}
	}
}

// TestGPUDeltaNetChunked: dn_conv, dn_conv_state and the chunked rule
// (dn_chunk_prep, dn_chunk_state, dn_gnorm) over prefill steps whose
// sequences span whole and partial chunks (1, 63, 64, 65, 130 and 200
// rows, beside decode rows and a new sequence) match dnReference (the CPU
// recurrence) at TestGPUDeltaNet's bounds, both projection layouts, at
// the parity suite's heads and Qwen3-Next's; and the chunked rule's
// block output and state equal dn_rule's on the same steps to rounding.
func TestGPUDeltaNetChunked(t *testing.T) {
	g := newGPU(t)
	cat := func(parts ...[]int32) (out []int32) {
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	steps := [][]int32{
		cat(runOf(1, 65), runOf(3, 1), runOf(0, 63)), // a chunk and one row, a decode row, one short of a chunk
		cat(runOf(2, 130), runOf(0, 1)),              // two chunks and 2, a decode row
		cat(runOf(3, 64), runOf(1, 200)),             // exactly one chunk; three and 8
	}
	const seqs = 4
	for _, shape := range []struct{ nk, nv, dk, dv int }{{2, 4, 16, 8}, {2, 4, 128, 128}, {2, 4, 40, 24}} {
		for _, grouped := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d×%d_%d×%d_grouped=%v", shape.nk, shape.dk, shape.nv, shape.dv, grouped), func(t *testing.T) {
				r := rng(47 + shape.dk)
				k, convW, aLog, dtBias, normW := dnLayer(&r, shape.nk, shape.nv, shape.dk, shape.dv, grouped)
				if !k.ChunkFits() {
					t.Fatalf("%+v: the chunked rule does not take these heads", shape)
				}
				_, vd, cd := k.Dims()
				pw, stride := k.ProjWidth(), k.StateFloats()
				pool := r.vec(seqs*stride, 0.2)
				ref := append([]float32(nil), pool...)
				k.ConvW, k.ALog, k.Dt, k.NormW = g.f32(convW), g.f32(aLog), g.f32(dtBias), g.f32(normW)
				ka, kb := k, k
				ka.State, kb.State = g.f32(pool), g.f32(pool)
				for si, slots := range steps {
					R := len(slots)
					proj := r.vec(R*pw, 1)
					nseq := stepSeqs(slots)
					ka.Proj, ka.Slot, ka.Conv, ka.Out = g.f32(proj), g.i32(slots), g.zeros(R*cd), g.zeros(R*vd)
					kb.Proj, kb.Slot, kb.Conv, kb.Out = ka.Proj, ka.Slot, g.zeros(R*cd), g.zeros(R*vd)
					X := g.zeros(int(ka.ChunkScratch(R) / 4))
					g.run(func(l *kern.Launcher) error { return l.DeltaNetChunked(ka, R, nseq, X) })
					g.run(func(l *kern.Launcher) error { return l.DeltaNet(kb, R, nseq) })
					wantConv, wantOut := dnReference(k, proj, slots, ref, convW, aLog, dtBias, normW)
					label := fmt.Sprintf("step %d (%d rows)", si, R)
					dnClose(t, label+": dn_conv", g.readF32(ka.Conv, R*cd), wantConv, 1e-5)
					gotOut, gotPool := g.readF32(ka.Out, R*vd), g.readF32(ka.State, seqs*stride)
					dnClose(t, label+": chunked output", gotOut, wantOut, 1e-4)
					dnClose(t, label+": chunked state pool", gotPool, ref, 1e-5)
					dnClose(t, label+": chunked output against dn_rule's", gotOut, g.readF32(kb.Out, R*vd), 1e-4)
					dnClose(t, label+": chunked state against dn_rule's", gotPool, g.readF32(kb.State, seqs*stride), 1e-5)
				}
			})
		}
	}
}

// TestGPUDeltaNetStep: a decode step's dn_conv_step (the conv and the
// carried inputs' shift in one launch) then dn_rule against dn_conv,
// dn_conv_state and dn_rule on a copy of the same pool, bitwise (conv
// output, block output, the whole state pool), over decode steps of 1, 3
// and 4 rows with slots out of order, both projection layouts, at the
// parity suite's shape and Qwen3-Next's heads.
func TestGPUDeltaNetStep(t *testing.T) {
	g := newGPU(t)
	steps := [][]int32{{2}, {1, 3, 0}, {2, 0, 1, 3}, {3, 1, 0, 2}}
	const seqs = 4
	for _, shape := range []struct{ nk, nv, dk, dv int }{{2, 4, 16, 8}, {2, 4, 128, 128}} {
		for _, grouped := range []bool{false, true} {
			r := rng(43 + shape.dk)
			k, convW, aLog, dtBias, normW := dnLayer(&r, shape.nk, shape.nv, shape.dk, shape.dv, grouped)
			_, vd, cd := k.Dims()
			pw, stride := k.ProjWidth(), k.StateFloats()
			k.ConvW, k.ALog, k.Dt, k.NormW = g.f32(convW), g.f32(aLog), g.f32(dtBias), g.f32(normW)
			pool := r.vec(seqs*stride, 0.2)
			pa, pb := g.f32(pool), g.f32(pool)
			for si, slots := range steps {
				R := len(slots)
				a, b := k, k
				a.Proj = g.f32(r.vec(R*pw, 1))
				b.Proj = a.Proj
				a.Slot, b.Slot = g.i32(slots), g.i32(slots)
				a.State, b.State = pa, pb
				a.Conv, a.Out, b.Conv, b.Out = g.zeros(R*cd), g.zeros(R*vd), g.zeros(R*cd), g.zeros(R*vd)
				g.run(func(l *kern.Launcher) error { return l.DeltaNet(a, R, R) })
				g.run(func(l *kern.Launcher) error { return l.DeltaNetStep(b, R) })
				label := fmt.Sprintf("%d×%d_%d×%d grouped %v step %d", shape.nk, shape.dk, shape.nv, shape.dv, grouped, si)
				for _, p := range []struct {
					what string
					x, y kern.Ptr
					n    int
				}{{"conv output", a.Conv, b.Conv, R * cd}, {"block output", a.Out, b.Out, R * vd}, {"state pool", pa, pb, seqs * stride}} {
					x, y := g.readBytes(p.x, 4*p.n), g.readBytes(p.y, 4*p.n)
					if !bytes.Equal(x, y) {
						t.Fatalf("%s: %s differs between dn_conv_step and dn_conv + dn_conv_state", label, p.what)
					}
				}
			}
		}
	}
}
