package kern_test

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/quant"
)

// TestGPUDecodeStep chains the kernels into a one-layer llama decode step
// for two sequences decoding side by side (batched rows, different slots
// and positions): embed → norm → fused qkv matvec → RoPE + K/V append →
// split-K attention → out projection (+residual) → norm → gate|up → SwiGLU
// → down (+residual) → norm → head → argmax. The step is captured once as
// a graph; every replay must equal the eager launches byte for byte, and
// the logits must match a plain float64-attention reference of the same
// model within 1e-4 of their RMS, over six positions.
func TestGPUDecodeStep(t *testing.T) {
	g := newGPU(t)
	r := rng(13)
	const (
		H, nq, nkv, hd, F, V, ctx, S, R, steps = 64, 4, 2, 16, 96, 100, 16, 3, 2, 6
		qkvN                                   = (nq + 2*nkv) * hd
		eps                                    = 1e-5
	)
	E := r.vec(V*H, 1)
	wAttn, wMLP, wFinal := r.vec(H, 0.2), r.vec(H, 0.2), r.vec(H, 0.2)
	for i := range H {
		wAttn[i] += 1
		wMLP[i] += 1
		wFinal[i] += 1
	}
	Wqkv, Wo := r.vec(qkvN*H, 0.15), r.vec(H*nq*hd, 0.15)
	Wgu, Wd, Wout := r.vec(2*F*H, 0.15), r.vec(H*F, 0.1), r.vec(V*H, 0.15)
	inv := invFreq(hd, 10000)
	scale := float32(1 / math.Sqrt(hd))

	up := func(v []float32) driver.DevicePtr { return g.f32(v) }
	dE, dWqkv, dWo, dWgu, dWd, dWout := up(E), up(Wqkv), up(Wo), up(Wgu), up(Wd), up(Wout)
	dwA, dwM, dwF, dinv := up(wAttn), up(wMLP), up(wFinal), up(inv)
	x, xn, qkv, att := g.zeros(R*H), g.zeros(R*H), g.zeros(R*qkvN), g.zeros(R*nq*hd)
	gu, hbuf, logits := g.zeros(R*2*F), g.zeros(R*F), g.zeros(R*V)
	ids, pos, slot, next := g.zeros(R), g.zeros(R), g.i32([]int32{1, 0}), g.zeros(R)
	kc, vc := g.zeros(2*nkv*ctx*hd), g.zeros(2*nkv*ctx*hd)
	part := g.zeros(kern.AttnPartFloats(R, nq, S, hd))

	var s driver.Stream
	g.do(func(c *driver.Ctx) error {
		var err error
		s, err = c.NewStream(driver.StreamNonBlocking)
		return err
	})
	// The step through the typed launchers (the backend's future calls).
	enqueue := func(c *driver.Ctx, pdl bool) error {
		l := g.m.On(c, s, pdl)
		return errorsJoin(
			l.Embed(quant.F32, dE, V, H, ids, x, H, R),
			l.RMSNorm(x, H, dwA, xn, H, H, R, eps, false),
			l.Matvec(quant.F32, dWqkv, qkvN, H, xn, H, qkv, qkvN, R, 0, false),
			l.RopeQKAppend(qkv, qkvN, nq, nkv, hd, hd, dinv, 1, pos, slot, kc, vc, ctx, R, false, kern.HeadNorms{}),
			l.Attention(qkv, qkvN, kc, vc, pos, slot, part, att, nq*hd, R, nq, nkv, hd, ctx, S, scale),
			l.Matvec(quant.F32, dWo, H, nq*hd, att, nq*hd, x, H, R, 0, true),
			l.RMSNorm(x, H, dwM, xn, H, H, R, eps, false),
			l.Matvec(quant.F32, dWgu, 2*F, H, xn, H, gu, 2*F, R, 0, false),
			l.SiluMul(gu, gu.Add(4*F), 2*F, hbuf, F, F, R),
			l.Matvec(quant.F32, dWd, H, F, hbuf, F, x, H, R, 0, true),
			l.RMSNorm(x, H, dwF, xn, H, H, R, eps, false),
			l.Matvec(quant.F32, dWout, V, H, xn, H, logits, V, R, 0, false),
			l.Argmax(logits, V, V, next, R),
		)
	}
	var exec driver.GraphExec
	g.do(func(c *driver.Ctx) error {
		if err := c.BeginCapture(s, driver.CaptureThreadLocal); err != nil {
			return err
		}
		err := enqueue(c, true)
		graph, cerr := c.EndCapture(s)
		if err != nil || cerr != nil {
			return errorsJoin(err, cerr)
		}
		defer c.DestroyGraph(graph)
		exec, err = c.Instantiate(graph)
		return err
	})
	t.Cleanup(func() {
		g.d.Do(func(c *driver.Ctx) error { c.DestroyGraphExec(exec); return c.DestroyStream(s) })
	})
	i32b := func(v []int32) []byte {
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
		}
		return b
	}
	// run decodes `steps` tokens per sequence from the given first ids, with
	// the graph or eagerly, and returns every step's logits and tokens.
	run := func(graph bool) ([][]float32, [][]int32) {
		g.do(func(c *driver.Ctx) error {
			c.MemsetD32(kc, 0, 2*nkv*ctx*hd)
			c.MemsetD32(vc, 0, 2*nkv*ctx*hd)
			return c.Synchronize() // the legacy stream's memsets before work on s
		})
		tok := []int32{5, 77}
		var ls [][]float32
		var ts [][]int32
		for st := range steps {
			g.write(ids, i32b(tok))
			g.write(pos, i32b([]int32{int32(st), int32(st + 3)})) // the second sequence starts at position 3
			g.do(func(c *driver.Ctx) error {
				var err error
				if graph {
					err = c.GraphLaunch(exec, s)
				} else {
					err = enqueue(c, false)
				}
				if err != nil {
					return err
				}
				return c.StreamSync(s)
			})
			ls = append(ls, g.readF32(logits, R*V))
			tok = g.readI32(next, R)
			ts = append(ts, tok)
		}
		return ls, ts
	}
	eagerL, eagerT := run(false)
	graphL, graphT := run(true)
	for st := range steps {
		for i := range eagerL[st] {
			if math.Float32bits(eagerL[st][i]) != math.Float32bits(graphL[st][i]) {
				t.Fatalf("step %d: graph logit %d = %g, eager %g", st, i, graphL[st][i], eagerL[st][i])
			}
		}
		for i := range R {
			if eagerT[st][i] != graphT[st][i] {
				t.Fatalf("step %d: graph token %d, eager %d", st, graphT[st][i], eagerT[st][i])
			}
		}
	}

	// The reference, fed the GPU's tokens. Sequence b uses cache slot
	// 1-b (slot = {1, 0}); positions 0..2 of the second sequence's cache
	// are zeros, as on the device.
	refK := make([][]float32, 2)
	refV := make([][]float32, 2)
	for i := range refK {
		refK[i] = make([]float32, nkv*ctx*hd)
		refV[i] = make([]float32, nkv*ctx*hd)
	}
	slots := []int{1, 0}
	matvec := func(W []float32, rows, cols int, in []float32) []float32 {
		out := make([]float32, rows)
		for o := range rows {
			var s float32
			for i := range cols {
				s += W[o*cols+i] * in[i]
			}
			out[o] = s
		}
		return out
	}
	tok := []int32{5, 77}
	for st := range steps {
		for b := range R {
			p := st + 3*b
			xr := append([]float32(nil), E[int(tok[b])*H:int(tok[b]+1)*H]...)
			n := make([]float32, H)
			refRMSNorm(n, xr, wAttn, eps, false)
			q := matvec(Wqkv, qkvN, H, n)
			for h := range nq + nkv {
				refRope(q[h*hd:(h+1)*hd], hd, inv, 1, p)
			}
			sl := slots[b]
			for h := range nkv {
				copy(refK[sl][(h*ctx+p)*hd:], q[(nq+h)*hd:(nq+h+1)*hd])
				copy(refV[sl][(h*ctx+p)*hd:], q[(nq+nkv+h)*hd:(nq+nkv+h+1)*hd])
			}
			// refAttention indexes caches by slot; give it this slot's cache as slot 0.
			o := refAttention(q, refK[sl], refV[sl], p, 0, nq, nkv, hd, ctx, float64(scale))
			for i, v := range matvec(Wo, H, nq*hd, o) {
				xr[i] += v
			}
			refRMSNorm(n, xr, wMLP, eps, false)
			guv := matvec(Wgu, 2*F, H, n)
			hv := make([]float32, F)
			for i := range F {
				v := float64(guv[i])
				hv[i] = float32(v / (1 + math.Exp(-v)) * float64(guv[F+i]))
			}
			for i, v := range matvec(Wd, H, F, hv) {
				xr[i] += v
			}
			refRMSNorm(n, xr, wFinal, eps, false)
			want := matvec(Wout, V, H, n)
			var rms float64
			for _, v := range want {
				rms += float64(v) * float64(v)
			}
			rms = math.Sqrt(rms / V)
			for i, v := range want {
				if d := math.Abs(float64(eagerL[st][b*V+i] - v)); d > 1e-4*rms {
					t.Fatalf("step %d sequence %d logit %d = %g, reference %g (|diff| %g, RMS %g)", st, b, i, eagerL[st][b*V+i], v, d, rms)
				}
			}
		}
		tok = eagerT[st]
	}
}
