package quant

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/cortiq/cortiq/half"
)

// bf16Codec stores a plain row-major array of little-endian bfloat16 (the
// top half of a float32), rounded to nearest even. A finite weight that
// rounds to infinity is an error.
type bf16Codec struct{}

func init() { register(bf16Codec{}) }

func (bf16Codec) DType() DType { return BF16 }

func (bf16Codec) EncodeRows(dst []byte, w []float32, rows, cols, r0 int, _ *EncodeOptions) error {
	if _, err := checkRows(BF16, dst, w, rows, cols, r0); err != nil {
		return err
	}
	out := dst[r0*cols*2:]
	for i, v := range w {
		h := half.F32ToBF16(v)
		if h&0x7fff == 0x7f80 && !math.IsInf(float64(v), 0) {
			return fmt.Errorf("quant: bf16: weight %g at row %d, column %d overflows bf16", v, r0+i/cols, i%cols)
		}
		binary.LittleEndian.PutUint16(out[2*i:], h)
	}
	return nil
}

func (bf16Codec) DecodeRow(dst []float32, src []byte, rows, cols, r int) {
	row := src[r*cols*2 : (r+1)*cols*2]
	for i := range dst[:cols] {
		dst[i] = half.BF16ToF32(binary.LittleEndian.Uint16(row[2*i:]))
	}
}

func (bf16Codec) DotRow(src []byte, rows, cols, r int, x []float32) float32 {
	row := src[r*cols*2 : (r+1)*cols*2]
	var acc float32
	for i, xi := range x[:cols] {
		acc += float32(half.BF16ToF32(binary.LittleEndian.Uint16(row[2*i:])) * xi)
	}
	return acc
}
