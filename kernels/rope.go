package kernels

import (
	"math"

	"github.com/cortiq/cortiq/rope"
)

// RopeConfig and Rope are the rotary embedding's description and frequency
// table (package rope).
type (
	RopeConfig = rope.Config
	Rope       = rope.Table
)

// NewRope computes the frequencies of a rotary embedding.
func NewRope(c RopeConfig) (*Rope, error) { return rope.New(c) }

// CosSin writes cos and sin of the angles pos·inv[i] (float32 products as
// transformers computes them), times scale, to cos and sin.
func CosSin(inv []float32, scale float32, pos int, cos, sin []float32) {
	p := float32(pos)
	cos, sin = cos[:len(inv)], sin[:len(inv)]
	for i, f := range inv {
		s, c := math.Sincos(float64(p * f))
		cos[i], sin[i] = float32(c)*scale, float32(s)*scale
	}
}

// ApplyRope rotates one head vector in place with NeoX pairing over its
// first 2·len(cos) dimensions: for i < d/2, (x[i], x[i+d/2]) becomes
// (x[i]·cos − x[i+d/2]·sin, x[i+d/2]·cos + x[i]·sin).
func ApplyRope(x, cos, sin []float32) {
	h := len(cos)
	lo, hi := x[:h], x[h:2*h]
	sin = sin[:h]
	for i, c := range cos {
		a, b := lo[i], hi[i]
		lo[i] = a*c - b*sin[i]
		hi[i] = b*c + a*sin[i]
	}
}
