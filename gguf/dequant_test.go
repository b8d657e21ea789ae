package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/half"
)

// This file checks the dequantizers three ways: against a per-element
// restatement of each block layout (written element-first, unlike the
// block loops in dequant.go), against hand-computed blocks, and by
// quantize→dequantize error bounds.

func f16(b []byte) float64 { return float64(half.F16ToF32(binary.LittleEndian.Uint16(b))) }

// elem returns element k of one block of type t, evaluated in float64,
// together with the magnitude of the terms summed (for the tolerance).
func elem(t Type, blk []byte, k int) (v, mag float64) {
	nib := func(b byte, high bool) int {
		if high {
			return int(b >> 4)
		}
		return int(b & 15)
	}
	// 6-bit scale/min pairs of Q4_K and Q5_K, as the format describes them.
	k4 := func(p []byte, j int) (sc, m int) {
		if j < 4 {
			return int(p[j] & 63), int(p[j+4] & 63)
		}
		return int(p[j+4]&15) | int(p[j-4]>>6)<<4, int(p[j+4]>>4) | int(p[j]>>6)<<4
	}
	switch t {
	case TypeF32:
		v = float64(math.Float32frombits(binary.LittleEndian.Uint32(blk)))
	case TypeF16:
		v = f16(blk)
	case TypeBF16:
		v = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(blk)) << 16))
	case TypeF64:
		v = float64(float32(math.Float64frombits(binary.LittleEndian.Uint64(blk))))
	case TypeQ4_0:
		v = f16(blk) * float64(nib(blk[2+k%16], k >= 16)-8)
	case TypeQ4_1:
		v = f16(blk)*float64(nib(blk[4+k%16], k >= 16)) + f16(blk[2:])
		mag = math.Abs(f16(blk[2:]))
	case TypeQ5_0:
		qh := binary.LittleEndian.Uint32(blk[2:])
		q := nib(blk[6+k%16], k >= 16) | int(qh>>k&1)<<4
		v = f16(blk) * float64(q-16)
	case TypeQ5_1:
		qh := binary.LittleEndian.Uint32(blk[4:])
		q := nib(blk[8+k%16], k >= 16) | int(qh>>k&1)<<4
		v = f16(blk)*float64(q) + f16(blk[2:])
		mag = math.Abs(f16(blk[2:]))
	case TypeQ8_0:
		v = f16(blk) * float64(int8(blk[2+k]))
	case TypeQ2_K:
		// k = 128h + 32s + r: bits 2s of qs[32h + r]; scale byte k/16.
		h, s, r := k/128, k%128/32, k%32
		q := int(blk[16+32*h+r]>>(2*s)) & 3
		sc := blk[k/16]
		a := f16(blk[80:]) * float64(sc&15) * float64(q)
		m := f16(blk[82:]) * float64(sc>>4)
		v, mag = a-m, math.Abs(m)
	case TypeQ3_K:
		j := k / 16
		p := blk[96:108]
		lo := p[j%8]
		if j >= 8 {
			lo >>= 4
		}
		sc := int(lo&15|(p[8+j%4]>>(2*(j/4))&3)<<4) - 32
		h, s, r := k/128, k%128/32, k%32
		q := int(blk[32+32*h+r]>>(2*s)) & 3
		if blk[k%32]>>(k/32)&1 == 0 {
			q -= 4
		}
		v = f16(blk[108:]) * float64(sc) * float64(q)
	case TypeQ4_K:
		sc, m := k4(blk[4:16], k/32)
		q := nib(blk[16+32*(k/64)+k%32], k/32%2 == 1)
		a := f16(blk) * float64(sc) * float64(q)
		mm := f16(blk[2:]) * float64(m)
		v, mag = a-mm, math.Abs(mm)
	case TypeQ5_K:
		sc, m := k4(blk[4:16], k/32)
		q := nib(blk[48+32*(k/64)+k%32], k/32%2 == 1) | int(blk[16+k%32]>>(k/32)&1)<<4
		a := f16(blk) * float64(sc) * float64(q)
		mm := f16(blk[2:]) * float64(m)
		v, mag = a-mm, math.Abs(mm)
	case TypeQ6_K:
		// k = 128h + 32c + r: low nibble (c < 2) or high nibble of
		// ql[64h + 32(c%2) + r], high bits 2c of qh[32h + r], scale k/16.
		h, c, r := k/128, k%128/32, k%32
		q := nib(blk[64*h+32*(c%2)+r], c >= 2) | int(blk[128+32*h+r]>>(2*c)&3)<<4
		v = f16(blk[208:]) * float64(int8(blk[192+k/16])) * float64(q-32)
	case TypeQ8_K:
		v = float64(math.Float32frombits(binary.LittleEndian.Uint32(blk))) * float64(int8(blk[4+k]))
	case TypeIQ4_NL:
		v = f16(blk) * float64(iq4nlValues[nib(blk[2+k%16], k >= 16)])
	case TypeIQ4_XS:
		j := k / 32
		ls := int(blk[4+j/2]>>(4*(j%2))&15) | int(binary.LittleEndian.Uint16(blk[2:])>>(2*j)&3)<<4
		r := k % 32
		v = f16(blk) * float64(ls-32) * float64(iq4nlValues[nib(blk[8+16*j+r%16], r >= 16)])
	case TypeMXFP4:
		d := math.Ldexp(1, int(blk[0])-128)
		v = d * float64(mxfp4Values[nib(blk[1+k%16], k >= 16)])
	default:
		panic(fmt.Sprintf("no element formula for %s", t))
	}
	return v, mag + math.Abs(v)
}

// scaleFields lists the byte offsets of f16 scales in a block (f32 for Q8_K).
var scaleFields = map[Type][]int{
	TypeQ4_0: {0}, TypeQ4_1: {0, 2}, TypeQ5_0: {0}, TypeQ5_1: {0, 2}, TypeQ8_0: {0},
	TypeQ2_K: {80, 82}, TypeQ3_K: {108}, TypeQ4_K: {0, 2}, TypeQ5_K: {0, 2}, TypeQ6_K: {208},
	TypeIQ4_NL: {0}, TypeIQ4_XS: {0},
}

// randomBlocks returns n random blocks of t whose scales are finite.
func randomBlocks(r *rand.Rand, t Type, n int) []byte {
	b := make([]byte, n*t.TypeSize())
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	for i := range n {
		blk := b[i*t.TypeSize():]
		for _, off := range scaleFields[t] {
			binary.LittleEndian.PutUint16(blk[off:], half.F32ToF16(float32(r.NormFloat64())))
		}
		switch t {
		case TypeQ8_K:
			binary.LittleEndian.PutUint32(blk, math.Float32bits(float32(r.NormFloat64())))
		case TypeMXFP4:
			blk[0] = byte(100 + r.IntN(56))
		case TypeF32:
			binary.LittleEndian.PutUint32(blk, math.Float32bits(float32(r.NormFloat64())))
		case TypeF16, TypeBF16:
			binary.LittleEndian.PutUint16(blk, half.F32ToBF16(float32(r.NormFloat64()))&0xbfff)
		case TypeF64:
			binary.LittleEndian.PutUint64(blk, math.Float64bits(r.NormFloat64()))
		}
	}
	return b
}

func TestDequantMatchesElementFormula(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for typ := range dequantizers {
		t.Run(typ.String(), func(t *testing.T) {
			const nBlocks = 40
			src := randomBlocks(r, typ, nBlocks)
			bs := typ.BlockSize()
			dst := make([]float32, nBlocks*bs)
			if err := Dequantize(typ, src, dst); err != nil {
				t.Fatal(err)
			}
			for i := range dst {
				blk := src[i/bs*typ.TypeSize():]
				want, mag := elem(typ, blk, i%bs)
				if math.Abs(float64(dst[i])-want) > 1e-6*mag+1e-30 {
					t.Fatalf("element %d (block %d, index %d) = %v, want %v", i, i/bs, i%bs, dst[i], want)
				}
			}
		})
	}
}

func TestDequantF32FastMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, n := range []int{0, 1, 5, 1024} {
		src := make([]byte, 4*n)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		a, b := make([]float32, n), make([]float32, n)
		dequantF32(a, src)
		dequantF32Ref(b, src)
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				t.Fatalf("n=%d [%d]: %#x vs %#x", n, i, math.Float32bits(a[i]), math.Float32bits(b[i]))
			}
		}
	}
}

// TestScaleMinK4 checks that the Q4_K/Q5_K scale packing (transcribed from
// ggml's quantizer) and unpacking (from its dequantizer) are inverses over
// every 6-bit value in every slot.
func TestScaleMinK4(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	var p [12]byte
	ls, lm := make([]int, 8), make([]int, 8)
	for range 2000 {
		for j := range 8 {
			ls[j], lm[j] = r.IntN(64), r.IntN(64)
		}
		packScaleMinK4(p[:], ls, lm)
		for j := range 8 {
			if sc, m := scaleMinK4(j, p[:]); int(sc) != ls[j] || int(m) != lm[j] {
				t.Fatalf("slot %d: packed (%d, %d), unpacked (%d, %d)", j, ls[j], lm[j], sc, m)
			}
		}
	}
	// The same for Q3_K's sixteen offset scales via the quantizer's packing.
	for range 500 {
		x := randFloats(r, qkK)
		for j := range 16 { // vary sub-block magnitudes widely
			s := float32(math.Exp(r.NormFloat64() * 2))
			for l := range 16 {
				x[16*j+l] *= s
			}
		}
		b, _ := Quantize(TypeQ3_K, x)
		got := q3Scales(b[96:108])
		for j := range 16 {
			if got[j] < -32 || got[j] > 31 {
				t.Fatalf("scale %d = %d", j, got[j])
			}
		}
	}
}

func hexBlock(t *testing.T, typ Type, set func(b []byte)) []float32 {
	t.Helper()
	b := make([]byte, typ.TypeSize())
	set(b)
	out := make([]float32, typ.BlockSize())
	if err := Dequantize(typ, b, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func le16(b []byte, v uint16) { binary.LittleEndian.PutUint16(b, v) }

// TestHandChecked decodes hand-built blocks whose values were worked out
// on paper from the ggml block layouts.
func TestHandChecked(t *testing.T) {
	expect := func(name string, got []float32, want map[int]float32) {
		t.Helper()
		for k, w := range want {
			if got[k] != w {
				t.Errorf("%s[%d] = %v, want %v", name, k, got[k], w)
			}
		}
	}

	// Q4_0, d = 0.25: qs[3] = 0xA1 → x3 = (1−8)/4, x19 = (10−8)/4.
	expect("Q4_0", hexBlock(t, TypeQ4_0, func(b []byte) { le16(b, 0x3400); b[2+3] = 0xA1 }),
		map[int]float32{3: -1.75, 19: 0.5, 0: -2})

	// Q5_0, d = 1: qs[3] = 0x2F, qh bit 3 set, bit 19 clear → x3 = 31−16, x19 = 2−16.
	expect("Q5_0", hexBlock(t, TypeQ5_0, func(b []byte) {
		le16(b, 0x3c00)
		binary.LittleEndian.PutUint32(b[2:], 1<<3)
		b[6+3] = 0x2F
	}), map[int]float32{3: 15, 19: -14, 0: -16})

	// Q8_0, d = 0.5: qs[5] = −2.
	expect("Q8_0", hexBlock(t, TypeQ8_0, func(b []byte) { le16(b, 0x3800); b[2+5] = 0xFE }),
		map[int]float32{5: -1, 6: 0})

	// Q4_K, d = 1, dmin = 0.5. Sub-block 0: sc 1, m 2; sub-block 1: sc 3,
	// m 4; sub-block 5: sc 37 = 0b10_0101, m 50 = 0b11_0010, whose low
	// nibbles go to byte 9 and top bits to bytes 1 and 5.
	expect("Q4_K", hexBlock(t, TypeQ4_K, func(b []byte) {
		le16(b, 0x3c00)
		le16(b[2:], 0x3800)
		s := b[4:16]
		s[0], s[4] = 1, 2
		s[1], s[5] = 0x80|3, 0xC0|4
		s[9] = 5 | 2<<4
		q := b[16:]
		q[0] = 0x0F  // x0 = 1·1·15 − 0.5·2 = 14; x32 = 3·0 − 0.5·4 = −2
		q[67] = 0x70 // x131 (sub-block 4: sc 0, m 0) = 0; x163 = 37·7 − 0.5·50 = 234
	}), map[int]float32{0: 14, 32: -2, 131: 0, 163: 234, 1: -1})

	// Q6_K, d = 0.5, scale[10] = −3, scale[14] = 1. x170 (half 1, quarter 1,
	// row 10) takes the low nibble of ql[106] and bits 2-3 of qh[42]:
	// q = 13 | 2<<4 = 45 → 0.5·(−3)·(45−32). x234 (quarter 3) takes the high
	// nibble of ql[106] and bits 6-7 of qh[42], both 0 → 0.5·1·(−32).
	expect("Q6_K", hexBlock(t, TypeQ6_K, func(b []byte) {
		b[106] = 0x0D
		b[128+42] = 0x08
		b[192+10] = 0xFD
		b[192+14] = 1
		le16(b[208:], 0x3800)
	}), map[int]float32{170: -19.5, 234: -16, 0: 0})

	// Q3_K, d = 2. Scale 9 = 27 − 32 = −5: low nibble 11 in the high half of
	// byte 1, top bits 01 at bits 4-5 of byte 9. x150 (half 1, shift 0,
	// row 22): low bits qs[54] = 1, hmask[22] bit 4 clear → q = 1 − 4;
	// x151: hmask[23] bit 4 set → q = 0. x0: scale 0 − 32, q = 0 − 4.
	expect("Q3_K", hexBlock(t, TypeQ3_K, func(b []byte) {
		b[23] = 0x10
		b[32+54] = 0x01
		b[96+1] = 0xB0
		b[96+9] = 0x10
		le16(b[108:], 0x4000)
	}), map[int]float32{150: 30, 151: 0, 0: 256})

	// Q2_K, d = 1, dmin = 0.25: scales[9] = 3 | 4<<4. x150 = 128 + 16 + 6
	// (half 1, shift 0, second 16) takes bits 0-1 of qs[32+22] = 2
	// → 1·3·2 − 0.25·4.
	expect("Q2_K", hexBlock(t, TypeQ2_K, func(b []byte) {
		b[9] = 3 | 4<<4
		b[16+54] = 0x02
		le16(b[80:], 0x3c00)
		le16(b[82:], 0x3400)
	}), map[int]float32{150: 5, 151: -1, 0: 0})

	// MXFP4 with e = 128 (scale 1): qs[0] = 0xF7 → x0 = 12, x16 = −12.
	expect("MXFP4", hexBlock(t, TypeMXFP4, func(b []byte) { b[0] = 128; b[1] = 0xF7 }),
		map[int]float32{0: 12, 16: -12, 1: 0})
	if e8m0Half(1) != float32(math.Ldexp(1, -127)) || e8m0Half(0) != float32(math.Ldexp(1, -128)) || e8m0Half(200) != float32(math.Ldexp(1, 72)) {
		t.Error("e8m0Half")
	}

	// IQ4_NL, d = 1: qs[0] = 0x80 → x0 = −127, x16 = 1.
	expect("IQ4_NL", hexBlock(t, TypeIQ4_NL, func(b []byte) { le16(b, 0x3c00); b[2] = 0x80 }),
		map[int]float32{0: -127, 16: 1})

	// ggml's Q4_0 reference quantizer on x[j] = j − 10: max = 21, d = −21/8;
	// x0 → int(−10/d + 8.5) = 12 → (12−8)·d = −10.5; x31 → 0 → 21.
	x := make([]float32, 32)
	for j := range x {
		x[j] = float32(j - 10)
	}
	q, _ := Quantize(TypeQ4_0, x)
	y := make([]float32, 32)
	_ = Dequantize(TypeQ4_0, q, y)
	if y[0] != -10.5 || y[31] != 21 || y[10] != 0 {
		t.Errorf("Q4_0 of j−10: %v", y)
	}
	q, _ = Quantize(TypeQ8_0, x)
	_ = Dequantize(TypeQ8_0, q, y)
	if d := half.RoundF16(21.0 / 127); y[31] != 127*d || y[0] != -60*d {
		t.Errorf("Q8_0 of j−10: %v", y)
	}
}

// TestQuantizeRoundTrip bounds the error of quantize→dequantize for every
// quantizable type, per super-block, relative to its largest magnitude.
func TestQuantizeRoundTrip(t *testing.T) {
	// Worst-case error as a fraction of the block's max |x| (see the
	// quantizer comments), with room for f16 rounding of scales.
	bounds := map[Type]float64{
		TypeF32: 0, TypeF16: 1.0 / 1024, TypeBF16: 1.0 / 128,
		TypeQ8_0: 0.5/127 + 1e-3, TypeQ8_K: 0.5/127 + 1e-6,
		TypeQ4_0: 1.0/8 + 1e-3, TypeQ4_1: 1.0/15 + 1e-3,
		TypeQ5_0: 1.0/16 + 1e-3, TypeQ5_1: 1.0/31 + 1e-3,
		TypeQ2_K: 0.38, TypeQ3_K: 0.28, TypeQ4_K: 0.075, TypeQ5_K: 0.036, TypeQ6_K: 1.02 / 32,
	}
	// RMS error relative to the data's RMS on this data (measured, plus
	// about 25%).
	rms := map[Type]float64{
		TypeF32: 0, TypeF16: 3e-4, TypeBF16: 2.5e-3,
		TypeQ8_0: 0.012, TypeQ8_K: 0.03, TypeQ4_0: 0.16, TypeQ4_1: 0.12, TypeQ5_0: 0.085, TypeQ5_1: 0.06,
		TypeQ2_K: 0.45, TypeQ3_K: 0.2, TypeQ4_K: 0.12, TypeQ5_K: 0.06, TypeQ6_K: 0.035,
	}
	r := rand.New(rand.NewPCG(17, 18))
	for typ := range quantizers {
		t.Run(typ.String(), func(t *testing.T) {
			const n = 64 * 256
			x := randFloats(r, n)
			for i := range 40 { // outliers and constant runs
				x[r.IntN(n)] *= 20
				x[256*i+r.IntN(200)] = 0
			}
			copy(x[512:768], make([]float32, 256)) // an all-zero super-block
			for i := 768; i < 1024; i++ {
				x[i] = 3 // a constant positive one
			}
			for i := 1024; i < 1280; i++ {
				x[i] = float32(i-1024) * 1e-3 // a small positive ramp
			}
			q, err := Quantize(typ, x)
			if err != nil {
				t.Fatal(err)
			}
			y := make([]float32, n)
			if err := Dequantize(typ, q, y); err != nil {
				t.Fatal(err)
			}
			var se, sx float64
			for b := 0; b < n; b += 256 {
				amax := 0.0
				for _, v := range x[b : b+256] {
					amax = max(amax, math.Abs(float64(v)))
				}
				for i := b; i < b+256; i++ {
					e := math.Abs(float64(y[i] - x[i]))
					if e > bounds[typ]*amax+1e-7 {
						t.Fatalf("element %d: %v → %v, error %.3g > %.3g·%.3g", i, x[i], y[i], e, bounds[typ], amax)
					}
					se += e * e
					sx += float64(x[i]) * float64(x[i])
				}
			}
			if rel := math.Sqrt(se / sx); rel > rms[typ] {
				t.Fatalf("relative RMS error %.4f > %.4f", rel, rms[typ])
			} else {
				t.Logf("relative RMS error %.4f", rel)
			}
			for i := 512; i < 768; i++ {
				if y[i] != 0 {
					t.Fatalf("zero block decodes to %v at %d", y[i], i)
				}
			}
		})
	}
}

// TestQ4KNoClipping checks the Q4_K quantizer's promise: every value is
// within half a step of its sub-block (nothing clipped).
func TestQ4KNoClipping(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 20))
	x := randFloats(r, 32*256)
	for i := range x {
		x[i] = x[i]*float32(1+i%7) + float32(i%5) // shifted, mixed-scale sub-blocks
	}
	q, _ := Quantize(TypeQ4_K, x)
	y := make([]float32, len(x))
	_ = Dequantize(TypeQ4_K, q, y)
	for i := range x {
		blk := q[i/256*144:]
		sc, _ := scaleMinK4(i%256/32, blk[4:16])
		step := float64(half.F16ToF32(binary.LittleEndian.Uint16(blk))) * float64(sc)
		if e := math.Abs(float64(x[i] - y[i])); e > step/2*(1+1e-5)+1e-6 {
			t.Fatalf("element %d: error %v > half step %v", i, e, step/2)
		}
	}
}

func TestDequantizeErrors(t *testing.T) {
	err := Dequantize(TypeIQ2_XXS, make([]byte, 66), make([]float32, 256))
	if !errors.Is(err, ErrUnsupportedType) || !strings.Contains(err.Error(), "IQ2_XXS") {
		t.Fatalf("IQ2_XXS: %v", err)
	}
	if err := Dequantize(Type(99), nil, nil); !errors.Is(err, ErrUnsupportedType) || !strings.Contains(err.Error(), "type(99)") {
		t.Fatalf("type 99: %v", err)
	}
	if err := Dequantize(TypeQ4_K, make([]byte, 144), make([]float32, 128)); err == nil {
		t.Fatal("partial block accepted")
	}
	if err := Dequantize(TypeQ4_K, make([]byte, 143), make([]float32, 256)); err == nil {
		t.Fatal("short data accepted")
	}
	if _, err := Quantize(TypeQ8_0, make([]float32, 33)); err == nil {
		t.Fatal("partial block quantized")
	}
	if _, err := Quantize(TypeIQ4_NL, make([]float32, 32)); !errors.Is(err, ErrUnsupportedType) {
		t.Fatalf("IQ4_NL quantize: %v", err)
	}
}

func TestTypeTable(t *testing.T) {
	// Block sizes and byte sizes from ggml's type traits.
	want := map[Type][2]int{
		TypeF32: {1, 4}, TypeF16: {1, 2}, TypeBF16: {1, 2}, TypeQ4_0: {32, 18}, TypeQ4_1: {32, 20},
		TypeQ5_0: {32, 22}, TypeQ5_1: {32, 24}, TypeQ8_0: {32, 34}, TypeQ2_K: {256, 84}, TypeQ3_K: {256, 110},
		TypeQ4_K: {256, 144}, TypeQ5_K: {256, 176}, TypeQ6_K: {256, 210}, TypeQ8_K: {256, 292},
		TypeIQ4_NL: {32, 18}, TypeIQ4_XS: {256, 136}, TypeMXFP4: {32, 17}, TypeIQ2_XXS: {256, 66},
	}
	for typ, w := range want {
		if typ.BlockSize() != w[0] || typ.TypeSize() != w[1] {
			t.Errorf("%s: block %d size %d, want %v", typ, typ.BlockSize(), typ.TypeSize(), w)
		}
		if p, err := ParseType(typ.String()); err != nil || p != typ {
			t.Errorf("ParseType(%s) = %v, %v", typ, p, err)
		}
	}
	if _, err := ParseType("Q9_K"); err == nil {
		t.Error("ParseType(Q9_K)")
	}
	if n, err := TypeQ4_K.RowSize(512); err != nil || n != 288 {
		t.Errorf("RowSize = %d, %v", n, err)
	}
	if FileTypeName(15) != "MOSTLY_Q4_K_M" || FileTypeName(99) != "file_type(99)" {
		t.Error("FileTypeName")
	}
	supported := []Type{}
	for typ := range dequantizers {
		supported = append(supported, typ)
	}
	slices.Sort(supported)
	t.Logf("dequantizable: %v", supported)
}
