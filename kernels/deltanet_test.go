package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// deltaInputs makes T tokens of realistic delta-rule inputs: unit q and k
// (q scaled by dk^-½), per-token decays e^g in 0.6–0.95, β in (0, 1).
func deltaInputs(r *rand.Rand, d DeltaRule, T int) (q, k, v, g, beta []float32) {
	kw, vw := d.KeyHeads*d.KeyDim, d.ValueHeads*d.ValueDim
	q, k, v = randVec(r, T*kw), randVec(r, T*kw), randVec(r, T*vw)
	for i := 0; i < T*kw; i += d.KeyDim {
		L2Norm(q[i:i+d.KeyDim], 1e-6)
		L2Norm(k[i:i+d.KeyDim], 1e-6)
		for j := i; j < i+d.KeyDim; j++ {
			q[j] /= float32(math.Sqrt(float64(d.KeyDim)))
		}
	}
	g, beta = make([]float32, T*d.ValueHeads), make([]float32, T*d.ValueHeads)
	for i := range g {
		g[i] = float32(math.Log(0.6 + 0.35*r.Float64()))
		beta[i] = float32(r.Float64())
	}
	return
}

// refDelta64 is the recurrence in float64, straight from the formula.
func refDelta64(d DeltaRule, S []float64, q, k, v, g, beta []float32, T int) []float64 {
	dk, dv, r := d.KeyDim, d.ValueDim, d.ValueHeads/d.KeyHeads
	o := make([]float64, T*d.ValueHeads*dv)
	for t := range T {
		for h := range d.ValueHeads {
			kh := h / r
			qt := q[t*d.KeyHeads*dk+kh*dk:]
			kt := k[t*d.KeyHeads*dk+kh*dk:]
			vt := v[t*d.ValueHeads*dv+h*dv:]
			Sh := S[h*dk*dv : (h+1)*dk*dv]
			eg, b := math.Exp(float64(g[t*d.ValueHeads+h])), float64(beta[t*d.ValueHeads+h])
			for i := range Sh {
				Sh[i] *= eg
			}
			for j := range dv {
				var u float64
				for i := range dk {
					u += float64(kt[i]) * Sh[i*dv+j]
				}
				delta := b * (float64(vt[j]) - u)
				for i := range dk {
					Sh[i*dv+j] += float64(kt[i]) * delta
				}
				var s float64
				for i := range dk {
					s += float64(qt[i]) * Sh[i*dv+j]
				}
				o[t*d.ValueHeads*dv+h*dv+j] = s
			}
		}
	}
	return o
}

func maxAbs(a []float32, b []float64) float64 {
	var m float64
	for i := range a {
		m = math.Max(m, math.Abs(float64(a[i])-b[i]))
	}
	return m
}

// TestDeltaRuleChunkedEqualsRecurrent runs the chunked form, the f32
// recurrence and a float64 recurrence on the same inputs, from a non-zero
// state, with grouped value heads (4 value heads on 2 key heads), over
// lengths around the chunk size, and on the pool; outputs and final states
// must agree to rounding.
func TestDeltaRuleChunkedEqualsRecurrent(t *testing.T) {
	d := DeltaRule{KeyHeads: 2, ValueHeads: 4, KeyDim: 16, ValueDim: 8}
	pool := NewPool(2)
	defer pool.Close()
	for _, T := range []int{1, 2, 63, 64, 65, 130, 200} {
		t.Run(fmt.Sprint(T), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(T), 7))
			q, k, v, g, beta := deltaInputs(r, d, T)
			S0 := randVec(r, d.StateLen())
			for i := range S0 {
				S0[i] *= 0.3
			}
			S64 := make([]float64, len(S0))
			for i, x := range S0 {
				S64[i] = float64(x)
			}
			want := refDelta64(d, S64, q, k, v, g, beta, T)
			vw := d.ValueHeads * d.ValueDim
			run := func(name string, f func(S, o []float32)) {
				S := append([]float32(nil), S0...)
				o := make([]float32, T*vw)
				f(S, o)
				eo, es := maxAbs(o, want), maxAbs(S, S64)
				t.Logf("%s: output %.2g, state %.2g from float64", name, eo, es)
				if eo > 2e-6 || es > 2e-6 || math.IsNaN(eo+es) {
					t.Errorf("%s: output differs by %.3g, state by %.3g from the float64 recurrence", name, eo, es)
				}
			}
			run("recurrent", func(S, o []float32) { d.Recurrent(S, q, k, v, g, beta, o, T) })
			run("chunked", func(S, o []float32) { d.Chunked(S, q, k, v, g, beta, o, T) })
			dr := &DeltaRun{Rule: d}
			run("pool", func(S, o []float32) { dr.Run(pool, S, q, k, v, g, beta, o, T) })
			// Chunked over two calls (a split prefill) equals one call.
			run("split", func(S, o []float32) {
				a := T / 3
				kw := d.KeyHeads * d.KeyDim
				d.Chunked(S, q[:a*kw], k[:a*kw], v[:a*vw], g[:a*d.ValueHeads], beta[:a*d.ValueHeads], o[:a*vw], a)
				d.Chunked(S, q[a*kw:], k[a*kw:], v[a*vw:], g[a*d.ValueHeads:], beta[a*d.ValueHeads:], o[a*vw:], T-a)
			})
		})
	}
}

// TestCausalConv1D compares the convolution with the formula over a
// zero-padded history, and checks that feeding the input in pieces
// (prefill then decode steps) through the state gives the same output.
func TestCausalConv1D(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const C, K = 7, 4
	for _, T := range []int{1, 2, 3, 5, 17} {
		x, w := randVec(r, T*C), randVec(r, C*K)
		want := make([]float64, T*C)
		for tt := range T {
			for c := range C {
				var s float64
				for j := range K {
					if p := tt - K + 1 + j; p >= 0 {
						s += float64(w[c*K+j]) * float64(x[p*C+c])
					}
				}
				want[tt*C+c] = s / (1 + math.Exp(-s))
			}
		}
		out := make([]float32, T*C)
		state := make([]float32, (K-1)*C)
		CausalConv1D(out, x, T, C, w, K, state)
		if e := maxAbs(out, want); e > 1e-5 {
			t.Fatalf("T=%d: one call differs by %.3g", T, e)
		}
		for _, split := range []int{1, 2, 3} {
			clear(state)
			got := make([]float32, T*C)
			for s := 0; s < T; s += split {
				n := min(split, T-s)
				CausalConv1D(got[s*C:(s+n)*C], x[s*C:(s+n)*C], n, C, w, K, state)
			}
			if e := maxAbs(got, want); e > 1e-5 {
				t.Fatalf("T=%d in pieces of %d: differs by %.3g", T, split, e)
			}
		}
	}
}

// TestDeltaSmallOps checks L2Norm (eps inside the sum), the gates and the
// gated RMSNorm against their formulas in float64.
func TestDeltaSmallOps(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	x := randVec(r, 16)
	y := append([]float32(nil), x...)
	L2Norm(y, 0.5)
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	for i := range x {
		if e := math.Abs(float64(y[i]) - float64(x[i])/math.Sqrt(ss+0.5)); e > 1e-6 {
			t.Fatalf("L2Norm[%d] off by %.3g", i, e)
		}
	}
	// A zero vector stays finite (eps inside the sum).
	z := make([]float32, 4)
	L2Norm(z, 1e-6)
	for _, v := range z {
		if v != 0 {
			t.Fatal("L2Norm of zero is not zero")
		}
	}
	a, b, aLog, dt := []float32{-3, 0, 2, 25}, []float32{-1, 0, 1, 4}, []float32{-1, 0.2, -2, 0}, []float32{0.5, -0.3, 0, 1}
	g, beta := make([]float32, 4), make([]float32, 4)
	DeltaGates(g, beta, a, b, aLog, dt)
	for h := range g {
		sp := math.Log1p(math.Exp(float64(a[h] + dt[h])))
		if a[h]+dt[h] > 20 {
			sp = float64(a[h] + dt[h])
		}
		wg := -math.Exp(float64(aLog[h])) * sp
		wb := 1 / (1 + math.Exp(-float64(b[h])))
		if math.Abs(float64(g[h])-wg) > 1e-5*math.Max(1, math.Abs(wg)) || math.Abs(float64(beta[h])-wb) > 1e-6 {
			t.Fatalf("head %d: g %v β %v, want %v %v", h, g[h], beta[h], wg, wb)
		}
	}
	x, zz, w := randVec(r, 8), randVec(r, 8), randVec(r, 8)
	got := append([]float32(nil), x...)
	GatedRMSNorm(got, zz, w, 1e-6)
	ss = 0
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := 1 / math.Sqrt(ss/8+1e-6)
	for i := range x {
		zi := float64(zz[i])
		want := float64(x[i]) * inv * float64(w[i]) * zi / (1 + math.Exp(-zi))
		if math.Abs(float64(got[i])-want) > 1e-5 {
			t.Fatalf("GatedRMSNorm[%d] = %v, want %v", i, got[i], want)
		}
	}
}

func BenchmarkDeltaRule(b *testing.B) {
	d := DeltaRule{KeyHeads: 4, ValueHeads: 8, KeyDim: 64, ValueDim: 64}
	for _, T := range []int{1, 256} {
		b.Run(fmt.Sprintf("T=%d", T), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 1))
			q, k, v, g, beta := deltaInputs(r, d, T)
			S, o := make([]float32, d.StateLen()), make([]float32, T*d.ValueHeads*d.ValueDim)
			b.SetBytes(int64(4 * d.StateLen()))
			for b.Loop() {
				if T == 1 {
					d.Recurrent(S, q, k, v, g, beta, o, T)
				} else {
					d.Chunked(S, q, k, v, g, beta, o, T)
				}
			}
			b.ReportMetric(float64(T)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}
