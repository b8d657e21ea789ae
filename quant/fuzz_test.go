package quant

import (
	"encoding/binary"
	"math"
	"testing"
)

// fuzzShape maps fuzz inputs to a format and a small shape.
func fuzzShape(d, rows byte, cols uint16) (DType, int, int) {
	return floatDTypes[int(d)%len(floatDTypes)], int(rows % 9), int(cols % 321)
}

// FuzzDecode feeds arbitrary stored bytes to every codec: a wrong length
// must be an error, and any bytes of the right length must decode (and
// dot) without panicking, consistently.
func FuzzDecode(f *testing.F) {
	f.Add(byte(5), byte(1), uint16(64), []byte{0x10, 0x32, 0x54, 0x76, 0xc3, 0x03, 0x00, 0xbc, 0x00, 0x38})
	f.Add(byte(3), byte(3), uint16(3), []byte{0x7f, 0xc0, 0, 0, 0, 0, 0x7f, 61, 0, 0, 0x3c, 0, 0, 0x08, 0x20})
	f.Add(byte(4), byte(2), uint16(3), []byte{0x7f, 0x7f, 0x81, 0x7f, 0x7f, 0x40, 0, 0x3c, 0x08, 0x1c, 0, 0})
	f.Add(byte(1), byte(2), uint16(5), []byte{0xff, 0x7c, 0x00, 0x7e})
	f.Fuzz(func(t *testing.T, db, rb byte, cb uint16, data []byte) {
		d, rows, cols := fuzzShape(db, rb, cb)
		shape := []int{rows, cols}
		nb, err := ExpectedBytes(d, shape)
		if err != nil {
			if _, err := Decode(d, data, shape); err == nil {
				t.Fatalf("%s %v: Decode accepted a shape ExpectedBytes refuses", d, shape)
			}
			return
		}
		if int64(len(data)) != nb {
			if _, err := Decode(d, data, shape); err == nil {
				t.Fatalf("%s %v: Decode accepted %d bytes, need %d", d, shape, len(data), nb)
			}
			if len(data) == 0 {
				return
			}
			buf := make([]byte, nb)
			for i := range buf {
				buf[i] = data[i%len(data)]
			}
			data = buf
		}
		got, err := Decode(d, data, shape)
		if err != nil {
			t.Fatalf("%s %v: %v", d, shape, err)
		}
		rows, cols, _ = Matrix(shape) // a tensor with no columns has no rows either
		c, _ := CodecFor(d)
		x := make([]float32, cols)
		for i := range x {
			x[i] = float32(i%7) - 3
		}
		for r := range rows {
			y := float64(c.DotRow(data, rows, cols, r, x))
			var want, mag float64
			for i, v := range got[r*cols : (r+1)*cols] {
				want += float64(v) * float64(x[i])
				mag += math.Abs(float64(v) * float64(x[i]))
			}
			if math.IsNaN(mag) || math.IsInf(mag, 0) || mag > 1e30 {
				continue
			}
			if math.Abs(y-want) > 1e-4*mag+1e-37 {
				t.Fatalf("%s %v row %d: DotRow %g, decoded dot %g", d, shape, r, y, want)
			}
		}
	})
}

// FuzzEncode feeds arbitrary float32 weights to every encoder: they either
// refuse them with an error or produce bytes that decode to finite values
// (for finite input) without panicking.
func FuzzEncode(f *testing.F) {
	f.Add(byte(5), byte(2), uint16(64), []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0, 0x01, 0, 0, 0})
	f.Add(byte(4), byte(3), uint16(7), []byte{0, 0, 0x80, 0x7f, 0, 0, 0, 0})
	f.Add(byte(3), byte(1), uint16(40), []byte{0xff, 0xff, 0x7f, 0x7f})
	f.Add(byte(5), byte(1), uint16(32), []byte{0x01, 0, 0, 0, 0, 0, 0x80, 0x3f})
	// Magnitudes at the ends of the float32 range (issue 8: q8_2f panicked
	// on values near 3e38; q4tp stored rows near 1e30 as garbage).
	f.Add(byte(4), byte(2), uint16(3), []byte{0xe6, 0xb1, 0x61, 0x7f, 0xf8, 0x2b, 0x5a, 0xff})
	f.Add(byte(4), byte(3), uint16(5), []byte{0xff, 0xff, 0x7f, 0x7f, 0xc2, 0x16, 0x01, 0x00, 0xe6, 0xb1, 0x61, 0xff, 0x00, 0x00, 0x00, 0x3f})
	f.Add(byte(4), byte(2), uint16(4), []byte{0xec, 0x78, 0xad, 0x60, 0x08, 0xe5, 0x3c, 0x9e, 0xec, 0x39, 0x04, 0x1e, 0x01, 0x00, 0x00, 0x00})
	f.Add(byte(5), byte(2), uint16(64), []byte{0xca, 0xf2, 0x49, 0x71, 0xe9, 0xc0, 0x35, 0xf1, 0x60, 0x42, 0xa2, 0x0d, 0x0d, 0xb6, 0xc2, 0x0c})
	f.Add(byte(5), byte(1), uint16(32), []byte{0xee, 0xe3, 0x6c, 0x00, 0xf7, 0x71, 0x36, 0x80, 0xc2, 0x16, 0x01, 0x00})
	f.Add(byte(3), byte(2), uint16(9), []byte{0x01, 0x00, 0x00, 0x00, 0x00, 0x24, 0xf4, 0x4a, 0x95, 0xbf, 0xd6, 0xb3})
	f.Add(byte(2), byte(1), uint16(6), []byte{0x9e, 0xc9, 0x7f, 0x7f, 0xe0, 0x1b, 0x00, 0x00, 0x00, 0x00, 0xc0, 0x7f})
	f.Add(byte(1), byte(1), uint16(6), []byte{0x00, 0xf0, 0x7f, 0x47, 0x77, 0xcc, 0x2b, 0x32, 0x00, 0x00, 0x80, 0xff})
	f.Fuzz(func(t *testing.T, db, rb byte, cb uint16, data []byte) {
		d, rows, cols := fuzzShape(db, rb, cb)
		if d == Q4TP {
			cols = cols / GroupSize * GroupSize
		}
		if len(data) < 4 {
			return
		}
		w := make([]float32, rows*cols)
		finite := true
		for i := range w {
			j := (4 * i) % (len(data) / 4 * 4)
			w[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[j:]))
			finite = finite && !math.IsNaN(float64(w[i])) && !math.IsInf(float64(w[i]), 0)
		}
		shape := []int{rows, cols}
		enc, err := Encode(d, w, shape, nil)
		if err != nil {
			return
		}
		got, err := Decode(d, enc, shape)
		if err != nil {
			t.Fatalf("%s %v: decoding what was encoded: %v", d, shape, err)
		}
		if !finite || d == F32 {
			return
		}
		for i, v := range got {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("%s %v: finite weight %g decodes to %v", d, shape, w[i], v)
			}
		}
		// What encodes decodes close to the input: within the format's
		// error relative to the row's largest magnitude (the tensor's for
		// q8_2f, whose f16 row scales cannot span rows 2^40 apart), plus
		// the floor below which the format stores zeros (issue 8: q4tp
		// rows near 1e30 decoded as nibbles times 1).
		rel, abs := extremeTol(d)
		var tmax float64
		for _, x := range w {
			tmax = max(tmax, math.Abs(float64(x)))
		}
		for o := range rows {
			amax := tmax
			if d != Q82F {
				amax = 0
				for _, x := range w[o*cols : (o+1)*cols] {
					amax = max(amax, math.Abs(float64(x)))
				}
			}
			for i := o * cols; i < (o+1)*cols; i++ {
				if e := math.Abs(float64(got[i]) - float64(w[i])); e > rel*amax+abs {
					t.Fatalf("%s %v: [%d,%d] %g decodes to %g, error %.3g of the max %g", d, shape, o, i-o*cols, w[i], got[i], e/amax, amax)
				}
			}
		}
	})
}
