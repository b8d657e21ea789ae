package quant

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"

	"github.com/cortiq/cortiq/half"
)

// These tests pin the normative byte layouts with hand-built tensors.

func TestLayoutPlain(t *testing.T) {
	w := []float32{1, -2, 0.5}
	cases := []struct {
		d    DType
		want []byte
	}{
		{F32, []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0, 0, 0, 0, 0x3f}},
		{F16, []byte{0, 0x3c, 0, 0xc0, 0, 0x38}},
		{BF16, []byte{0x80, 0x3f, 0, 0xc0, 0, 0x3f}},
	}
	for _, c := range cases {
		if got := mustEncode(t, c.d, w, []int{1, 3}, nil); !bytes.Equal(got, c.want) {
			t.Errorf("%s: % x, want % x", c.d, got, c.want)
		}
	}
}

func TestLayoutQ8Row(t *testing.T) {
	w := []float32{
		127, -63.5, 0, // scale 1: -63.5 rounds away from zero
		0, 0, 0, // zero row: scale 0, q 0
		1, 0.476362, 0, // scale f16(1/127) = 0x2008 rounds down, so 0.476362 gives 61 (60 with the exact scale)
	}
	want := []byte{
		0x7f, 0xc0, 0x00,
		0x00, 0x00, 0x00,
		0x7f, 61, 0x00,
		0x00, 0x3c, 0x00, 0x00, 0x08, 0x20,
	}
	if got := mustEncode(t, Q8Row, w, []int{3, 3}, nil); !bytes.Equal(got, want) {
		t.Errorf("q8_row: % x\nwant    % x", got, want)
	}
	if math.Round(float64(w[7])*127) != 60 {
		t.Fatal("test value no longer tells the rounded scale from the exact one")
	}
}

func TestLayoutQ82F(t *testing.T) {
	w := []float32{
		127, 254, -508, // /col = 127, 127, -127: rs 1
		0.5, 1, 1, // /col = 0.5, 0.5, 0.25: rs f16(0.5/127) = 0x1c08, q 127, 127, 64
	}
	want := []byte{
		0x7f, 0x7f, 0x81,
		0x7f, 0x7f, 0x40,
		0x00, 0x3c, 0x08, 0x1c, // row scales
		0x00, 0x00, // padding to Q82FColOffset = 12
		0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x80, 0x40, // col 1, 2, 4
	}
	got := mustEncode(t, Q82F, w, []int{2, 3}, &EncodeOptions{Col: []float32{1, 2, 4}})
	if !bytes.Equal(got, want) {
		t.Errorf("q8_2f: % x\nwant   % x", got, want)
	}
	if Q82FColOffset(2, 3) != 12 {
		t.Errorf("Q82FColOffset(2, 3) = %d", Q82FColOffset(2, 3))
	}
	c, _ := CodecFor(Q82F)
	// y = rs·Σ q·(x·col): row 1 with x = (1, 1, 1) is rs·(127 + 254 + 256).
	rs := half.F16ToF32(0x1c08)
	if y := c.DotRow(got, 2, 3, 1, []float32{1, 1, 1}); y != rs*637 {
		t.Errorf("q8_2f DotRow = %v, want %v", y, rs*637)
	}
}

// TestLayoutQ4TPDecode decodes a hand-built 1×64 tensor: nibble order
// within the u32 words, the parameter section, and 5-bit codes that
// straddle a byte boundary.
func TestLayoutQ4TPDecode(t *testing.T) {
	src := make([]byte, 0, 38)
	for _, word := range []uint32{0x76543210, 0xfedcba98, 0x88888888, 0x0f0f0f0f} { // group 0
		src = binary.LittleEndian.AppendUint32(src, word)
	}
	src = append(src, bytes.Repeat([]byte{0x99}, 16)...) // group 1: all +1
	src = append(src, 0x00, 0xbc, 0x00, 0x38)            // a = -1, b = 0.5
	src = append(src, 0xc3, 0x03)                        // codes 3 (bits 0-4) and 30 (bits 5-9)
	if nb, _ := ExpectedBytes(Q4TP, []int{1, 64}); int64(len(src)) != nb {
		t.Fatalf("hand-built tensor has %d bytes, ExpectedBytes %d", len(src), nb)
	}
	s0 := float32(math.Sqrt2) // exp2(-1 + 3·0.5)
	want := make([]float32, 64)
	for i := range 16 {
		want[i] = float32(i-8) * s0
	}
	for n := range 8 {
		want[24+n] = []float32{7, -8}[n%2] * s0
	}
	for i := 32; i < 64; i++ {
		want[i] = 16384 // exp2(-1 + 30·0.5)
	}
	got, err := Decode(Q4TP, src, []int{1, 64})
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("weight %d: %v, want %v", i, got[i], want[i])
		}
	}
	c, _ := CodecFor(Q4TP)
	x := ones(64)
	var g0 float32
	for _, v := range want[:32] {
		g0 += v / s0
	}
	if y, w := c.DotRow(src, 1, 64, 0, x), g0*s0+32*16384; y != w {
		t.Errorf("DotRow %v, want %v", y, w)
	}
}

// TestLayoutQ4TPCodes checks the LSB-first 5-bit code packing against an
// independent construction as one little-endian integer.
func TestLayoutQ4TPCodes(t *testing.T) {
	const gpr = 8
	codes := make([]byte, Q4TPCodeStride(gpr*GroupSize))
	if len(codes) != 5 {
		t.Fatalf("Q4TPCodeStride(256) = %d, want 5", len(codes))
	}
	var bits uint64
	for g := range gpr {
		c := (7*g + 3) % 32
		q4tpPutCode(codes, g, c)
		bits |= uint64(c) << (5 * g)
	}
	want := binary.LittleEndian.AppendUint64(nil, bits)[:5]
	if !bytes.Equal(codes, want) {
		t.Fatalf("codes % x, want % x", codes, want)
	}
	for g := range gpr {
		if c := q4tpCode(codes, g); c != (7*g+3)%32 {
			t.Fatalf("group %d reads code %d", g, c)
		}
	}
	if Q4TPCodeStride(32) != 1 || Q4TPCodeStride(96) != 2 || Q4TPCodeStride(4096) != 80 {
		t.Fatal("Q4TPCodeStride")
	}
}

// TestLayoutQ4TPEncode encodes rows that are exactly representable: the
// encoder must find a rung at the row's scale and produce known nibbles, in
// the documented places.
func TestLayoutQ4TPEncode(t *testing.T) {
	w := make([]float32, 64)
	for i := range 32 {
		v := float32(i - 8)
		if i >= 16 {
			v = float32(7 - (i - 16))
		}
		w[i] = v * 0.25
		w[32+i] = v * 0.5 // row 1: twice row 0
	}
	enc := mustEncode(t, Q4TP, w, []int{2, 32}, nil)
	if len(enc) != 2*16+2*4+2*1 {
		t.Fatalf("2×32 q4tp has %d bytes", len(enc))
	}
	nib := []byte{0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe, 0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01}
	for r, scale := range []float32{0.25, 0.5} {
		if got := enc[16*r : 16*r+16]; !bytes.Equal(got, nib) {
			t.Errorf("row %d nibbles % x, want % x", r, got, nib)
		}
		var lad [q4tpRungs]float32
		q4tpLadder(&lad, binary.LittleEndian.Uint16(enc[32+4*r:]), binary.LittleEndian.Uint16(enc[34+4*r:]))
		code := enc[40+r] & 31
		if enc[40+r]>>5 != 0 {
			t.Errorf("row %d: bits above the only code are set: %#x", r, enc[40+r])
		}
		if s := lad[code]; math.Abs(float64(s/scale)-1) > 0.01 {
			t.Errorf("row %d: rung %d = %v, want about %v", r, code, s, scale)
		}
	}
}
