package kernels

import (
	"fmt"
	"math"
)

// GDN is one Gated DeltaNet mixer (a linear_attention layer of Qwen3-Next
// and Qwen3.5, architectures.md §6.4, §8) as one block-level operation:
//
//	out += out_proj( gated_norm( delta_rule( conv( in_proj(x) ) ), z ) )
//
// with the conv inputs and the recurrent state carried in a GDNState.
// Exactly one projection layout is set: Qwen3-Next's QKVZ/BA, whose output
// rows are grouped by key head ([q_g, k_g, v_g (r·dv), z_g (r·dv)] and
// [b_g (r), a_g (r)] per key head g), or Qwen3.5's split QKV (q_all |
// k_all | v_all), Z, B, A.
type GDN struct {
	Rule DeltaRule
	Conv int // kernel size K

	QKVZ, BA     *Mat // Qwen3-Next: (2·kd+2·vd, dim), (2·nv, dim)
	QKV, Z, B, A *Mat // Qwen3.5: (2·kd+vd, dim), (vd, dim), (nv, dim), (nv, dim)
	ConvW        []float32
	ALog, DtBias []float32 // (nv)
	Norm         []float32 // (dv): the gated norm's (standard) weight
	Out          *Mat      // (dim, vd)
	Eps          float32
}

// Dims returns key_dim (nk·dk), value_dim (nv·dv) and conv_dim (2·kd+vd).
func (g *GDN) Dims() (kd, vd, cd int) {
	d := g.Rule
	kd, vd = d.KeyHeads*d.KeyDim, d.ValueHeads*d.ValueDim
	return kd, vd, 2*kd + vd
}

// Check validates the shapes against the model width dim.
func (g *GDN) Check(dim int) error {
	d := g.Rule
	if d.KeyHeads <= 0 || d.ValueHeads <= 0 || d.KeyDim <= 0 || d.ValueDim <= 0 || d.ValueHeads%d.KeyHeads != 0 || g.Conv < 1 {
		return fmt.Errorf("kernels: gated deltanet %d key heads × %d, %d value heads × %d, conv %d", d.KeyHeads, d.KeyDim, d.ValueHeads, d.ValueDim, g.Conv)
	}
	kd, vd, cd := g.Dims()
	nv := d.ValueHeads
	shape := func(m *Mat, r, c int) bool { return m != nil && m.Rows == r && m.Cols == c }
	switch {
	case g.QKVZ != nil:
		if !shape(g.QKVZ, 2*kd+2*vd, dim) || !shape(g.BA, 2*nv, dim) {
			return fmt.Errorf("kernels: gated deltanet in_proj_qkvz/in_proj_ba shapes")
		}
	case !shape(g.QKV, 2*kd+vd, dim) || !shape(g.Z, vd, dim) || !shape(g.B, nv, dim) || !shape(g.A, nv, dim):
		return fmt.Errorf("kernels: gated deltanet in_proj_qkv/z/b/a shapes")
	}
	if len(g.ConvW) != cd*g.Conv || len(g.ALog) != nv || len(g.DtBias) != nv || len(g.Norm) != d.ValueDim || !shape(g.Out, dim, vd) {
		return fmt.Errorf("kernels: gated deltanet conv/A_log/dt_bias/norm/out_proj shapes")
	}
	return nil
}

// GDNState is one sequence's state of one GDN layer: the last K-1 conv
// inputs and the delta rule's matrices (float32).
type GDNState struct {
	Conv []float32 // (K-1, conv_dim)
	S    []float32 // (nv, dk, dv)
}

// NewState allocates a zero state.
func (g *GDN) NewState() GDNState {
	_, _, cd := g.Dims()
	return GDNState{Conv: make([]float32, (g.Conv-1)*cd), S: make([]float32, g.Rule.StateLen())}
}

// StateBytes is the size of one layer's state.
func (g *GDN) StateBytes() int64 {
	_, _, cd := g.Dims()
	return 4 * int64((g.Conv-1)*cd+g.Rule.StateLen())
}

// GDNScratch holds the activations of one call, grown on first use.
type GDNScratch struct {
	proj, mixed, conv []float32 // (T, ·)
	z, o              []float32 // (T, vd)
	b, a, gate, beta  []float32 // (T, nv)
	q, k, v           []float32 // (T, kd), (T, kd), (T, vd)
	y                 []float32 // (T, dim)
	run               DeltaRun
	jobs              []MatVecJob
	// Observe, when set, is called with each matrix and the rows×cols
	// inputs it multiplies, before the product (calibration).
	Observe func(m *Mat, x []float32, rows, cols int)
}

func (s *GDNScratch) see(x []float32, rows int, ms ...*Mat) {
	if s.Observe == nil {
		return
	}
	for _, m := range ms {
		s.Observe(m, x[:rows*m.Cols], rows, m.Cols)
	}
}

// Forward adds the mixer's output for T rows of x (T, dim: the normed
// input) to out (T, dim), advancing st by T tokens.
func (g *GDN) Forward(p *Pool, x []float32, T, dim int, out []float32, st *GDNState, s *GDNScratch) {
	d := g.Rule
	kd, vd, cd := g.Dims()
	nk, nv, dk, dv := d.KeyHeads, d.ValueHeads, d.KeyDim, d.ValueDim
	r := nv / nk
	x = x[:T*dim]
	s.mixed, s.z = grow(s.mixed, T*cd), grow(s.z, T*vd)
	s.b, s.a = grow(s.b, T*nv), grow(s.a, T*nv)
	if g.QKVZ != nil {
		// Ungroup [q_g | k_g | v_g | z_g] per key head into q_all | k_all
		// | v_all and z; [b_g | a_g] into b and a (value head g·r+i).
		per := 2*dk + 2*r*dv
		s.proj = grow(s.proj, T*(2*kd+2*vd+2*nv))
		qkvz, ba := s.proj[:T*(2*kd+2*vd)], s.proj[T*(2*kd+2*vd):]
		s.see(x, T, g.QKVZ, g.BA)
		if T == 1 {
			s.jobs = append(s.jobs[:0], MatVecJob{M: g.QKVZ, X: x, Y: qkvz}, MatVecJob{M: g.BA, X: x, Y: ba})
			p.MatVecs(s.jobs)
		} else {
			p.MatMul(g.QKVZ, x, T, qkvz)
			p.MatMul(g.BA, x, T, ba)
		}
		for t := range T {
			row, m, z := qkvz[t*nk*per:(t+1)*nk*per], s.mixed[t*cd:(t+1)*cd], s.z[t*vd:(t+1)*vd]
			bar := ba[t*2*nv : (t+1)*2*nv]
			for gi := range nk {
				grp := row[gi*per : (gi+1)*per]
				copy(m[gi*dk:(gi+1)*dk], grp[:dk])
				copy(m[kd+gi*dk:kd+(gi+1)*dk], grp[dk:2*dk])
				copy(m[2*kd+gi*r*dv:2*kd+(gi+1)*r*dv], grp[2*dk:2*dk+r*dv])
				copy(z[gi*r*dv:(gi+1)*r*dv], grp[2*dk+r*dv:])
				copy(s.b[t*nv+gi*r:t*nv+(gi+1)*r], bar[gi*2*r:gi*2*r+r])
				copy(s.a[t*nv+gi*r:t*nv+(gi+1)*r], bar[gi*2*r+r:(gi+1)*2*r])
			}
		}
	} else {
		s.see(x, T, g.QKV, g.Z, g.B, g.A)
		if T == 1 {
			s.jobs = append(s.jobs[:0], MatVecJob{M: g.QKV, X: x, Y: s.mixed}, MatVecJob{M: g.Z, X: x, Y: s.z}, MatVecJob{M: g.B, X: x, Y: s.b}, MatVecJob{M: g.A, X: x, Y: s.a})
			p.MatVecs(s.jobs)
		} else {
			p.MatMul(g.QKV, x, T, s.mixed)
			p.MatMul(g.Z, x, T, s.z)
			p.MatMul(g.B, x, T, s.b)
			p.MatMul(g.A, x, T, s.a)
		}
	}
	// Causal conv + SiLU over the concatenated channels, with the state.
	s.conv = grow(s.conv, T*cd)
	CausalConv1D(s.conv, s.mixed, T, cd, g.ConvW, g.Conv, st.Conv)
	// Split, L2-normalise q and k (q also scaled by dk^-½), gates.
	s.q, s.k, s.v = grow(s.q, T*kd), grow(s.k, T*kd), grow(s.v, T*vd)
	s.gate, s.beta = grow(s.gate, T*nv), grow(s.beta, T*nv)
	qs := float32(1 / math.Sqrt(float64(dk)))
	for t := range T {
		c := s.conv[t*cd : (t+1)*cd]
		q, k := s.q[t*kd:(t+1)*kd], s.k[t*kd:(t+1)*kd]
		copy(q, c[:kd])
		copy(k, c[kd:2*kd])
		copy(s.v[t*vd:(t+1)*vd], c[2*kd:])
		for h := range nk {
			qh := q[h*dk : (h+1)*dk]
			L2Norm(qh, 1e-6)
			for i := range qh {
				qh[i] *= qs
			}
			L2Norm(k[h*dk:(h+1)*dk], 1e-6)
		}
		DeltaGates(s.gate[t*nv:(t+1)*nv], s.beta[t*nv:(t+1)*nv], s.a[t*nv:(t+1)*nv], s.b[t*nv:(t+1)*nv], g.ALog, g.DtBias)
	}
	// The delta rule over the value heads (chunked for T > 1).
	s.o = grow(s.o, T*vd)
	s.run.Rule = d
	s.run.Run(p, st.S, s.q, s.k, s.v, s.gate, s.beta, s.o, T)
	// Gated RMSNorm per value head, out_proj, residual.
	for i := 0; i < T*vd; i += dv {
		GatedRMSNorm(s.o[i:i+dv], s.z[i:i+dv], g.Norm, g.Eps)
	}
	s.y = grow(s.y, T*dim)
	s.see(s.o, T, g.Out)
	p.MatMul(g.Out, s.o, T, s.y)
	Add(out[:T*dim], s.y)
}
