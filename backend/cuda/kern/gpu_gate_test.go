package kern_test

import (
	"math"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/kern"
)

// TestGPUGateSplitMul: gate_split moves each head's q and gate halves and
// shifts k|v exactly; gate_mul multiplies by the sigmoid of the gate.
func TestGPUGateSplitMul(t *testing.T) {
	g := newGPU(t)
	r := rng(41)
	const nq, hd, kv, R = 3, 80, 2 * 2 * 80, 2
	qd := nq * hd
	lds, ldq, ldg := 2*qd+kv+3, qd+kv+1, qd+2
	src := r.vec(R*lds, 1)
	// Uploads first: g.run holds the device's thread, so g.f32 inside it would deadlock.
	ds, dq, dg := g.f32(src), g.zeros(R*ldq), g.zeros(R*ldg)
	g.run(func(l *kern.Launcher) error { return l.GateSplit(ds, lds, dq, ldq, dg, ldg, nq, hd, kv, R) })
	q, gate := g.readF32(dq, R*ldq), g.readF32(dg, R*ldg)
	for row := range R {
		for h := range nq {
			for d := range hd {
				if q[row*ldq+h*hd+d] != src[row*lds+2*h*hd+d] || gate[row*ldg+h*hd+d] != src[row*lds+2*h*hd+hd+d] {
					t.Fatalf("row %d head %d dim %d: q %g gate %g from %g %g", row, h, d, q[row*ldq+h*hd+d], gate[row*ldg+h*hd+d],
						src[row*lds+2*h*hd+d], src[row*lds+2*h*hd+hd+d])
				}
			}
		}
		for i := qd; i < qd+kv; i++ {
			if q[row*ldq+i] != src[row*lds+qd+i] {
				t.Fatalf("row %d k|v %d: %g, want %g", row, i-qd, q[row*ldq+i], src[row*lds+qd+i])
			}
		}
	}
	y := r.vec(R*ldq, 1)
	dy := g.f32(y)
	g.run(func(l *kern.Launcher) error { return l.GateMul(dy, ldq, dg, ldg, qd, R) })
	got := g.readF32(dy, R*ldq)
	for row := range R {
		for i := range qd {
			want := float64(y[row*ldq+i]) / (1 + math.Exp(-float64(gate[row*ldg+i])))
			if math.Abs(float64(got[row*ldq+i])-want) > 1e-6*(1+math.Abs(want)) {
				t.Fatalf("gate_mul row %d col %d: %g, want %g", row, i, got[row*ldq+i], want)
			}
		}
		if got[row*ldq+qd] != y[row*ldq+qd] {
			t.Fatalf("gate_mul wrote past n")
		}
	}
}
