package kern

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/quant"
)

// The arithmetic of the half wide tiles (GemmQ.F16, gemmq.cu's gemmh_*),
// as plain references for the tests beside them: Y = Σ_k GemmHActivation(x_k)·
// GemmHWeights(W)[o][k] in float32 sums.

// GemmHActivation is gemmh_acth's value of x: x rounded to f16 (nearest
// even), |x| > 65504 saturated to ±65504, a NaN kept.
func GemmHActivation(x float32) float32 {
	if x > 65504 {
		x = 65504
	} else if x < -65504 {
		x = -65504
	}
	return half.RoundF16(x)
}

// GemmHRowExp is E of a q4tp row's ladder (a, b): ⌈max(a, a + 31·b)⌉ in
// float32, within [−126, 126], 0 for a NaN (gemmq.cu's gh_rowexp).
func GemmHRowExp(ah, bh uint16) int {
	a, b := half.F16ToF32(ah), half.F16ToF32(bh)
	e := math.Ceil(float64(max(a, a+float32(31*b))))
	if math.IsNaN(e) {
		return 0
	}
	return int(min(max(e, -126), 126))
}

// GemmHWeights returns the weights the half wide tiles multiply by for a
// q4tp tensor of rows×cols in its stored bytes: row o's weight k of group
// g is 2^E·f16((n − 8)·f16(rung·2^−E)) with E = GemmHRowExp of the row's
// ladder and rung its code's (quant's ladder: a correctly rounded exp2; a
// GPU's exp2f may differ by an ulp, which can move a scaled rung by one f16
// ulp).
func GemmHWeights(w []byte, rows, cols int) ([]float32, error) {
	n, err := quant.ExpectedBytes(quant.Q4TP, []int{rows, cols})
	if err != nil {
		return nil, err
	}
	if int64(len(w)) != n {
		return nil, fmt.Errorf("kern: q4tp %d×%d is %d bytes, not %d", rows, cols, n, len(w))
	}
	gpr := cols / 32
	lad, codes, stride := rows*gpr*16, rows*gpr*16+rows*4, quant.Q4TPCodeStride(cols)
	out := make([]float32, rows*cols)
	for o := range rows {
		ah, bh := binary.LittleEndian.Uint16(w[lad+4*o:]), binary.LittleEndian.Uint16(w[lad+4*o+2:])
		e := GemmHRowExp(ah, bh)
		a, b := half.F16ToF32(ah), half.F16ToF32(bh)
		cb := w[codes+o*stride : codes+(o+1)*stride]
		for g := range gpr {
			bit, code := 5*g, 0
			for j := range 5 {
				code |= int(cb[(bit+j)/8]>>((bit+j)%8)&1) << j
			}
			rung := float32(math.Exp2(float64(a + float32(float32(code)*b))))
			r := half.RoundF16(float32(math.Ldexp(float64(rung), -e)))
			grp := w[(o*gpr+g)*16 : (o*gpr+g+1)*16]
			for i, byt := range grp {
				for h, nib := range [2]byte{byt & 15, byt >> 4} {
					v := half.RoundF16(float32(int(nib)-8) * r)
					out[o*cols+32*g+2*i+h] = float32(math.Ldexp(float64(v), e))
				}
			}
		}
	}
	return out, nil
}
