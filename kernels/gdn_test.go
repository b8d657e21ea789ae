package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cortiq/cortiq/quant"
)

func f32Mat(t testing.TB, rows, cols int, w []float32) *Mat {
	data, err := quant.Encode(quant.F32, w, []int{rows, cols}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMat(quant.F32, rows, cols, data)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// testGDNs returns one random layer in both projection layouts: Qwen3.5's
// split projections and the same rows regrouped by key head as Qwen3-Next
// stores them.
func testGDNs(t testing.TB, r *rand.Rand, dim int) (split, grouped *GDN) {
	d := DeltaRule{KeyHeads: 2, ValueHeads: 4, KeyDim: 8, ValueDim: 6}
	nk, nv, dk, dv, rr := d.KeyHeads, d.ValueHeads, d.KeyDim, d.ValueDim, d.ValueHeads/d.KeyHeads
	kd, vd := nk*dk, nv*dv
	rnd := func(n int, s float64) []float32 {
		v := randVec(r, n)
		for i := range v {
			v[i] *= float32(s)
		}
		return v
	}
	qkv, z, b, a := rnd((2*kd+vd)*dim, 0.2), rnd(vd*dim, 0.2), rnd(nv*dim, 0.2), rnd(nv*dim, 0.2)
	aLog := make([]float32, nv)
	for i := range aLog {
		aLog[i] = float32(math.Log(0.05 + 0.45*r.Float64()))
	}
	norm := rnd(dv, 0.1)
	for i := range norm {
		norm[i]++
	}
	base := GDN{Rule: d, Conv: 4, ConvW: rnd((2*kd+vd)*4, 0.3), ALog: aLog, DtBias: rnd(nv, 0.5), Norm: norm,
		Out: f32Mat(t, dim, vd, rnd(dim*vd, 0.2)), Eps: 1e-6}
	split, grouped = new(GDN), new(GDN)
	*split, *grouped = base, base
	split.QKV, split.Z, split.B, split.A = f32Mat(t, 2*kd+vd, dim, qkv), f32Mat(t, vd, dim, z), f32Mat(t, nv, dim, b), f32Mat(t, nv, dim, a)
	var qkvz, ba []float32
	rows := func(w []float32, lo, n int) []float32 { return w[lo*dim : (lo+n)*dim] }
	for g := range nk {
		qkvz = append(qkvz, rows(qkv, g*dk, dk)...)
		qkvz = append(qkvz, rows(qkv, kd+g*dk, dk)...)
		qkvz = append(qkvz, rows(qkv, 2*kd+g*rr*dv, rr*dv)...)
		qkvz = append(qkvz, rows(z, g*rr*dv, rr*dv)...)
		ba = append(ba, rows(b, g*rr, rr)...)
		ba = append(ba, rows(a, g*rr, rr)...)
	}
	grouped.QKVZ, grouped.BA = f32Mat(t, 2*kd+2*vd, dim, qkvz), f32Mat(t, 2*nv, dim, ba)
	for _, g := range []*GDN{split, grouped} {
		if err := g.Check(dim); err != nil {
			t.Fatal(err)
		}
	}
	return split, grouped
}

// TestGDNLayouts runs a GDN layer in both projection layouts on the same
// weights, as one prefill and token by token through the state (and as
// two prefill calls): all must agree to rounding.
func TestGDNLayouts(t *testing.T) {
	pool := NewPool(2)
	defer pool.Close()
	const dim = 24
	for _, T := range []int{1, 7, 70} {
		t.Run(fmt.Sprint(T), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(T), 99))
			split, grouped := testGDNs(t, r, dim)
			x := randVec(r, T*dim)
			run := func(g *GDN, pieces int) []float32 {
				st, out := g.NewState(), make([]float32, T*dim)
				var s GDNScratch
				step := max(1, (T+pieces-1)/pieces)
				for t0 := 0; t0 < T; t0 += step {
					n := min(step, T-t0)
					g.Forward(pool, x[t0*dim:(t0+n)*dim], n, dim, out[t0*dim:(t0+n)*dim], &st, &s)
				}
				return out
			}
			want := run(split, 1)
			var scale float64
			for _, v := range want {
				scale = math.Max(scale, math.Abs(float64(v)))
			}
			if scale == 0 {
				t.Fatal("zero output")
			}
			for _, c := range []struct {
				name   string
				g      *GDN
				pieces int
			}{{"grouped", grouped, 1}, {"split token by token", split, T}, {"grouped in two calls", grouped, 2}} {
				got := run(c.g, c.pieces)
				var e float64
				for i, v := range got {
					e = math.Max(e, math.Abs(float64(v-want[i])))
				}
				if e > 1e-5*scale {
					t.Errorf("%s differs by %.3g (output scale %.3g)", c.name, e, scale)
				}
			}
		})
	}
}
