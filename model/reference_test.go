package model_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/quant"
)

// refModel is a plain scalar forward pass written straight from the
// formulas of architectures.md §1–§4, in float64, with no cache, no pool
// and no kernels package: the weights are decoded from the CMF file with
// the quant codecs, so a quantized file is checked against exactly the
// weights it stores.
type refModel struct {
	a    cmf.Arch
	vals map[string][]float64
}

func newRefModel(t testing.TB, m *cmf.Model) *refModel {
	t.Helper()
	r := &refModel{a: m.Header.Arch, vals: map[string][]float64{}}
	for i := range m.Tensors {
		tt := &m.Tensors[i]
		if tt.DType == quant.U8 {
			continue
		}
		v, err := quant.Decode(tt.DType, m.Data(tt), tt.Shape)
		if err != nil {
			t.Fatalf("%s: %v", tt.Name, err)
		}
		f := make([]float64, len(v))
		for j, x := range v {
			f[j] = float64(x)
		}
		r.vals[tt.Name] = f
	}
	return r
}

func (r *refModel) w(name string) []float64 {
	v, ok := r.vals[name]
	if !ok {
		panic("reference: no tensor " + name)
	}
	return v
}

// linear returns W·x (+ b) for W [len(W)/len(x), len(x)].
func linear(W, x, b []float64) []float64 {
	n := len(x)
	y := make([]float64, len(W)/n)
	for o := range y {
		var s float64
		for i, xi := range x {
			s += W[o*n+i] * xi
		}
		if b != nil {
			s += b[o]
		}
		y[o] = s
	}
	return y
}

func (r *refModel) rmsnorm(x, w []float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+r.a.RMSNormEps)
	y := make([]float64, len(x))
	for i, v := range x {
		ww := w[i]
		if r.a.NormStyle == "one_plus" {
			ww++
		}
		y[i] = ww * v * inv
	}
	return y
}

// invFreq returns the RoPE inverse frequencies and the cos/sin scaling for
// a call whose positions end before seqLen (transformers v5 formulas).
func (r *refModel) invFreq(seqLen int) ([]float64, float64) {
	a := &r.a
	prf := a.PartialRotaryFactor
	if prf == 0 {
		prf = 1
	}
	d := int(float64(a.HeadDim) * prf)
	s := a.RopeScaling
	if s == nil {
		s = &cmf.RopeScaling{Type: "default"}
	}
	omp := float64(s.OriginalMaxPositionEmbeddings)
	if omp == 0 {
		omp = float64(a.MaxPositionEmbeddings)
	}
	base := a.RopeTheta
	if s.Type == "dynamic" {
		L := float64(max(seqLen, a.MaxPositionEmbeddings))
		base *= math.Pow(s.Factor*L/float64(a.MaxPositionEmbeddings)-(s.Factor-1), float64(d)/float64(d-2))
	}
	inv := make([]float64, d/2)
	for i := range inv {
		inv[i] = 1 / math.Pow(base, float64(2*i)/float64(d))
	}
	scale := 1.0
	switch s.Type {
	case "linear":
		for i := range inv {
			inv[i] /= s.Factor
		}
	case "llama3":
		lw, hw := omp/s.LowFreqFactor, omp/s.HighFreqFactor
		for i, v := range inv {
			wl := 2 * math.Pi / v
			switch {
			case wl < hw:
			case wl > lw:
				inv[i] = v / s.Factor
			default:
				sm := (omp/wl - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
				inv[i] = (1-sm)*v/s.Factor + sm*v
			}
		}
	case "yarn":
		scale = 0.1*math.Log(s.Factor) + 1
		if s.AttentionFactor != 0 {
			scale = s.AttentionFactor
		}
		bf, bs := 32.0, 1.0
		if s.BetaFast != 0 {
			bf = s.BetaFast
		}
		if s.BetaSlow != 0 {
			bs = s.BetaSlow
		}
		cd := func(rot float64) float64 {
			return float64(d) * math.Log(omp/(rot*2*math.Pi)) / (2 * math.Log(a.RopeTheta))
		}
		lo, hi := cd(bf), cd(bs)
		if s.Truncate == nil || *s.Truncate {
			lo, hi = math.Floor(lo), math.Ceil(hi)
		}
		lo, hi = math.Max(lo, 0), math.Min(hi, float64(d-1))
		if lo == hi {
			hi += 0.001
		}
		for i, v := range inv {
			ramp := math.Min(math.Max((float64(i)-lo)/(hi-lo), 0), 1)
			inv[i] = v/s.Factor*ramp + v*(1-ramp)
		}
	}
	return inv, scale
}

// rope rotates x (one head) at position pos: pairs (i, i+d/2) over the
// first d = 2·len(inv) dimensions, the rest unchanged.
func rope(x []float64, inv []float64, scale float64, pos int) {
	h := len(inv)
	for i, f := range inv {
		c, s := math.Cos(float64(pos)*f)*scale, math.Sin(float64(pos)*f)*scale
		a, b := x[i], x[i+h]
		x[i], x[i+h] = a*c-b*s, b*c+a*s
	}
}

// forward returns the logits of every position of ids, run from position
// 0 as a single call.
func (r *refModel) forward(ids []int) [][]float64 {
	a := &r.a
	H, hd, nh, nkv, V := a.HiddenSize, a.HeadDim, a.NumAttentionHeads, a.NumKVHeads, a.VocabSize
	T := len(ids)
	inv, rscale := r.invFreq(T)
	emb := r.w("model.embed_tokens.weight")
	x := make([][]float64, T)
	for t, id := range ids {
		x[t] = append([]float64(nil), emb[id*H:(id+1)*H]...)
	}
	opt := func(name string) []float64 { return r.vals[name] }
	for l := 0; l < a.NumLayers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		q, k, v := make([][]float64, T), make([][]float64, T), make([][]float64, T)
		for t := range T {
			xn := r.rmsnorm(x[t], r.w(p+"input_layernorm.weight"))
			q[t] = linear(r.w(p+"self_attn.q_proj.weight"), xn, opt(p+"self_attn.q_proj.bias"))
			k[t] = linear(r.w(p+"self_attn.k_proj.weight"), xn, opt(p+"self_attn.k_proj.bias"))
			v[t] = linear(r.w(p+"self_attn.v_proj.weight"), xn, opt(p+"self_attn.v_proj.bias"))
			for h := range nh {
				qh := q[t][h*hd : (h+1)*hd]
				if a.QKNorm {
					copy(qh, r.rmsnorm(qh, r.w(p+"self_attn.q_norm.weight")))
				}
				rope(qh, inv, rscale, t)
			}
			for h := range nkv {
				kh := k[t][h*hd : (h+1)*hd]
				if a.QKNorm {
					copy(kh, r.rmsnorm(kh, r.w(p+"self_attn.k_norm.weight")))
				}
				rope(kh, inv, rscale, t)
			}
		}
		for t := range T {
			att := make([]float64, nh*hd)
			for h := range nh {
				g := h / (nh / nkv)
				s := make([]float64, t+1)
				mx := math.Inf(-1)
				for j := range s {
					var d float64
					for i := range hd {
						d += q[t][h*hd+i] * k[j][g*hd+i]
					}
					s[j] = d / math.Sqrt(float64(hd))
					mx = math.Max(mx, s[j])
				}
				var sum float64
				for j := range s {
					s[j] = math.Exp(s[j] - mx)
					sum += s[j]
				}
				for j := range s {
					for i := range hd {
						att[h*hd+i] += s[j] / sum * v[j][g*hd+i]
					}
				}
			}
			o := linear(r.w(p+"self_attn.o_proj.weight"), att, opt(p+"self_attn.o_proj.bias"))
			for i := range o {
				x[t][i] += o[i]
			}
			xn := r.rmsnorm(x[t], r.w(p+"post_attention_layernorm.weight"))
			g := linear(r.w(p+"mlp.gate_proj.weight"), xn, opt(p+"mlp.gate_proj.bias"))
			u := linear(r.w(p+"mlp.up_proj.weight"), xn, opt(p+"mlp.up_proj.bias"))
			for i := range g {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			d := linear(r.w(p+"mlp.down_proj.weight"), g, opt(p+"mlp.down_proj.bias"))
			for i := range d {
				x[t][i] += d[i]
			}
		}
	}
	head := "lm_head.weight"
	if a.TieWordEmbeddings {
		head = "model.embed_tokens.weight"
	}
	out := make([][]float64, T)
	for t := range T {
		out[t] = linear(r.w(head), r.rmsnorm(x[t], r.w("model.norm.weight")), nil)
		if len(out[t]) != V {
			panic("reference: head size")
		}
	}
	return out
}
