package quant

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/cortiq/cortiq/half"
)

// f16Codec stores a plain row-major array of little-endian IEEE binary16,
// rounded to nearest even. A finite weight beyond the f16 range is an error
// rather than a silent infinity.
type f16Codec struct{}

func init() { register(f16Codec{}) }

func (f16Codec) DType() DType { return F16 }

func (f16Codec) EncodeRows(dst []byte, w []float32, rows, cols, r0 int, _ *EncodeOptions) error {
	if _, err := checkRows(F16, dst, w, rows, cols, r0); err != nil {
		return err
	}
	out := dst[r0*cols*2:]
	for i, v := range w {
		h := half.F32ToF16(v)
		if h&0x7fff == 0x7c00 && !math.IsInf(float64(v), 0) {
			return fmt.Errorf("quant: f16: weight %g at row %d, column %d overflows f16", v, r0+i/cols, i%cols)
		}
		binary.LittleEndian.PutUint16(out[2*i:], h)
	}
	return nil
}

func (f16Codec) DecodeRow(dst []float32, src []byte, rows, cols, r int) {
	row := src[r*cols*2 : (r+1)*cols*2]
	for i := range dst[:cols] {
		dst[i] = half.F16ToF32(binary.LittleEndian.Uint16(row[2*i:]))
	}
}

func (f16Codec) DotRow(src []byte, rows, cols, r int, x []float32) float32 {
	row := src[r*cols*2 : (r+1)*cols*2]
	var acc float32
	for i, xi := range x[:cols] {
		acc += float32(half.F16ToF32(binary.LittleEndian.Uint16(row[2*i:])) * xi)
	}
	return acc
}
