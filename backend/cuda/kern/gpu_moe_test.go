package kern_test

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/kernels"
	"github.com/cortiq/cortiq/quant"
)

// TestGPUMoE: moe_route picks kernels.Route's experts and weights (ties
// included: two equal logits), mv_moe_* computes each slot's product over
// its expert (gate/up rows share their row's activations, down rows use
// their own SwiGLU'd ones) against float64 sums over kern.ActQuant, and
// moe_combine adds Σ w·y (+ σ(g)·shared) in order.
func TestGPUMoE(t *testing.T) {
	g := newGPU(t)
	r := rng(31)
	const E, k, R, H, I = 8, 2, 3, 64, 96
	logits := r.vec(R*E, 2)
	logits[1] = logits[4] // a tie: the lower index first
	dl := g.f32(logits)
	ids, wts := g.zeros(R*k), g.zeros(R*k)
	g.run(func(l *kern.Launcher) error { return l.MoERoute(dl, E, E, k, true, ids, wts, R) })
	gotIDs, gotW := g.readI32(ids, R*k), g.readF32(wts, R*k)
	for row := range R {
		lg := append([]float32(nil), logits[row*E:(row+1)*E]...)
		idx, w := make([]int, k), make([]float32, k)
		kernels.Route(lg, true, idx, w)
		for j := range k {
			if int(gotIDs[row*k+j]) != idx[j] || math.Abs(float64(gotW[row*k+j]-w[j])) > 1e-6 {
				t.Fatalf("row %d slot %d: device expert %d weight %g, kernels.Route %d %g", row, j, gotIDs[row*k+j], gotW[row*k+j], idx[j], w[j])
			}
		}
	}
	for _, dt := range []quant.DType{quant.Q8Row, quant.Q4TP} {
		// Experts: gate (I×H) for the xmode-0 product, down (H×I) for xmode 1.
		gates, downs := make([][]float32, E), make([][]float32, E)
		tg, td := make([]byte, 8*E), make([]byte, 8*E)
		for e := range E {
			wb, _ := quant.Encode(dt, r.vec(I*H, 0.05), []int{I, H}, nil)
			gates[e], _ = quant.Decode(dt, wb, []int{I, H})
			binary.LittleEndian.PutUint64(tg[8*e:], uint64(g.upload(wb)))
			db, _ := quant.Encode(dt, r.vec(H*I, 0.05), []int{H, I}, nil)
			downs[e], _ = quant.Decode(dt, db, []int{H, I})
			binary.LittleEndian.PutUint64(td[8*e:], uint64(g.upload(db)))
		}
		dtg, dtd := g.upload(tg), g.upload(td)
		x := r.vec(R*H, 1)
		gu := r.vec(R*k*2*I, 1)
		dx, dgu := g.f32(x), g.f32(gu)
		yg, yd := g.zeros(R*k*I), g.zeros(R*k*H)
		g.run(func(l *kern.Launcher) error {
			if err := l.MoEMatvec(dt, dtg, ids, R*k, k, I, H, dx, H, 0, 0, yg, I, kern.ProPlain); err != nil {
				return err
			}
			return l.MoEMatvec(dt, dtd, ids, R*k, k, H, I, dgu, 2*I, I, 1, yd, H, kern.ProSilu)
		})
		got1, got2 := g.readF32(yg, R*k*I), g.readF32(yd, R*k*H)
		for s := range R * k {
			e := int(gotIDs[s])
			xq := kern.ActQuant(x[(s/k)*H : (s/k+1)*H])
			h := make([]float32, I)
			for i := range h {
				v := float64(gu[s*2*I+i])
				h[i] = float32(v/(1+math.Exp(-v))) * gu[s*2*I+I+i]
			}
			hq := kern.ActQuant(h)
			check := func(name string, got float32, w []float32, xv []float64, o, cols int) {
				var want, mag float64
				for i, v := range xv {
					p := float64(w[o*cols+i]) * v
					want += p
					mag += math.Abs(p)
				}
				tol := 1e-5
				if name == "down" {
					tol = 3e-3 // expf vs exp may move a quant across a boundary
				}
				if d := math.Abs(float64(got) - want); d > tol*mag+1e-7 {
					t.Fatalf("%s %s slot %d (expert %d) row %d: %g, reference %g", dt, name, s, e, o, got, want)
				}
			}
			for o := range I {
				check("gate", got1[s*I+o], gates[e], xq, o, H)
			}
			for o := range H {
				check("down", got2[s*H+o], downs[e], hq, o, I)
			}
		}
	}
	// Combine with a shared expert.
	x0 := r.vec(R*H, 1)
	y := r.vec(R*k*H, 1)
	ys, sg := r.vec(R*H, 1), r.vec(R, 1)
	dx, dy, dys, dsg := g.f32(x0), g.f32(y), g.f32(ys), g.f32(sg) // before g.run: uploads inside it would deadlock
	g.run(func(l *kern.Launcher) error {
		return l.MoECombine(dx, H, dy, H, wts, k, dys, dsg, H, R)
	})
	got := g.readF32(dx, R*H)
	for row := range R {
		for i := range H {
			v := x0[row*H+i]
			for j := range k {
				v += gotW[row*k+j] * y[(row*k+j)*H+i]
			}
			v += float32(1/(1+math.Exp(-float64(sg[row])))) * ys[row*H+i]
			if math.Abs(float64(got[row*H+i]-v)) > 1e-5*(1+math.Abs(float64(v))) {
				t.Fatalf("combine row %d col %d: %g, want %g", row, i, got[row*H+i], v)
			}
		}
	}
}
