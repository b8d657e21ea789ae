package kern_test

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/driver"
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
	for _, dt := range []quant.DType{quant.Q8Row, quant.Q4TP, quant.F32, quant.BF16} {
		quantized := dt == quant.Q8Row || dt == quant.Q4TP
		actq := func(v []float32) []float64 {
			if quantized {
				return kern.ActQuant(v)
			}
			f := make([]float64, len(v))
			for i, x := range v {
				f[i] = float64(x)
			}
			return f
		}
		// Experts: gate and up (I×H) for the xmode-0 product of two
		// matrices (table [gate E | up E]), down (H×I) for xmode 1.
		gates, ups, downs := make([][]float32, E), make([][]float32, E), make([][]float32, E)
		tg, td := make([]byte, 16*E), make([]byte, 8*E)
		for e := range E {
			wb, _ := quant.Encode(dt, r.vec(I*H, 0.05), []int{I, H}, nil)
			gates[e], _ = quant.Decode(dt, wb, []int{I, H})
			binary.LittleEndian.PutUint64(tg[8*e:], uint64(g.upload(wb)))
			ub, _ := quant.Encode(dt, r.vec(I*H, 0.05), []int{I, H}, nil)
			ups[e], _ = quant.Decode(dt, ub, []int{I, H})
			binary.LittleEndian.PutUint64(tg[8*(E+e):], uint64(g.upload(ub)))
			db, _ := quant.Encode(dt, r.vec(H*I, 0.05), []int{H, I}, nil)
			downs[e], _ = quant.Decode(dt, db, []int{H, I})
			binary.LittleEndian.PutUint64(td[8*e:], uint64(g.upload(db)))
		}
		dtg, dtd := g.upload(tg), g.upload(td)
		x := r.vec(R*H, 1)
		gu := r.vec(R*k*2*I, 1)
		dx, dgu := g.f32(x), g.f32(gu)
		yg, yd := g.zeros(R*k*2*I), g.zeros(R*k*H)
		g.run(func(l *kern.Launcher) error {
			if err := l.MoEMatvec(dt, dtg, E, 2, ids, R*k, k, I, H, dx, H, 0, 0, yg, 2*I, kern.ProPlain); err != nil {
				return err
			}
			return l.MoEMatvec(dt, dtd, E, 1, ids, R*k, k, H, I, dgu, 2*I, I, 1, yd, H, kern.ProSilu)
		})
		got1, got2 := g.readF32(yg, R*k*2*I), g.readF32(yd, R*k*H)
		for s := range R * k {
			e := int(gotIDs[s])
			xq := actq(x[(s/k)*H : (s/k+1)*H])
			h := make([]float32, I)
			for i := range h {
				v := float64(gu[s*2*I+i])
				h[i] = float32(v/(1+math.Exp(-v))) * gu[s*2*I+I+i]
			}
			hq := actq(h)
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
				check("gate", got1[s*2*I+o], gates[e], xq, o, H)
				check("up", got1[s*2*I+I+o], ups[e], xq, o, H)
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
		return l.MoECombine(dx, H, dy, H, wts, k, dys, dsg, H, R, 0)
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

// TestGPUMoEGrouped: moe_sort orders (row, slot) pairs by expert in tiles
// of kern.MoETile (each expert's pairs in slot order, padding −1, the
// inverse map, unused tiles −1) as a plain Go sort does — here and in
// prefill-sized sorts (512 rows of 8 among 128 experts, of 10 among 512,
// random routings: every block of the grid places its own expert) —;
// moe_gather_q and gemmq_moe_* then give every sorted row its expert's
// product over the row's ActQuant activations (float64 reference), for
// q8_row and q4tp.
func TestGPUMoEGrouped(t *testing.T) {
	g := newGPU(t)
	r := rng(57)
	for _, c := range []struct{ E, k, R int }{{128, 8, 512}, {512, 10, 512}, {1024, 8, 1024}} {
		ids := make([]int32, c.R*c.k)
		for row := range c.R {
			p := make([]int32, c.E) // distinct experts a row, as top-k picks
			for i := range p {
				p[i] = int32(i)
			}
			for j := range c.k {
				i := j + int(r.next()%uint64(c.E-j))
				p[j], p[i] = p[i], p[j]
				ids[row*c.k+j] = p[j]
			}
		}
		_, _, _ = checkMoESort(t, g, ids, c.E)
	}
	const E, k, R, H, I = 8, 3, 37, 96, 64
	nslot := R * k
	ids := make([]int32, nslot)
	for s := range ids {
		ids[s] = int32((s*7 + s/5) % E)
		if s%11 == 0 {
			ids[s] = 2 // a crowded expert: several tiles
		}
	}
	ntile := kern.MoETiles(nslot, E)
	perm, tile, gi := checkMoESort(t, g, ids, E)
	x := r.vec(R*H, 1)
	dx := g.f32(x)
	rows := ntile * kern.MoETile
	for _, dt := range []quant.DType{quant.Q8Row, quant.Q4TP} {
		ws := make([][]float32, E)
		tab := make([]byte, 8*E)
		for e := range E {
			wb, _ := quant.Encode(dt, r.vec(I*H, 0.05), []int{I, H}, nil)
			ws[e], _ = quant.Decode(dt, wb, []int{I, H})
			binary.LittleEndian.PutUint64(tab[8*e:], uint64(g.upload(wb)))
		}
		dtab := g.upload(tab)
		nq, ns := kern.GemmQScratch(H, R)
		xq, xd := g.upload(make([]byte, nq)), g.upload(make([]byte, ns))
		sq, sd := g.upload(make([]byte, rows*H)), g.upload(make([]byte, 4*rows*H/32))
		y := g.zeros(rows * I)
		g.run(func(l *kern.Launcher) error {
			if err := l.ActQuant(dt, dx, H, H, xq, xd, R); err != nil {
				return err
			}
			if err := l.MoEGatherQ(xq, xd, H, k, perm, tile, sq, sd, ntile); err != nil {
				return err
			}
			return l.GemmQMoE(dt, dtab, tile, I, H, sq, sd, y, I, ntile)
		})
		got := g.readF32(y, rows*I)
		for s := range nslot {
			e, at := int(ids[s]), int(gi[s])
			xv := kern.ActQuant(x[(s/k)*H : (s/k+1)*H])
			for o := range I {
				var want, mag float64
				for i, v := range xv {
					p := float64(ws[e][o*H+i]) * v
					want += p
					mag += math.Abs(p)
				}
				if d := math.Abs(float64(got[at*I+o]) - want); d > 1e-5*mag+1e-7 {
					t.Fatalf("%s slot %d (expert %d, sorted row %d) row %d: %g, reference %g", dt, s, e, at, o, got[at*I+o], want)
				}
			}
		}
	}
}

// checkMoESort runs moe_sort over ids (E experts, kern.MoETiles tiles) and
// compares its perm, inv and tile_e with a plain Go sort's; it returns the
// device's perm and tile_e and the inverse map it wrote.
func checkMoESort(t *testing.T, g *gpu, ids []int32, E int) (perm, tile driver.DevicePtr, gi []int32) {
	t.Helper()
	nslot := len(ids)
	ntile := kern.MoETiles(nslot, E)
	dids := g.i32(ids)
	perm, inv, tile := g.zeros(ntile*kern.MoETile), g.zeros(nslot), g.zeros(ntile)
	g.run(func(l *kern.Launcher) error { return l.MoESort(dids, nslot, E, perm, inv, tile, ntile) })
	gp, gt := g.readI32(perm, ntile*kern.MoETile), g.readI32(tile, ntile)
	gi = g.readI32(inv, nslot)
	mine := make([][]int, E)
	for s, id := range ids {
		mine[id] = append(mine[id], s)
	}
	wantT := 0
	for e := range E {
		nt := (len(mine[e]) + kern.MoETile - 1) / kern.MoETile
		for j := range nt * kern.MoETile {
			at := wantT*kern.MoETile + j
			want := -1
			if j < len(mine[e]) {
				want = mine[e][j]
				if int(gi[want]) != at {
					t.Fatalf("E %d, %d slots: inv[%d] = %d, want %d", E, nslot, want, gi[want], at)
				}
			}
			if int(gp[at]) != want {
				t.Fatalf("E %d, %d slots: expert %d: perm[%d] = %d, want %d", E, nslot, e, at, gp[at], want)
			}
		}
		for j := range nt {
			if int(gt[wantT+j]) != e {
				t.Fatalf("E %d, %d slots: tile %d: expert %d, want %d", E, nslot, wantT+j, gt[wantT+j], e)
			}
		}
		wantT += nt
	}
	for j := wantT; j < ntile; j++ {
		if gt[j] != -1 {
			t.Fatalf("E %d, %d slots: unused tile %d: expert %d, want -1", E, nslot, j, gt[j])
		}
	}
	return perm, tile, gi
}
