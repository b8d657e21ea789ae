package kernels

import (
	"math"
)

// Gated DeltaNet kernels (the linear-attention layers of Qwen3-Next and
// Qwen3.5, architectures.md §6.4): the causal depthwise convolution with
// its rolling state, the L2 norm of q and k, the decay and write-strength
// gates, the gated delta rule (token by token for decode, chunked for
// prefill, the recurrence kept beside it as the reference) and the gated
// per-head RMSNorm. The recurrent state is float32.

// CausalConv1D runs the causal depthwise convolution of kernel size K
// over C channels, followed by SiLU:
//
//	out[t,c] = silu( Σ_{j<K} w[c,j] · in[t-K+1+j, c] )
//
// x is (T, C) row-major, w is (C, K) (conv1d.weight [C,1,K]), and state
// holds the K-1 inputs before x, oldest first ((K-1, C); zeros at the start
// of a sequence). On return state holds the last K-1 inputs of state+x, so
// consecutive calls equal one call over the concatenated input. out must
// not alias x or state.
func CausalConv1D(out, x []float32, T, C int, w []float32, K int, state []float32) {
	h := K - 1
	out, x, w, state = out[:T*C], x[:T*C], w[:C*K], state[:h*C]
	// in returns input row s (s < 0: the state's row h+s).
	in := func(s int) []float32 {
		if s < 0 {
			return state[(h+s)*C : (h+s+1)*C]
		}
		return x[s*C : (s+1)*C]
	}
	for t := range T {
		o := out[t*C : (t+1)*C]
		clear(o)
		for j := range K {
			r := in(t - h + j)
			for c := range o {
				o[c] += w[c*K+j] * r[c]
			}
		}
		for c, v := range o {
			o[c] = v / (1 + Exp(-v))
		}
	}
	// The new state: the last h rows of state ++ x.
	if T >= h {
		copy(state, x[(T-h)*C:])
		return
	}
	copy(state, state[T*C:])
	copy(state[(h-T)*C:], x)
}

// L2Norm scales x to unit length with eps inside the sum, as the fla /
// transformers l2norm does: x /= sqrt(Σx² + eps).
func L2Norm(x []float32, eps float32) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := float32(1 / math.Sqrt(float64(float32(ss)+eps)))
	for i := range x {
		x[i] *= inv
	}
}

// softplus is torch's F.softplus (beta 1, threshold 20).
func softplus(x float64) float64 {
	if x > 20 {
		return x
	}
	return math.Log1p(math.Exp(x))
}

// DeltaGates computes, per value head, the log-decay
// g = −exp(A_log)·softplus(a + dt_bias) (≤ 0) and the write strength
// β = σ(b) from one token's projections a and b.
func DeltaGates(g, beta, a, b, aLog, dtBias []float32) {
	n := len(g)
	beta, a, b, aLog, dtBias = beta[:n], a[:n], b[:n], aLog[:n], dtBias[:n]
	for h := range g {
		g[h] = float32(-math.Exp(float64(aLog[h])) * softplus(float64(a[h])+float64(dtBias[h])))
		beta[h] = float32(1 / (1 + math.Exp(-float64(b[h]))))
	}
}

// GatedRMSNorm computes x = RMSNorm(x)·w · silu(z) over one head (the
// standard, not zero-centred, weight w: Qwen3NextRMSNormGated).
func GatedRMSNorm(x, z, w []float32, eps float32) {
	RMSNorm(x, x, w, eps, false)
	z = z[:len(x)]
	for i, v := range z {
		x[i] *= v / (1 + Exp(-v))
	}
}

// DeltaRule is the shape of a gated delta rule: KeyHeads key heads of
// KeyDim shared by ValueHeads value heads of ValueDim (grouped value
// attention: value head h uses key head h / (ValueHeads/KeyHeads)). Its
// state is one KeyDim×ValueDim matrix per value head, S[i,j] with i over
// the key dimension (transformers' orientation).
//
// The inputs of a call over T tokens are row-major: q, k (T, KeyHeads·
// KeyDim), already L2-normalised (q also scaled by KeyDim^-½); v and the
// output o (T, ValueHeads·ValueDim); g and beta (T, ValueHeads). Per token
// and value head:
//
//	S = e^g·S;  δ = β·(v − Sᵀk);  S = S + k⊗δ;  o = Sᵀq
type DeltaRule struct {
	KeyHeads, ValueHeads, KeyDim, ValueDim int
}

// StateLen returns the number of float32 of the state (all value heads).
func (d DeltaRule) StateLen() int { return d.ValueHeads * d.KeyDim * d.ValueDim }

// DeltaChunk is the chunk length of the chunked form (transformers' 64).
const DeltaChunk = 64

// deltaIn is one call's inputs.
type deltaIn struct {
	q, k, v, g, beta, o []float32
	T                   int
}

// rowQ and rowK return the q and k of value head h's key head at token t;
// rowV returns value head h's slice of a (T, nv·dv) row-major x at t.
func (d *DeltaRule) rowQ(in *deltaIn, t, h int) []float32 {
	kh := h / (d.ValueHeads / d.KeyHeads)
	w := d.KeyHeads * d.KeyDim
	return in.q[t*w+kh*d.KeyDim : t*w+(kh+1)*d.KeyDim]
}

func (d *DeltaRule) rowK(in *deltaIn, t, h int) []float32 {
	kh := h / (d.ValueHeads / d.KeyHeads)
	w := d.KeyHeads * d.KeyDim
	return in.k[t*w+kh*d.KeyDim : t*w+(kh+1)*d.KeyDim]
}

func (d *DeltaRule) rowV(x []float32, t, h int) []float32 {
	w := d.ValueHeads * d.ValueDim
	return x[t*w+h*d.ValueDim : t*w+(h+1)*d.ValueDim]
}

// Recurrent runs the rule token by token (the decode form and the plain
// reference of Chunked), updating S.
func (d DeltaRule) Recurrent(S, q, k, v, g, beta, o []float32, T int) {
	in := &deltaIn{q: q, k: k, v: v, g: g, beta: beta, o: o, T: T}
	u := make([]float32, d.ValueDim)
	for h := range d.ValueHeads {
		d.recurrentHead(S[h*d.KeyDim*d.ValueDim:(h+1)*d.KeyDim*d.ValueDim], in, h, 0, T, u)
	}
}

// recurrentHead runs tokens [t0, t1) of value head h on its state Sh.
// u is scratch of ValueDim.
func (d *DeltaRule) recurrentHead(Sh []float32, in *deltaIn, h, t0, t1 int, u []float32) {
	dk, dv := d.KeyDim, d.ValueDim
	for t := t0; t < t1; t++ {
		q, k, v, o := d.rowQ(in, t, h), d.rowK(in, t, h), d.rowV(in.v, t, h), d.rowV(in.o, t, h)
		eg := float32(math.Exp(float64(in.g[t*d.ValueHeads+h])))
		beta := in.beta[t*d.ValueHeads+h]
		// S = e^g·S; u = Sᵀk
		clear(u)
		for i := range dk {
			row := Sh[i*dv : (i+1)*dv]
			for j := range row {
				row[j] *= eg
			}
			AXPY(u, k[i], row)
		}
		// δ = β·(v − u)
		for j := range u {
			u[j] = beta * (v[j] - u[j])
		}
		// S = S + k⊗δ; o = Sᵀq
		clear(o)
		for i := range dk {
			row := Sh[i*dv : (i+1)*dv]
			AXPY(row, k[i], u)
			AXPY(o, q[i], row)
		}
	}
}

// DeltaScratch is one worker's scratch for the chunked form.
type DeltaScratch struct {
	gam []float32 // (chunk): cumulative log-decay Γ
	a   []float32 // (chunk, chunk): the strictly lower system, then the masked q·k
	x   []float32 // (chunk, dv+dk): [β·v | β·e^Γ·k], solved in place to [U | W]
	u   []float32 // (dv)
}

func (d *DeltaRule) newScratch() *DeltaScratch {
	C := DeltaChunk
	return &DeltaScratch{
		gam: make([]float32, C), a: make([]float32, C*C),
		x: make([]float32, C*(d.ValueDim+d.KeyDim)), u: make([]float32, d.ValueDim),
	}
}

// Chunked runs the rule over T tokens in chunks of DeltaChunk (the
// prefill form), updating S; it equals Recurrent to rounding. Within a
// chunk of n tokens with Γ the cumulative sum of g:
//
//	L[t,s] = β_t (k_t·k_s) e^{Γ_t−Γ_s} (s < t);   (I+L)[U | W] = [β⊙V | β⊙e^Γ⊙K]
//	V' = U − W·S
//	O_t = e^{Γ_t} Sᵀq_t + Σ_{s≤t} (q_t·k_s) e^{Γ_t−Γ_s} V'_s
//	S  = e^{Γ_n} S + Σ_t e^{Γ_n−Γ_t} k_t⊗V'_t
//
// (the WY/UT form; the unit lower-triangular system is solved by forward
// substitution). A final partial chunk is run as is, without padding.
func (d DeltaRule) Chunked(S, q, k, v, g, beta, o []float32, T int) {
	in := &deltaIn{q: q, k: k, v: v, g: g, beta: beta, o: o, T: T}
	sc := d.newScratch()
	for h := range d.ValueHeads {
		d.chunkedHead(S[h*d.KeyDim*d.ValueDim:(h+1)*d.KeyDim*d.ValueDim], in, h, sc)
	}
}

func (d *DeltaRule) chunkedHead(Sh []float32, in *deltaIn, h int, sc *DeltaScratch) {
	dk, dv, nv := d.KeyDim, d.ValueDim, d.ValueHeads
	w := dv + dk
	for t0 := 0; t0 < in.T; t0 += DeltaChunk {
		n := min(DeltaChunk, in.T-t0)
		gam, a, x := sc.gam[:n], sc.a[:n*n], sc.x[:n*w]
		var acc float32
		for t := range n {
			acc += in.g[(t0+t)*nv+h]
			gam[t] = acc
		}
		// Right-hand sides [β·v | β·e^Γ·k] and L (strictly lower).
		for t := range n {
			bt := in.beta[(t0+t)*nv+h]
			kt := d.rowK(in, t0+t, h)
			xr := x[t*w : (t+1)*w]
			for j, vv := range d.rowV(in.v, t0+t, h) {
				xr[j] = bt * vv
			}
			be := bt * float32(math.Exp(float64(gam[t])))
			for i, kk := range kt {
				xr[dv+i] = be * kk
			}
			for s := range t {
				a[t*n+s] = bt * Dot(kt, d.rowK(in, t0+s, h)) * float32(math.Exp(float64(gam[t]-gam[s])))
			}
		}
		// Forward substitution: row t -= Σ_{s<t} L[t,s]·row s.
		for t := 1; t < n; t++ {
			xr := x[t*w : (t+1)*w]
			for s := range t {
				AXPY(xr, -a[t*n+s], x[s*w:(s+1)*w])
			}
		}
		// V' = U − W·S, in the U columns.
		for t := range n {
			xr := x[t*w : (t+1)*w]
			u, wk := xr[:dv], xr[dv:]
			for i, c := range wk {
				AXPY(u, -c, Sh[i*dv:(i+1)*dv])
			}
		}
		// O_t = e^{Γ_t} Sᵀq_t + Σ_{s≤t} (q_t·k_s) e^{Γ_t−Γ_s} V'_s.
		for t := range n {
			qt, o := d.rowQ(in, t0+t, h), d.rowV(in.o, t0+t, h)
			clear(o)
			for i, c := range qt {
				AXPY(o, c, Sh[i*dv:(i+1)*dv])
			}
			et := float32(math.Exp(float64(gam[t])))
			for j := range o {
				o[j] *= et
			}
			for s := 0; s <= t; s++ {
				c := Dot(qt, d.rowK(in, t0+s, h)) * float32(math.Exp(float64(gam[t]-gam[s])))
				AXPY(o, c, x[s*w:s*w+dv])
			}
		}
		// S = e^{Γ_n} S + Σ_t e^{Γ_n−Γ_t} k_t⊗V'_t.
		en := float32(math.Exp(float64(gam[n-1])))
		for i := range Sh {
			Sh[i] *= en
		}
		for t := range n {
			kt := d.rowK(in, t0+t, h)
			e := float32(math.Exp(float64(gam[n-1] - gam[t])))
			vp := x[t*w : t*w+dv]
			for i, kk := range kt {
				AXPY(Sh[i*dv:(i+1)*dv], e*kk, vp)
			}
		}
	}
}

// DeltaRun runs a DeltaRule over the value heads in parallel on a pool:
// Recurrent for T == 1 (or when chunked is false), Chunked otherwise.
type DeltaRun struct {
	Rule    DeltaRule
	scratch []*DeltaScratch
	task    deltaTask
}

type deltaTask struct {
	r       *DeltaRun
	S       []float32
	in      deltaIn
	chunked bool
}

func (t *deltaTask) Run(lo, hi, worker int) {
	d := &t.r.Rule
	sc := t.r.scratch[worker]
	per := d.KeyDim * d.ValueDim
	for h := lo; h < hi; h++ {
		Sh := t.S[h*per : (h+1)*per]
		if t.chunked {
			d.chunkedHead(Sh, &t.in, h, sc)
		} else {
			d.recurrentHead(Sh, &t.in, h, 0, t.in.T, sc.u)
		}
	}
}

// Run runs T tokens on the pool (see DeltaRule for the layouts).
func (r *DeltaRun) Run(p *Pool, S, q, k, v, g, beta, o []float32, T int) {
	for len(r.scratch) < p.Workers() {
		r.scratch = append(r.scratch, r.Rule.newScratch())
	}
	d := r.Rule
	r.task = deltaTask{r: r, S: S, in: deltaIn{q: q, k: k, v: v, g: g, beta: beta, o: o, T: T}, chunked: T > 1}
	work := T * d.ValueHeads * d.KeyDim * d.ValueDim * 4
	p.For(d.ValueHeads, work, &r.task)
	r.task = deltaTask{}
}
