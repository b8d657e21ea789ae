package quant

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/cortiq/cortiq/half"
)

// q82fCodec stores int8 quants with an f16 scale per row and a float32
// scale per column: W[o,i] ≈ rs[o]·q[o,i]·col[i]. A kernel computes
// y = rs ⊙ (Q·(x ⊙ col)), prescaling the activations by the column field.
//
// Layout (little-endian): int8 quants rows·cols bytes row-major, then the
// f16 row scales rs[rows], zero padding up to Q82FColOffset(rows, cols)
// (a multiple of 4), then the float32 column field col[cols].
//
// Each row of W/col (divided in float32) is quantized like q8_row:
// rs = f16(absmax/127), q = clamp(round(v/rs), -127, 127).
type q82fCodec struct{}

func init() { register(q82fCodec{}) }

func (q82fCodec) DType() DType { return Q82F }

// ErrNeedCol reports a partial q8_2f encode without a column field.
var ErrNeedCol = errors.New("quant: q8_2f: encoding part of a tensor needs EncodeOptions.Col (see FitColumns)")

func (q82fCodec) EncodeRows(dst []byte, w []float32, rows, cols, r0 int, opt *EncodeOptions) error {
	n, err := checkRows(Q82F, dst, w, rows, cols, r0)
	if err != nil {
		return err
	}
	if err := checkFinite(Q82F, w, cols, r0); err != nil {
		return err
	}
	var col, stats []float32
	if opt != nil {
		col, stats = opt.Col, opt.ColStats
	}
	if col == nil {
		if r0 != 0 || n != rows {
			return ErrNeedCol
		}
		if err := checkColStats(stats, cols); err != nil {
			return err
		}
		col = FitColumns(w, rows, cols, stats)
	}
	if err := checkCol(col, cols); err != nil {
		return err
	}
	off := Q82FColOffset(rows, cols)
	v := make([]float32, cols)
	for k := range n {
		r := r0 + k
		for i, x := range w[k*cols : (k+1)*cols] {
			v[i] = x / col[i]
		}
		h, err := quantizeRowI8(dst[r*cols:(r+1)*cols], v)
		if err != nil {
			return fmt.Errorf("quant: q8_2f: row %d: %w", r, err)
		}
		binary.LittleEndian.PutUint16(dst[rows*cols+2*r:], h)
	}
	if r0 == 0 {
		// The padding and the column field are shared by all rows: the
		// chunk holding row 0 writes them, so chunks encoded concurrently
		// never write the same bytes.
		clear(dst[rows*cols+2*rows : off])
		for i, c := range col {
			binary.LittleEndian.PutUint32(dst[off+int64(4*i):], math.Float32bits(c))
		}
	}
	return nil
}

func checkCol(col []float32, cols int) error {
	if len(col) != cols {
		return fmt.Errorf("quant: q8_2f: column field has %d values for %d columns", len(col), cols)
	}
	for i, c := range col {
		if !(c > 0) || math.IsInf(float64(c), 0) {
			return fmt.Errorf("quant: q8_2f: column field value %v at column %d is not positive and finite", c, i)
		}
	}
	return nil
}

func checkColStats(stats []float32, cols int) error {
	if stats == nil {
		return nil
	}
	if len(stats) != cols {
		return fmt.Errorf("quant: q8_2f: %d column statistics for %d columns", len(stats), cols)
	}
	for i, s := range stats {
		if !(s >= 0) || math.IsInf(float64(s), 0) {
			return fmt.Errorf("quant: q8_2f: column statistic %v at column %d is not finite and non-negative", s, i)
		}
	}
	return nil
}

func (q82fCodec) DecodeRow(dst []float32, src []byte, rows, cols, r int) {
	q := src[r*cols : (r+1)*cols]
	rs := half.F16ToF32(binary.LittleEndian.Uint16(src[rows*cols+2*r:]))
	col := src[Q82FColOffset(rows, cols):]
	for i := range dst[:cols] {
		c := math.Float32frombits(binary.LittleEndian.Uint32(col[4*i:]))
		dst[i] = float32(rs*float32(int8(q[i]))) * c
	}
}

func (q82fCodec) DotRow(src []byte, rows, cols, r int, x []float32) float32 {
	q := src[r*cols : (r+1)*cols]
	rs := half.F16ToF32(binary.LittleEndian.Uint16(src[rows*cols+2*r:]))
	col := src[Q82FColOffset(rows, cols):]
	var acc float32
	for i, xi := range x[:cols] {
		xc := xi * math.Float32frombits(binary.LittleEndian.Uint32(col[4*i:]))
		acc += float32(float32(int8(q[i])) * xc)
	}
	return acc * rs
}
