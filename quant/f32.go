package quant

import (
	"encoding/binary"
	"math"
)

// f32Codec stores a plain row-major array of little-endian float32.
type f32Codec struct{}

func init() { register(f32Codec{}) }

func (f32Codec) DType() DType { return F32 }

func (f32Codec) EncodeRows(dst []byte, w []float32, rows, cols, r0 int, _ *EncodeOptions) error {
	if _, err := checkRows(F32, dst, w, rows, cols, r0); err != nil {
		return err
	}
	out := dst[r0*cols*4:]
	for i, v := range w {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
	}
	return nil
}

func (f32Codec) DecodeRow(dst []float32, src []byte, rows, cols, r int) {
	row := src[r*cols*4 : (r+1)*cols*4]
	for i := range dst[:cols] {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(row[4*i:]))
	}
}

func (f32Codec) DotRow(src []byte, rows, cols, r int, x []float32) float32 {
	row := src[r*cols*4 : (r+1)*cols*4]
	var acc float32
	for i, xi := range x[:cols] {
		acc += float32(math.Float32frombits(binary.LittleEndian.Uint32(row[4*i:])) * xi)
	}
	return acc
}
