package quant

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/cortiq/cortiq/half"
)

// q8RowCodec stores int8 quants row-major (rows·cols bytes) followed by one
// f16 scale per row (rows·2 bytes): W[o,i] = scale[o]·q[o,i].
//
// The scale is f16(absmax/127) and the quants are computed with that rounded
// scale: q = clamp(round(w/scale), -127, 127), rounding half away from zero.
// A row whose scale rounds to zero stores scale 0 and q 0.
type q8RowCodec struct{}

func init() { register(q8RowCodec{}) }

func (q8RowCodec) DType() DType { return Q8Row }

func (q8RowCodec) EncodeRows(dst []byte, w []float32, rows, cols, r0 int, _ *EncodeOptions) error {
	n, err := checkRows(Q8Row, dst, w, rows, cols, r0)
	if err != nil {
		return err
	}
	if err := checkFinite(Q8Row, w, cols, r0); err != nil {
		return err
	}
	scales := dst[rows*cols:]
	for k := range n {
		r := r0 + k
		h, err := quantizeRowI8(dst[r*cols:(r+1)*cols], w[k*cols:(k+1)*cols])
		if err != nil {
			return fmt.Errorf("quant: q8_row: row %d: %w", r, err)
		}
		binary.LittleEndian.PutUint16(scales[2*r:], h)
	}
	return nil
}

// quantizeRowI8 quantizes v to int8 with one f16 scale, f16(absmax/127),
// writing the quants to q and returning the scale's bits.
func quantizeRowI8(q []byte, v []float32) (uint16, error) {
	var amax float32
	for _, x := range v {
		amax = max(amax, float32(math.Abs(float64(x))))
	}
	h := half.F32ToF16(amax / 127)
	if h == 0x7c00 {
		return 0, fmt.Errorf("absmax %g needs a scale beyond the f16 range", amax)
	}
	s := half.F16ToF32(h)
	if s == 0 {
		clear(q)
		return 0, nil
	}
	for i, x := range v {
		q[i] = byte(int8(roundClamp(x/s, 127)))
	}
	return h, nil
}

// roundClamp rounds x half away from zero and clamps it to [-m, m].
func roundClamp(x float32, m float32) float32 {
	r := float32(math.Round(float64(x)))
	return min(max(r, -m), m)
}

func (q8RowCodec) DecodeRow(dst []float32, src []byte, rows, cols, r int) {
	q := src[r*cols : (r+1)*cols]
	s := half.F16ToF32(binary.LittleEndian.Uint16(src[rows*cols+2*r:]))
	for i := range dst[:cols] {
		dst[i] = s * float32(int8(q[i]))
	}
}

func (q8RowCodec) DotRow(src []byte, rows, cols, r int, x []float32) float32 {
	q := src[r*cols : (r+1)*cols]
	s := half.F16ToF32(binary.LittleEndian.Uint16(src[rows*cols+2*r:]))
	var acc float32
	for i, xi := range x[:cols] {
		acc += float32(float32(int8(q[i])) * xi)
	}
	return acc * s
}
