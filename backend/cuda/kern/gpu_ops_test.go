package kern_test

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/half"
)

// Plain references with the CPU backend's arithmetic (kernels/ops.go,
// kernels/rope.go), written out here: backend/cuda must not import kernels.

func refRMSNorm(dst, x, w []float32, eps float32, onePlus bool) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := float32(1 / math.Sqrt(float64(float32(ss/float64(len(x)))+eps)))
	for i, v := range x {
		if onePlus {
			dst[i] = (v * inv) * (1 + w[i])
		} else {
			dst[i] = w[i] * (v * inv)
		}
	}
}

func refRope(x []float32, rot int, inv []float32, mscale float32, pos int) {
	h := rot / 2
	for i := range h {
		s, c := math.Sincos(float64(float32(pos) * inv[i]))
		cs, sn := float32(c)*mscale, float32(s)*mscale
		a, b := x[i], x[i+h]
		x[i] = a*cs - b*sn
		x[i+h] = b*cs + a*sn
	}
}

func invFreq(rot int, theta float64) []float32 {
	inv := make([]float32, rot/2)
	for i := range inv {
		inv[i] = float32(1 / math.Pow(theta, float64(2*i)/float64(rot)))
	}
	return inv
}

func closeRel(a, b float32, rel, abs float64) bool {
	d := math.Abs(float64(a) - float64(b))
	return d <= rel*math.Abs(float64(b))+abs && !math.IsNaN(float64(a))
}

func TestGPURMSNormParity(t *testing.T) {
	g := newGPU(t)
	r := rng(3)
	for _, n := range []int{1, 100, 4096, 5003} {
		for _, onePlus := range []bool{false, true} {
			const R = 9
			ld := n + 1
			x := r.vec(R*ld, 2)
			w := r.vec(n, 1)
			dy := g.zeros(R * ld)
			var a driver.Args
			a.Ptr(g.f32(x)).Int(ld).Ptr(g.f32(w)).Ptr(dy).Int(ld).Int(n).F32(1e-6).Int(b2i(onePlus))
			g.launch("rmsnorm", driver.D1(R), driver.D1(256), 0, &a)
			got := g.readF32(dy, R*ld)
			want := make([]float32, n)
			for ri := range R {
				refRMSNorm(want, x[ri*ld:ri*ld+n], w, 1e-6, onePlus)
				for i := range n {
					if !closeRel(got[ri*ld+i], want[i], 1e-6, 1e-7) {
						t.Fatalf("rmsnorm n=%d onePlus=%v row %d [%d] = %g, want %g", n, onePlus, ri, i, got[ri*ld+i], want[i])
					}
				}
			}
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestGPUHeadRMSNormParity(t *testing.T) {
	g := newGPU(t)
	r := rng(4)
	for _, hd := range []int{64, 80, 128, 256} {
		const R, nh = 3, 5
		ld := nh*hd + 7
		x := r.vec(R*ld, 1)
		w := r.vec(hd, 1)
		dx := g.f32(x)
		var a driver.Args
		a.Ptr(dx).Int(ld).Ptr(g.f32(w)).Int(hd).F32(1e-6).Int(0)
		g.launch("head_rmsnorm", driver.D2(nh, R), driver.D1(32), 0, &a)
		got := g.readF32(dx, R*ld)
		want := make([]float32, hd)
		for ri := range R {
			for h := range nh {
				off := ri*ld + h*hd
				refRMSNorm(want, x[off:off+hd], w, 1e-6, false)
				for i := range hd {
					if !closeRel(got[off+i], want[i], 1e-6, 1e-7) {
						t.Fatalf("head_rmsnorm hd=%d row %d head %d [%d] = %g, want %g", hd, ri, h, i, got[off+i], want[i])
					}
				}
			}
			if got[ri*ld+nh*hd] != x[ri*ld+nh*hd] {
				t.Fatal("head_rmsnorm wrote past the heads")
			}
		}
	}
}

func TestGPURopeParity(t *testing.T) {
	g := newGPU(t)
	r := rng(5)
	for _, c := range []struct {
		hd, rot int
		mscale  float32
	}{{64, 64, 1}, {128, 64, 1}, {128, 128, 1.25}, {80, 40, 1}} {
		const R, nh = 4, 3
		ld := nh * c.hd
		pos := []int32{0, 1, 4097, 131071}
		x := r.vec(R*ld, 1)
		inv := invFreq(c.rot, 500000)
		dx := g.f32(x)
		var a driver.Args
		a.Ptr(dx).Int(ld).Int(c.hd).Int(c.rot).Ptr(g.f32(inv)).F32(c.mscale).Ptr(g.i32(pos))
		g.launch("rope", driver.D2(nh, R), driver.D1(64), 0, &a)
		got := g.readF32(dx, R*ld)
		for ri := range R {
			for h := range nh {
				want := append([]float32(nil), x[ri*ld+h*c.hd:ri*ld+(h+1)*c.hd]...)
				refRope(want, c.rot, inv, c.mscale, int(pos[ri]))
				for i, wv := range want {
					if !closeRel(got[ri*ld+h*c.hd+i], wv, 1e-6, 1e-6) {
						t.Fatalf("rope hd=%d rot=%d pos %d head %d [%d] = %g, want %g", c.hd, c.rot, pos[ri], h, i, got[ri*ld+h*c.hd+i], wv)
					}
				}
			}
		}
	}
}

// rope_qk_append equals rope on q and k followed by kv_append, and the
// cache holds the rotated k and the v at each row's position and slot.
func TestGPURopeKVAppend(t *testing.T) {
	g := newGPU(t)
	r := rng(6)
	const R, nq, nkv, hd, rot, ctx, slots = 3, 8, 2, 64, 64, 40, 2
	ld := (nq + 2*nkv) * hd
	qkv := r.vec(R*ld, 1)
	pos := []int32{0, 39, 17}
	slot := []int32{1, 0, 1}
	inv := invFreq(rot, 10000)
	dinv, dpos, dslot := g.f32(inv), g.i32(pos), g.i32(slot)
	cacheN := slots * nkv * ctx * hd
	// Fused.
	d1 := g.f32(qkv)
	kc1, vc1 := g.zeros(cacheN), g.zeros(cacheN)
	var a driver.Args
	a.Ptr(d1).Int(ld).Int(nq).Int(nkv).Int(hd).Int(rot).Ptr(dinv).F32(1).Ptr(dpos).Ptr(dslot).Ptr(kc1).Ptr(vc1).Int(ctx).Ptr(0).Ptr(0).F32(0).Int(0)
	g.launch("rope_qk_append", driver.D2(nq+nkv, R), driver.D1(64), 0, &a)
	// Separate: rope over q and k heads (they are contiguous), then append.
	d2 := g.f32(qkv)
	kc2, vc2 := g.zeros(cacheN), g.zeros(cacheN)
	a.Reset().Ptr(d2).Int(ld).Int(hd).Int(rot).Ptr(dinv).F32(1).Ptr(dpos)
	g.launch("rope", driver.D2(nq+nkv, R), driver.D1(64), 0, &a)
	a.Reset().Ptr(d2.Add(4 * nq * hd)).Int(ld).Ptr(d2.Add(4 * (nq + nkv) * hd)).Int(ld).Ptr(kc2).Ptr(vc2).Ptr(dpos).Ptr(dslot).Int(nkv).Int(hd).Int(ctx)
	g.launch("kv_append", driver.D2(nkv, R), driver.D1(128), 0, &a)
	b1, b2 := g.readBytes(d1, 4*R*ld), g.readBytes(d2, 4*R*ld)
	for i := range b1 {
		if b1[i] != b2[i] {
			t.Fatalf("fused q/k rotation differs from rope at byte %d", i)
		}
	}
	k1, k2 := g.readF32(kc1, cacheN), g.readF32(kc2, cacheN)
	v1 := g.readF32(vc1, cacheN)
	rot1 := bytesf32(b1)
	for i := range k1 {
		if k1[i] != k2[i] {
			t.Fatalf("fused K cache differs at %d", i)
		}
	}
	for ri := range R {
		for h := range nkv {
			base := ((int(slot[ri])*nkv+h)*ctx + int(pos[ri])) * hd
			for d := range hd {
				if k1[base+d] != rot1[ri*ld+(nq+h)*hd+d] || v1[base+d] != qkv[ri*ld+(nq+nkv+h)*hd+d] {
					t.Fatalf("cache row %d head %d dim %d not the appended k/v", ri, h, d)
				}
			}
		}
	}
	// rope_qk_append_h: the same rotation in qkv, the float16 cache holds
	// the f32 cache's values rounded to nearest even.
	d3 := g.f32(qkv)
	kc3, vc3 := g.upload(make([]byte, 2*cacheN)), g.upload(make([]byte, 2*cacheN))
	a.Reset().Ptr(d3).Int(ld).Int(nq).Int(nkv).Int(hd).Int(rot).Ptr(dinv).F32(1).Ptr(dpos).Ptr(dslot).Ptr(kc3).Ptr(vc3).Int(ctx).Ptr(0).Ptr(0).F32(0).Int(0)
	g.launch("rope_qk_append_h", driver.D2(nq+nkv, R), driver.D1(64), 0, &a)
	if b3 := g.readBytes(d3, 4*R*ld); string(b3) != string(b1) {
		t.Fatalf("rope_qk_append_h rotates q/k differently from rope_qk_append")
	}
	kh, vh := g.readBytes(kc3, 2*cacheN), g.readBytes(vc3, 2*cacheN)
	v2 := g.readF32(vc1, cacheN)
	for i := range k1 {
		if binary.LittleEndian.Uint16(kh[2*i:]) != half.F32ToF16(k1[i]) || binary.LittleEndian.Uint16(vh[2*i:]) != half.F32ToF16(v2[i]) {
			t.Fatalf("float16 cache element %d: %#x / %#x, want the float32 cache's %g / %g rounded", i,
				binary.LittleEndian.Uint16(kh[2*i:]), binary.LittleEndian.Uint16(vh[2*i:]), k1[i], v2[i])
		}
	}
}

func TestGPUSiluMulAdd(t *testing.T) {
	g := newGPU(t)
	r := rng(7)
	const R, n = 9, 1001
	ld := 2 * n
	gu := r.vec(R*ld, 3)
	dgu := g.f32(gu)
	dh := g.zeros(R * n)
	var a driver.Args
	a.Ptr(dgu).Ptr(dgu.Add(4 * n)).Int(ld).Ptr(dh).Int(n).Int(n)
	g.launch("silu_mul", driver.D2((n+255)/256, R), driver.D1(256), 0, &a)
	h := g.readF32(dh, R*n)
	for ri := range R {
		for i := range n {
			v, u := float64(gu[ri*ld+i]), float64(gu[ri*ld+n+i])
			want := float32(v / (1 + math.Exp(-v)) * u)
			if !closeRel(h[ri*n+i], want, 1e-6, 1e-7) {
				t.Fatalf("silu_mul [%d][%d] = %g, want %g", ri, i, h[ri*n+i], want)
			}
		}
	}
	x := r.vec(R*n, 1)
	a.Reset().Ptr(dh).Int(n).Ptr(g.f32(x)).Int(n).Int(n)
	g.launch("add", driver.D2((n+255)/256, R), driver.D1(256), 0, &a)
	y := g.readF32(dh, R*n)
	for i := range y {
		if y[i] != h[i]+x[i] {
			t.Fatalf("add [%d] = %g, want %g", i, y[i], h[i]+x[i])
		}
	}
}

// Attention reference in float64: softmax over positions 0..pos of the
// row's slot, per query head, GQA head mapping h → h/(nq/nkv). A row with
// no position (pos < 0, length 0) attends to nothing: its output is zeros,
// the definition the kernels implement (see Launcher.Attention).
func refAttention(q, kc, vc []float32, pos, slot int, nq, nkv, hd, ctx int, scale float64) []float32 {
	out := make([]float32, nq*hd)
	G := nq / nkv
	n := min(pos+1, ctx)
	if n <= 0 {
		return out
	}
	for h := range nq {
		kh := h / G
		s := make([]float64, n)
		mx := math.Inf(-1)
		for t := range n {
			base := ((slot*nkv+kh)*ctx + t) * hd
			var d float64
			for i := range hd {
				d += float64(q[h*hd+i]) * float64(kc[base+i])
			}
			s[t] = d * scale
			mx = math.Max(mx, s[t])
		}
		var z float64
		for t := range s {
			s[t] = math.Exp(s[t] - mx)
			z += s[t]
		}
		for i := range hd {
			var o float64
			for t := range n {
				o += s[t] * float64(vc[((slot*nkv+kh)*ctx+t)*hd+i])
			}
			out[h*hd+i] = float32(o / z)
		}
	}
	return out
}

const attWarps, attMaxG = 4, 8

// attend runs attn_split + attn_merge.
func attend(g *gpu, dq driver.DevicePtr, ldq int, kc, vc, dpos, dslot, part, out driver.DevicePtr, ldo, R, nq, nkv, hd, ctx, nsplit int, scale float32) {
	var a driver.Args
	a.Ptr(dq).Int(ldq).Ptr(kc).Ptr(vc).Ptr(dpos).Ptr(dslot).Ptr(part).Int(nq).Int(nkv).Int(hd).Int(ctx).Int(nsplit).F32(scale)
	g.launch("attn_split", driver.D3(nsplit, nkv, R), driver.D1(128), attWarps*attMaxG*(hd+2)*4, &a)
	a.Reset().Ptr(part).Ptr(out).Int(ldo).Int(nq).Int(hd).Int(nsplit)
	g.launch("attn_merge", driver.D2(nq, R), driver.D1(128), 0, &a)
}

// TestGPUAttentionParity: GQA group sizes 1, 4, 7 and 16 (two passes of
// 8), head sizes 64, 80, 128, lengths on both sides of split boundaries,
// and length 0 (pos = -1) in every case, which must give zeros.
// attnCase is one attention test: rows of the given lengths (pos =
// length−1, slots round-robin), random caches and queries (q rows padded
// by 4 floats), the reference scale.
type attnCase struct {
	nq, nkv, hd, ctx, nsplit int
	lens                     []int
	pos, slot                []int32
	q, kc, vc                []float32
	ldq                      int
	scale                    float32
}

func newAttnCase(r *rng, nq, nkv, hd, ctx, nsplit, slots int, lens []int) *attnCase {
	c := &attnCase{nq: nq, nkv: nkv, hd: hd, ctx: ctx, nsplit: nsplit, lens: lens, ldq: nq*hd + 4}
	for i, l := range lens {
		c.pos, c.slot = append(c.pos, int32(l-1)), append(c.slot, int32(i%slots))
	}
	n := slots * nkv * ctx * hd
	c.kc, c.vc = r.vec(n, 1), r.vec(n, 1)
	c.q = r.vec(len(lens)*c.ldq, 1)
	c.scale = float32(1 / math.Sqrt(float64(hd)))
	return c
}

// check compares out (rows of nq·hd) with the float64 reference.
func (c *attnCase) check(t *testing.T, kernel string, got []float32) {
	t.Helper()
	w := c.nq * c.hd
	for ri := range c.lens {
		want := refAttention(c.q[ri*c.ldq:], c.kc, c.vc, int(c.pos[ri]), int(c.slot[ri]), c.nq, c.nkv, c.hd, c.ctx, float64(c.scale))
		for i, wv := range want {
			if !closeRel(got[ri*w+i], wv, 1e-5, 1e-5) {
				t.Fatalf("%s nq %d nkv %d hd %d ctx %d splits %d, len %d: out[%d] = %g, want %g",
					kernel, c.nq, c.nkv, c.hd, c.ctx, c.nsplit, c.lens[ri], i, got[ri*w+i], wv)
			}
		}
	}
}

// checkHalf compares outh (the f16 copy, gemmh_acth's order) with out.
func (c *attnCase) checkHalf(t *testing.T, kernel string, out []float32, hb []byte) {
	t.Helper()
	w := c.nq * c.hd
	for ri := range c.lens {
		for k := range w {
			m, q := k&7, (k&31)>>3
			h := half.F16ToF32(binary.LittleEndian.Uint16(hb[2*(ri*w+k&^31+2*q+m>>2+8*(m&3)):]))
			if want := kern.GemmHActivation(out[ri*w+k]); h != want {
				t.Fatalf("%s nq %d nkv %d hd %d splits %d: f16 output row %d column %d is %g, want %g", kernel, c.nq, c.nkv, c.hd, c.nsplit, ri, k, h, want)
			}
		}
	}
}

func TestGPUAttentionParity(t *testing.T) {
	g := newGPU(t)
	r := rng(8)
	for _, s := range []struct{ nq, nkv, hd, ctx, nsplit int }{
		{4, 4, 64, 70, 1}, {8, 2, 128, 300, 4}, {28, 4, 80, 129, 16}, {32, 2, 64, 1000, 7},
	} {
		n := s.nsplit
		c := newAttnCase(&r, s.nq, s.nkv, s.hd, s.ctx, n, 2, []int{0, 1, 2, n - 1, n, n + 1, 2*n + 1, s.ctx - 1, s.ctx, s.ctx + 5})
		R := len(c.lens)
		part, out := g.zeros(R*c.nq*n*(c.hd+2)), g.zeros(R*c.nq*c.hd)
		attend(g, g.f32(c.q), c.ldq, g.f32(c.kc), g.f32(c.vc), g.i32(c.pos), g.i32(c.slot), part, out, c.nq*c.hd, R, c.nq, c.nkv, c.hd, c.ctx, n, c.scale)
		c.check(t, "attn_split", g.readF32(out, R*c.nq*c.hd))
	}
}

// attendTiles runs attn_tiles through the launcher (cnt: R·nkv zeroed
// counters).
func attendTiles(g *gpu, dq driver.DevicePtr, ldq int, kc, vc, dpos, dslot, part, cnt, out driver.DevicePtr, ldo, R, nq, nkv, hd, ctx, nsplit int, scale float32) {
	attendTilesKV(g, dq, ldq, kc, vc, dpos, dslot, part, cnt, out, ldo, R, nq, nkv, hd, ctx, nsplit, scale, false, 0)
}

func attendTilesKV(g *gpu, dq driver.DevicePtr, ldq int, kc, vc, dpos, dslot, part, cnt, out driver.DevicePtr, ldo, R, nq, nkv, hd, ctx, nsplit int, scale float32, f16 bool, outh driver.DevicePtr) {
	g.run(func(l *kern.Launcher) error {
		return l.AttentionTiles(dq, ldq, kc, vc, dpos, dslot, part, cnt, out, ldo, R, nq, nkv, hd, ctx, nsplit, scale, f16, outh)
	})
}

// TestGPUAttentionTilesParity: attn_tiles against the float64 reference
// over GQA groups 1, 2, 4, 7, 8 and 16 (two passes), head sizes 64, 80,
// 128 and 256, one split (the output written directly) and several (the
// last block's merge, counters reset: each case runs twice and must give
// the same bits), lengths around the tile and split edges, length 0
// (zeros) and rows sharing a slot; with outh, the f16 copy of the output
// in gemmh_acth's order, bit for bit.
func TestGPUAttentionTilesParity(t *testing.T) {
	g := newGPU(t)
	r := rng(18)
	for _, s := range []struct{ nq, nkv, hd, ctx, nsplit int }{
		{4, 4, 64, 70, 1}, {8, 2, 128, 300, 4}, {28, 4, 80, 129, 16}, {32, 2, 64, 1000, 7},
		{32, 8, 128, 520, 1}, {32, 8, 128, 520, 2}, {16, 2, 256, 200, 3}, {16, 8, 128, 4100, 64}, {4, 2, 128, 97, 5},
	} {
		c := newAttnCase(&r, s.nq, s.nkv, s.hd, s.ctx, s.nsplit, 3, []int{0, 1, 2, 31, 32, 33, 63, 64, 65, s.nsplit*32 + 1, s.ctx - 1, s.ctx, s.ctx + 5})
		R := len(c.lens)
		part, cnt, out := g.zeros(R*c.nq*c.nsplit*(c.hd+2)), g.zeros(R*c.nkv), g.zeros(R*c.nq*c.hd)
		dq, dk, dv, dp, ds := g.f32(c.q), g.f32(c.kc), g.f32(c.vc), g.i32(c.pos), g.i32(c.slot)
		attendTiles(g, dq, c.ldq, dk, dv, dp, ds, part, cnt, out, c.nq*c.hd, R, c.nq, c.nkv, c.hd, c.ctx, c.nsplit, c.scale)
		got := g.readF32(out, R*c.nq*c.hd)
		c.check(t, "attn_tiles", got)
		for i, v := range g.readI32(cnt, R*c.nkv) {
			if v != 0 {
				t.Fatalf("attn_tiles %+v: counter %d left at %d", s, i, v)
			}
		}
		// The second launch also writes the half GEMM's f16 activations.
		w := c.nq * c.hd
		outh := g.upload(make([]byte, kern.GemmHScratch(w, R)))
		attendTilesKV(g, dq, c.ldq, dk, dv, dp, ds, part, cnt, out, w, R, c.nq, c.nkv, c.hd, c.ctx, c.nsplit, c.scale, false, outh)
		again := g.readF32(out, R*w)
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(again[i]) {
				t.Fatalf("attn_tiles %+v: a second launch gives out[%d] = %g, the first %g", s, i, again[i], got[i])
			}
		}
		c.checkHalf(t, "attn_tiles", got, g.readBytes(outh, 2*R*w))
	}
}

// TestGPUAttentionTilesF16: attn_tiles_h over float16 caches against the
// float64 reference of the same (f16-rounded) keys and values: head sizes
// 64, 80, 128 and 256, one split and several, lengths around the tile
// edges and 0.
func TestGPUAttentionTilesF16(t *testing.T) {
	g := newGPU(t)
	r := rng(19)
	for _, s := range []struct{ nq, nkv, hd, ctx, nsplit int }{
		{32, 8, 128, 520, 1}, {32, 8, 128, 520, 2}, {28, 4, 80, 129, 16}, {16, 2, 256, 200, 3}, {8, 8, 64, 300, 64},
	} {
		c := newAttnCase(&r, s.nq, s.nkv, s.hd, s.ctx, s.nsplit, 3, []int{0, 1, 31, 32, 33, 65, s.ctx - 1, s.ctx})
		kh, vh := make([]byte, 2*len(c.kc)), make([]byte, 2*len(c.vc))
		for i := range c.kc {
			binary.LittleEndian.PutUint16(kh[2*i:], half.F32ToF16(c.kc[i]))
			binary.LittleEndian.PutUint16(vh[2*i:], half.F32ToF16(c.vc[i]))
			c.kc[i], c.vc[i] = half.RoundF16(c.kc[i]), half.RoundF16(c.vc[i]) // the reference sees the stored values
		}
		R := len(c.lens)
		part, cnt, out := g.zeros(R*c.nq*c.nsplit*(c.hd+2)), g.zeros(R*c.nkv), g.zeros(R*c.nq*c.hd)
		outh := g.upload(make([]byte, kern.GemmHScratch(c.nq*c.hd, R)))
		attendTilesKV(g, g.f32(c.q), c.ldq, g.upload(kh), g.upload(vh), g.i32(c.pos), g.i32(c.slot), part, cnt, out, c.nq*c.hd, R,
			c.nq, c.nkv, c.hd, c.ctx, c.nsplit, c.scale, true, outh)
		got := g.readF32(out, R*c.nq*c.hd)
		c.check(t, "attn_tiles_h", got)
		c.checkHalf(t, "attn_tiles_h", got, g.readBytes(outh, int(kern.GemmHScratch(c.nq*c.hd, R))))
	}
}

// One captured graph serves every length: the positions change in device
// memory between replays, the graph does not.
func TestGPUAttentionGraphLengths(t *testing.T) {
	g := newGPU(t)
	r := rng(9)
	const nq, nkv, hd, ctx, nsplit, R = 8, 2, 64, 512, 8, 2
	cacheN := nkv * ctx * hd
	kc, vc := r.vec(cacheN, 1), r.vec(cacheN, 1)
	q := r.vec(R*nq*hd, 1)
	dq, dkc, dvc := g.f32(q), g.f32(kc), g.f32(vc)
	dpos, dslot := g.i32([]int32{0, 0}), g.i32([]int32{0, 0})
	part := g.zeros(R * nq * nsplit * (hd + 2))
	out := g.zeros(R * nq * hd)
	scale := float32(0.125)
	var exec driver.GraphExec
	var s driver.Stream
	g.do(func(c *driver.Ctx) error {
		var err error
		if s, err = c.NewStream(driver.StreamNonBlocking); err != nil {
			return err
		}
		if err := c.BeginCapture(s, driver.CaptureThreadLocal); err != nil {
			return err
		}
		var a driver.Args
		a.Ptr(dq).Int(nq * hd).Ptr(dkc).Ptr(dvc).Ptr(dpos).Ptr(dslot).Ptr(part).Int(nq).Int(nkv).Int(hd).Int(ctx).Int(nsplit).F32(scale)
		err1 := g.m.Launch(c, "attn_split", driver.Config{Grid: driver.D3(nsplit, nkv, R), Block: driver.D1(128), Shared: attWarps * attMaxG * (hd + 2) * 4, Stream: s}, &a)
		a.Reset().Ptr(part).Ptr(out).Int(nq * hd).Int(nq).Int(hd).Int(nsplit)
		err2 := g.m.Launch(c, "attn_merge", driver.Config{Grid: driver.D2(nq, R), Block: driver.D1(128), Stream: s, PDL: true}, &a)
		graph, err := c.EndCapture(s)
		if err1 != nil || err2 != nil || err != nil {
			return errorsJoin(err1, err2, err)
		}
		defer c.DestroyGraph(graph)
		exec, err = c.Instantiate(graph)
		return err
	})
	t.Cleanup(func() {
		g.d.Do(func(c *driver.Ctx) error { c.DestroyGraphExec(exec); return c.DestroyStream(s) })
	})
	for _, l := range []int{1, 7, 8, 9, 100, 511, 512} {
		pos := []int32{int32(l - 1), int32(ctx - l)}
		b := make([]byte, 8)
		binary.LittleEndian.PutUint32(b, uint32(pos[0]))
		binary.LittleEndian.PutUint32(b[4:], uint32(pos[1]))
		g.write(dpos, b)
		g.do(func(c *driver.Ctx) error {
			if err := c.GraphLaunch(exec, s); err != nil {
				return err
			}
			return c.StreamSync(s)
		})
		got := g.readF32(out, R*nq*hd)
		for ri := range R {
			want := refAttention(q[ri*nq*hd:], kc, vc, int(pos[ri]), 0, nq, nkv, hd, ctx, float64(scale))
			for i, wv := range want {
				if !closeRel(got[ri*nq*hd+i], wv, 1e-5, 1e-5) {
					t.Fatalf("graph replay at length %d row %d: out[%d] = %g, want %g", pos[ri]+1, ri, i, got[ri*nq*hd+i], wv)
				}
			}
		}
	}
}

// The attention reference itself, on the CPU: an empty length gives zeros
// (not NaN), one position gives that position's value row, and two equal
// keys give the mean of their value rows.
func TestRefAttentionEdges(t *testing.T) {
	const nq, nkv, hd, ctx = 2, 1, 4, 3
	r := rng(10)
	q := r.vec(nq*hd, 1)
	kc, vc := r.vec(nkv*ctx*hd, 1), r.vec(nkv*ctx*hd, 1)
	for i, v := range refAttention(q, kc, vc, -1, 0, nq, nkv, hd, ctx, 0.5) {
		if v != 0 {
			t.Fatalf("length 0: out[%d] = %g, want 0", i, v)
		}
	}
	for i, v := range refAttention(q, kc, vc, 0, 0, nq, nkv, hd, ctx, 0.5) {
		if !closeRel(v, vc[i%hd], 1e-6, 0) {
			t.Fatalf("length 1: out[%d] = %g, want %g", i, v, vc[i%hd])
		}
	}
	copy(kc[hd:2*hd], kc[:hd])
	for i, v := range refAttention(q, kc, vc, 1, 0, nq, nkv, hd, ctx, 0.5) {
		want := (vc[i%hd] + vc[hd+i%hd]) / 2
		if !closeRel(v, want, 1e-6, 1e-7) {
			t.Fatalf("length 2, equal keys: out[%d] = %g, want %g", i, v, want)
		}
	}
}

// TestGPUAttentionMMA: attn_mma_h (the tensor-core attention of the
// half-GEMM steps) against the float64 reference over the f16-rounded
// caches, within the bound of its roundings (q·scale and each softmax
// weight to f16: per head 2^-10·S + 2^-9 times the largest |v|, S the
// largest Σ_d |q_d·scale·k_d| of its positions): head sizes 64 and 128,
// GQA groups 1, 4, 8 and 16, one split and several (the last block's
// merge: each case runs twice and must give the same bits, counters left
// at zero), lengths around its 16-position tiles, the 32-position split
// chunks and 0, peaked softmaxes (q ×6), heads of 128 on both the 2- and
// the 4-warp kernel; its f16 copy equals its output rounded, bit for bit,
// and without the copy (outh null) the output is the same bits.
func TestGPUAttentionMMA(t *testing.T) {
	g := newGPU(t)
	r := rng(47)
	for _, s := range []struct {
		nq, nkv, hd, ctx, nsplit int
		qmul                     float32
	}{
		{32, 8, 128, 520, 1, 1}, {32, 8, 128, 520, 3, 1}, {32, 4, 128, 300, 2, 6}, {16, 1, 64, 200, 1, 1},
		{8, 8, 64, 300, 64, 1}, {4, 2, 128, 97, 5, 6}, {64, 4, 64, 150, 1, 6},
	} {
		c := newAttnCase(&r, s.nq, s.nkv, s.hd, s.ctx, s.nsplit, 3, []int{0, 1, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, s.ctx - 1, s.ctx})
		for i := range c.q {
			c.q[i] *= s.qmul
		}
		kh, vh := make([]byte, 2*len(c.kc)), make([]byte, 2*len(c.vc))
		for i := range c.kc {
			binary.LittleEndian.PutUint16(kh[2*i:], half.F32ToF16(c.kc[i]))
			binary.LittleEndian.PutUint16(vh[2*i:], half.F32ToF16(c.vc[i]))
			c.kc[i], c.vc[i] = half.RoundF16(c.kc[i]), half.RoundF16(c.vc[i])
		}
		R, w := len(c.lens), c.nq*c.hd
		part, cnt, out := g.zeros(R*c.nq*c.nsplit*(c.hd+2)), g.zeros(R*c.nkv), g.zeros(R*w)
		outh := g.upload(make([]byte, kern.GemmHScratch(w, R)))
		dq, dk, dv, dp, ds := g.f32(c.q), g.upload(kh), g.upload(vh), g.i32(c.pos), g.i32(c.slot)
		for _, w4 := range []bool{false, true} {
			if w4 && c.hd != 128 {
				continue
			}
			var got []float32
			for run := range 2 {
				g.run(func(l *kern.Launcher) error {
					return l.AttentionMMA(dq, c.ldq, dk, dv, dp, ds, part, cnt, out, w, R, c.nq, c.nkv, c.hd, c.ctx, c.nsplit, c.scale, outh, w4)
				})
				again := g.readF32(out, R*w)
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(again[i]) {
						t.Fatalf("attn_mma %+v: launch %d gives out[%d] = %g, the first %g", s, run, i, again[i], got[i])
					}
				}
				got = again
			}
			for i, v := range g.readI32(cnt, R*c.nkv) {
				if v != 0 {
					t.Fatalf("attn_mma %+v: counter %d left at %d", s, i, v)
				}
			}
			G := c.nq / c.nkv
			worst := 0.0
			for ri, ln := range c.lens {
				want := refAttention(c.q[ri*c.ldq:], c.kc, c.vc, int(c.pos[ri]), int(c.slot[ri]), c.nq, c.nkv, c.hd, c.ctx, float64(c.scale))
				n := min(max(ln, 0), c.ctx)
				for h := range c.nq {
					S, vmax := 0.0, 0.0
					for tp := range n {
						base := ((int(c.slot[ri])*c.nkv+h/G)*c.ctx + tp) * c.hd
						var a float64
						for d := range c.hd {
							a += math.Abs(float64(c.q[ri*c.ldq+h*c.hd+d]) * float64(c.scale) * float64(c.kc[base+d]))
							vmax = math.Max(vmax, math.Abs(float64(c.vc[base+d])))
						}
						S = math.Max(S, a)
					}
					bound := (0x1p-10*S+0x1p-9)*vmax + 1e-5
					for d := range c.hd {
						i := h*c.hd + d
						diff := math.Abs(float64(got[ri*w+i]) - float64(want[i]))
						if diff > bound || math.IsNaN(float64(got[ri*w+i])) {
							t.Fatalf("attn_mma %+v, len %d: out[%d] = %g, want %g (|diff| %g, bound %g)", s, ln, i, got[ri*w+i], want[i], diff, bound)
						}
						worst = math.Max(worst, diff/bound)
					}
				}
			}
			t.Logf("attn_mma %+v (4 warps at hd 128: %v): worst |diff| %.3f of its bound", s, w4, worst)
			c.checkHalf(t, "attn_mma", got, g.readBytes(outh, int(kern.GemmHScratch(w, R))))
			// Without the f16 copy (prefill chunks over an int8 o_proj):
			// the same output, bit for bit.
			g.run(func(l *kern.Launcher) error {
				return l.AttentionMMA(dq, c.ldq, dk, dv, dp, ds, part, cnt, out, w, R, c.nq, c.nkv, c.hd, c.ctx, c.nsplit, c.scale, 0, w4)
			})
			for i, v := range g.readF32(out, R*w) {
				if math.Float32bits(v) != math.Float32bits(got[i]) {
					t.Fatalf("attn_mma %+v without the f16 copy: out[%d] = %g, with it %g", s, i, v, got[i])
				}
			}
		}
	}
}
