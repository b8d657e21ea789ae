package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/cortiq/cortiq/half"
)

// A dequantizer expands whole blocks: len(dst) is a multiple of the block
// size and len(src) the matching number of bytes.
type dequantizer func(dst []float32, src []byte)

var dequantizers = map[Type]dequantizer{
	TypeF32:    dequantF32,
	TypeF16:    dequantF16,
	TypeBF16:   dequantBF16,
	TypeF64:    dequantF64,
	TypeQ4_0:   dequantQ4_0,
	TypeQ4_1:   dequantQ4_1,
	TypeQ5_0:   dequantQ5_0,
	TypeQ5_1:   dequantQ5_1,
	TypeQ8_0:   dequantQ8_0,
	TypeQ2_K:   dequantQ2K,
	TypeQ3_K:   dequantQ3K,
	TypeQ4_K:   dequantQ4K,
	TypeQ5_K:   dequantQ5K,
	TypeQ6_K:   dequantQ6K,
	TypeQ8_K:   dequantQ8K,
	TypeIQ4_NL: dequantIQ4NL,
	TypeIQ4_XS: dequantIQ4XS,
	TypeMXFP4:  dequantMXFP4,
}

// Dequantize expands the raw data of len(dst) elements of type t into dst.
// len(dst) must be a whole number of blocks and src exactly their size.
func Dequantize(t Type, src []byte, dst []float32) error {
	dq, ok := dequantizers[t]
	if !ok {
		return fmt.Errorf("%w: cannot dequantize %s", ErrUnsupportedType, t)
	}
	want, err := t.RowSize(int64(len(dst)))
	if err != nil {
		return err
	}
	if int64(len(src)) != want {
		return fmt.Errorf("gguf: %d %s elements need %d bytes, got %d", len(dst), t, want, len(src))
	}
	dq(dst, src)
	return nil
}

func f16At(b []byte) float32 { return half.F16ToF32(binary.LittleEndian.Uint16(b)) }

// littleEndian reports whether float32s in memory have the file's byte
// order, which lets F32 data decode with one copy.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

func dequantF32(dst []float32, src []byte) {
	if littleEndian && len(dst) > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), src)
		return
	}
	dequantF32Ref(dst, src)
}

// dequantF32Ref is the portable reference for dequantF32.
func dequantF32Ref(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

func dequantF16(dst []float32, src []byte) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = half.F16ToF32(uint16(src[2*i]) | uint16(src[2*i+1])<<8)
	}
}

func dequantBF16(dst []float32, src []byte) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits((uint32(src[2*i]) | uint32(src[2*i+1])<<8) << 16)
	}
}

func dequantF64(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:])))
	}
}

// Legacy 32-element blocks. In all of them byte j of qs holds element j in
// its low nibble and element j+16 in its high nibble.

// Q4_0: f16 d, qs[16]; x = d·(q−8).
func dequantQ4_0(dst []float32, src []byte) {
	for i := range len(dst) / 32 {
		b := src[i*18 : i*18+18]
		d := f16At(b)
		qs := b[2:18]
		y := dst[i*32 : i*32+32]
		for j, q := range qs {
			y[j] = float32(int(q&0xf)-8) * d
			y[j+16] = float32(int(q>>4)-8) * d
		}
	}
}

// Q4_1: f16 d, f16 m, qs[16]; x = d·q + m.
func dequantQ4_1(dst []float32, src []byte) {
	for i := range len(dst) / 32 {
		b := src[i*20 : i*20+20]
		d, m := f16At(b), f16At(b[2:])
		qs := b[4:20]
		y := dst[i*32 : i*32+32]
		for j, q := range qs {
			y[j] = float32(q&0xf)*d + m
			y[j+16] = float32(q>>4)*d + m
		}
	}
}

// Q5_0: f16 d, u32 qh (bit j = fifth bit of element j), qs[16]; x = d·(q−16).
func dequantQ5_0(dst []float32, src []byte) {
	for i := range len(dst) / 32 {
		b := src[i*22 : i*22+22]
		d := f16At(b)
		qh := binary.LittleEndian.Uint32(b[2:])
		qs := b[6:22]
		y := dst[i*32 : i*32+32]
		for j, q := range qs {
			lo := int(q&0xf) | int(qh>>j&1)<<4
			hi := int(q>>4) | int(qh>>(j+16)&1)<<4
			y[j] = float32(lo-16) * d
			y[j+16] = float32(hi-16) * d
		}
	}
}

// Q5_1: f16 d, f16 m, u32 qh, qs[16]; x = d·q + m.
func dequantQ5_1(dst []float32, src []byte) {
	for i := range len(dst) / 32 {
		b := src[i*24 : i*24+24]
		d, m := f16At(b), f16At(b[2:])
		qh := binary.LittleEndian.Uint32(b[4:])
		qs := b[8:24]
		y := dst[i*32 : i*32+32]
		for j, q := range qs {
			lo := uint32(q&0xf) | (qh>>j&1)<<4
			hi := uint32(q>>4) | (qh>>(j+16)&1)<<4
			y[j] = float32(lo)*d + m
			y[j+16] = float32(hi)*d + m
		}
	}
}

// Q8_0: f16 d, int8 qs[32]; x = d·q.
func dequantQ8_0(dst []float32, src []byte) {
	for i := range len(dst) / 32 {
		b := src[i*34 : i*34+34]
		d := f16At(b)
		y := dst[i*32 : i*32+32]
		for j, q := range b[2:34] {
			y[j] = float32(int8(q)) * d
		}
	}
}

// K-quants: super-blocks of 256 elements.

// scaleMinK4 unpacks the 6-bit scale and min of sub-block j (0..7) from the
// 12 packed bytes of a Q4_K/Q5_K block: sub-blocks 0-3 keep their low six
// bits in bytes j (scale) and j+4 (min); sub-blocks 4-7 keep their low four
// bits in the nibbles of byte j+4 and their top two bits in the spare top
// bits of bytes j-4 (scale) and j (min).
func scaleMinK4(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xf | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

// Q2_K: scales[16] (low nibble scale, high nibble min, per 16 elements),
// qs[64] (2-bit), f16 d, f16 dmin; x = d·sc·q − dmin·m.
func dequantQ2K(dst []float32, src []byte) {
	for i := range len(dst) / qkK {
		b := src[i*84 : i*84+84]
		scales, qs := b[0:16], b[16:80]
		d, dmin := f16At(b[80:]), f16At(b[82:])
		y := dst[i*qkK : i*qkK+qkK]
		// Element 128h + 32s + l (l < 32) is bits 2s..2s+1 of qs[32h+l];
		// its scale is scales[8h + 2s + l/16].
		for h := range 2 {
			q := qs[32*h : 32*h+32]
			for s := range 4 {
				shift := uint(2 * s)
				for half := range 2 {
					sc := scales[8*h+2*s+half]
					dl, ml := d*float32(sc&0xf), dmin*float32(sc>>4)
					out := y[128*h+32*s+16*half:]
					for l := range 16 {
						out[l] = dl*float32(q[16*half+l]>>shift&3) - ml
					}
				}
			}
		}
	}
}

// q3Scales unpacks the sixteen 6-bit Q3_K scales (stored offset by 32) from
// their 12 packed bytes: scale j has its low four bits in byte j%8 (low
// nibble for j < 8, high nibble otherwise) and its top two bits in bits
// 2(j/4)..2(j/4)+1 of byte 8 + j%4.
func q3Scales(p []byte) [16]int8 {
	var s [16]int8
	for j := range 16 {
		lo := p[j%8]
		if j >= 8 {
			lo >>= 4
		}
		hi := p[8+j%4] >> (2 * (j / 4)) & 3
		s[j] = int8(lo&0xf|hi<<4) - 32
	}
	return s
}

// Q3_K: hmask[32], qs[64] (low 2 bits), scales[12], f16 d. The third bit
// of element 128h + 32s + l is bit 4h+s of hmask[l]; when it is clear the
// value is lowered by 4. x = d·sc·(q − 4·!hbit).
func dequantQ3K(dst []float32, src []byte) {
	for i := range len(dst) / qkK {
		b := src[i*110 : i*110+110]
		hmask, qs := b[0:32], b[32:96]
		sc := q3Scales(b[96:108])
		d := f16At(b[108:])
		y := dst[i*qkK : i*qkK+qkK]
		for h := range 2 {
			q := qs[32*h : 32*h+32]
			for s := range 4 {
				shift := uint(2 * s)
				m := byte(1) << (4*h + s)
				for half := range 2 {
					dl := d * float32(sc[8*h+2*s+half])
					out := y[128*h+32*s+16*half:]
					for l := range 16 {
						k := 16*half + l
						v := int(q[k] >> shift & 3)
						if hmask[k]&m == 0 {
							v -= 4
						}
						out[l] = dl * float32(v)
					}
				}
			}
		}
	}
}

// Q4_K: f16 d, f16 dmin, scales[12] (eight 6-bit scale/min pairs), qs[128].
// Element 64p + l is the low nibble of qs[32p + l] (sub-block 2p) and
// element 64p + 32 + l the high nibble (sub-block 2p+1);
// x = d·sc·q − dmin·m.
func dequantQ4K(dst []float32, src []byte) {
	for i := range len(dst) / qkK {
		b := src[i*144 : i*144+144]
		d, dmin := f16At(b), f16At(b[2:])
		scales, qs := b[4:16], b[16:144]
		y := dst[i*qkK : i*qkK+qkK]
		for p := range 4 {
			sc1, m1 := scaleMinK4(2*p, scales)
			sc2, m2 := scaleMinK4(2*p+1, scales)
			d1, mm1 := d*float32(sc1), dmin*float32(m1)
			d2, mm2 := d*float32(sc2), dmin*float32(m2)
			q := qs[32*p : 32*p+32]
			out := y[64*p : 64*p+64]
			for l, v := range q {
				out[l] = d1*float32(v&0xf) - mm1
				out[32+l] = d2*float32(v>>4) - mm2
			}
		}
	}
}

// Q5_K: as Q4_K plus qh[32]: the fifth bit of element 64p + l is bit 2p of
// qh[l], and of element 64p + 32 + l bit 2p+1.
func dequantQ5K(dst []float32, src []byte) {
	for i := range len(dst) / qkK {
		b := (*[176]byte)(src[i*176:])
		d, dmin := f16At(b[0:]), f16At(b[2:])
		scales, qh := b[4:16], (*[32]byte)(b[16:48])
		y := dst[i*qkK : i*qkK+qkK]
		for p := range 4 {
			sc1, m1 := scaleMinK4(2*p, scales)
			sc2, m2 := scaleMinK4(2*p+1, scales)
			d1, mm1 := d*float32(sc1), dmin*float32(m1)
			d2, mm2 := d*float32(sc2), dmin*float32(m2)
			q := (*[32]byte)(b[48+32*p:])
			out := (*[64]float32)(y[64*p:])
			shift := uint(2 * p)
			for l := range 32 {
				v, hb := q[l], qh[l]>>shift
				out[l] = d1*float32(v&0xf|(hb&1)<<4) - mm1
				out[32+l] = d2*float32(v>>4|(hb>>1&1)<<4) - mm2
			}
		}
	}
}

// Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], f16 d.
// In each half h (128 elements), for l < 32: elements l and l+64 take the
// low and high nibble of ql[64h+l], elements l+32 and l+96 those of
// ql[64h+32+l]; their high bits are bit pairs 0, 4, 2, 6 of qh[32h+l].
// Each 16 elements share a scale; x = d·sc·(q − 32).
func dequantQ6K(dst []float32, src []byte) {
	var ds [16]float32
	for i := range len(dst) / qkK {
		b := (*[210]byte)(src[i*210:])
		d := f16At(b[208:])
		for j := range ds {
			ds[j] = d * float32(int8(b[192+j]))
		}
		y := dst[i*qkK : i*qkK+qkK]
		for h := range 2 {
			l4 := (*[64]byte)(b[64*h:])
			h2 := (*[32]byte)(b[128+32*h:])
			out := (*[128]float32)(y[128*h:])
			for is := range 2 { // rows l < 16 and l ≥ 16 use different scales
				s0, s1, s2, s3 := ds[8*h+is], ds[8*h+is+2], ds[8*h+is+4], ds[8*h+is+6]
				for l := 16 * is; l < 16*is+16; l++ {
					lo, hi, hb := l4[l], l4[l+32], h2[l]
					out[l] = s0 * float32(int8(lo&0xf|(hb&3)<<4)-32)
					out[l+32] = s1 * float32(int8(hi&0xf|(hb>>2&3)<<4)-32)
					out[l+64] = s2 * float32(int8(lo>>4|(hb>>4&3)<<4)-32)
					out[l+96] = s3 * float32(int8(hi>>4|(hb>>6&3)<<4)-32)
				}
			}
		}
	}
}

// Q8_K: f32 d, int8 qs[256], int16 bsums[16] (unused here); x = d·q.
func dequantQ8K(dst []float32, src []byte) {
	for i := range len(dst) / qkK {
		b := src[i*292 : i*292+292]
		d := math.Float32frombits(binary.LittleEndian.Uint32(b))
		y := dst[i*qkK : i*qkK+qkK]
		for j, q := range b[4 : 4+qkK] {
			y[j] = d * float32(int8(q))
		}
	}
}

// iq4nlValues is the non-linear 4-bit codebook of IQ4_NL and IQ4_XS.
var iq4nlValues = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// IQ4_NL: f16 d, qs[16] indexing the codebook; x = d·v[q].
func dequantIQ4NL(dst []float32, src []byte) {
	for i := range len(dst) / 32 {
		b := src[i*18 : i*18+18]
		d := f16At(b)
		y := dst[i*32 : i*32+32]
		for j, q := range b[2:18] {
			y[j] = d * float32(iq4nlValues[q&0xf])
			y[j+16] = d * float32(iq4nlValues[q>>4])
		}
	}
}

// IQ4_XS: f16 d, u16 scales_h, scales_l[4], qs[128]. Sub-block j (32
// elements) has a 6-bit scale (offset by 32) with its low nibble in
// scales_l[j/2] and top bits at bits 2j..2j+1 of scales_h.
func dequantIQ4XS(dst []float32, src []byte) {
	for i := range len(dst) / qkK {
		b := src[i*136 : i*136+136]
		d := f16At(b)
		sh := binary.LittleEndian.Uint16(b[2:])
		sl, qs := b[4:8], b[8:136]
		y := dst[i*qkK : i*qkK+qkK]
		for j := range 8 {
			ls := int(sl[j/2]>>(4*(j%2))&0xf) | int(sh>>(2*j)&3)<<4
			dl := d * float32(ls-32)
			q := qs[16*j : 16*j+16]
			out := y[32*j : 32*j+32]
			for l, v := range q {
				out[l] = dl * float32(iq4nlValues[v&0xf])
				out[l+16] = dl * float32(iq4nlValues[v>>4])
			}
		}
	}
}

// mxfp4Values are the E2M1 values doubled (the scale is halved to match).
var mxfp4Values = [16]int8{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

// e8m0Half returns 2^(e−128), half the E8M0 scale 2^(e−127).
func e8m0Half(e uint8) float32 {
	if e < 2 {
		return math.Float32frombits(0x00200000 << e) // subnormal 2^-128, 2^-127
	}
	return math.Float32frombits(uint32(e-1) << 23)
}

// MXFP4: u8 E8M0 exponent, qs[16] of E2M1 codes; x = 2^(e−128)·v[q].
func dequantMXFP4(dst []float32, src []byte) {
	for i := range len(dst) / 32 {
		b := src[i*17 : i*17+17]
		d := e8m0Half(b[0])
		y := dst[i*32 : i*32+32]
		for j, q := range b[1:17] {
			y[j] = d * float32(mxfp4Values[q&0xf])
			y[j+16] = d * float32(mxfp4Values[q>>4])
		}
	}
}
