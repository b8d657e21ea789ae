package gguf

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/cortiq/cortiq/half"
)

// Quantizers make valid blocks for tests and fixtures. The legacy formats
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) follow ggml's reference quantizers
// (quantize_row_*_ref) exactly. The k-quants use simple min/max rules, not
// ggml's error-minimising search: their blocks decode with any GGUF reader
// but are not byte-identical to llama-quantize output. Scales are rounded
// up where needed so that no value is clipped, which bounds every element's
// error by one quantization step of its sub-block.

type quantizer func(dst []byte, src []float32)

var quantizers = map[Type]quantizer{
	TypeF32:  quantF32,
	TypeF16:  quantF16,
	TypeBF16: quantBF16,
	TypeQ4_0: quantQ4_0,
	TypeQ4_1: quantQ4_1,
	TypeQ5_0: quantQ5_0,
	TypeQ5_1: quantQ5_1,
	TypeQ8_0: quantQ8_0,
	TypeQ2_K: quantQ2K,
	TypeQ3_K: quantQ3K,
	TypeQ4_K: quantQ4K,
	TypeQ5_K: quantQ5K,
	TypeQ6_K: quantQ6K,
	TypeQ8_K: quantQ8K,
}

// Quantize encodes src as type t. len(src) must be a whole number of blocks.
func Quantize(t Type, src []float32) ([]byte, error) {
	q, ok := quantizers[t]
	if !ok {
		return nil, fmt.Errorf("%w: cannot quantize to %s", ErrUnsupportedType, t)
	}
	n, err := t.RowSize(int64(len(src)))
	if err != nil {
		return nil, err
	}
	dst := make([]byte, n)
	q(dst, src)
	return dst, nil
}

func putF16(b []byte, f float32) { binary.LittleEndian.PutUint16(b, half.F32ToF16(f)) }

func quantF32(dst []byte, src []float32) {
	for i, x := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(x))
	}
}

func quantF16(dst []byte, src []float32) {
	for i, x := range src {
		putF16(dst[2*i:], x)
	}
}

func quantBF16(dst []byte, src []float32) {
	for i, x := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], half.F32ToBF16(x))
	}
}

// absMax returns the largest magnitude in x and the signed value having it
// (the first one on ties).
func absMax(x []float32) (amax, max float32) {
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); a > amax {
			amax, max = a, v
		}
	}
	return amax, max
}

func minMax(x []float32) (lo, hi float32) {
	lo, hi = x[0], x[0]
	for _, v := range x[1:] {
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

func inv(d float32) float32 {
	if d == 0 {
		return 0
	}
	return 1 / d
}

// Q8_0: d = amax/127, q = round(x/d).
func quantQ8_0(dst []byte, src []float32) {
	for i := range len(src) / 32 {
		x, b := src[i*32:i*32+32], dst[i*34:i*34+34]
		amax, _ := absMax(x)
		d := amax / 127
		id := inv(d)
		putF16(b, d)
		for j, v := range x {
			b[2+j] = byte(int8(math.Round(float64(v * id))))
		}
	}
}

// Q4_0: d = max/−8 with max the signed value of largest magnitude,
// q = min(15, int(x/d + 8.5)).
func quantQ4_0(dst []byte, src []float32) {
	for i := range len(src) / 32 {
		x, b := src[i*32:i*32+32], dst[i*18:i*18+18]
		_, mx := absMax(x)
		d := mx / -8
		id := inv(d)
		putF16(b, d)
		for j := range 16 {
			lo := min(15, int8(x[j]*id+8.5))
			hi := min(15, int8(x[j+16]*id+8.5))
			b[2+j] = byte(lo)&0xf | byte(hi)<<4
		}
	}
}

// Q4_1: d = (max−min)/15, m = min, q = min(15, int((x−min)/d + 0.5)).
func quantQ4_1(dst []byte, src []float32) {
	for i := range len(src) / 32 {
		x, b := src[i*32:i*32+32], dst[i*20:i*20+20]
		lo, hi := minMax(x)
		d := (hi - lo) / 15
		id := inv(d)
		putF16(b, d)
		putF16(b[2:], lo)
		for j := range 16 {
			q0 := min(15, int8((x[j]-lo)*id+0.5))
			q1 := min(15, int8((x[j+16]-lo)*id+0.5))
			b[4+j] = byte(q0)&0xf | byte(q1)<<4
		}
	}
}

// Q5_0: d = max/−16, q = min(31, int(x/d + 16.5)).
func quantQ5_0(dst []byte, src []float32) {
	for i := range len(src) / 32 {
		x, b := src[i*32:i*32+32], dst[i*22:i*22+22]
		_, mx := absMax(x)
		d := mx / -16
		id := inv(d)
		putF16(b, d)
		var qh uint32
		for j := range 16 {
			q0 := uint32(min(31, int8(x[j]*id+16.5))) & 31
			q1 := uint32(min(31, int8(x[j+16]*id+16.5))) & 31
			b[6+j] = byte(q0&0xf) | byte(q1&0xf)<<4
			qh |= (q0>>4)<<j | (q1>>4)<<(j+16)
		}
		binary.LittleEndian.PutUint32(b[2:], qh)
	}
}

// Q5_1: d = (max−min)/31, m = min, q = int((x−min)/d + 0.5).
func quantQ5_1(dst []byte, src []float32) {
	for i := range len(src) / 32 {
		x, b := src[i*32:i*32+32], dst[i*24:i*24+24]
		lo, hi := minMax(x)
		d := (hi - lo) / 31
		id := inv(d)
		putF16(b, d)
		putF16(b[2:], lo)
		var qh uint32
		for j := range 16 {
			q0 := uint32(min(31, uint8((x[j]-lo)*id+0.5)))
			q1 := uint32(min(31, uint8((x[j+16]-lo)*id+0.5)))
			b[8+j] = byte(q0&0xf) | byte(q1&0xf)<<4
			qh |= (q0>>4)<<j | (q1>>4)<<(j+16)
		}
		binary.LittleEndian.PutUint32(b[4:], qh)
	}
}

// f16Ceil returns the smallest binary16 value ≥ f, for f ≥ 0 finite.
func f16Ceil(f float32) float32 {
	h := half.F32ToF16(f)
	for half.F16ToF32(h) < f && h < 0x7bff {
		h++
	}
	return half.F16ToF32(h)
}

// clampRound rounds x to the nearest integer and clamps it to [lo, hi]
// (NaN gives lo).
func clampRound(x float32, lo, hi int) int {
	r := math.Round(float64(x))
	if !(r >= float64(lo)) {
		return lo
	}
	if r > float64(hi) {
		return hi
	}
	return int(r)
}

// ceilLevel returns the smallest level l in [0, top] with l·step ≥ v (top
// if none), for v ≥ 0.
func ceilLevel(v, step float32, top int) int {
	if step == 0 || !(v > 0) {
		return 0
	}
	l := int(math.Ceil(float64(v / step)))
	for l > 0 && float32(l-1)*step >= v {
		l--
	}
	for l < top && float32(l)*step < v {
		l++
	}
	return min(max(l, 0), top)
}

// affineParams picks, for sub-blocks with minimum lo[j] and maximum hi[j],
// quantized mins and scales for x = d·ls·q − dmin·lm with q in [0, nmax]
// and levels up to top, so that every value in [lo, hi] is representable.
// It returns the f16 super-block scales and the per-sub-block levels.
func affineParams(lo, hi []float32, nmax, top int, ls, lm []int) (d, dmin float32) {
	maxMin := float32(0)
	for _, v := range lo {
		maxMin = max(maxMin, -min(v, 0))
	}
	dmin = f16Ceil(maxMin / float32(top))
	for float32(top)*dmin < maxMin {
		dmin = f16Ceil(math.Nextafter32(dmin, float32(math.Inf(1))))
	}
	need := make([]float32, len(lo))
	maxNeed := float32(0)
	for j := range lo {
		lm[j] = ceilLevel(-min(lo[j], 0), dmin, top)
		need[j] = (hi[j] + dmin*float32(lm[j])) / float32(nmax)
		maxNeed = max(maxNeed, need[j])
	}
	d = f16Ceil(maxNeed / float32(top))
	for float32(top)*d < maxNeed {
		d = f16Ceil(math.Nextafter32(d, float32(math.Inf(1))))
	}
	for j := range lo {
		ls[j] = ceilLevel(need[j], d, top)
	}
	return d, dmin
}

// packScaleMinK4 stores eight 6-bit scales and mins in 12 bytes, the
// inverse of scaleMinK4.
func packScaleMinK4(dst []byte, ls, lm []int) {
	clear(dst[:12])
	for j := range 8 {
		s, m := byte(ls[j]), byte(lm[j])
		if j < 4 {
			dst[j] |= s
			dst[j+4] |= m
		} else {
			dst[j+4] = s&0xf | (m&0xf)<<4
			dst[j-4] |= (s >> 4) << 6
			dst[j] |= (m >> 4) << 6
		}
	}
}

// affineLevels quantizes x for x ≈ s·q − m, q in [0, nmax].
func affineLevels(q []int, x []float32, s, m float32, nmax int) {
	is := inv(s)
	for i, v := range x {
		q[i] = clampRound((v+m)*is, 0, nmax)
	}
}

// Q4_K: eight sub-blocks of 32 with 6-bit scale and min.
func quantQ4K(dst []byte, src []float32) {
	var lo, hi [8]float32
	var ls, lm [8]int
	var q [qkK]int
	for i := range len(src) / qkK {
		x, b := src[i*qkK:i*qkK+qkK], dst[i*144:i*144+144]
		for j := range 8 {
			lo[j], hi[j] = minMax(x[32*j : 32*j+32])
		}
		d, dmin := affineParams(lo[:], hi[:], 15, 63, ls[:], lm[:])
		putF16(b, d)
		putF16(b[2:], dmin)
		packScaleMinK4(b[4:16], ls[:], lm[:])
		for j := range 8 {
			affineLevels(q[32*j:32*j+32], x[32*j:32*j+32], d*float32(ls[j]), dmin*float32(lm[j]), 15)
		}
		qs := b[16:144]
		for p := range 4 {
			for l := range 32 {
				qs[32*p+l] = byte(q[64*p+l]) | byte(q[64*p+32+l])<<4
			}
		}
	}
}

// Q5_K: as Q4_K with 5-bit quants; the fifth bits go to qh.
func quantQ5K(dst []byte, src []float32) {
	var lo, hi [8]float32
	var ls, lm [8]int
	var q [qkK]int
	for i := range len(src) / qkK {
		x, b := src[i*qkK:i*qkK+qkK], dst[i*176:i*176+176]
		for j := range 8 {
			lo[j], hi[j] = minMax(x[32*j : 32*j+32])
		}
		d, dmin := affineParams(lo[:], hi[:], 31, 63, ls[:], lm[:])
		putF16(b, d)
		putF16(b[2:], dmin)
		packScaleMinK4(b[4:16], ls[:], lm[:])
		for j := range 8 {
			affineLevels(q[32*j:32*j+32], x[32*j:32*j+32], d*float32(ls[j]), dmin*float32(lm[j]), 31)
		}
		qh, qs := b[16:48], b[48:176]
		clear(qh)
		for p := range 4 {
			for l := range 32 {
				a, c := q[64*p+l], q[64*p+32+l]
				qs[32*p+l] = byte(a&0xf) | byte(c&0xf)<<4
				qh[l] |= byte(a>>4)<<(2*p) | byte(c>>4)<<(2*p+1)
			}
		}
	}
}

// pack2 stores 2-bit values the Q2_K/Q3_K way: qs[32h + l] holds elements
// 128h + l + 32s in bits 2s..2s+1.
func pack2(qs []byte, q []int) {
	for h := range 2 {
		for l := range 32 {
			e := 128*h + l
			qs[32*h+l] = byte(q[e]&3) | byte(q[e+32]&3)<<2 | byte(q[e+64]&3)<<4 | byte(q[e+96]&3)<<6
		}
	}
}

// Q2_K: sixteen sub-blocks of 16 with 4-bit scale and min.
func quantQ2K(dst []byte, src []float32) {
	var lo, hi [16]float32
	var ls, lm [16]int
	var q [qkK]int
	for i := range len(src) / qkK {
		x, b := src[i*qkK:i*qkK+qkK], dst[i*84:i*84+84]
		for j := range 16 {
			lo[j], hi[j] = minMax(x[16*j : 16*j+16])
		}
		d, dmin := affineParams(lo[:], hi[:], 3, 15, ls[:], lm[:])
		for j := range 16 {
			b[j] = byte(ls[j]) | byte(lm[j])<<4
			affineLevels(q[16*j:16*j+16], x[16*j:16*j+16], d*float32(ls[j]), dmin*float32(lm[j]), 3)
		}
		pack2(b[16:80], q[:])
		putF16(b[80:], d)
		putF16(b[82:], dmin)
	}
}

// symmetricScales picks signed per-sub-block scales sc[j] in
// [−top, top] and an f16 super-block scale d so that d·|sc[j]| ≥ want[j]
// (with sc[j] taking want's sign).
func symmetricScales(want []float32, top int, sc []int) float32 {
	amax := float32(0)
	for _, w := range want {
		amax = max(amax, float32(math.Abs(float64(w))))
	}
	d := f16Ceil(amax / float32(top))
	for float32(top)*d < amax {
		d = f16Ceil(math.Nextafter32(d, float32(math.Inf(1))))
	}
	for j, w := range want {
		l := ceilLevel(float32(math.Abs(float64(w))), d, top)
		if w < 0 {
			l = -l
		}
		sc[j] = l
	}
	return d
}

// Q3_K: sixteen sub-blocks of 16, signed 3-bit quants in [−4, 3] and
// signed 6-bit scales. Each sub-block scale maps its largest-magnitude
// value to −4, as ggml does.
func quantQ3K(dst []byte, src []float32) {
	var want [16]float32
	var sc [16]int
	var q [qkK]int
	for i := range len(src) / qkK {
		x, b := src[i*qkK:i*qkK+qkK], dst[i*110:i*110+110]
		for j := range 16 {
			_, mx := absMax(x[16*j : 16*j+16])
			want[j] = mx / -4
		}
		d := symmetricScales(want[:], 31, sc[:])
		for j := range 16 {
			s := d * float32(sc[j])
			is := inv(s)
			for l := range 16 {
				q[16*j+l] = clampRound(x[16*j+l]*is, -4, 3) + 4
			}
		}
		hmask, scales := b[0:32], b[96:108]
		clear(hmask)
		clear(scales)
		for e := range qkK {
			if q[e] > 3 {
				hmask[e%32] |= 1 << (e / 32)
				q[e] -= 4
			}
		}
		pack2(b[32:96], q[:])
		for j := range 16 {
			l := byte(sc[j] + 32)
			if j < 8 {
				scales[j] |= l & 0xf
			} else {
				scales[j-8] |= (l & 0xf) << 4
			}
			scales[8+j%4] |= (l >> 4) << (2 * (j / 4))
		}
		putF16(b[108:], d)
	}
}

// Q6_K: sixteen sub-blocks of 16, 6-bit quants in [−32, 31] and int8
// scales; each sub-block scale maps its largest-magnitude value to −32.
func quantQ6K(dst []byte, src []float32) {
	var want [16]float32
	var sc [16]int
	var q [qkK]int
	for i := range len(src) / qkK {
		x, b := src[i*qkK:i*qkK+qkK], dst[i*210:i*210+210]
		for j := range 16 {
			_, mx := absMax(x[16*j : 16*j+16])
			want[j] = mx / -32
		}
		d := symmetricScales(want[:], 127, sc[:])
		for j := range 16 {
			is := inv(d * float32(sc[j]))
			for l := range 16 {
				q[16*j+l] = clampRound(x[16*j+l]*is, -32, 31) + 32
			}
		}
		ql, qh, scales := b[0:128], b[128:192], b[192:208]
		for h := range 2 {
			for l := range 32 {
				e := 128*h + l
				ql[64*h+l] = byte(q[e]&0xf) | byte(q[e+64]&0xf)<<4
				ql[64*h+32+l] = byte(q[e+32]&0xf) | byte(q[e+96]&0xf)<<4
				qh[32*h+l] = byte(q[e]>>4) | byte(q[e+32]>>4)<<2 | byte(q[e+64]>>4)<<4 | byte(q[e+96]>>4)<<6
			}
		}
		for j := range 16 {
			scales[j] = byte(int8(sc[j]))
		}
		putF16(b[208:], d)
	}
}

// Q8_K: f32 d = amax/127, q = round(x/d), bsums = sums of 16 quants.
func quantQ8K(dst []byte, src []float32) {
	for i := range len(src) / qkK {
		x, b := src[i*qkK:i*qkK+qkK], dst[i*292:i*292+292]
		amax, _ := absMax(x)
		d := amax / 127
		id := inv(d)
		binary.LittleEndian.PutUint32(b, math.Float32bits(d))
		for j := range 16 {
			sum := 0
			for l := range 16 {
				v := clampRound(x[16*j+l]*id, -127, 127)
				b[4+16*j+l] = byte(int8(v))
				sum += v
			}
			binary.LittleEndian.PutUint16(b[4+qkK+2*j:], uint16(int16(sum)))
		}
	}
}
