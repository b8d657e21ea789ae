package kern

import "math"

// ActQuantBlock is the number of activations sharing one int8 scale in
// the quantized-activation matvecs (matvec.cu's mq_* kernels).
const ActQuantBlock = 32

// ActQuant is the plain reference of the int8 activations the q8_row,
// q8_2f and q4tp matvecs compute with: per block of 32, amax = max|x|,
// q = round-half-even(x·(127/amax)) in float32, d = amax/127; a block
// whose amax is below 2^-120 (or NaN) is zeros. It returns q·d per
// element (exact in float64), the values the kernels' integer sums
// stand for. The rule is the CPU's (kernels/quantx.go quantizeBlock), so
// both backends see the same activations.
func ActQuant(x []float32) []float64 {
	out := make([]float64, len(x))
	for b := 0; b < len(x); b += ActQuantBlock {
		blk := x[b:min(len(x), b+ActQuantBlock)]
		var amax float32
		for _, v := range blk {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		if !(amax >= 0x1p-120) {
			continue
		}
		id, d := 127/amax, amax/127
		for i, v := range blk {
			out[b+i] = math.RoundToEven(float64(v*id)) * float64(d)
		}
	}
	return out
}
