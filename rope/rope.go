// Package rope computes the frequency tables of rotary position
// embeddings (every scaling type transformers implements) on the host, in
// float32 as transformers does; the CPU kernels and the GPU backends apply
// them.
package rope

import (
	"fmt"
	"math"
)

// Config describes a rotary position embedding, with the field names
// of Hugging Face's rope_parameters (docs/cmf.md `rope_scaling`).
type Config struct {
	HeadDim             int
	PartialRotaryFactor float64 // fraction of HeadDim rotated; 0 means 1
	Theta               float64 // rope_theta
	MaxPositions        int     // max_position_embeddings

	Type           string  // "", "default", "linear", "dynamic", "yarn", "llama3"
	Factor         float64 // linear, dynamic, yarn, llama3
	OriginalMaxPos int     // yarn, llama3 (0: MaxPositions)
	LowFreqFactor  float64 // llama3
	HighFreqFactor float64 // llama3
	BetaFast       float64 // yarn (0: 32)
	BetaSlow       float64 // yarn (0: 1)
	AttnFactor     float64 // yarn (0: derived from Factor, MScale, MScaleAllDim)
	MScale         float64 // yarn
	MScaleAllDim   float64 // yarn
	Truncate       *bool   // yarn: round the correction range (nil: true)
	// FreqFactors ("freq_factors"): per rotated pair, the divisor of its
	// inverse frequency, as GGUF files store llama3 scaling (rope_freqs).
	FreqFactors []float64
}

// Table holds the inverse frequencies of a rotary embedding, computed once
// per model the way transformers (v5, modeling_rope_utils.py) computes
// them in float32, and the attention scaling applied to cos and sin.
//
// Pairing is NeoX / rotate_half: dimension i is rotated with i+d/2 over the
// first d = Dim() dimensions of a head; the rest pass through.
type Table struct {
	cfg     Config
	dim     int
	invFreq []float32
	scale   float32
}

// New computes the frequencies of a rotary embedding.
func New(c Config) (*Table, error) {
	prf := c.PartialRotaryFactor
	if prf == 0 {
		prf = 1
	}
	d := int(float64(c.HeadDim) * prf)
	if c.HeadDim <= 0 || prf < 0 || prf > 1 || d%2 != 0 {
		return nil, fmt.Errorf("rope: head_dim %d with partial_rotary_factor %g gives %d rotated dimensions (need an even number)", c.HeadDim, prf, d)
	}
	if !(c.Theta > 1) {
		return nil, fmt.Errorf("rope: theta %g must be > 1", c.Theta)
	}
	if c.OriginalMaxPos == 0 {
		c.OriginalMaxPos = c.MaxPositions
	}
	r := &Table{cfg: c, dim: d, scale: 1}
	if d == 0 {
		return r, nil
	}
	switch c.Type {
	case "", "default":
	case "linear":
	case "dynamic":
		if c.MaxPositions <= 0 {
			return nil, fmt.Errorf("rope: dynamic scaling needs max_position_embeddings")
		}
	case "yarn":
		if c.OriginalMaxPos <= 0 {
			return nil, fmt.Errorf("rope: yarn needs original_max_position_embeddings or max_position_embeddings")
		}
	case "llama3":
		if c.OriginalMaxPos <= 0 || c.HighFreqFactor == c.LowFreqFactor || c.LowFreqFactor <= 0 {
			return nil, fmt.Errorf("rope: llama3 scaling needs original_max_position_embeddings and distinct positive low/high_freq_factor (got %d, %g, %g)", c.OriginalMaxPos, c.LowFreqFactor, c.HighFreqFactor)
		}
	case "freq_factors":
		if len(c.FreqFactors) != d/2 {
			return nil, fmt.Errorf("rope: %d frequency factors for %d rotated pairs", len(c.FreqFactors), d/2)
		}
		for _, f := range c.FreqFactors {
			if !(f > 0) || math.IsInf(f, 0) {
				return nil, fmt.Errorf("rope: frequency factor %g is not a positive number", f)
			}
		}
	default:
		return nil, fmt.Errorf("rope: scaling type %q is not supported on CPU (default, linear, dynamic, yarn, llama3, freq_factors)", c.Type)
	}
	if c.Type != "" && c.Type != "default" && c.Type != "freq_factors" && !(c.Factor > 0) {
		return nil, fmt.Errorf("rope: %s scaling needs a positive factor, got %g", c.Type, c.Factor)
	}
	r.invFreq = make([]float32, d/2)
	r.scale = r.compute(r.invFreq, c.MaxPositions)
	return r, nil
}

// Dim returns the number of rotated dimensions of a head.
func (r *Table) Dim() int { return r.dim }

// Dynamic reports whether the frequencies depend on the sequence length.
func (r *Table) Dynamic() bool { return r.cfg.Type == "dynamic" }

// baseFreqs returns base^(2i/d) as torch computes it in float32.
func baseFreqs(dst []float32, base float32, d int) {
	for i := range dst {
		e := float32(2*i) / float32(d)
		dst[i] = float32(math.Pow(float64(base), float64(e)))
	}
}

// compute fills inv with the inverse frequencies for a sequence of seqLen
// positions and returns the attention scaling of cos and sin.
func (r *Table) compute(inv []float32, seqLen int) float32 {
	c, d := &r.cfg, r.dim
	base := float32(c.Theta)
	switch c.Type {
	case "dynamic":
		// base' = base·((factor·L/max) − (factor−1))^(d/(d−2)), L ≥ max.
		f, L := float32(c.Factor), float32(max(seqLen, c.MaxPositions))
		g := f*L/float32(c.MaxPositions) - (f - 1)
		base *= float32(math.Pow(float64(g), float64(d)/float64(d-2)))
	}
	baseFreqs(inv, base, d)
	switch c.Type {
	case "yarn":
		return yarnFreqs(inv, c, d)
	}
	for i, p := range inv {
		inv[i] = 1 / p
	}
	switch c.Type {
	case "linear":
		f := float32(c.Factor)
		for i := range inv {
			inv[i] /= f
		}
	case "llama3":
		llama3Freqs(inv, c)
	case "freq_factors":
		for i, f := range c.FreqFactors {
			inv[i] /= float32(f)
		}
	}
	return 1
}

// llama3Freqs applies Llama 3.1 scaling: low frequencies (wavelength past
// omp/low_freq_factor) are divided by factor, high ones kept, and the band
// between interpolated smoothly.
func llama3Freqs(inv []float32, c *Config) {
	f, lo, hi := float32(c.Factor), float32(c.LowFreqFactor), float32(c.HighFreqFactor)
	omp := float32(c.OriginalMaxPos)
	loWave, hiWave := float32(float64(c.OriginalMaxPos)/c.LowFreqFactor), float32(float64(c.OriginalMaxPos)/c.HighFreqFactor)
	for i, v := range inv {
		wave := float32(2*math.Pi) / v
		if wave > loWave {
			v /= f
		} else if !(wave < hiWave) {
			s := (omp/wave - lo) / (hi - lo)
			v = (1-s)*v/f + s*v
		}
		inv[i] = v
	}
}

// yarnFreqs turns pos = base^(2i/d) into YaRN frequencies: interpolated
// (1/(factor·pos)) below the correction range, extrapolated (1/pos) above,
// a linear ramp between, and returns the attention factor.
func yarnFreqs(pos []float32, c *Config, d int) float32 {
	factor := c.Factor
	mscale := func(s, m float64) float64 {
		if s <= 1 {
			return 1
		}
		return 0.1*m*math.Log(s) + 1
	}
	af := c.AttnFactor
	if af == 0 {
		if c.MScale != 0 && c.MScaleAllDim != 0 {
			af = mscale(factor, c.MScale) / mscale(factor, c.MScaleAllDim)
		} else {
			af = mscale(factor, 1)
		}
	}
	betaFast, betaSlow := c.BetaFast, c.BetaSlow
	if betaFast == 0 {
		betaFast = 32
	}
	if betaSlow == 0 {
		betaSlow = 1
	}
	corr := func(rot float64) float64 {
		return float64(d) * math.Log(float64(c.OriginalMaxPos)/(rot*2*math.Pi)) / (2 * math.Log(c.Theta))
	}
	low, high := corr(betaFast), corr(betaSlow)
	if c.Truncate == nil || *c.Truncate {
		low, high = math.Floor(low), math.Ceil(high)
	}
	low, high = max(low, 0), min(high, float64(d-1))
	if low == high {
		high += 0.001
	}
	f32 := float32(factor)
	for i, p := range pos {
		ramp := min(max((float32(i)-float32(low))/float32(high-low), 0), 1)
		extra := 1 - ramp
		interp, extrap := 1/(f32*p), 1/p
		pos[i] = interp*(1-extra) + extrap*extra
	}
	return float32(af)
}

// Freqs returns the inverse frequencies (Dim()/2 values) and the cos/sin
// scaling for a forward call whose positions end before seqLen. Only
// dynamic scaling depends on seqLen (as transformers, which recomputes the
// frequencies from the largest position of each call); otherwise the
// precomputed table is returned and buf is not touched.
func (r *Table) Freqs(seqLen int, buf []float32) ([]float32, float32) {
	if r.cfg.Type != "dynamic" || seqLen <= r.cfg.MaxPositions {
		return r.invFreq, r.scale
	}
	buf = buf[:r.dim/2]
	return buf, r.compute(buf, seqLen)
}
