package quant

import (
	"fmt"
	"math"
)

// EncodeOptions tune an encoder. The zero value is valid.
type EncodeOptions struct {
	// ColStats is an optional per-column activation statistic (the RMS of
	// input feature i over calibration data) that q8_2f uses when it fits
	// its column field; nil means weights only.
	ColStats []float32
	// Col, when set, is the q8_2f column field to use as is (len cols).
	// EncodeRows of q8_2f needs it, since a field fitted per chunk of rows
	// would differ between chunks.
	Col []float32
}

// Codec is one storage format's traits: every format implements it and the
// fast kernels elsewhere are tested against DotRow.
type Codec interface {
	DType() DType
	// EncodeRows encodes rows [r0, r0+len(w)/cols) of a rows×cols tensor
	// from the row-major float32 slice w into dst, the whole tensor's
	// buffer of ExpectedBytes length. Rows are independent, so a tensor can
	// be encoded in chunks (for q8_2f, opt.Col must then be given).
	EncodeRows(dst []byte, w []float32, rows, cols, r0 int, opt *EncodeOptions) error
	// DecodeRow writes row r of the stored tensor src to dst[:cols]. src
	// must hold ExpectedBytes of the shape (any contents are safe: odd
	// bytes give odd values, never a panic) and 0 <= r < rows; these are
	// not checked.
	DecodeRow(dst []float32, src []byte, rows, cols, r int)
	// DotRow is the plain reference Σ_i W[r,i]·x[i] from the stored bytes,
	// with the same arithmetic a kernel is expected to reproduce; the
	// preconditions of DecodeRow apply, and len(x) >= cols.
	DotRow(src []byte, rows, cols, r int, x []float32) float32
}

var codecs = map[DType]Codec{}

func register(c Codec) { codecs[c.DType()] = c }

// CodecFor returns the codec of a format that holds float weights.
func CodecFor(d DType) (Codec, error) {
	c, ok := codecs[d]
	if !ok {
		return nil, fmt.Errorf("quant: no codec for format %s", d)
	}
	return c, nil
}

// Encode encodes a whole tensor of the given shape from row-major float32.
func Encode(d DType, w []float32, shape []int, opt *EncodeOptions) ([]byte, error) {
	c, err := CodecFor(d)
	if err != nil {
		return nil, err
	}
	nb, err := ExpectedBytes(d, shape)
	if err != nil {
		return nil, err
	}
	rows, cols, _ := Matrix(shape)
	if len(w) != rows*cols {
		return nil, fmt.Errorf("quant: %d values for shape %v", len(w), shape)
	}
	dst := make([]byte, nb)
	if err := c.EncodeRows(dst, w, rows, cols, 0, opt); err != nil {
		return nil, err
	}
	return dst, nil
}

// Decode decodes a whole stored tensor to row-major float32.
func Decode(d DType, src []byte, shape []int) ([]float32, error) {
	c, err := CodecFor(d)
	if err != nil {
		return nil, err
	}
	nb, err := ExpectedBytes(d, shape)
	if err != nil {
		return nil, err
	}
	if int64(len(src)) != nb {
		return nil, fmt.Errorf("quant: %s %v needs %d bytes, have %d", d, shape, nb, len(src))
	}
	rows, cols, _ := Matrix(shape)
	out := make([]float32, rows*cols)
	for r := 0; r < rows; r++ {
		c.DecodeRow(out[r*cols:(r+1)*cols], src, rows, cols, r)
	}
	return out, nil
}

// checkRows validates the arguments of an EncodeRows call and returns the
// number of rows in w.
func checkRows(d DType, dst []byte, w []float32, rows, cols, r0 int) (int, error) {
	if rows < 0 || cols < 0 {
		return 0, fmt.Errorf("quant: %s: negative shape %d×%d", d, rows, cols)
	}
	nb, err := ExpectedBytes(d, []int{rows, cols})
	if err != nil {
		return 0, err
	}
	if int64(len(dst)) != nb {
		return 0, fmt.Errorf("quant: %s %d×%d: destination has %d bytes, need %d", d, rows, cols, len(dst), nb)
	}
	if cols == 0 {
		if len(w) != 0 {
			return 0, fmt.Errorf("quant: %s: %d values for a tensor with no columns", d, len(w))
		}
		return 0, nil
	}
	if len(w)%cols != 0 {
		return 0, fmt.Errorf("quant: %s: %d values are not whole rows of %d columns", d, len(w), cols)
	}
	n := len(w) / cols
	if r0 < 0 || r0 > rows || n > rows-r0 {
		return 0, fmt.Errorf("quant: %s: rows [%d,%d) outside the tensor's %d rows", d, r0, r0+n, rows)
	}
	return n, nil
}

// checkFinite reports the first NaN or infinite value of rows [r0, ...) in w,
// which a quantized format cannot store.
func checkFinite(d DType, w []float32, cols, r0 int) error {
	for i, v := range w {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("quant: %s: non-finite weight %v at row %d, column %d", d, v, r0+i/cols, i%cols)
		}
	}
	return nil
}
