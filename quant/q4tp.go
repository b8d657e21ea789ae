package quant

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/cortiq/cortiq/half"
)

// q4tpCodec stores 4-bit weights in groups of 32 with a per-row
// logarithmic ladder of 32 scales and a 5-bit ladder code per group.
//
// For a rows×cols tensor (cols a multiple of 32, gpr = cols/32 groups per
// row) the bytes are, little-endian throughout:
//
//   - nibbles, rows·gpr·16 bytes: group g of row r at (r·gpr+g)·16 as four
//     u32 words; weight 8j+n of the group is nibble n (LSB first) of word j
//     and stands for nibble-8 (so byte i holds weights 2i and 2i+1, low
//     nibble first);
//   - ladder parameters at rows·gpr·16: per row two f16, a then b; rung k
//     of the row is exp2(a + k·b), k = 0..31, computed in float32;
//   - codes at rows·gpr·16 + rows·4: per row Q4TPCodeStride(cols) bytes,
//     the 5-bit rung index of group g at bit 5g, LSB-first across bytes.
//
// W[r, 32g+i] = (nibble-8)·rung[code[g]].
type q4tpCodec struct{}

func init() { register(q4tpCodec{}) }

func (q4tpCodec) DType() DType { return Q4TP }

// q4tpRungs is the number of scales on a row's ladder.
const q4tpRungs = 32

// q4tpLadder computes a row's rungs from its stored f16 parameters exactly
// as a kernel does: float(a) + k·float(b) in float32, then exp2. The exp2
// here is correctly rounded (via float64); a GPU exp2f may differ by an ulp
// or two.
func q4tpLadder(l *[q4tpRungs]float32, ah, bh uint16) {
	a, b := half.F16ToF32(ah), half.F16ToF32(bh)
	for k := range l {
		e := a + float32(float32(k)*b) // the conversion forbids an FMA
		l[k] = float32(math.Exp2(float64(e)))
	}
}

// q4tpSections returns the byte offsets of the parameter and code sections
// and the code bytes per row.
func q4tpSections(rows, cols int) (params, codes, stride int) {
	params = rows * (cols / GroupSize) * 16
	return params, params + rows*4, Q4TPCodeStride(cols)
}

// q4tpCode reads the 5-bit code of group g from a row's code bytes.
func q4tpCode(codes []byte, g int) int {
	bit := 5 * g
	c := 0
	for j := range 5 {
		c |= int(codes[(bit+j)/8]>>((bit+j)%8)&1) << j
	}
	return c
}

// q4tpPutCode writes the 5-bit code c of group g into a row's code bytes,
// which must start zeroed.
func q4tpPutCode(codes []byte, g, c int) {
	bit := 5 * g
	for j := range 5 {
		codes[(bit+j)/8] |= byte(c>>j&1) << ((bit + j) % 8)
	}
}

func (q4tpCodec) EncodeRows(dst []byte, w []float32, rows, cols, r0 int, opt *EncodeOptions) error {
	n, err := checkRows(Q4TP, dst, w, rows, cols, r0)
	if err != nil {
		return err
	}
	if err := checkFinite(Q4TP, w, cols, r0); err != nil {
		return err
	}
	for i, v := range w {
		if math.Abs(float64(v)) >= q4tpMaxWeight {
			return fmt.Errorf("quant: q4tp: weight %g at row %d, column %d is beyond the format's range (|w| < 2^100)", v, r0+i/cols, i%cols)
		}
	}
	var stats []float32
	if opt != nil {
		stats = opt.ColStats
	}
	if err := checkStats(Q4TP, stats, cols); err != nil {
		return err
	}
	e := newQ4TPEncoder(cols)
	e.cw = StatWeights(stats)
	for k := range n {
		r := r0 + k
		ah, bh := e.encodeRow(w[k*cols : (k+1)*cols])
		q4tpPutRow(dst, rows, cols, r, e.q, e.code, ah, bh)
	}
	return nil
}

// q4tpPutRow stores row r of a rows×cols tensor: its nibble values q
// (-8..7, cols of them), group codes and ladder parameters.
func q4tpPutRow(dst []byte, rows, cols, r int, q []int8, code []uint8, ah, bh uint16) {
	gpr := cols / GroupSize
	po, co, stride := q4tpSections(rows, cols)
	nib := dst[r*gpr*16 : (r+1)*gpr*16]
	for i := range nib {
		nib[i] = byte(q[2*i]+8) | byte(q[2*i+1]+8)<<4
	}
	binary.LittleEndian.PutUint16(dst[po+4*r:], ah)
	binary.LittleEndian.PutUint16(dst[po+4*r+2:], bh)
	codes := dst[co+r*stride : co+(r+1)*stride]
	clear(codes)
	for g := range gpr {
		q4tpPutCode(codes, g, int(code[g]))
	}
}

func (q4tpCodec) DecodeRow(dst []float32, src []byte, rows, cols, r int) {
	gpr := cols / GroupSize
	po, co, stride := q4tpSections(rows, cols)
	var lad [q4tpRungs]float32
	q4tpLadder(&lad, binary.LittleEndian.Uint16(src[po+4*r:]), binary.LittleEndian.Uint16(src[po+4*r+2:]))
	nib := src[r*gpr*16 : (r+1)*gpr*16]
	codes := src[co+r*stride : co+(r+1)*stride]
	for g := range gpr {
		s := lad[q4tpCode(codes, g)]
		for i := range 16 {
			b := nib[g*16+i]
			dst[g*32+2*i] = float32(int(b&15)-8) * s
			dst[g*32+2*i+1] = float32(int(b>>4)-8) * s
		}
	}
}

func (q4tpCodec) DotRow(src []byte, rows, cols, r int, x []float32) float32 {
	gpr := cols / GroupSize
	po, co, stride := q4tpSections(rows, cols)
	var lad [q4tpRungs]float32
	q4tpLadder(&lad, binary.LittleEndian.Uint16(src[po+4*r:]), binary.LittleEndian.Uint16(src[po+4*r+2:]))
	nib := src[r*gpr*16 : (r+1)*gpr*16]
	codes := src[co+r*stride : co+(r+1)*stride]
	xs := x[:cols]
	var acc float32
	for g := range gpr {
		var gs float32
		for i := range 16 {
			b := nib[g*16+i]
			gs += float32(float32(int(b&15)-8) * xs[g*32+2*i])
			gs += float32(float32(int(b>>4)-8) * xs[g*32+2*i+1])
		}
		acc += float32(gs * lad[q4tpCode(codes, g)])
	}
	return acc
}

// Encoder.

const (
	q4tpMinLog2   = -100    // groups with absmax below 2^-100 are stored as zeros
	q4tpMaxWeight = 0x1p100 // larger weights are refused
	q4tpMaxLog2   = 126     // the top rung stays below the float32 range
	q4tpMargin    = 0.05    // log2 slack added around the ladder's range
	q4tpMinSpan   = 1.25    // a ladder spanning less than this needs no tuning of its bottom
	q4tpReach     = 0.16    // log2 distance from the starting scale searched exhaustively
)

// q4tpEncoder holds the scratch state of the row encoder.
type q4tpEncoder struct {
	gpr    int
	t      []float64 // per group: starting log2 scale, NaN for a zero group
	code   []uint8   // current assignment
	best   []uint8   // best assignment so far
	q      []int8    // nibble values of the best assignment, -8..7
	sorted []float64
	lad    [q4tpRungs]float32
	// cw, when set, weights each column's squared error (the activations'
	// mean square, see StatWeights); nil is the plain weight error.
	cw []float32
}

func newQ4TPEncoder(cols int) *q4tpEncoder {
	gpr := cols / GroupSize
	return &q4tpEncoder{
		gpr:    gpr,
		t:      make([]float64, gpr),
		code:   make([]uint8, gpr),
		best:   make([]uint8, gpr),
		q:      make([]int8, cols),
		sorted: make([]float64, 0, gpr),
	}
}

// q4tpGroupErr returns the squared error of a group of 32 weights quantized
// with scale s, each weight rounded to the nearest of -8..7 times s.
func q4tpGroupErr(w []float32, s float32) float32 {
	inv := 1 / s
	var e float32
	for _, v := range w[:GroupSize] {
		x := float32(v * inv) // rounded here: no FMA with the +8.5 below
		if x < -8 {
			x = -8
		} else if x > 7 {
			x = 7
		}
		r := float32(int32(x+8.5)) - 8 // x+8.5 > 0, so truncation is floor
		d := v - float32(r*s)
		e += float32(d * d)
	}
	return e
}

// q4tpGroupErrW is q4tpGroupErr with column weights c:
// Σ_i c[i]·(w[i] − ŵ[i])². For a fixed scale the nearest nibble stays the
// best one whatever the weights, so only the choice of scale changes.
func q4tpGroupErrW(w, c []float32, s float32) float32 {
	inv := 1 / s
	c = c[:GroupSize]
	var e float32
	for i, v := range w[:GroupSize] {
		x := float32(v * inv)
		if x < -8 {
			x = -8
		} else if x > 7 {
			x = 7
		}
		r := float32(int32(x+8.5)) - 8
		d := v - float32(r*s)
		e += float32(c[i] * float32(d*d))
	}
	return e
}

// groupErr is the (weighted, when the encoder has column weights) squared
// error of group g, whose weights are w, at scale s.
func (e *q4tpEncoder) groupErr(g int, w []float32, s float32) float32 {
	if e.cw == nil {
		return q4tpGroupErr(w, s)
	}
	return q4tpGroupErrW(w, e.cw[g*GroupSize:], s)
}

// q4tpGroupQuant writes the nibble values of a group quantized with scale s.
func q4tpGroupQuant(q []int8, w []float32, s float32) {
	inv := 1 / s
	for i, v := range w[:GroupSize] {
		x := float32(v * inv) // rounded here: no FMA with the +8.5 below
		if x < -8 {
			x = -8
		} else if x > 7 {
			x = 7
		}
		q[i] = int8(int32(x+8.5) - 8)
	}
}

// q4tpPlainLog2 bounds the row magnitudes (log2 of the largest |w|) that
// the encoder searches as they are: beyond it the float32 error sums would
// overflow or vanish, so such a row is searched scaled by a power of two.
const q4tpPlainLog2 = 40

// encodeRow quantizes one row into e.q and e.best and returns the row's f16
// ladder parameters (a, b). |w| must be below q4tpMaxWeight.
//
// A row whose largest magnitude lies outside [2^-40, 2^40] is searched as
// w·2^-s (exact: a power of two) with s its binary exponent, groups below
// the format's 2^-100 floor zeroed first; the ladder bottom then moves by s
// and the nibbles are rounded again against the ladder actually stored
// (whose f16 bottom is rounded), with the codes kept.
func (e *q4tpEncoder) encodeRow(w []float32) (ah, bh uint16) {
	var amax float64
	for _, v := range w {
		amax = max(amax, math.Abs(float64(v)))
	}
	if amax == 0 {
		return e.encodeScaledRow(w)
	}
	_, ex := math.Frexp(amax)
	sh := ex - 1 // amax in [2^sh, 2^(sh+1))
	if sh >= -q4tpPlainLog2 && sh < q4tpPlainLog2 {
		return e.encodeScaledRow(w)
	}
	ws := make([]float32, len(w))
	for g := range e.gpr {
		gw := w[g*GroupSize : (g+1)*GroupSize]
		var gmax float64
		for _, v := range gw {
			gmax = max(gmax, math.Abs(float64(v)))
		}
		if math.Log2(gmax) < q4tpMinLog2 {
			continue // stored as zeros, like a zero group
		}
		for i, v := range gw {
			ws[g*GroupSize+i] = float32(math.Ldexp(float64(v), -sh))
		}
	}
	ah, bh = e.encodeScaledRow(ws)
	if allNaN(e.t) {
		return 0, 0
	}
	ah = half.F32ToF16(half.F16ToF32(ah) + float32(sh))
	q4tpLadder(&e.lad, ah, bh)
	for g := range e.gpr {
		q := e.q[g*GroupSize : (g+1)*GroupSize]
		if math.IsNaN(e.t[g]) {
			clear(q)
			continue
		}
		q4tpGroupQuant(q, w[g*GroupSize:], e.lad[e.best[g]])
	}
	return ah, bh
}

func allNaN(v []float64) bool {
	for _, x := range v {
		if !math.IsNaN(x) {
			return false
		}
	}
	return true
}

// encodeScaledRow is encodeRow for a row whose magnitudes the float32
// search handles directly.
func (e *q4tpEncoder) encodeScaledRow(w []float32) (ah, bh uint16) {
	// Starting scale of every group: the one that maps its largest weight
	// onto the end of the -8..7 range on its side, a little tighter for a
	// positive maximum, where clipping it slightly usually pays off.
	e.sorted = e.sorted[:0]
	for g := range e.gpr {
		var amax, peak float32
		for _, v := range w[g*GroupSize : (g+1)*GroupSize] {
			if a := float32(math.Abs(float64(v))); a > amax {
				amax, peak = a, v
			}
		}
		if amax == 0 || math.Log2(float64(amax)) < q4tpMinLog2 {
			e.t[g] = math.NaN()
			continue
		}
		d := 7.25
		if peak < 0 {
			d = 8
		}
		e.t[g] = min(math.Log2(float64(amax)/d), q4tpMaxLog2-q4tpMargin)
		e.sorted = append(e.sorted, e.t[g])
	}
	if len(e.sorted) == 0 {
		clear(e.q)
		clear(e.best)
		return 0, 0
	}
	slices.Sort(e.sorted)
	hi := e.sorted[len(e.sorted)-1] + q4tpMargin
	lows := e.lowCandidates(hi)

	bestErr := math.Inf(1)
	for _, lo := range lows {
		a, b := q4tpParams(lo, (hi-lo)/(q4tpRungs-1))
		if err := e.assign(w, a, b, e.t); err < bestErr {
			bestErr, ah, bh = err, a, b
			copy(e.best, e.code)
		}
	}
	// Refine the ladder: with codes and nibbles fixed, each group's best
	// scale is s* = Σwq/Σq²; fit log2 s* ≈ a + k·b by weighted least
	// squares and reassign. Keep the result only if the error drops.
	for range 2 {
		a, b, ok := e.refit(w, ah, bh)
		if !ok || (a == ah && b == bh) {
			break
		}
		err := e.assign(w, a, b, e.t)
		if err >= bestErr {
			break
		}
		bestErr, ah, bh = err, a, b
		copy(e.best, e.code)
	}
	q4tpLadder(&e.lad, ah, bh)
	for g := range e.gpr {
		q := e.q[g*GroupSize : (g+1)*GroupSize]
		if math.IsNaN(e.t[g]) {
			clear(q)
			e.best[g] = 0
			continue
		}
		q4tpGroupQuant(q, w[g*GroupSize:], e.lad[e.best[g]])
	}
	copy(e.code, e.best)
	return ah, bh
}

// lowCandidates returns the bottoms of the ladders worth trying for a row
// whose top is hi: the smallest group scale, and when that makes the ladder
// long, a few quantiles that give up on the smallest groups (which cost
// little when stored with too large a scale) for finer rungs.
func (e *q4tpEncoder) lowCandidates(hi float64) []float64 {
	s := e.sorted
	lo0 := s[0] - q4tpMargin
	if hi-lo0 <= q4tpMinSpan {
		return []float64{max(lo0, q4tpMinLog2)}
	}
	out := []float64{max(lo0, q4tpMinLog2)}
	for _, p := range [...]float64{0.05, 0.15, 0.3} {
		lo := min(s[int(p*float64(len(s)-1))]-q4tpMargin, hi-q4tpMinSpan)
		if lo-out[len(out)-1] > 0.02 {
			out = append(out, lo)
		}
	}
	return out
}

// q4tpParams rounds the ladder bottom and step to their stored f16 form.
func q4tpParams(a, b float64) (ah, bh uint16) {
	return half.F32ToF16(float32(a)), half.F32ToF16(float32(max(b, 0)))
}

// assign chooses every group's rung for the ladder (ah, bh), starting the
// search of group g at log2 scale start[g], and returns the row's squared
// error. Codes go to e.code.
func (e *q4tpEncoder) assign(w []float32, ah, bh uint16, start []float64) float64 {
	q4tpLadder(&e.lad, ah, bh)
	a, b := float64(half.F16ToF32(ah)), float64(half.F16ToF32(bh))
	reach := 0
	if b > 0 {
		reach = min(max(int(math.Round(q4tpReach/b)), 1), 6)
	}
	var total float64
	for g := range e.gpr {
		gw := w[g*GroupSize : (g+1)*GroupSize]
		if math.IsNaN(e.t[g]) {
			e.code[g] = 0
			for i, v := range gw {
				d := float64(v) * float64(v)
				if e.cw != nil {
					d *= float64(e.cw[g*GroupSize+i])
				}
				total += d
			}
			continue
		}
		f := 0.0
		if reach > 0 {
			f = (start[g] - a) / b
		}
		k, err := e.searchGroup(g, gw, f, reach)
		e.code[g] = uint8(k)
		total += float64(err)
	}
	return total
}

// searchGroup returns the rung with the least error for one group: it
// tries every rung within reach of the one nearest f, and keeps going
// outwards while the best rung sits at the edge. (The error as a function
// of the scale is bumpy, so a plain descent stops early too often.)
func (e *q4tpEncoder) searchGroup(g int, w []float32, f float64, reach int) (int, float32) {
	k0 := 0
	if f > 0 {
		k0 = int(min(math.Round(f), q4tpRungs-1))
	}
	k, best := k0, e.groupErr(g, w, e.lad[k0])
	if reach == 0 {
		return k, best
	}
	lo, hi := max(k0-reach, 0), min(k0+reach, q4tpRungs-1)
	for c := lo; c <= hi; c++ {
		if c == k0 {
			continue
		}
		if ce := e.groupErr(g, w, e.lad[c]); ce < best {
			best, k = ce, c
		}
	}
	for k == lo && lo > 0 {
		lo--
		ce := e.groupErr(g, w, e.lad[lo])
		if ce >= best {
			break
		}
		best, k = ce, lo
	}
	for k == hi && hi < q4tpRungs-1 {
		hi++
		ce := e.groupErr(g, w, e.lad[hi])
		if ce >= best {
			break
		}
		best, k = ce, hi
	}
	return k, best
}

// refit fits the ladder to the best assignment: per group the optimal free
// scale s* = Σcwq/Σcq² for its nibbles (c the column weights, 1 without
// statistics), then a weighted least-squares line log2 s* ≈ a + k·b with
// weights Σcq²·s*² (the curvature of the error in log2 s). It also points e.t at the s* so the next search starts there.
func (e *q4tpEncoder) refit(w []float32, ah, bh uint16) (uint16, uint16, bool) {
	q4tpLadder(&e.lad, ah, bh)
	var sw, sk, sy, skk, sky float64
	var q [GroupSize]int8
	for g := range e.gpr {
		if math.IsNaN(e.t[g]) {
			continue
		}
		gw := w[g*GroupSize : (g+1)*GroupSize]
		k := float64(e.best[g])
		q4tpGroupQuant(q[:], gw, e.lad[e.best[g]])
		var wq, qq float64
		for i, v := range gw {
			c := 1.0
			if e.cw != nil {
				c = float64(e.cw[g*GroupSize+i])
			}
			wq += c * float64(v) * float64(q[i])
			qq += c * float64(q[i]) * float64(q[i])
		}
		if wq <= 0 || qq == 0 {
			continue
		}
		s := wq / qq
		y := math.Log2(s)
		e.t[g] = y
		om := qq * s * s
		sw += om
		sk += om * k
		sy += om * y
		skk += om * k * k
		sky += om * k * y
	}
	if sw == 0 {
		return 0, 0, false
	}
	b := float64(half.F16ToF32(bh))
	a := (sy - b*sk) / sw
	if det := sw*skk - sk*sk; det > 1e-9*sw*sw {
		if nb := (sw*sky - sk*sy) / det; nb >= 0 {
			b = nb
			a = (sy - b*sk) / sw
		}
	}
	if !(a >= q4tpMinLog2 && a+float64(q4tpRungs-1)*b <= q4tpMaxLog2) {
		return 0, 0, false
	}
	na, nb := q4tpParams(a, b)
	return na, nb, true
}
