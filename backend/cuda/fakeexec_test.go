package cuda

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/backendtest"
	"github.com/cortiq/cortiq/backend/cpu"
	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/kernels"
	"github.com/cortiq/cortiq/quant"
)

// A plain float64 model of each kernel, run by the fake on its memory when
// numeric is set: what csrc/*.cu documents each kernel computes (not how).
// With it the parity suite compares the Go side's whole dataflow (buffers,
// offsets, strides, the order of launches, graph replays) with the CPU
// backend, without a GPU.

// f32s is a float32 view of fake device memory.
type f32s []byte

func (v f32s) at(i int) float32     { return math.Float32frombits(binary.LittleEndian.Uint32(v[4*i:])) }
func (v f32s) set(i int, x float32) { binary.LittleEndian.PutUint32(v[4*i:], math.Float32bits(x)) }

// f16s is a float16 view of fake device memory (a K/V cache of
// Options.KVF16): set rounds to nearest even.
type f16s []byte

func (v f16s) at(i int) float32     { return half.F16ToF32(binary.LittleEndian.Uint16(v[2*i:])) }
func (v f16s) set(i int, x float32) { binary.LittleEndian.PutUint16(v[2*i:], half.F32ToF16(x)) }

// kvStore is a K/V cache's view: float32 or float16.
type kvStore interface {
	at(i int) float32
	set(i int, x float32)
}

// kv returns a cache view of n elements at p, float16 for the _h kernels.
func (f *fakeGPU) kv(p driver.DevicePtr, n int, f16 bool) kvStore {
	if !f16 {
		return f.view(p, n)
	}
	a := f.find(p, 2*int64(n))
	if a == nil || a.mem == nil {
		f.t.Fatalf("fake: %d halves at %#x outside the allocations", n, p)
	}
	o := int(p - a.base)
	return f16s(a.mem[o : o+2*n])
}

// view returns n floats at p (the launch checks have bounded every extent).
func (f *fakeGPU) view(p driver.DevicePtr, n int) f32s {
	a := f.find(p, 4*int64(n))
	if a == nil || a.mem == nil {
		f.t.Fatalf("fake: %d floats at %#x outside the allocations", n, p)
	}
	o := int(p - a.base)
	return f32s(a.mem[o : o+4*n])
}

func (f *fakeGPU) bytesAt(p driver.DevicePtr, n int64) []byte {
	a := f.find(p, n)
	if a == nil || a.mem == nil {
		f.t.Fatalf("fake: %d bytes at %#x outside the allocations", n, p)
	}
	o := int64(p - a.base)
	return a.mem[o : o+n]
}

// bf16 rounds to the nearest bfloat16 (ties to even), as
// __float2bfloat16_rn.
func bf16(x float32) float32 {
	b := math.Float32bits(x)
	b += 0x7fff + (b>>16)&1
	return math.Float32frombits(b &^ 0xffff)
}

func bf16Copy(f *fakeGPU, w []float32) []float32 {
	key := fmt.Sprintf("bf16/%p", &w[0])
	if v, ok := f.decoded[key]; ok {
		return v
	}
	v := make([]float32, len(w))
	for i, x := range w {
		v[i] = bf16(x)
	}
	f.decoded[key] = v
	return v
}

// q8scale is row o's f16 scale of a q8_row tensor (also q8_2f's).
func (f *fakeGPU) q8scale(p driver.DevicePtr, rows, cols, o int) float32 {
	b := f.bytesAt(p.Add(int64(rows)*int64(cols)+2*int64(o)), 2)
	w, _ := quant.Decode(quant.F16, b, []int{1, 1})
	return w[0]
}

var famDType = map[string]quant.DType{"f32": quant.F32, "f16": quant.F16, "bf16": quant.BF16, "q8row": quant.Q8Row, "q82f": quant.Q82F, "q4tp": quant.Q4TP}

// weights decodes a kernel's weight operand as its family reads it.
func (f *fakeGPU) weights(fam string, p driver.DevicePtr, rows, cols int) []float32 {
	key := fmt.Sprintf("%s/%#x/%d/%d", fam, p, rows, cols)
	if w, ok := f.decoded[key]; ok {
		return w
	}
	if fam == "q8quants" {
		q := f.bytesAt(p, int64(rows)*int64(cols))
		w := make([]float32, len(q))
		for i, b := range q {
			w[i] = float32(int8(b))
		}
		f.decoded[key] = w
		return w
	}
	if fam == "q4tph" { // the half wide tiles' weights
		n, _ := quant.ExpectedBytes(quant.Q4TP, []int{rows, cols})
		w, err := kern.GemmHWeights(f.bytesAt(p, n), rows, cols)
		if err != nil {
			f.t.Fatalf("fake: %v", err)
		}
		f.decoded[key] = w
		return w
	}
	dt := famDType[fam]
	n, _ := quant.ExpectedBytes(dt, []int{rows, cols})
	w, err := quant.Decode(dt, f.bytesAt(p, n), []int{rows, cols})
	if err != nil {
		f.t.Fatalf("fake: decoding %s %d×%d: %v", fam, rows, cols, err)
	}
	f.decoded[key] = w
	return w
}

// qpos is the position of element i of a block of 32 in gemmq_actq's
// output in quant order perm (kern.QuantPos; q4tp's 0,2,4,6,1,3,5,7 for
// perm 1, the wide tiles' orders for 2 and 3).
func qpos(i, perm int) int { return kern.QuantPos(i, perm) }

// actPrologue applies the quantizer prologue of call c (its pro at
// parameter i, then U, the norm weight, eps and one_plus) to row t of its
// input (ldx apart, T rows), in place: rmsnorm's or silu_mul's values.
func (f *fakeGPU) actPrologue(c *fakeCall, i, t, ldx int, row []float32, T int) {
	cols := len(row)
	switch pro := c.int(i); pro {
	case kern.ProNorm:
		xs := make([]float64, cols)
		for k, v := range row {
			xs[k] = float64(v)
		}
		rmsApply(xs, f.view(c.ptr(i+2), cols), c.f32(i+3), c.int(i+4) != 0, func(k int, v float32) { row[k] = v })
	case kern.ProSilu:
		u := f.view(c.ptr(i+1), int(rowsSpan(T, ldx, cols)/4))
		for k, v := range row {
			row[k] = float32(float64(v) / (1 + math.Exp(-float64(v))) * float64(u.at(t*ldx+k)))
		}
	default:
		f.t.Fatalf("fake: %s prologue %d", c.name, pro)
	}
}

func rmsApply(x []float64, w f32s, eps float32, onePlus bool, out func(i int, v float32)) {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	inv := float32(1 / math.Sqrt(float64(float32(ss/float64(len(x)))+eps)))
	for i, v := range x {
		if onePlus {
			out(i, (float32(v)*inv)*(1+w.at(i)))
		} else {
			out(i, w.at(i)*(float32(v)*inv))
		}
	}
}

// headNorm is head_rmsnorm's model over x[b : b+hd) in place.
func (f *fakeGPU) headNorm(x f32s, b, hd int, w f32s, eps float32, onePlus bool) {
	row := make([]float64, hd)
	for i := range row {
		row[i] = float64(x.at(b + i))
	}
	rmsApply(row, w, eps, onePlus, func(i int, v float32) { x.set(b+i, v) })
}

// route is moe_route's model over R rows of E logits (ldl apart): the
// softmax written back, then kernels.TopK's selection into ids and wv.
func (f *fakeGPU) route(lg f32s, ldl, E, k int, renorm bool, ids []byte, wv f32s, R int) {
	for r := range R {
		p := make([]float64, E)
		mx := math.Inf(-1)
		for e := range E {
			mx = math.Max(mx, float64(lg.at(r*ldl+e)))
		}
		var sum float64
		for e := range E {
			p[e] = float64(float32(math.Exp(float64(lg.at(r*ldl+e)) - mx)))
			sum += p[e]
		}
		pf := make([]float32, E)
		for e := range E {
			pf[e] = float32(p[e]) * float32(1/sum)
			lg.set(r*ldl+e, pf[e])
		}
		idx, w := make([]int, k), make([]float32, k)
		kernels.TopK(pf, renorm, idx, w)
		for j := range k {
			binary.LittleEndian.PutUint32(ids[4*(r*k+j):], uint32(int32(idx[j])))
			wv.set(r*k+j, w[j])
		}
	}
}

// moeActs is an expert product's input as the device has it: int8 per
// block of 32 (kern.ActQuant) for quantized experts, float for the rest.
func moeActs(fam string, xp []float32) []float64 {
	if fam == "q8row" || fam == "q4tp" {
		return kern.ActQuant(xp)
	}
	xq := make([]float64, len(xp))
	for i, v := range xp {
		xq[i] = float64(v)
	}
	return xq
}

// moeProductQ is expert e's matrix m (of the table's nmat·E pointers)
// times the activations xq as the device takes them (moeActs).
func (f *fakeGPU) moeProductQ(fam string, table driver.DevicePtr, E, e, m, rowsE, cols int, xq []float64) []float32 {
	wp := driver.DevicePtr(binary.LittleEndian.Uint64(f.bytesAt(table.Add(int64(8*(m*E+e))), 8)))
	w := f.weights(fam, wp, rowsE, cols)
	y := make([]float32, rowsE)
	for o := range y {
		var acc float64
		for i, xv := range xq {
			acc += float64(w[o*cols+i]) * xv
		}
		y[o] = float32(acc)
	}
	return y
}

// moeProduct is moeProductQ of the float activations xp.
func (f *fakeGPU) moeProduct(fam string, table driver.DevicePtr, E, e, m, rowsE, cols int, xp []float32) []float32 {
	return f.moeProductQ(fam, table, E, e, m, rowsE, cols, moeActs(fam, xp))
}

// exec runs one launch's model on the fake memory.
func (f *fakeGPU) exec(c *fakeCall) {
	g := c.cfg.Grid
	switch name := c.name; {
	case strings.HasPrefix(name, "embed_"):
		rows, cols, ldo, R := c.int(1), c.int(2), c.int(5), int(g.X)
		w := f.weights(strings.TrimPrefix(name, "embed_"), c.ptr(0), rows, cols)
		ids, _ := f.ints(c.ptr(3), R)
		out := f.view(c.ptr(4), int(rowsSpan(R, ldo, cols)/4))
		for r, id := range ids {
			for i := range cols {
				out.set(r*ldo+i, w[id*cols+i])
			}
		}
	case name == "rmsnorm":
		R, ldx, ldy, n, eps, op := int(g.X), c.int(1), c.int(4), c.int(5), c.f32(6), c.int(7) != 0
		x, w, y := f.view(c.ptr(0), int(rowsSpan(R, ldx, n)/4)), f.view(c.ptr(2), n), f.view(c.ptr(3), int(rowsSpan(R, ldy, n)/4))
		for r := range R {
			row := make([]float64, n)
			for i := range row {
				row[i] = float64(x.at(r*ldx + i))
			}
			rmsApply(row, w, eps, op, func(i int, v float32) { y.set(r*ldy+i, v) })
		}
	case name == "head_rmsnorm":
		nh, R, ldx, hd, eps, op := int(g.X), int(g.Y), c.int(1), c.int(3), c.f32(4), c.int(5) != 0
		x, w := f.view(c.ptr(0), int(rowsSpan(R, ldx, nh*hd)/4)), f.view(c.ptr(2), hd)
		for r := range R {
			for h := range nh {
				f.headNorm(x, r*ldx+h*hd, hd, w, eps, op)
			}
		}
	case strings.HasPrefix(name, "mv_q8row_"), strings.HasPrefix(name, "mv_q4tp_"):
		// matvec.cu's mq_* kernels: stacked tensors, a prologue, int8
		// activations per block of 32 (kern.ActQuant).
		fam := strings.Split(name, "_")[1]
		var R int
		fmt.Sscanf(strings.Split(name, "_")[2], "r%d", &R)
		rows := [3]int{c.int(3), c.int(4), c.int(5)}
		cols, ldx, xoff, ldy, acc, eps, pro := c.int(6), c.int(8), c.int(9), c.int(11), c.int(15) != 0, c.f32(17), c.int(18)
		N := rows[0] + rows[1] + rows[2]
		span := rowsSpan(R, ldx, cols)
		if pro == kern.ProSilu {
			span = rowsSpan(R, ldx, xoff+cols)
		}
		x, y := f.view(c.ptr(7), int(span/4)), f.view(c.ptr(10), int(rowsSpan(R, ldy, N)/4))
		var nw f32s
		if pro == kern.ProNorm || pro == kern.ProNorm1 {
			nw = f.view(c.ptr(16), cols)
		}
		for r := range R {
			xp := make([]float32, cols)
			switch pro {
			case kern.ProPlain:
				for i := range xp {
					xp[i] = x.at(r*ldx + i)
				}
			case kern.ProNorm, kern.ProNorm1:
				row := make([]float64, cols)
				for i := range row {
					row[i] = float64(x.at(r*ldx + i))
				}
				rmsApply(row, nw, eps, pro == kern.ProNorm1, func(i int, v float32) { xp[i] = v })
			case kern.ProSilu:
				for i := range xp {
					v := float64(x.at(r*ldx + i))
					xp[i] = float32(v / (1 + math.Exp(-v)) * float64(x.at(r*ldx+xoff+i)))
				}
			}
			xq := kern.ActQuant(xp)
			v0 := 0
			for j := range 3 {
				if rows[j] == 0 {
					continue
				}
				w := f.weights(fam, c.ptr(j), rows[j], cols)
				var b f32s
				if bias := c.ptr(12 + j); bias != 0 {
					b = f.view(bias, rows[j])
				}
				for o := range rows[j] {
					var s float64
					for i, xv := range xq {
						s += float64(w[o*cols+i]) * xv
					}
					v := float32(s)
					if b != nil {
						v += b.at(o)
					}
					if acc {
						v += y.at(r*ldy + v0 + o)
					}
					y.set(r*ldy+v0+o, v)
				}
				v0 += rows[j]
			}
		}
	case name == "gemmq_actq" || name == "gemmq_actq_pro":
		// ActQuant's int8 per block of 32 (q4tp: each 8 in the order
		// 0,2,4,6,1,3,5,7), quants at [t][cols], scales at [t][cols/32];
		// gemmq_actq_pro of rmsnorm's or silu_mul's values (their models).
		ldx, cols, perm, T := c.int(1), c.int(2), c.int(5), int(g.Y)
		nb := cols / 32
		x, d := f.view(c.ptr(0), int(rowsSpan(T, ldx, cols)/4)), f.view(c.ptr(4), T*nb)
		xq := f.bytesAt(c.ptr(3), int64(T*cols))
		for t := range T {
			row := make([]float32, cols)
			for i := range row {
				row[i] = x.at(t*ldx + i)
			}
			if name == "gemmq_actq_pro" {
				f.actPrologue(c, 6, t, ldx, row, T)
			}
			for b := range nb {
				var amax float32
				nan := false
				for i := range 32 {
					v := row[32*b+i]
					nan = nan || v != v
					amax = max(amax, float32(math.Abs(float64(v))))
				}
				var id, s float32
				if !nan && amax >= 0x1p-120 {
					id, s = 127/amax, amax/127
				}
				for i := range 32 {
					q := int8(math.RoundToEven(float64(row[32*b+i] * id)))
					xq[t*cols+32*b+qpos(i, perm)] = byte(q)
				}
				d.set(t*nb+b, s)
			}
		}
	case name == "gemmh_acth":
		// kern.GemmHActivation of x or of its prologue (gemmq_actq_pro's),
		// element 8q+m of each block of 32 at 2q + m/4 + 8·(m%4).
		ldx, cols, T := c.int(1), c.int(2), int(g.Y)
		x := f.view(c.ptr(0), int(rowsSpan(T, ldx, cols)/4))
		xh := f.bytesAt(c.ptr(3), 2*int64(T*cols))
		for t := range T {
			row := make([]float32, cols)
			for i := range row {
				row[i] = x.at(t*ldx + i)
			}
			if c.int(4) != kern.ProPlain {
				f.actPrologue(c, 4, t, ldx, row, T)
			}
			for k, v := range row {
				m, q := k&7, (k&31)>>3
				binary.LittleEndian.PutUint16(xh[2*(t*cols+k&^31+2*q+m>>2+8*(m&3)):], half.F32ToF16(kern.GemmHActivation(v)))
			}
		}
	case strings.HasPrefix(name, "gemmh_q4tp_w"):
		// Σ_k kern.GemmHWeights(w)[o,k]·h(x)[t,k] (+ bias) =|+= Y over up to three tensors.
		g := fakeGemmHArgs(c)
		xh := f.bytesAt(g.xq, 2*int64(g.T*g.cols))
		xv := make([][]float64, g.T)
		for t := range g.T {
			xv[t] = make([]float64, g.cols)
			for k := range g.cols {
				m, q := k&7, (k&31)>>3
				xv[t][k] = float64(half.F16ToF32(binary.LittleEndian.Uint16(xh[2*(t*g.cols+k&^31+2*q+m>>2+8*(m&3)):])))
			}
		}
		if hout, ldh := c.ptr(15), c.int(16); hout != 0 {
			// SwiGLU mode: h = silu(gate)·up, rounded as gemmh_acth rounds, into hout.
			xh := f.bytesAt(hout, 2*int64(g.T*ldh))
			I := g.parts[0].rows
			for t, row := range f.gemmValues("q4tph", g, xv) {
				for o := range I {
					gv, uv := float64(row[o]), float64(row[I+o])
					h := float32(gv / (1 + math.Exp(-gv)) * uv)
					m, q := o&7, (o&31)>>3
					binary.LittleEndian.PutUint16(xh[2*(t*ldh+o&^31+2*q+m>>2+8*(m&3)):], half.F32ToF16(kern.GemmHActivation(h)))
				}
			}
			break
		}
		f.gemmParts("q4tph", g, xv)
	case strings.HasPrefix(name, "gemmq_") && !strings.HasPrefix(name, "gemmq_moe_"):
		// Σ_k w[o,k]·q[t,k]·d[t,k/32] (q8_row: the int8 quants, the row
		// scale after the sum), + bias, =|+= Y; the wide tiles over up to
		// three tensors, side by side in Y.
		fam := strings.Split(name, "_")[1]
		suffix := strings.TrimPrefix(name, "gemmq_"+fam)
		perm := kern.GemmQPerm(fam, suffix)
		g := fakeGemmQArgs(c, kern.WideParams(suffix))
		nb := g.cols / 32
		xq, d := f.bytesAt(g.xq, int64(g.T*g.cols)), f.view(g.d, g.T*nb)
		xv := make([][]float64, g.T)
		for t := range g.T {
			xv[t] = make([]float64, g.cols)
			for k := range g.cols {
				xv[t][k] = float64(int8(xq[t*g.cols+32*(k/32)+qpos(k%32, perm)])) * float64(d.at(t*nb+k/32))
			}
		}
		f.gemmParts(fam, g, xv)
	case strings.HasPrefix(name, "mv_") && !strings.HasPrefix(name, "mv_moe_"), strings.HasPrefix(name, "gemm_"), strings.HasPrefix(name, "mm_"):
		fam := strings.Split(name, "_")[1]
		rows, cols, ldx, ldy := c.int(1), c.int(2), c.int(4), c.int(6)
		var R int
		var bias driver.DevicePtr
		var acc bool
		if strings.HasPrefix(name, "mv_") {
			fmt.Sscanf(strings.Split(name, "_")[2], "r%d", &R)
			bias, acc = c.ptr(7), c.int(8) != 0
		} else {
			R, bias, acc = c.int(7), c.ptr(8), c.int(9) != 0
		}
		var w []float32
		if fam == "q8row" {
			// q8_2f's bytes begin as q8_row's: decode that prefix.
			w = f.weights("q8row", c.ptr(0), rows, cols)
		} else {
			w = f.weights(fam, c.ptr(0), rows, cols)
		}
		x, y := f.view(c.ptr(3), int(rowsSpan(R, ldx, cols)/4)), f.view(c.ptr(5), int(rowsSpan(R, ldy, rows)/4))
		xat := x.at
		if name[0] == 'g' {
			// gemm.cu: activations rounded to bf16; so are non-q8
			// weights (q8 quants are exact in bf16, their row scale is
			// applied after the sum).
			xat = func(i int) float32 { return bf16(x.at(i)) }
			if fam != "q8row" {
				w = bf16Copy(f, w)
			} else {
				w = f.weights("q8quants", c.ptr(0), rows, cols)
			}
		}
		var b f32s
		if bias != 0 {
			b = f.view(bias, rows)
		}
		for r := range R {
			for o := range rows {
				var s float64
				for i := range cols {
					s += float64(w[o*cols+i]) * float64(xat(r*ldx+i))
				}
				v := float32(s)
				if name[0] == 'g' && fam == "q8row" {
					v *= f.q8scale(c.ptr(0), rows, cols, o)
				}
				if b != nil {
					v += b.at(o)
				}
				if acc {
					v += y.at(r*ldy + o)
				}
				y.set(r*ldy+o, v)
			}
		}
	case name == "q82f_prescale":
		off, cols, ldx, ldxs, R := c.i64(1), c.int(2), c.int(4), c.int(6), int(g.Y)
		col := f32s(f.bytesAt(c.ptr(0).Add(off), 4*int64(cols)))
		x, xs := f.view(c.ptr(3), int(rowsSpan(R, ldx, cols)/4)), f.view(c.ptr(5), int(rowsSpan(R, ldxs, cols)/4))
		for r := range R {
			for i := range cols {
				xs.set(r*ldxs+i, x.at(r*ldx+i)*col.at(i))
			}
		}
	case name == "rope_qk_append" || name == "rope_qk_append_h":
		ld, nq, nkv, hd, ctx, R := c.int(1), c.int(2), c.int(3), c.int(4), c.int(12), int(g.Y)
		qkv := f.view(c.ptr(0), int(rowsSpan(R, ld, (nq+2*nkv)*hd)/4))
		f.ropeQKAppend(qkv, ld, nq, nkv, hd, c.int(5), c.ptr(6), c.f32(7), c.ptr(8), c.ptr(9), c.ptr(10), c.ptr(11), ctx,
			c.ptr(13), c.ptr(14), c.f32(15), c.int(16) != 0, R, name == "rope_qk_append_h")
	case name == "attn_rope_tiles" || name == "attn_rope_tiles_h":
		// rope_qk_append on a copy of q|k|v (the kernel leaves it as it
		// is), then attn_tiles over the copy.
		ldq, nq, nkv, hd, ctx, R := c.int(1), c.int(10), c.int(11), c.int(12), c.int(13), int(g.Z)
		f16 := name == "attn_rope_tiles_h"
		qkv := f32s(bytes.Clone(f.view(c.ptr(0), int(rowsSpan(R, ldq, (nq+2*nkv)*hd)/4))))
		f.ropeQKAppend(qkv, ldq, nq, nkv, hd, c.int(19), c.ptr(17), c.f32(18), c.ptr(4), c.ptr(5), c.ptr(2), c.ptr(3), ctx,
			c.ptr(20), c.ptr(21), c.f32(22), c.int(23) != 0, R, f16)
		f.attnTiles(c, qkv, f16, R)
	case name == "attn_split":
		ldq, nq, nkv, hd, ctx, nsplit, scale := c.int(1), c.int(7), c.int(8), c.int(9), c.int(10), c.int(11), c.f32(12)
		R := int(g.Z)
		q := f.view(c.ptr(0), int(rowsSpan(R, ldq, nq*hd)/4))
		per := f.seqs * nkv * ctx * hd
		kc, vc := f.view(c.ptr(2), per), f.view(c.ptr(3), per)
		pos, _ := f.ints(c.ptr(4), R)
		slot, _ := f.ints(c.ptr(5), R)
		part := f.view(c.ptr(6), R*nq*nsplit*(hd+2))
		G := nq / nkv
		for r := range R {
			n := min(max(pos[r]+1, 0), ctx)
			chunk := (n + nsplit - 1) / nsplit
			for s := range nsplit {
				t0, t1 := s*chunk, min(n, s*chunk+chunk)
				for h := range nq {
					base := (slot[r]*nkv + h/G) * ctx * hd
					m, l := math.Inf(-1), 0.0
					o := make([]float64, hd)
					for t := t0; t < t1; t++ {
						var dot float64
						for d := range hd {
							dot += float64(q.at(r*ldq+h*hd+d)) * float64(kc.at(base+t*hd+d))
						}
						sc := dot * float64(scale)
						mn := math.Max(m, sc)
						corr, p := math.Exp(m-mn), math.Exp(sc-mn)
						l = l*corr + p
						for d := range hd {
							o[d] = o[d]*corr + p*float64(vc.at(base+t*hd+d))
						}
						m = mn
					}
					pb := ((r*nq+h)*nsplit + s) * (hd + 2)
					part.set(pb, float32(m))
					part.set(pb+1, float32(l))
					for d := range hd {
						part.set(pb+2+d, float32(o[d]))
					}
				}
			}
		}
	case name == "attn_merge":
		ldo, nq, hd, nsplit := c.int(2), c.int(3), c.int(4), c.int(5)
		R := int(g.Y)
		part, out := f.view(c.ptr(0), R*nq*nsplit*(hd+2)), f.view(c.ptr(1), int(rowsSpan(R, ldo, nq*hd)/4))
		for r := range R {
			for h := range nq {
				pb := (r*nq + h) * nsplit * (hd + 2)
				M := math.Inf(-1)
				for s := range nsplit {
					M = math.Max(M, float64(part.at(pb+s*(hd+2))))
				}
				var L float64
				O := make([]float64, hd)
				for s := range nsplit {
					ms := float64(part.at(pb + s*(hd+2)))
					if math.IsInf(ms, -1) {
						continue
					}
					e := math.Exp(ms - M)
					L += float64(part.at(pb+s*(hd+2)+1)) * e
					for d := range hd {
						O[d] += float64(part.at(pb+s*(hd+2)+2+d)) * e
					}
				}
				for d := range hd {
					v := 0.0
					if L > 0 {
						v = O[d] / L
					}
					out.set(r*ldo+h*hd+d, float32(v))
				}
			}
		}
	case name == "attn_tiles" || name == "attn_tiles_h" || strings.HasPrefix(name, "attn_mma_h_d"):
		ldq, nq, R := c.int(1), c.int(10), int(g.Z)
		f.attnTiles(c, f.view(c.ptr(0), int(rowsSpan(R, ldq, nq*c.int(12))/4)), name != "attn_tiles", R)
	case name == "argmax":
		// sample.cu's argmax: ties to the lowest index, NaN never chosen.
		ld, n, R := c.int(1), c.int(2), int(g.X)
		lg := f.view(c.ptr(0), int(rowsSpan(R, ld, n)/4))
		next := f.bytesAt(c.ptr(3), 4*int64(R))
		for r := range R {
			best := -1
			for i := range n {
				v := lg.at(r*ld + i)
				if v == v && (best < 0 || v > lg.at(r*ld+best)) {
					best = i
				}
			}
			binary.LittleEndian.PutUint32(next[4*r:], uint32(int32(best)))
		}
	case name == "gate_split":
		lds, ldq, ldg, nq, hd, kv, R := c.int(1), c.int(3), c.int(5), c.int(6), c.int(7), c.int(8), int(g.Y)
		qd := nq * hd
		src := f.view(c.ptr(0), int(rowsSpan(R, lds, 2*qd+kv)/4))
		qkv, gate := f.view(c.ptr(2), int(rowsSpan(R, ldq, qd+kv)/4)), f.view(c.ptr(4), int(rowsSpan(R, ldg, qd)/4))
		for r := range R {
			for h := range nq {
				for d := range hd {
					qkv.set(r*ldq+h*hd+d, src.at(r*lds+2*h*hd+d))
					gate.set(r*ldg+h*hd+d, src.at(r*lds+2*h*hd+hd+d))
				}
			}
			for i := qd; i < qd+kv; i++ {
				qkv.set(r*ldq+i, src.at(r*lds+qd+i))
			}
		}
	case name == "gate_mul":
		ldy, ldg, n, R := c.int(1), c.int(3), c.int(4), int(g.Y)
		y, gv := f.view(c.ptr(0), int(rowsSpan(R, ldy, n)/4)), f.view(c.ptr(2), int(rowsSpan(R, ldg, n)/4))
		for r := range R {
			for i := range n {
				y.set(r*ldy+i, y.at(r*ldy+i)*float32(1/(1+math.Exp(-float64(gv.at(r*ldg+i))))))
			}
		}
	case name == "moe_route":
		ldl, E, k, renorm, R := c.int(1), c.int(2), c.int(3), c.int(4) != 0, int(g.X)
		f.route(f.view(c.ptr(0), int(rowsSpan(R, ldl, E)/4)), ldl, E, k, renorm, f.bytesAt(c.ptr(5), 4*int64(R*k)), f.view(c.ptr(6), R*k), R)
	case name == "moe_router_f32":
		// rmsnorm into xb, the router's float32 matvec, moe_route.
		ldx, eps, op, H, E, k, renorm, ldl, ldxb, R := c.int(1), c.f32(3), c.int(4) != 0, c.int(6), c.int(7), c.int(8), c.int(9) != 0, c.int(11), c.int(15), int(g.Y)
		x, nw, xb := f.view(c.ptr(0), int(rowsSpan(R, ldx, H)/4)), f.view(c.ptr(2), H), f.view(c.ptr(14), int(rowsSpan(R, ldxb, H)/4))
		W, lg := f.view(c.ptr(5), E*H), f.view(c.ptr(10), int(rowsSpan(R, ldl, E)/4))
		for r := range R {
			row := make([]float64, H)
			for i := range row {
				row[i] = float64(x.at(r*ldx + i))
			}
			rmsApply(row, nw, eps, op, func(i int, v float32) { xb.set(r*ldxb+i, v) })
			for e := range E {
				var acc float64
				for i := range H {
					acc += float64(W.at(e*H+i)) * float64(xb.at(r*ldxb+i))
				}
				lg.set(r*ldl+e, float32(acc))
			}
			if c.ptr(17) != 0 { // the shared expert's gate logit
				sgw, sg := f.view(c.ptr(17), H), f.view(c.ptr(18), R)
				var acc float64
				for i := range H {
					acc += float64(sgw.at(i)) * float64(xb.at(r*ldxb+i))
				}
				sg.set(r, float32(acc))
			}
		}
		f.route(lg, ldl, E, k, renorm, f.bytesAt(c.ptr(12), 4*int64(R*k)), f.view(c.ptr(13), R*k), R)
		if cnt, _ := f.ints(c.ptr(16), R); slices.ContainsFunc(cnt, func(v int) bool { return v != 0 }) {
			f.t.Fatalf("fake: moe_router_f32's counters are %v, not zeros", cnt)
		}
	case strings.HasPrefix(name, "mv_moe_ff_"):
		// mv_moe_* (gate|up, ProPlain) into gu, then mv_moe_dc_* over gu.
		fam := strings.TrimPrefix(name, "mv_moe_ff_")
		E, nslot, k, I, H, ldx, ldgu, ldy := c.int(2), c.int(4), c.int(5), c.int(6), c.int(7), c.int(9), c.int(11), c.int(13)
		sub := func(name string, a *driver.Args) {
			cc := fakeCall{name: name, cfg: c.cfg, args: append([]byte(nil), a.Bytes()...)}
			for i := range a.Len() {
				cc.offs = append(cc.offs, a.Offset(i))
			}
			f.exec(&cc)
		}
		sub("mv_moe_"+fam, new(driver.Args).Ptr(c.ptr(0)).Int(E).Int(2).Ptr(c.ptr(3)).Int(nslot).Int(k).Int(I).Int(H).Ptr(c.ptr(8)).Int(ldx).
			Int(0).Int(0).Ptr(c.ptr(10)).Int(ldgu).Int(kern.ProPlain).Ptr(0).F32(0))
		sub("mv_moe_dc_"+fam, new(driver.Args).Ptr(c.ptr(1)).Int(E).Ptr(c.ptr(3)).Int(nslot).Int(k).Int(H).Int(I).Ptr(c.ptr(10)).Int(ldgu).
			Int(I).Int(kern.ProSilu).Ptr(c.ptr(12)).Int(ldy).Ptr(c.ptr(14)).Ptr(c.ptr(15)).Ptr(c.ptr(16)))
	case strings.HasPrefix(name, "mv_moe_dc_"):
		// mv_moe_* over the slots' SwiGLU rows, then moe_combine into y.
		fam := strings.TrimPrefix(name, "mv_moe_dc_")
		E, nslot, k, rowsE, cols, ldx, xoff, pro, ldy := c.int(1), c.int(3), c.int(4), c.int(5), c.int(6), c.int(8), c.int(9), c.int(10), c.int(12)
		if pro != kern.ProSilu && pro != kern.ProPlain {
			f.t.Fatalf("fake: %s with prologue %d", name, pro)
		}
		R := nslot / k
		x, y := f.view(c.ptr(7), int(rowsSpan(nslot, ldx, xoff+cols)/4)), f.view(c.ptr(11), int(rowsSpan(R, ldy, rowsE)/4))
		ids, wv := f.bytesAt(c.ptr(2), 4*int64(nslot)), f.view(c.ptr(13), nslot)
		var ys, sg f32s
		if c.ptr(14) != 0 {
			ys, sg = f.view(c.ptr(14), int(rowsSpan(R, ldy, rowsE)/4)), f.view(c.ptr(15), R)
		}
		for r := range R {
			acc := make([]float32, rowsE)
			for o := range acc {
				acc[o] = y.at(r*ldy + o)
			}
			for j := range k {
				s := r*k + j
				xp := make([]float32, cols)
				for i := range xp {
					v := float64(x.at(s*ldx + i))
					if pro == kern.ProPlain { // mv_moe_*'s SwiGLU rows (kern.MoEXGLU)
						xp[i] = float32(v)
						continue
					}
					xp[i] = float32(v / (1 + math.Exp(-v)) * float64(x.at(s*ldx+xoff+i)))
				}
				d := f.moeProduct(fam, c.ptr(0), E, int(int32(binary.LittleEndian.Uint32(ids[4*s:]))), 0, rowsE, cols, xp)
				for o := range acc {
					acc[o] += wv.at(s) * d[o]
				}
			}
			for o := range acc {
				if ys != nil {
					acc[o] += float32(1/(1+math.Exp(-float64(sg.at(r))))) * ys.at(r*ldy+o)
				}
				y.set(r*ldy+o, acc[o])
			}
		}
	case strings.HasPrefix(name, "mv_moe_"):
		fam := strings.TrimPrefix(name, "mv_moe_")
		E, nmat := c.int(1), c.int(2)
		nslot, k, rowsE, cols := c.int(4), c.int(5), c.int(6), c.int(7)
		ldx, xoff, xmode, ldy, pro := c.int(9), c.int(10), c.int(11), c.int(13), c.int(14)
		nx := nslot / k
		if xmode == kern.MoEXSlot {
			nx = nslot
		}
		out := nmat * rowsE
		if xmode == kern.MoEXGLU {
			if nmat != 2 || fam != "q4tp" || !kern.MoEGLUFits(quant.Q4TP, cols) {
				f.t.Fatalf("fake: %s with the SwiGLU epilogue over %d matrices of %d columns", name, nmat, cols)
			}
			out = rowsE
		}
		span := rowsSpan(nx, ldx, cols)
		if pro == kern.ProSilu {
			span = rowsSpan(nx, ldx, xoff+cols)
		}
		x, y := f.view(c.ptr(8), int(span/4)), f.view(c.ptr(12), int(rowsSpan(nslot, ldy, out)/4))
		ids := f.bytesAt(c.ptr(3), 4*int64(nslot))
		for s := range nslot {
			xr := s / k
			if xmode == kern.MoEXSlot {
				xr = s
			}
			xp := make([]float32, cols)
			for i := range xp {
				v := x.at(xr*ldx + i)
				if pro == kern.ProSilu {
					v64 := float64(v)
					v = float32(v64 / (1 + math.Exp(-v64)) * float64(x.at(xr*ldx+xoff+i)))
				}
				xp[i] = v
			}
			xq := moeActs(fam, xp)
			e := int(int32(binary.LittleEndian.Uint32(ids[4*s:])))
			if xmode == kern.MoEXGLU {
				g, u := f.moeProductQ(fam, c.ptr(0), E, e, 0, rowsE, cols, xq), f.moeProductQ(fam, c.ptr(0), E, e, 1, rowsE, cols, xq)
				for o := range g {
					v := float64(g[o])
					y.set(s*ldy+o, float32(v/(1+math.Exp(-v))*float64(u[o])))
				}
				continue
			}
			for m := range nmat {
				for o, v := range f.moeProductQ(fam, c.ptr(0), E, e, m, rowsE, cols, xq) {
					y.set(s*ldy+m*rowsE+o, v)
				}
			}
		}
	case name == "moe_sort":
		nslot, E, ntile := c.int(1), c.int(2), c.int(6)
		ids := f.bytesAt(c.ptr(0), 4*int64(nslot))
		perm, inv, tile := f.bytesAt(c.ptr(3), 4*int64(ntile*kern.MoETile)), f.bytesAt(c.ptr(4), 4*int64(nslot)), f.bytesAt(c.ptr(5), 4*int64(ntile))
		put := func(b []byte, i, v int) { binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(v))) }
		for t := range ntile {
			put(tile, t, -1)
		}
		t := 0
		for e := range E {
			i0 := t * kern.MoETile
			i := i0
			for sl := range nslot {
				if int(int32(binary.LittleEndian.Uint32(ids[4*sl:]))) == e {
					put(perm, i, sl)
					put(inv, sl, i)
					i++
				}
			}
			nt := (i - i0 + kern.MoETile - 1) / kern.MoETile
			for ; i < i0+nt*kern.MoETile; i++ {
				put(perm, i, -1)
			}
			for j := range nt {
				if t+j >= ntile {
					f.t.Fatalf("fake: moe_sort needs more than %d tiles", ntile)
				}
				put(tile, t+j, e)
			}
			t += nt
		}
	case name == "moe_gather_q":
		cols, k, rows := c.int(2), c.int(3), int(g.X)
		nb := cols / 32
		perm, tile := f.bytesAt(c.ptr(4), 4*int64(rows)), f.bytesAt(c.ptr(5), 4*int64(rows/kern.MoETile))
		xqs, ds := f.bytesAt(c.ptr(6), int64(rows*cols)), f.view(c.ptr(7), rows*nb)
		for i := range rows {
			if int32(binary.LittleEndian.Uint32(tile[4*(i/kern.MoETile):])) < 0 {
				continue
			}
			sl := int(int32(binary.LittleEndian.Uint32(perm[4*i:])))
			if sl < 0 {
				clear(xqs[i*cols : (i+1)*cols])
				for b := range nb {
					ds.set(i*nb+b, 0)
				}
				continue
			}
			r := sl / k
			copy(xqs[i*cols:(i+1)*cols], f.bytesAt(c.ptr(0).Add(int64(r*cols)), int64(cols)))
			d := f.view(c.ptr(1).Add(int64(4*r*nb)), nb)
			for b := range nb {
				ds.set(i*nb+b, d.at(b))
			}
		}
	case strings.HasPrefix(name, "gemmq_moe_"):
		fam := strings.TrimPrefix(name, "gemmq_moe_")
		rowsE, cols, ldy, T := c.int(2), c.int(3), c.int(7), c.int(8)
		nb := cols / 32
		tile := f.bytesAt(c.ptr(1), 4*int64(T/kern.MoETile))
		xq, d := f.bytesAt(c.ptr(4), int64(T*cols)), f.view(c.ptr(5), T*nb)
		y := f.view(c.ptr(6), int(rowsSpan(T, ldy, rowsE)/4))
		xv := make([]float64, cols)
		for t := range T {
			e := int(int32(binary.LittleEndian.Uint32(tile[4*(t/kern.MoETile):])))
			if e < 0 {
				continue
			}
			wp := driver.DevicePtr(binary.LittleEndian.Uint64(f.bytesAt(c.ptr(0).Add(int64(8*e)), 8)))
			var w []float32
			if fam == "q8row" {
				w = f.weights("q8quants", wp, rowsE, cols)
			} else {
				w = f.weights(fam, wp, rowsE, cols)
			}
			for kk := range cols {
				xv[kk] = float64(int8(xq[t*cols+32*(kk/32)+qpos(kk%32, b2i(fam == "q4tp"))])) * float64(d.at(t*nb+kk/32))
			}
			for o := range rowsE {
				var acc float64
				for kk, v := range xv {
					acc += float64(w[o*cols+kk]) * v
				}
				v := float32(acc)
				if fam == "q8row" {
					v *= f.q8scale(wp, rowsE, cols, o)
				}
				y.set(t*ldy+o, v)
			}
		}
	case name == "moe_combine":
		ldx, ldy, k, n, R := c.int(1), c.int(3), c.int(5), c.int(8), int(g.Y)
		yrows := R * k
		var inv []byte
		if c.ptr(9) != 0 {
			inv = f.bytesAt(c.ptr(9), 4*int64(R*k))
			yrows = 0
			for j := range R * k {
				yrows = max(yrows, int(int32(binary.LittleEndian.Uint32(inv[4*j:])))+1)
			}
		}
		x, y := f.view(c.ptr(0), int(rowsSpan(R, ldx, n)/4)), f.view(c.ptr(2), int(rowsSpan(yrows, ldy, n)/4))
		yrow := func(j int) int {
			if inv == nil {
				return j
			}
			return int(int32(binary.LittleEndian.Uint32(inv[4*j:])))
		}
		wv := f.view(c.ptr(4), R*k)
		var ys, sg f32s
		if c.ptr(6) != 0 {
			ys, sg = f.view(c.ptr(6), int(rowsSpan(R, ldy, n)/4)), f.view(c.ptr(7), R)
		}
		for r := range R {
			for i := range n {
				v := x.at(r*ldx + i)
				for j := range k {
					v += wv.at(r*k+j) * y.at(yrow(r*k+j)*ldy+i)
				}
				if ys != nil {
					v += float32(1/(1+math.Exp(-float64(sg.at(r))))) * ys.at(r*ldy+i)
				}
				x.set(r*ldx+i, v)
			}
		}
	case name == "silu_mul":
		ldi, ldh, n, R := c.int(2), c.int(4), c.int(5), int(g.Y)
		gv, u, h := f.view(c.ptr(0), int(rowsSpan(R, ldi, n)/4)), f.view(c.ptr(1), int(rowsSpan(R, ldi, n)/4)), f.view(c.ptr(3), int(rowsSpan(R, ldh, n)/4))
		for r := range R {
			for i := range n {
				v := float64(gv.at(r*ldi + i))
				h.set(r*ldh+i, float32(v/(1+math.Exp(-v))*float64(u.at(r*ldi+i))))
			}
		}
	case strings.HasPrefix(name, "dn_"):
		f.execDN(c)
	default:
		f.t.Fatalf("fake: no model of kernel %s", name)
	}
}

// ropeQKAppend is rope.cu's rope_qk_append over qkv (R rows of ld floats:
// q | k | v heads of hd): the fused q/k norms (qw, kw: 0 for none), the
// rotation of q and k in place, and k and v into the caches at each row's
// position and slot.
func (f *fakeGPU) ropeQKAppend(qkv f32s, ld, nq, nkv, hd, rot int, invP driver.DevicePtr, ms float32, posP, slotP, kcP, vcP driver.DevicePtr,
	ctx int, qw, kw driver.DevicePtr, eps float32, onePlus bool, R int, f16 bool) {
	inv := f.view(invP, max(rot/2, 1))
	pos, _ := f.ints(posP, R)
	slot, _ := f.ints(slotP, R)
	per := f.seqs * nkv * ctx * hd
	kc, vc := f.kv(kcP, per, f16), f.kv(vcP, per, f16)
	rotate := func(b, p int) {
		for i := range rot / 2 {
			ang := float32(p) * inv.at(i)
			cs, sn := float32(math.Cos(float64(ang)))*ms, float32(math.Sin(float64(ang)))*ms
			a, bb := qkv.at(b+i), qkv.at(b+i+rot/2)
			qkv.set(b+i, a*cs-bb*sn)
			qkv.set(b+i+rot/2, bb*cs+a*sn)
		}
	}
	for r := range R {
		for h := range nq + nkv {
			nw := qw
			if h >= nq {
				nw = kw
			}
			if nw != 0 { // the fused q/k norms
				f.headNorm(qkv, r*ld+h*hd, hd, f.view(nw, hd), eps, onePlus)
			}
			rotate(r*ld+h*hd, pos[r])
		}
		if pos[r] < 0 || pos[r] >= ctx {
			continue
		}
		for j := range nkv {
			base := ((slot[r]*nkv+j)*ctx + pos[r]) * hd
			for d := range hd {
				kc.set(base+d, qkv.at(r*ld+(nq+j)*hd+d))
				vc.set(base+d, qkv.at(r*ld+(nq+nkv+j)*hd+d))
			}
		}
	}
}

// attnTiles is attn.cu's attn_tiles (and attn_mma_h's) over q (R rows of
// c's ldq): split and merge in one launch; the result is the
// softmax-weighted sum over each row's positions (the splits only change
// the rounding), zeros for no position.
func (f *fakeGPU) attnTiles(c *fakeCall, q f32s, f16 bool, R int) {
	ldq, ldo, nq, nkv, hd, ctx, scale := c.int(1), c.int(9), c.int(10), c.int(11), c.int(12), c.int(13), c.f32(15)
	per := f.seqs * nkv * ctx * hd
	kc, vc := f.kv(c.ptr(2), per, f16), f.kv(c.ptr(3), per, f16)
	if nsplit := c.int(14); nsplit > 1 {
		// The last-block merge needs its counters at zero on entry
		// (bufZeroed's clear; the kernel leaves them zero).
		cnt, _ := f.ints(c.ptr(7), R*nkv)
		for i, v := range cnt {
			if v != 0 {
				f.t.Fatalf("fake: attn_tiles counter %d is %d at launch, want 0", i, v)
			}
		}
	}
	pos, _ := f.ints(c.ptr(4), R)
	slot, _ := f.ints(c.ptr(5), R)
	out := f.view(c.ptr(8), int(rowsSpan(R, ldo, nq*hd)/4))
	G := nq / nkv
	for r := range R {
		n := min(max(pos[r]+1, 0), ctx)
		for h := range nq {
			base := (slot[r]*nkv + h/G) * ctx * hd
			sc := make([]float64, n)
			M := math.Inf(-1)
			for t := range n {
				var dot float64
				for d := range hd {
					dot += float64(q.at(r*ldq+h*hd+d)) * float64(kc.at(base+t*hd+d))
				}
				sc[t] = dot * float64(scale)
				M = math.Max(M, sc[t])
			}
			var L float64
			o := make([]float64, hd)
			for t := range n {
				p := math.Exp(sc[t] - M)
				L += p
				for d := range hd {
					o[d] += p * float64(vc.at(base+t*hd+d))
				}
			}
			for d := range hd {
				v := 0.0
				if L > 0 {
					v = o[d] / L
				}
				out.set(r*ldo+h*hd+d, float32(v))
			}
		}
	}
	if c.ptr(16) != 0 { // the half GEMM's f16 copy, gemmh_acth's order
		w := nq * hd
		xh := f.bytesAt(c.ptr(16), 2*int64(R*w))
		for r := range R {
			for k := range w {
				m, q := k&7, (k&31)>>3
				binary.LittleEndian.PutUint16(xh[2*(r*w+k&^31+2*q+m>>2+8*(m&3)):], half.F32ToF16(kern.GemmHActivation(out.at(r*ldo+k))))
			}
		}
	}
}

func (c *fakeCall) f32(i int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(c.args[c.offs[i]:]))
}

// fakeParity runs every parity-suite case tol accepts (a negative
// tolerance skips the case) under every schedule on the fake device d and
// on the CPU backend c, fails a run whose logits' NMSE exceeds tol, and
// returns the worst NMSE per format and per Gated DeltaNet case. seen, if
// set, gets each run's launches (f.calls from the run's start).
func fakeParity(t *testing.T, label string, f *fakeGPU, d *Device, c *cpu.Device, tol func(backendtest.Case) float64,
	seen func(k backendtest.Case, sched string, launched []fakeCall)) (worst map[quant.DType]float64, worstDN map[string]float64) {
	t.Helper()
	worst, worstDN = map[quant.DType]float64{}, map[string]float64{}
	for _, k := range backendtest.Cases() {
		tl := tol(k)
		if tl < 0 {
			continue
		}
		for name, sched := range backendtest.Schedules() {
			n0 := len(f.calls)
			got, err := backendtest.Run(d, k, sched, 11)
			if notYet(err) {
				t.Logf("%s: NOT RUN (%v)", k.Name, err)
				continue
			}
			if err != nil {
				t.Fatalf("%s: %s / %s: %v", label, k.Name, name, err)
			}
			if seen != nil {
				seen(k, name, f.calls[n0:])
			}
			want, err := backendtest.Run(c, k, sched, 11)
			if err != nil {
				t.Fatal(err)
			}
			n := backendtest.NMSE(got, want)
			worst[k.DType] = max(worst[k.DType], n)
			if k.Op == "deltanet" {
				worstDN[k.Name] = max(worstDN[k.Name], n)
			}
			if n > tl || math.IsNaN(n) {
				t.Errorf("%s: %s / %s: NMSE %.3g against the CPU (tolerance %.0g)", label, k.Name, name, n, tl)
			}
		}
	}
	return worst, worstDN
}

// TestParitySuiteNumericOnFake runs the GPU parity suite (every case and
// schedule) on the fake with the kernels' models and Options.NoMMQ (the
// bf16 GEMM's path) and compares its logits with the CPU backend's at
// TestGPUParityBF16GEMM's tolerances, with graphs on (replays re-run the
// recorded launches) and off.
func TestParitySuiteNumericOnFake(t *testing.T) {
	c := cpu.New(1)
	defer c.Close()
	for _, graphs := range []bool{false, true} {
		f := newFake(t, 4)
		f.numeric, f.decoded = true, map[string][]float32{}
		d := fakeOpen(f, Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: graphs, NoMMQ: true})
		worst, worstDN := fakeParity(t, fmt.Sprintf("graphs %v", graphs), f, d, c, func(k backendtest.Case) float64 {
			switch k.DType {
			case quant.Q8Row, quant.Q82F, quant.Q4TP:
				if k.Op == "deltanet" {
					// Six projections' prefill GEMMs on bf16 activations
					// against the CPU's int8 ones: up to 2.4e-4 (q8_2f,
					// grouped, prefill9), TestGPUParity's 3e-4. With MMQ
					// (activations quantized as the CPU does) the same
					// cases are within 1e-5 (TestParitySuiteNumericOnFakeMMQ).
					return 3e-4
				}
				return 2e-4 // the CPU runs quantized formats on int8 activations (worst here ≈1.1e-4)
			}
			return 1e-9
		}, nil)
		t.Logf("graphs %v: worst NMSE against the CPU per format: %v; of the Gated DeltaNet cases: %v", graphs, worst, worstDN)
		if graphs && f.replays == 0 {
			t.Fatal("no step was replayed")
		}
	}
}

// TestParitySuiteNumericOnFakeMMQ: the parity suite's quantized cases with
// the default options (steps of more than 8 rows on gemmq_actq + gemmq_*), graphs
// on and off, against the CPU; the int8 GEMM must actually have run. The
// tolerance is 1e-5, 20× tighter than the bf16 GEMM's suite: the models
// quantize the activations exactly as the CPU's int8 kernels do, so only
// float rounding is left (worst seen ≈3e-7, q4tp) — a wrong quant order,
// scale or stride shows as ≥1e-3. Then Options.F16Wide, where q4tp's
// steps of 33 to 64 rows take the half wide tiles (gemmh_acth +
// gemmh_q4tp_w*, which must have run, o_proj's on attn_tiles' f16 copy
// with no gemmh_acth, gate|up with SwiGLU in its epilogue writing down's
// input): q4tp within 3e-4 of the CPU (its activations
// rounded to f16, not to int8: ~1.5e-4 seen), the rest 1e-5.
func TestParitySuiteNumericOnFakeMMQ(t *testing.T) {
	for _, exact := range []bool{true, false} {
		t.Run(map[bool]string{true: "int8", false: "f16wide"}[exact], func(t *testing.T) { numericOnFakeMMQ(t, exact) })
	}
}

func numericOnFakeMMQ(t *testing.T, exact bool) {
	c := cpu.New(1)
	defer c.Close()
	for _, graphs := range []bool{false, true} {
		f := newFake(t, 4)
		f.numeric, f.decoded = true, map[string][]float32{}
		// f16wide as cortiq runs it: with the float16 cache (KVF16), which
		// the tensor-core attention needs.
		d := fakeOpen(f, Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: graphs, F16Wide: !exact, KVF16: !exact})
		ran, ranB, fromAttn, swiglu, mma := 0, 0, 0, 0, 0
		worst, worstDN := fakeParity(t, fmt.Sprintf("graphs %v", graphs), f, d, c, func(k backendtest.Case) float64 {
			switch {
			case k.DType != quant.Q8Row && k.DType != quant.Q82F && k.DType != quant.Q4TP:
				return -1
			case !exact && k.DType == quant.Q4TP:
				return 3e-4
			case !exact:
				return 1e-4 // the float16 cache (TestGPUParityKVF16's bound)
			}
			return 1e-5
		}, func(k backendtest.Case, name string, launched []fakeCall) {
			for _, call := range launched {
				if strings.HasPrefix(call.name, "gemmq_") && !strings.HasPrefix(call.name, "gemmq_actq") {
					ran++
				}
				if strings.HasPrefix(call.name, "gemmh_q4tp_w") {
					ranB++
					if call.ptr(15) != 0 {
						swiglu++
					}
					if exact {
						t.Errorf("%s / %s: %s ran without F16Wide", k.Name, name, call.name)
					}
				}
				if strings.HasPrefix(call.name, "gemm_") {
					t.Errorf("%s / %s: %s ran with MMQ on", k.Name, name, call.name)
				}
			}
			// attn_tiles (or attn_mma_h) with the f16 copy: o_proj's half GEMM reads it, no gemmh_acth between.
			for i, call := range launched {
				if !strings.HasPrefix(call.name, "attn_tiles") && !strings.HasPrefix(call.name, "attn_mma_h") || call.ptr(16) == 0 {
					continue
				}
				if strings.HasPrefix(call.name, "attn_mma_h") {
					mma++
				}
				for _, next := range launched[i+1:] {
					if strings.HasPrefix(next.name, "gemmh_") {
						if next.name == "gemmh_acth" || next.ptr(7) != call.ptr(16) {
							t.Errorf("%s / %s: %s after attn_tiles' f16 copy", k.Name, name, next.name)
						}
						fromAttn++
						break
					}
				}
			}
		})
		t.Logf("graphs %v: worst NMSE against the CPU per format: %v; of the Gated DeltaNet cases: %v; %d tensor-core attentions", graphs, worst, worstDN, mma)
		if ran == 0 {
			t.Fatal("no int8 GEMM ran")
		}
		if !exact && (ranB == 0 || fromAttn == 0 || swiglu == 0 || mma == 0) {
			t.Fatalf("half wide GEMMs: %d ran, %d on attn_tiles' or attn_mma_h's f16 copy, %d gate|up with SwiGLU, %d tensor-core attentions (attention/q4tp/hd64)",
				ranB, fromAttn, swiglu, mma)
		}
		if exact && mma != 0 {
			t.Fatalf("%d tensor-core attentions without F16Wide", mma)
		}
	}
}

// TestMoEGroupedOnFake: the parity suite's mixture-of-experts cases run
// their steps of more than 8 rows grouped by expert (moe_sort,
// moe_gather_q, gemmq_moe_*: the kernels' models) and give the CPU's
// logits to float rounding (the grouped path quantizes activations as the
// CPU does; the dense layers on the int8 GEMM too: Options.MMQ), graphs on
// and off; with Options.NoMoEGroups no grouped kernel runs and the logits
// are the same to rounding.
func TestMoEGroupedOnFake(t *testing.T) {
	for _, graphs := range []bool{false, true} {
		grouped := 0
		d := moeVariantsOnFake(t, graphs, "per-slot", Options{NoMoEGroups: true}, func(k backendtest.Case) bool { return strings.HasPrefix(k.Name, "moe/") },
			func(k backendtest.Case, name string, calls, alt []fakeCall) {
				for _, call := range calls {
					if strings.HasPrefix(call.name, "gemmq_moe_") {
						grouped++
					}
				}
				for _, call := range alt {
					if strings.HasPrefix(call.name, "gemmq_moe_") || call.name == "moe_sort" {
						t.Fatalf("%s / %s: %s ran with NoMoEGroups", k.Name, name, call.name)
					}
				}
			})
		if grouped == 0 {
			t.Fatal("no grouped expert GEMM ran")
		}
		// The memory plan bounds the scratch the grouped steps used.
		var used int64
		for _, b := range d.st.bufs {
			used += b.n
		}
		for _, k := range backendtest.Cases() {
			if !strings.HasPrefix(k.Name, "moe/q") {
				continue
			}
			spec := backend.SeqSpec{Layers: 1, KVHeads: k.KVHeads, HeadDim: k.HeadDim,
				MoE: backend.MoEShape{Experts: k.Experts, TopK: k.TopK, Inter: k.I, SharedInter: k.I}}
			if plan := scratchBytes(d.opt.MaxRows, max(k.H, 2*k.I, k.Vocab), spec, d.info.SMs, true); used > plan {
				t.Errorf("graphs %v: the MoE steps' scratch is %d bytes, the plan's bound %d", graphs, used, plan)
			}
			if plan := scratchBytes(d.opt.MaxRows, max(k.H, 2*k.I, k.Vocab), backend.SeqSpec{Layers: 1, KVHeads: k.KVHeads, HeadDim: k.HeadDim},
				d.info.SMs, true); used <= plan {
				t.Logf("graphs %v: the plan without the MoE shape would also hold it (%d ≤ %d)", graphs, used, plan)
			}
			break
		}
		t.Logf("graphs %v: %d grouped expert GEMMs", graphs, grouped)
	}
}

// moeVariantsOnFake runs the parity-suite cases keep accepts under every
// schedule on two fake devices (the default options, and those with alt's
// switches) and on the CPU: the default's logits within 1e-5 NMSE of the
// CPU's and 1e-9 of the alternative's; check gets each run's launches on
// both. It returns the default device.
func moeVariantsOnFake(t *testing.T, graphs bool, label string, alt Options, keep func(backendtest.Case) bool,
	check func(k backendtest.Case, name string, calls, alt []fakeCall)) *Device {
	c := cpu.New(1)
	defer c.Close()
	f := newFake(t, 4)
	f.numeric, f.decoded = true, map[string][]float32{}
	d := fakeOpen(f, Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: graphs})
	f2 := newFake(t, 4)
	f2.numeric, f2.decoded = true, map[string][]float32{}
	alt.Seqs, alt.Ctx, alt.MaxRows, alt.Graphs = 4, 128, 64, graphs
	d2 := fakeOpen(f2, alt)
	for _, k := range backendtest.Cases() {
		if !keep(k) {
			continue
		}
		for name, sched := range backendtest.Schedules() {
			n0, m0 := len(f.calls), len(f2.calls)
			got, err := backendtest.Run(d, k, sched, 11)
			if notYet(err) {
				t.Logf("%s: NOT RUN (%v)", k.Name, err)
				break
			}
			if err != nil {
				t.Fatalf("%s / %s: %v", k.Name, name, err)
			}
			other, err := backendtest.Run(d2, k, sched, 11)
			if err != nil {
				t.Fatalf("%s / %s (%s): %v", k.Name, name, label, err)
			}
			check(k, name, f.calls[n0:], f2.calls[m0:])
			want, err := backendtest.Run(c, k, sched, 11)
			if err != nil {
				t.Fatal(err)
			}
			if n := backendtest.NMSE(got, want); n > 1e-5 || math.IsNaN(n) {
				t.Errorf("graphs %v: %s / %s: NMSE %.3g against the CPU (tolerance 1e-5)", graphs, k.Name, name, n)
			}
			if n := backendtest.NMSE(got, other); n > 1e-9 || math.IsNaN(n) {
				t.Errorf("graphs %v: %s / %s: NMSE %.3g against the %s run (tolerance 1e-9)", graphs, k.Name, name, n, label)
			}
		}
	}
	return d
}

// TestMoEFusedOnFake: the parity suite's mixture-of-experts cases with
// quantized experts run their decode steps' MoE blocks fused
// (moe_router_f32 for the norm, router and routing; mv_moe_dc_* for the
// down products and the combine: no moe_route or moe_combine in a step of
// at most 8 rows; the shared expert's gate|up stacked and its SwiGLU in the
// down matvec's prologue: no silu_mul) and give the logits of Options.NoFusion (the general
// launches, none of the fused kernels) to rounding and the CPU's to 1e-5.
func TestMoEFusedOnFake(t *testing.T) {
	quantized := func(k backendtest.Case) bool {
		return k.Op == "moe" && (k.DType == quant.Q8Row || k.DType == quant.Q4TP)
	}
	for _, graphs := range []bool{false, true} {
		fused, shared := 0, 0
		moeVariantsOnFake(t, graphs, "NoFusion", Options{NoFusion: true}, quantized, func(k backendtest.Case, name string, calls, alt []fakeCall) {
			small := strings.HasPrefix(name, "prefill") && name != "prefill9+decode" // every step ≤ 8 rows
			routers := 0
			for _, call := range calls {
				switch {
				case call.name == "moe_router_f32":
					routers++
					if k.Shared != (call.ptr(17) != 0) {
						t.Errorf("%s / %s: shared expert %v, the router's gate row %#x", k.Name, name, k.Shared, call.ptr(17))
					}
				case strings.HasPrefix(call.name, "mv_f32_r") && small:
					t.Errorf("%s / %s: %s beside moe_router_f32 (the shared gate is the router's)", k.Name, name, call.name)
				case strings.HasPrefix(call.name, "mv_moe_dc_"):
					fused++
					if call.ptr(14) != 0 {
						shared++
					}
				case strings.HasPrefix(call.name, "mv_moe_ff_"):
					t.Errorf("%s / %s: mv_moe_ff_* ran without Options.MoEFF", k.Name, name)
				case call.name == "moe_combine" && call.ptr(9) == 0:
					t.Errorf("%s / %s: an ungrouped moe_combine ran beside the fused kernels", k.Name, name)
				case call.name == "silu_mul" && small:
					// the shared expert's SwiGLU is in its down matvec's prologue
					t.Errorf("%s / %s: silu_mul in a step of at most 8 rows", k.Name, name)
				}
			}
			if routers == 0 {
				t.Errorf("%s / %s: no moe_router_f32 ran", k.Name, name)
			}
			for _, call := range alt {
				if call.name == "moe_router_f32" || strings.HasPrefix(call.name, "mv_moe_dc_") || strings.HasPrefix(call.name, "mv_moe_ff_") {
					t.Fatalf("%s / %s: %s ran with NoFusion", k.Name, name, call.name)
				}
			}
		})
		if fused == 0 || shared == 0 {
			t.Fatalf("graphs %v: %d fused down+combine launches, %d with a shared expert", graphs, fused, shared)
		}
		t.Logf("graphs %v: %d fused down+combine launches (%d with a shared expert)", graphs, fused, shared)
	}
}

// TestMoEFFOnFake: the fused decode path with Options.MoEFF (the one
// launch mv_moe_ff_*: gate|up, a grid barrier, down and combine) gives the
// logits of the default two launches (mv_moe_* gate|up, then mv_moe_dc_*)
// to rounding, with no mv_moe_dc_* beside it in steps of at most 8 rows;
// mv_moe_ff_* never runs by default.
func TestMoEFFOnFake(t *testing.T) {
	quantized := func(k backendtest.Case) bool {
		return k.Op == "moe" && (k.DType == quant.Q8Row || k.DType == quant.Q4TP)
	}
	ff, dc := 0, 0
	moeVariantsOnFake(t, true, "MoEFF", Options{MoEFF: true}, quantized, func(k backendtest.Case, name string, calls, alt []fakeCall) {
		for _, call := range calls {
			switch {
			case strings.HasPrefix(call.name, "mv_moe_ff_"):
				t.Fatalf("%s / %s: mv_moe_ff_* ran without MoEFF", k.Name, name)
			case strings.HasPrefix(call.name, "mv_moe_dc_"):
				dc++
			}
		}
		for _, call := range alt {
			switch {
			case strings.HasPrefix(call.name, "mv_moe_ff_"):
				ff++
			case strings.HasPrefix(call.name, "mv_moe_dc_"):
				t.Errorf("%s / %s: mv_moe_dc_* beside mv_moe_ff_* with MoEFF", k.Name, name)
			}
		}
	})
	if ff == 0 || dc == 0 {
		t.Fatalf("%d mv_moe_ff_* launches with MoEFF, %d mv_moe_dc_* without", ff, dc)
	}
}

// TestMMQSharesActQuant: in a step of more than 8 rows on the int8 GEMM,
// the q, k and v projections of one input (and gate and up) quantize that
// input once: by default they are one stacked wide launch (kern.GemmQ.More)
// after one gemmq_actq; with Options.NoFusion (separate launches) fewer
// gemmq_actq launches than GEMMs. No gemmq_actq ever re-quantizes the input
// the previous one did. By default the RMSNorm before q|k|v and gate|up
// and the SwiGLU before down run in the quantizer (gemmq_actq_pro): no
// separate 12-row rmsnorm or silu_mul. The logits are unchanged either way
// (TestParitySuiteNumericOnFakeMMQ compares them with the CPU).
func TestMMQSharesActQuant(t *testing.T) {
	for _, noFusion := range []bool{false, true} {
		f := newFake(t, 4)
		d := fakeOpen(f, Options{Seqs: 4, Ctx: 128, MaxRows: 64, NoFusion: noFusion})
		for _, k := range backendtest.Cases() {
			if k.Name != "attention/q4tp" && k.Name != "mlp/q8_row" {
				continue
			}
			n0 := len(f.calls)
			if _, err := backendtest.Run(d, k, []backendtest.Step{{{0, 12}}}, 5); err != nil {
				t.Fatal(err)
			}
			q, g, stacked, pro, sep := 0, 0, 0, 0, 0
			var last driver.DevicePtr
			for _, c := range f.calls[n0:] {
				switch {
				case c.name == "rmsnorm" && c.cfg.Grid.X == 12 || c.name == "silu_mul":
					sep++
				case c.name == "gemmq_actq" || c.name == "gemmq_actq_pro":
					q++
					if c.name == "gemmq_actq_pro" {
						pro++
					}
					if c.ptr(0) == last {
						t.Errorf("%s: gemmq_actq quantized the same input twice in a row", k.Name)
					}
					last = c.ptr(0)
				case strings.HasPrefix(c.name, "gemmq_"):
					g++
					if gq := fakeGemmQArgs(&c, strings.Contains(c.name, "_w")); gq.parts[1].rows > 0 {
						stacked++
					}
				}
			}
			t.Logf("%s (NoFusion %v): %d activation quantizations (%d with the norm or SwiGLU) for %d int8 GEMMs, %d stacked; %d rmsnorm / silu_mul launches",
				k.Name, noFusion, q, pro, g, stacked, sep)
			switch {
			case noFusion && pro > 0:
				t.Errorf("%s: gemmq_actq_pro with NoFusion", k.Name)
			case !noFusion && (pro == 0 || sep > 1): // the head's final norm is its own launch
				t.Errorf("%s: %d fused quantizations, %d separate rmsnorm / silu_mul launches: the 12-row step's norm or SwiGLU is not in the quantizer", k.Name, pro, sep)
			case noFusion && (g < 2 || q >= g || stacked > 0):
				t.Errorf("%s: %d gemmq_actq for %d GEMMs (%d stacked) with NoFusion: the shared input is quantized more than once", k.Name, q, g, stacked)
			case !noFusion && (stacked == 0 || q > g):
				t.Errorf("%s: %d gemmq_actq for %d GEMMs, %d stacked: q|k|v or gate|up not one launch", k.Name, q, g, stacked)
			}
		}
	}
}

// dnZBA returns the columns of value head h's z (first of dv), b and a.
func dnZBA(k kern.DeltaNet, h int) (z, b, a int) {
	_, vd, cd := k.Dims()
	r, dk, dv, nv := k.ValueHeads/k.KeyHeads, k.KeyDim, k.ValueDim, k.ValueHeads
	if !k.Grouped {
		return cd + h*dv, cd + vd + h, cd + vd + nv + h
	}
	per, g, hi := 2*dk+2*r*dv, h/r, h%r
	ba := k.KeyHeads*per + g*2*r
	return g*per + 2*dk + r*dv + hi*dv, ba + hi, ba + r + hi
}

// execDN models the dn_* kernels (deltanet.cu's comments) in float64.
func (f *fakeGPU) execDN(c *fakeCall) {
	k, R := dnCall(c)
	_, vd, cd := k.Dims()
	slots, _ := f.ints(k.Slot, R)
	switch c.name {
	case "dn_conv_step": // dn_conv, then dn_conv_state: one row a sequence
		conv, state := *c, *c
		conv.name, state.name = "dn_conv", "dn_conv_state"
		f.execDN(&conv)
		sa := new(driver.Args).Ptr(k.Proj).Int(k.Ldp).Int(b2i(k.Grouped)).Int(k.KeyHeads).Int(k.KeyDim).Int(k.ValueHeads).Int(k.ValueDim).
			Int(k.ConvKernel).Ptr(k.State).Int(k.StateFloats()).Ptr(k.Slot)
		state.args, state.offs = append([]byte(nil), sa.Bytes()...), nil
		for i := range sa.Len() {
			state.offs = append(state.offs, sa.Offset(i))
		}
		f.execDN(&state)
	case "dn_conv", "dn_conv_state":
		K := k.ConvKernel
		h, stride := K-1, k.StateFloats()
		proj := f.view(k.Proj, int(rowsSpan(R, k.Ldp, k.ProjWidth())/4))
		state := f.view(k.State, f.seqs*stride)
		if c.name == "dn_conv" {
			w, out := f.view(k.ConvW, cd*K), f.view(k.Conv, int(rowsSpan(R, k.Ldc, cd)/4))
			for r, s := range slots {
				m := 0 // rows of r's sequence before it in the step
				for m < h && r-m-1 >= 0 && slots[r-m-1] == s {
					m++
				}
				for ch := range cd {
					var acc float64
					for j := range K {
						d := h - j
						var x float32
						if d <= m {
							x = proj.at((r-d)*k.Ldp + k.ConvColumn(ch))
						} else {
							x = state.at(s*stride + (h-(d-m))*cd + ch)
						}
						acc += float64(w.at(ch*K+j)) * float64(x)
					}
					out.set(r*k.Ldc+ch, float32(acc/(1+math.Exp(-acc))))
				}
			}
			return
		}
		for r, s := range slots {
			if r+1 < R && slots[r+1] == s {
				continue
			}
			n := 1 // the sequence's rows in the step (counted up to K−1)
			for n < h && r-n >= 0 && slots[r-n] == s {
				n++
			}
			for ch := range cd {
				for i := range h {
					if n+i >= h {
						state.set(s*stride+i*cd+ch, proj.at((r-(h-1-i))*k.Ldp+k.ConvColumn(ch)))
					} else {
						state.set(s*stride+i*cd+ch, state.at(s*stride+(n+i)*cd+ch))
					}
				}
			}
		}
	case "dn_chunk_prep", "dn_chunk_state", "dn_gnorm":
		f.execDNChunk(c, k, R, slots)
	case "dn_rule":
		stride, soff := c.int(14), c.int(15)
		nk, nv, dk, dv := k.KeyHeads, k.ValueHeads, k.KeyDim, k.ValueDim
		kd := nk * dk
		conv, proj := f.view(k.Conv, int(rowsSpan(R, k.Ldc, cd)/4)), f.view(k.Proj, int(rowsSpan(R, k.Ldp, k.ProjWidth())/4))
		out := f.view(k.Out, int(rowsSpan(R, k.Ldo, vd)/4))
		state := f.view(k.State, f.seqs*stride)
		alog, dtb, nw := f.view(k.ALog, nv), f.view(k.Dt, nv), f.view(k.NormW, dv)
		seq := -1
		for r0, s := range slots {
			if r0 > 0 && slots[r0-1] == s {
				continue
			}
			if seq++; seq >= int(c.cfg.Grid.Y) {
				break // no block for it
			}
			for hv := range nv {
				kh := hv / (nv / nk)
				zc, bc, ac := dnZBA(k, hv)
				base := s*stride + soff + hv*dk*dv
				S := make([]float64, dk*dv)
				for i := range S {
					S[i] = float64(state.at(base + i))
				}
				for r := r0; r < R && slots[r] == s; r++ {
					q, kk := make([]float64, dk), make([]float64, dk)
					var sq, sk float64
					for i := range dk {
						q[i], kk[i] = float64(conv.at(r*k.Ldc+kh*dk+i)), float64(conv.at(r*k.Ldc+kd+kh*dk+i))
						sq += q[i] * q[i]
						sk += kk[i] * kk[i]
					}
					iq, ik := 1/math.Sqrt(sq+1e-6)/math.Sqrt(float64(dk)), 1/math.Sqrt(sk+1e-6)
					a, b := float64(proj.at(r*k.Ldp+ac)), float64(proj.at(r*k.Ldp+bc))
					sp := a + float64(dtb.at(hv))
					if sp <= 20 {
						sp = math.Log1p(math.Exp(sp))
					}
					eg := math.Exp(-math.Exp(float64(alog.at(hv))) * sp)
					beta := 1 / (1 + math.Exp(-b))
					o := make([]float64, dv)
					for j := range dv {
						var u float64
						for i := range dk {
							S[i*dv+j] *= eg
							u += kk[i] * ik * S[i*dv+j]
						}
						d := beta * (float64(conv.at(r*k.Ldc+2*kd+hv*dv+j)) - u)
						for i := range dk {
							S[i*dv+j] += kk[i] * ik * d
							o[j] += q[i] * iq * S[i*dv+j]
						}
					}
					var ss float64
					for _, v := range o {
						ss += v * v
					}
					inv := 1 / math.Sqrt(ss/float64(dv)+float64(k.Eps))
					for j, v := range o {
						z := float64(proj.at(r*k.Ldp + zc + j))
						out.set(r*k.Ldo+hv*dv+j, float32(float64(nw.at(j))*v*inv*z/(1+math.Exp(-z))))
					}
				}
				for i, v := range S {
					state.set(base+i, float32(v))
				}
			}
		}
	}
}

// fakeGemmQ is an int8 GEMM launch's parameters: the register-staged and
// _s tiles' (W, rows, cols, XQ, D, Y, ldy, T, bias, accumulate) or the
// wide tiles' (W0..2, rows0..2, cols, XQ, D, Y, ldy, T, b0..2, accumulate).
type fakeGemmQ struct {
	parts [3]struct {
		w, bias driver.DevicePtr
		rows    int
	}
	cols, ldy, T int
	xq, d, y     driver.DevicePtr
	acc          bool
}

func (g fakeGemmQ) total() int { return g.parts[0].rows + g.parts[1].rows + g.parts[2].rows }

func fakeGemmQArgs(c *fakeCall, wide bool) fakeGemmQ {
	var g fakeGemmQ
	if !wide {
		g.parts[0].w, g.parts[0].rows, g.parts[0].bias = c.ptr(0), c.int(1), c.ptr(8)
		g.cols, g.xq, g.d, g.y, g.ldy, g.T, g.acc = c.int(2), c.ptr(3), c.ptr(4), c.ptr(5), c.int(6), c.int(7), c.int(9) != 0
		return g
	}
	for j := range 3 {
		g.parts[j].w, g.parts[j].rows, g.parts[j].bias = c.ptr(j), c.int(3+j), c.ptr(12+j)
	}
	g.cols, g.xq, g.d, g.y, g.ldy, g.T, g.acc = c.int(6), c.ptr(7), c.ptr(8), c.ptr(9), c.int(10), c.int(11), c.int(15) != 0
	return g
}

// fakeGemmHArgs is a gemmh_q4tp_w* launch's parameters (W0..2, rows0..2,
// cols, XB, Y, ldy, T, b0..2, accumulate); xq holds XB.
func fakeGemmHArgs(c *fakeCall) fakeGemmQ {
	var g fakeGemmQ
	for j := range 3 {
		g.parts[j].w, g.parts[j].rows, g.parts[j].bias = c.ptr(j), c.int(3+j), c.ptr(11+j)
	}
	g.cols, g.xq, g.y, g.ldy, g.T, g.acc = c.int(6), c.ptr(7), c.ptr(8), c.int(9), c.int(10), c.int(14) != 0
	return g
}

// gemmParts writes Y's columns of each of g's tensors (format fam; q8row
// as its int8 quants, the row scale after the sum): Σ_k w[o,k]·xv[t][k]
// in float64, + bias, =|+= Y, the tensors side by side.
func (f *fakeGPU) gemmParts(fam string, g fakeGemmQ, xv [][]float64) {
	y := f.view(g.y, int(rowsSpan(g.T, g.ldy, g.total())/4))
	for t, row := range f.gemmValues(fam, g, xv) {
		for c, v := range row {
			if g.acc {
				v += y.at(t*g.ldy + c)
			}
			y.set(t*g.ldy+c, v)
		}
	}
}

// gemmValues is gemmParts' Y before the accumulate: [t][column].
func (f *fakeGPU) gemmValues(fam string, g fakeGemmQ, xv [][]float64) [][]float32 {
	out := make([][]float32, g.T)
	for t := range out {
		out[t] = make([]float32, g.total())
	}
	col := 0
	for _, p := range g.parts {
		if p.rows == 0 {
			continue
		}
		var w []float32
		if fam == "q8row" {
			w = f.weights("q8quants", p.w, p.rows, g.cols)
		} else {
			w = f.weights(fam, p.w, p.rows, g.cols)
		}
		var b f32s
		if p.bias != 0 {
			b = f.view(p.bias, p.rows)
		}
		for t := range g.T {
			for o := range p.rows {
				var s float64
				for k, v := range xv[t] {
					s += float64(w[o*g.cols+k]) * v
				}
				v := float32(s)
				if fam == "q8row" {
					v *= f.q8scale(p.w, p.rows, g.cols, o)
				}
				if b != nil {
					v += b.at(o)
				}
				out[t][col+o] = v
			}
		}
		col += p.rows
	}
	return out
}

// TestParitySuiteNumericOnFakeKVF16: the parity suite on one fake device
// with Options.KVF16 (the K/V cache in float16 for a model of quantized
// matrices: rope_qk_append_h and attn_tiles_h; float32 for the float
// cases, the pool rebuilt as the cases alternate) against the CPU's
// float32 cache, graphs on: every quantized case
// within 1e-4 NMSE (the cache's rounding, 2^-11 relative, is all that
// differs from the float32 path; worst seen 4e-5 on these small random
// models), and the float16 kernels must have run.
func TestParitySuiteNumericOnFakeKVF16(t *testing.T) {
	c := cpu.New(1)
	defer c.Close()
	f := newFake(t, 4)
	f.numeric, f.decoded = true, map[string][]float32{}
	d := fakeOpen(f, Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: true, KVF16: true})
	worst, _ := fakeParity(t, "KVF16", f, d, c, func(k backendtest.Case) float64 {
		// Float models keep the float32 cache (kvHalfFor), so the same
		// device switches its pool between the cases: theirs at the main
		// suite's tolerances.
		switch k.DType {
		case quant.F32:
			return 1e-9
		case quant.F16, quant.BF16:
			return 1e-8
		}
		return 1e-4
	}, nil)
	t.Logf("worst NMSE against the CPU's float32 cache per format: %v", worst)
	ran := map[string]bool{}
	for _, c := range f.calls {
		ran[c.name] = true
	}
	if !ran["rope_qk_append_h"] || !ran["attn_tiles_h"] || !ran["attn_tiles"] {
		t.Errorf("float16 cache kernels not used: %v", ran)
	}
}

// TestKVF16KeepsFloatModelsF32: with Options.KVF16 a model of float32
// matrices still gets the float32 cache (rope_qk_append, attn_tiles).
func TestKVF16KeepsFloatModelsF32(t *testing.T) {
	f := newFake(t, 4)
	d := fakeOpen(f, Options{Seqs: 4, Ctx: 128, MaxRows: 64, KVF16: true})
	for _, k := range backendtest.Cases() {
		if k.Name != "attention/f32" {
			continue
		}
		if _, err := backendtest.Run(d, k, []backendtest.Step{{{0, 12}}}, 5); err != nil {
			t.Fatal(err)
		}
	}
	ran := map[string]bool{}
	for _, c := range f.calls {
		ran[c.name] = true
	}
	if !ran["attn_tiles"] || !ran["rope_qk_append"] || ran["attn_tiles_h"] || ran["rope_qk_append_h"] {
		t.Fatalf("a float32 model with KVF16 launched %v, want the float32 cache's kernels", ran)
	}
}

// TestPrefillChunksTakeAttnMMA: with the float16 cache, a step of more
// than 64 rows over a quantized o_proj (a prefill chunk) runs its
// attention on attn_mma_h; a step of 40 rows (the int8 wide tiles) and,
// with Options.NoAttnMMA, the long one keep attn_tiles_h; the long one's
// q|k|v is one gemmq_q4tp_t64s launch with the norm in its quantizer (no
// rmsnorm; the 40-row step takes the wide tiles' stack). Numerically
// (the fake's model of both kernels) the logits of both paths agree with
// the CPU's float32 cache within TestParitySuiteNumericOnFakeKVF16's 1e-4.
func TestPrefillChunksTakeAttnMMA(t *testing.T) {
	k, ok := backendtest.CaseNamed("attention/q4tp/hd64")
	if !ok {
		t.Fatal("no attention/q4tp/hd64 case in backendtest.Cases")
	}
	c := cpu.New(1)
	defer c.Close()
	for _, tc := range []struct {
		rows  int
		noMMA bool
		want  string
	}{{100, false, "attn_mma_h_d64"}, {40, false, "attn_tiles_h"}, {100, true, "attn_tiles_h"}} {
		f := newFake(t, 1)
		f.numeric, f.decoded = true, map[string][]float32{}
		d := fakeOpen(f, Options{Seqs: 1, Ctx: 128, MaxRows: 128, KVF16: true, NoAttnMMA: tc.noMMA})
		sched := []backendtest.Step{{{0, tc.rows}}, {{0, 1}}}
		got, err := backendtest.Run(d, k, sched, 5)
		if err != nil {
			t.Fatal(err)
		}
		want, err := backendtest.Run(c, k, sched, 5)
		if err != nil {
			t.Fatal(err)
		}
		if e := backendtest.NMSE(got, want); e > 1e-4 || e != e {
			t.Errorf("%d rows (NoAttnMMA %v): NMSE %.3g against the CPU", tc.rows, tc.noMMA, e)
		}
		var first string
		for _, call := range f.calls {
			if strings.HasPrefix(call.name, "attn_") {
				first = call.name // the prefill step's attention comes first
				break
			}
		}
		if first != tc.want {
			t.Errorf("%d rows (NoAttnMMA %v): the prefill's attention ran %q, want %s", tc.rows, tc.noMMA, first, tc.want)
		}
		// The chunk's q|k|v: one stacked launch above 64 rows
		// (kern.GemmQStacked) with input_layernorm in its quantizer.
		ran := map[string]bool{} // the prefill step's kernels before its attention
		for _, call := range f.calls {
			if strings.HasPrefix(call.name, "attn_") {
				break
			}
			ran[call.name] = true
		}
		if stacked := ran["gemmq_q4tp"+kern.GemmQStacked]; stacked != (tc.rows > 64) || stacked && (ran["rmsnorm"] || !ran["gemmq_actq_pro"]) {
			t.Errorf("%d rows: q|k|v stacked %v, rmsnorm %v, gemmq_actq_pro %v before the attention", tc.rows, stacked, ran["rmsnorm"], ran["gemmq_actq_pro"])
		}
	}
}

// numericOnFake runs the backendtest case name over sched on a numeric
// fake opened with opt (opt.Seqs sequences) and on the CPU device c, fails
// t where the fake's logits are more than 1e-4 (NMSE) from the CPU's, and
// returns them with the fake's launches.
func numericOnFake(t *testing.T, c *cpu.Device, name string, sched []backendtest.Step, seed uint64, opt Options) ([]float32, []fakeCall) {
	t.Helper()
	k, ok := backendtest.CaseNamed(name)
	if !ok {
		t.Fatalf("no %s case in backendtest.Cases", name)
	}
	want, err := backendtest.Run(c, k, sched, seed)
	if err != nil {
		t.Fatal(err)
	}
	f := newFake(t, opt.Seqs)
	f.numeric, f.decoded = true, map[string][]float32{}
	got, err := backendtest.Run(fakeOpen(f, opt), k, sched, seed)
	if err != nil {
		t.Fatal(err)
	}
	if e := backendtest.NMSE(got, want); e > 1e-4 || e != e {
		t.Errorf("%s (%+v): NMSE %.3g against the CPU", name, opt, e)
	}
	return got, f.calls
}

// TestDecodeStepsFoldRope checks that with Options.RopeFold decode steps
// (each row a sequence of its own) rotate and append inside the attention
// launch (attn_rope_tiles: no rope_qk_append), that prefill chunks keep
// rope_qk_append, and that the logits equal the default's (apart) bit for
// bit and the CPU's (q/k norms with zero-centred weights, partial rotary
// with the gate, f32 and f16 caches, three sequences decoded together).
func TestDecodeStepsFoldRope(t *testing.T) {
	c := cpu.New(1)
	defer c.Close()
	sched := []backendtest.Step{{{0, 5}}, {{1, 3}}, {{2, 1}}, {{0, 1}, {1, 1}, {2, 1}}, {{1, 1}, {0, 1}}, {{2, 1}}, {{0, 2}}}
	for _, name := range []string{"attention/q4tp/qknorm_oneplus", "attention/q8_row/gated_partial", "attention/f32/partial"} {
		var logits [2][]float32
		for i, apart := range []bool{false, true} {
			got, calls := numericOnFake(t, c, name, sched, 7, Options{Seqs: 3, Ctx: 128, MaxRows: 16, KVF16: true, RopeFold: !apart})
			logits[i] = got
			ran := map[string]int{}
			for _, call := range calls {
				if strings.HasPrefix(call.name, "attn_") || strings.HasPrefix(call.name, "rope_") {
					ran[strings.TrimSuffix(call.name, "_h")]++
				}
			}
			// 7 steps of one layer: 3 prefill chunks (of 5, 3 and 2 rows)
			// and 4 decode steps (the one-token prompt of sequence 2 is one).
			wantRan := map[string]int{"rope_qk_append": 3, "attn_tiles": 3, "attn_rope_tiles": 4}
			if apart {
				wantRan = map[string]int{"rope_qk_append": 7, "attn_tiles": 7}
			}
			if fmt.Sprint(ran) != fmt.Sprint(wantRan) {
				t.Errorf("%s (RopeFold %v): launched %v, want %v", name, !apart, ran, wantRan)
			}
		}
		for i := range logits[0] {
			if math.Float32bits(logits[0][i]) != math.Float32bits(logits[1][i]) {
				t.Errorf("%s: logit %d is %g folded, %g apart", name, i, logits[0][i], logits[1][i])
				break
			}
		}
	}
}

// TestDecodeStepsFuseConv checks that Gated DeltaNet decode steps (each
// row a sequence of its own) take dn_conv_step (the conv and the carried
// inputs' shift in one launch), prefill chunks dn_conv then
// dn_conv_state, and that the logits match the CPU's over the mixed
// schedule, both projection layouts.
func TestDecodeStepsFuseConv(t *testing.T) {
	c := cpu.New(1)
	defer c.Close()
	sched := []backendtest.Step{{{0, 5}}, {{1, 3}}, {{0, 1}, {1, 1}}, {{1, 1}}, {{0, 2}}, {{1, 1}, {0, 1}}}
	for _, name := range []string{"deltanet/q4tp/split", "deltanet/f32/grouped"} {
		_, calls := numericOnFake(t, c, name, sched, 9, Options{Seqs: 2, Ctx: 128, MaxRows: 16})
		ran := map[string]int{}
		for _, call := range calls {
			if strings.HasPrefix(call.name, "dn_conv") {
				ran[call.name]++
			}
		}
		// 3 prefill chunks (5, 3, 2 rows) and 3 decode steps.
		if want := map[string]int{"dn_conv": 3, "dn_conv_state": 3, "dn_conv_step": 3}; fmt.Sprint(ran) != fmt.Sprint(want) {
			t.Errorf("%s: launched %v, want %v", name, ran, want)
		}
	}
}

// TestSharedBranchOnFake checks the shared expert's branch (the default;
// Options.NoBranch keeps one stream): a decode step's shared
// expert (gate|up with the block's norm in its prologue, then down) is
// launched on the side stream — the fake marks those launches and fails a
// fork without its join — and prefill steps keep one stream; the logits
// equal the default's and the CPU's, eager and replayed from graphs.
func TestSharedBranchOnFake(t *testing.T) {
	c := cpu.New(1)
	defer c.Close()
	sched := []backendtest.Step{{{0, 5}}, {{1, 3}}, {{0, 1}, {1, 1}}, {{1, 1}, {0, 1}}, {{0, 1}, {1, 1}}, {{0, 2}}}
	for _, name := range []string{"moe/q4tp/shared_norenorm", "moe/q8_row/shared_norenorm"} {
		var logits [2][]float32
		for i, branch := range []bool{false, true} {
			got, calls := numericOnFake(t, c, name, sched, 11, Options{Seqs: 2, Ctx: 128, MaxRows: 16, Graphs: true, NoBranch: !branch})
			logits[i] = got
			side, routers := 0, 0
			for _, call := range calls {
				if call.name == "moe_router_f32" {
					routers++ // one a fused (decode) MoE step
				}
				if call.side {
					side++
					if !strings.HasPrefix(call.name, "mv_") {
						t.Errorf("%s: %s launched on the side stream", name, call.name)
					}
				}
			}
			// The shared expert's two launches in every decode step's
			// MoE block, none elsewhere.
			if wantSide := 2 * routers * b2i(branch); side != wantSide || routers == 0 {
				t.Errorf("%s (Branch %v): %d launches on the side stream over %d decode MoE blocks, want %d", name, branch, side, routers, wantSide)
			}
		}
		if e := backendtest.NMSE(logits[1], logits[0]); e > 1e-12 || e != e {
			t.Errorf("%s: Branch's logits differ from the default's (NMSE %.3g)", name, e)
		}
	}
}

// dnChunks lists a step's chunks as [first row, rows, sequence index]:
// each sequence's rows from its first in chunks of kern.DNChunk.
func dnChunks(slots []int) [][3]int {
	var out [][3]int
	seq := -1
	for r0 := 0; r0 < len(slots); {
		r1 := r0 + 1
		for r1 < len(slots) && slots[r1] == slots[r0] {
			r1++
		}
		seq++
		for c := r0; c < r1; c += kern.DNChunk {
			out = append(out, [3]int{c, min(kern.DNChunk, r1-c), seq})
		}
		r0 = r1
	}
	return out
}

// execDNChunk models the chunked rule's kernels (deltanet.cu: dn_chunk_prep
// fills the scratch X, dn_chunk_state carries S over a sequence's chunks,
// dn_gnorm applies the gated norm) in float64, X in its documented layout.
func (f *fakeGPU) execDNChunk(c *fakeCall, k kern.DeltaNet, R int, slots []int) {
	stride, soff := c.int(14), c.int(15)
	nk, nv, dk, dv := k.KeyHeads, k.ValueHeads, k.KeyDim, k.ValueDim
	_, vd, cd := k.Dims()
	kd, F, C := nk*dk, kern.DNChunkFloats(dk, dv), kern.DNChunk
	conv, proj := f.view(k.Conv, int(rowsSpan(R, k.Ldc, cd)/4)), f.view(k.Proj, int(rowsSpan(R, k.Ldp, k.ProjWidth())/4))
	out := f.view(k.Out, int(rowsSpan(R, k.Ldo, vd)/4))
	X := f.view(c.ptr(20), int(k.ChunkScratch(R)/4))
	alog, dtb, nw := f.view(k.ALog, nv), f.view(k.Dt, nv), f.view(k.NormW, dv)
	x := func(r, h, i int) int { return (r*nv+h)*F + i }
	switch c.name {
	case "dn_chunk_prep":
		for ci, ch := range dnChunks(slots) {
			if ci >= int(c.cfg.Grid.Y) {
				f.t.Fatalf("fake: dn_chunk_prep's grid (%d) misses chunk %d", c.cfg.Grid.Y, ci)
			}
			r0, n := ch[0], ch[1]
			for hv := range nv {
				kh := hv / (nv / nk)
				_, bc, ac := dnZBA(k, hv)
				q, kk := make([][]float64, n), make([][]float64, n)
				G, beta := make([]float64, n), make([]float64, n)
				var acc float64
				for t := range n {
					r := r0 + t
					q[t], kk[t] = make([]float64, dk), make([]float64, dk)
					var sq, sk float64
					for i := range dk {
						q[t][i], kk[t][i] = float64(conv.at(r*k.Ldc+kh*dk+i)), float64(conv.at(r*k.Ldc+kd+kh*dk+i))
						sq += q[t][i] * q[t][i]
						sk += kk[t][i] * kk[t][i]
					}
					iq, ik := 1/math.Sqrt(sq+1e-6)/math.Sqrt(float64(dk)), 1/math.Sqrt(sk+1e-6)
					for i := range dk {
						q[t][i] *= iq
						kk[t][i] *= ik
					}
					sp := float64(proj.at(r*k.Ldp+ac)) + float64(dtb.at(hv))
					if sp <= 20 {
						sp = math.Log1p(math.Exp(sp))
					}
					acc += -math.Exp(float64(alog.at(hv))) * sp
					G[t], beta[t] = acc, 1/(1+math.Exp(-float64(proj.at(r*k.Ldp+bc))))
				}
				dot := func(a, b []float64) (s float64) {
					for i := range a {
						s += a[i] * b[i]
					}
					return s
				}
				// (I+L)[U | W] = [β⊙v | β⊙e^Γ⊙k̂] by forward substitution.
				rhs := make([][]float64, n)
				for t := range n {
					rhs[t] = make([]float64, dv+dk)
					for j := range dv {
						rhs[t][j] = beta[t] * float64(conv.at((r0+t)*k.Ldc+2*kd+hv*dv+j))
					}
					for i := range dk {
						rhs[t][dv+i] = beta[t] * math.Exp(G[t]) * kk[t][i]
					}
					for s := range t {
						l := beta[t] * dot(kk[t], kk[s]) * math.Exp(G[t]-G[s])
						for j := range rhs[t] {
							rhs[t][j] -= l * rhs[s][j]
						}
					}
				}
				for t := range n {
					r := r0 + t
					for j, v := range rhs[t] {
						X.set(x(r, hv, j), float32(v))
					}
					for i := range dk {
						X.set(x(r, hv, dv+dk+i), float32(math.Exp(G[t])*q[t][i]))
						X.set(x(r, hv, dv+2*dk+i), float32(math.Exp(G[n-1]-G[t])*kk[t][i]))
					}
					for s := range C {
						m := 0.0
						if s <= t {
							m = dot(q[t], kk[s]) * math.Exp(G[t]-G[s])
						}
						X.set(x(r, hv, dv+3*dk+s), float32(m))
					}
				}
				X.set(x(r0, hv, dv+3*dk+C), float32(math.Exp(G[n-1])))
			}
		}
	case "dn_chunk_state":
		state := f.view(k.State, f.seqs*stride)
		slices := (dv + kern.DNChunkCols - 1) / kern.DNChunkCols
		if int(c.cfg.Grid.X) != nv*slices {
			f.t.Fatalf("fake: dn_chunk_state over %d blocks of heads, want %d", c.cfg.Grid.X, nv*slices)
		}
		var S []float64
		for _, ch := range dnChunks(slots) {
			r0, n, seq := ch[0], ch[1], ch[2]
			if seq >= int(c.cfg.Grid.Y) {
				break // no block for it
			}
			first := r0 == 0 || slots[r0-1] != slots[r0]
			last := r0+n == R || slots[r0+n] != slots[r0]
			base := slots[r0]*stride + soff
			if first {
				S = make([]float64, nv*dk*dv)
				for i := range S {
					S[i] = float64(state.at(base + i))
				}
			}
			for hv := range nv {
				Sh := S[hv*dk*dv : (hv+1)*dk*dv]
				vp := make([][]float64, n)
				for t := range n {
					vp[t] = make([]float64, dv)
					for j := range dv {
						v := float64(X.at(x(r0+t, hv, j)))
						for i := range dk {
							v -= float64(X.at(x(r0+t, hv, dv+i))) * Sh[i*dv+j]
						}
						vp[t][j] = v
					}
				}
				for t := range n {
					for j := range dv {
						var o float64
						for i := range dk {
							o += float64(X.at(x(r0+t, hv, dv+dk+i))) * Sh[i*dv+j]
						}
						for s := 0; s <= t; s++ {
							o += float64(X.at(x(r0+t, hv, dv+3*dk+s))) * vp[s][j]
						}
						out.set((r0+t)*k.Ldo+hv*dv+j, float32(o))
					}
				}
				en := float64(X.at(x(r0, hv, dv+3*dk+C)))
				for i := range dk {
					for j := range dv {
						v := en * Sh[i*dv+j]
						for t := range n {
							v += float64(X.at(x(r0+t, hv, dv+2*dk+i))) * vp[t][j]
						}
						Sh[i*dv+j] = v
					}
				}
			}
			if last {
				for i, v := range S {
					state.set(base+i, float32(v))
				}
			}
		}
	case "dn_gnorm":
		for r := range R {
			for hv := range nv {
				zc, _, _ := dnZBA(k, hv)
				var ss float64
				for j := range dv {
					v := float64(out.at(r*k.Ldo + hv*dv + j))
					ss += v * v
				}
				inv := 1 / math.Sqrt(ss/float64(dv)+float64(k.Eps))
				for j := range dv {
					v, z := float64(out.at(r*k.Ldo+hv*dv+j)), float64(proj.at(r*k.Ldp+zc+j))
					out.set(r*k.Ldo+hv*dv+j, float32(float64(nw.at(j))*v*inv*z/(1+math.Exp(-z))))
				}
			}
		}
	}
}

// TestDeltaChunksOnFake checks that prefill steps with a sequence of at
// least DeltaChunkMin rows run the chunked rule (dn_chunk_prep,
// dn_chunk_state, dn_gnorm; both projection layouts, one and two
// sequences a step, partial and whole chunks), that shorter and decode
// steps keep dn_rule, that Options.NoDeltaChunks keeps dn_rule
// everywhere, and that both match the CPU.
func TestDeltaChunksOnFake(t *testing.T) {
	c := cpu.New(1)
	defer c.Close()
	sched := []backendtest.Step{{{0, 20}, {1, 3}}, {{1, 70}}, {{0, 1}, {1, 1}}, {{0, 64}, {1, 5}}, {{1, 1}}}
	for _, name := range []string{"deltanet/f32/grouped", "deltanet/q4tp/split"} {
		var logits [2][]float32
		for i, off := range []bool{false, true} {
			got, calls := numericOnFake(t, c, name, sched, 13, Options{Seqs: 2, Ctx: 160, MaxRows: 80, NoDeltaChunks: off})
			logits[i] = got
			ran := map[string]int{}
			for _, call := range calls {
				if strings.HasPrefix(call.name, "dn_chunk_") || call.name == "dn_gnorm" || call.name == "dn_rule" {
					ran[call.name]++
				}
			}
			// Steps 0, 1 and 3 chunked, 2 and 4 row by row (per DeltaNet layer).
			layers := ran["dn_rule"] + ran["dn_chunk_state"]
			if layers%5 != 0 || layers == 0 {
				t.Fatalf("%s: %v launches over 5 steps", name, ran)
			}
			L := layers / 5
			want := map[string]int{"dn_chunk_prep": 3 * L, "dn_chunk_state": 3 * L, "dn_gnorm": 3 * L, "dn_rule": 2 * L}
			if off {
				want = map[string]int{"dn_rule": 5 * L}
			}
			if fmt.Sprint(ran) != fmt.Sprint(want) {
				t.Errorf("%s (NoDeltaChunks %v): launched %v, want %v", name, off, ran, want)
			}
		}
		if e := backendtest.NMSE(logits[0], logits[1]); e > 1e-9 || e != e {
			t.Errorf("%s: chunked and row-by-row logits %.3g apart (NMSE)", name, e)
		}
	}
}
