// Package quant defines the tensor storage formats of a CMF file and the
// codecs that turn float32 rows into them and back.
//
// A format is one row in a traits table (see Codec): its byte size for a
// shape, an encoder from float32 rows, a decoder to float32, and a plain
// reference row·vector dot product against which every fast kernel is tested.
// The exact byte layouts are normative and written down in docs/quant.md
// (sizes and dtype codes also in docs/cmf.md).
package quant

import (
	"errors"
	"fmt"
	"math"
)

// DType names a tensor storage format. The numeric values are stored in CMF
// tensor directories and never change; new formats get new numbers.
type DType uint8

const (
	F32   DType = 0 // little-endian IEEE float32
	F16   DType = 1 // little-endian IEEE binary16
	BF16  DType = 2 // little-endian bfloat16
	Q8Row DType = 3 // int8 quants, one f16 scale per row
	Q82F  DType = 4 // int8 quants, f16 row scale and f32 column field
	Q4TP  DType = 5 // 4-bit groups of 32, per-row log ladder of 32 scales, 5-bit code per group
	U8    DType = 6 // raw bytes (blobs such as an embedded tokenizer)
	I32   DType = 7 // little-endian int32
)

// ErrShape reports a shape a format cannot store.
var ErrShape = errors.New("quant: shape not supported by format")

var names = [...]string{F32: "f32", F16: "f16", BF16: "bf16", Q8Row: "q8_row", Q82F: "q8_2f", Q4TP: "q4tp", U8: "u8", I32: "i32"}

// String returns the format's name as used in CMF headers and on the command line.
func (d DType) String() string {
	if int(d) < len(names) {
		return names[d]
	}
	return fmt.Sprintf("unknown(%d)", uint8(d))
}

// Known reports whether this build knows the format.
func (d DType) Known() bool { return int(d) < len(names) }

// Quantized reports whether the format is one of the block/row quantized ones.
func (d DType) Quantized() bool { return d == Q8Row || d == Q82F || d == Q4TP }

// ParseDType returns the format with the given name.
func ParseDType(s string) (DType, error) {
	for i, n := range names {
		if n == s {
			return DType(i), nil
		}
	}
	return 0, fmt.Errorf("quant: unknown format %q (known: f32, f16, bf16, q8_row, q8_2f, q4tp, u8, i32)", s)
}

// MaxElements bounds the element count of one tensor (2^40) so that size
// arithmetic on untrusted shapes can never overflow.
const MaxElements = 1 << 40

// Matrix returns the (rows, cols) view of a shape: cols is the last
// dimension and rows the product of the others (1 for a 1-D tensor).
func Matrix(shape []int) (rows, cols int, err error) {
	if len(shape) == 0 {
		return 1, 1, nil
	}
	n := 1
	for _, d := range shape {
		if d < 0 {
			return 0, 0, fmt.Errorf("%w: negative dimension in %v", ErrShape, shape)
		}
		if d != 0 && n > MaxElements/d {
			return 0, 0, fmt.Errorf("%w: %v has more than 2^40 elements", ErrShape, shape)
		}
		n *= d
	}
	cols = shape[len(shape)-1]
	rows = 1
	for _, d := range shape[:len(shape)-1] {
		rows *= d // cannot overflow: bounded by the product checked above, or a zero column count
		if rows > MaxElements {
			return 0, 0, fmt.Errorf("%w: %v has more than 2^40 rows", ErrShape, shape)
		}
	}
	return rows, cols, nil
}

// GroupSize is the q4tp group length (weights per 16-byte nibble group).
const GroupSize = 32

// Q4TPCodeStride returns the bytes of 5-bit codes per row for cols columns.
func Q4TPCodeStride(cols int) int { return (cols/GroupSize*5 + 7) / 8 }

// ExpectedBytes returns the exact byte size of a tensor of this format and
// shape, or an error if the format cannot hold the shape.
func ExpectedBytes(d DType, shape []int) (int64, error) {
	rows, cols, err := Matrix(shape)
	if err != nil {
		return 0, err
	}
	n := int64(rows) * int64(cols)
	switch d {
	case F32, I32:
		return n * 4, nil
	case F16, BF16:
		return n * 2, nil
	case U8:
		return n, nil
	case Q8Row:
		if len(shape) < 2 {
			return 0, fmt.Errorf("%w: %s needs a matrix, got %v", ErrShape, d, shape)
		}
		return n + int64(rows)*2, nil
	case Q82F:
		if len(shape) < 2 {
			return 0, fmt.Errorf("%w: %s needs a matrix, got %v", ErrShape, d, shape)
		}
		return Q82FColOffset(rows, cols) + int64(cols)*4, nil
	case Q4TP:
		if len(shape) < 2 || cols%GroupSize != 0 {
			return 0, fmt.Errorf("%w: %s needs a matrix with a multiple of %d columns, got %v", ErrShape, d, GroupSize, shape)
		}
		gpr := int64(cols / GroupSize)
		return int64(rows)*gpr*16 + int64(rows)*4 + int64(rows)*int64(Q4TPCodeStride(cols)), nil
	}
	return 0, fmt.Errorf("quant: unknown format %d", uint8(d))
}

// Q82FColOffset is the byte offset of the q8_2f column field: after the
// int8 quants and the f16 row scales, rounded up to 4 bytes.
func Q82FColOffset(rows, cols int) int64 {
	off := int64(rows)*int64(cols) + int64(rows)*2
	return (off + 3) &^ 3
}

// BitsPerWeight returns the storage cost of one weight of a tensor.
func BitsPerWeight(d DType, shape []int) float64 {
	nb, err := ExpectedBytes(d, shape)
	rows, cols, _ := Matrix(shape)
	if err != nil || rows*cols == 0 {
		return math.NaN()
	}
	return float64(nb) * 8 / float64(rows*cols)
}
