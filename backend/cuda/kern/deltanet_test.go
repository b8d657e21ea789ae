package kern_test

import (
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/kernels"
	"github.com/cortiq/cortiq/quant"
)

// TestDeltaNetReferenceMatchesGDN checks TestGPUDeltaNet's reference
// itself (its column mapping of both layouts included) against the CPU
// backend's block, kernels.GDN.Forward, run per sequence with identity
// projections (in_proj passes the projection row through, out_proj
// returns o): outputs and the state pool must agree to rounding (GDN runs
// the chunked form for prefill, the reference the recurrence).
func TestDeltaNetReferenceMatchesGDN(t *testing.T) {
	p := kernels.NewPool(1)
	defer p.Close()
	slots := []int32{1, 1, 1, 1, 1, 3, 0, 0, 2}
	for _, grouped := range []bool{false, true} {
		r := rng(7)
		k := kern.DeltaNet{KeyHeads: 2, ValueHeads: 4, KeyDim: 16, ValueDim: 8, ConvKernel: 4, Grouped: grouped, Eps: 1e-6}
		kd, vd, cd := k.Dims()
		nv, pw, stride := k.ValueHeads, k.ProjWidth(), k.StateFloats()
		eye := func(rows, col0 int) *kernels.Mat {
			w := make([]float32, rows*pw)
			for i := range rows {
				w[i*pw+col0+i] = 1
			}
			m, err := kernels.NewMat(quant.F32, rows, pw, f32bytes(w))
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
		g := &kernels.GDN{Rule: kernels.DeltaRule{KeyHeads: 2, ValueHeads: 4, KeyDim: 16, ValueDim: 8}, Conv: 4,
			ConvW: r.vec(cd*4, 0.3), ALog: r.vec(nv, 0.5), DtBias: r.vec(nv, 0.5), Norm: r.vec(8, 0.1), Eps: 1e-6}
		if grouped {
			g.QKVZ, g.BA = eye(2*kd+2*vd, 0), eye(2*nv, 2*kd+2*vd)
		} else {
			g.QKV, g.Z, g.B, g.A = eye(cd, 0), eye(vd, cd), eye(nv, cd+vd), eye(nv, cd+vd+nv)
		}
		ow := make([]float32, pw*vd)
		for i := range vd {
			ow[i*vd+i] = 1
		}
		var err error
		if g.Out, err = kernels.NewMat(quant.F32, pw, vd, f32bytes(ow)); err != nil {
			t.Fatal(err)
		}
		if err := g.Check(pw); err != nil {
			t.Fatal(err)
		}
		pool := r.vec(4*stride, 0.2)
		pool2 := append([]float32(nil), pool...)
		R := len(slots)
		proj := r.vec(R*pw, 1)
		_, want := dnReference(k, proj, slots, pool2, g.ConvW, g.ALog, g.DtBias, g.Norm)
		got := make([]float32, R*pw)
		var sc kernels.GDNScratch
		for r0 := 0; r0 < R; {
			r1 := r0 + 1
			for r1 < R && slots[r1] == slots[r0] {
				r1++
			}
			s := int(slots[r0])
			st := kernels.GDNState{Conv: pool[s*stride : s*stride+3*cd], S: pool[s*stride+3*cd : (s+1)*stride]}
			g.Forward(p, proj[r0*pw:r1*pw], r1-r0, pw, got[r0*pw:r1*pw], &st, &sc)
			r0 = r1
		}
		o := make([]float32, R*vd)
		for i := range R {
			copy(o[i*vd:(i+1)*vd], got[i*pw:i*pw+vd])
		}
		dnClose(t, "output", o, want, 1e-5)
		dnClose(t, "state pool", pool2, pool, 1e-5)
	}
}
