package kernels

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/cortiq/cortiq/hugemem"
	"github.com/cortiq/cortiq/quant"
)

// TestRoute checks softmax-then-top-k, the descending order, ties going
// to the lower index, and renormalisation.
func TestRoute(t *testing.T) {
	logits := []float32{0.5, 2, -1, 2, 1, 0.5}
	raw := slices.Clone(logits)
	idx, w := make([]int, 3), make([]float32, 3)
	Route(logits, false, idx, w)
	if !slices.Equal(idx, []int{1, 3, 4}) {
		t.Fatalf("top-3 %v, want [1 3 4] (ties to the lower index)", idx)
	}
	var z float64
	for _, v := range raw {
		z += math.Exp(float64(v))
	}
	for j, e := range idx {
		if p := math.Exp(float64(raw[e])) / z; math.Abs(float64(w[j])-p) > 1e-6 {
			t.Fatalf("weight %d = %v, want the softmax over all experts %v", j, w[j], p)
		}
	}
	idx2 := make([]int, 4)
	Route(slices.Clone(raw), false, idx2, make([]float32, 4))
	if !slices.Equal(idx2, []int{1, 3, 4, 0}) {
		t.Fatalf("top-4 %v, want [1 3 4 0]", idx2)
	}
	Route(slices.Clone(raw), true, idx, w)
	if s := w[0] + w[1] + w[2]; math.Abs(float64(s)-1) > 1e-6 || w[0] != w[1] || w[2] >= w[1] {
		t.Fatalf("renormalised weights %v", w)
	}
}

// refMoE is the plain per-token reference: route each row, run each of
// its experts on it alone with MatVec, accumulate in float64.
func refMoE(p *Pool, m *MoE, x []float32, T int) []float64 {
	E, k, dim := len(m.Experts), m.TopK, m.Router.Cols
	out := make([]float64, T*dim)
	swiglu := func(ex *Expert, xr []float32) []float32 {
		I := ex.Gate.Rows
		g, u, y := make([]float32, I), make([]float32, I), make([]float32, dim)
		p.MatVec(ex.Gate, xr, g)
		p.MatVec(ex.Up, xr, u)
		for i := range g {
			g[i] = g[i] / float32(1+math.Exp(-float64(g[i]))) * u[i]
		}
		p.MatVec(ex.Down, g, y)
		return y
	}
	for t := range T {
		xr := x[t*dim : (t+1)*dim]
		lg := make([]float32, E)
		p.MatVec(m.Router, xr, lg)
		idx, w := make([]int, k), make([]float32, k)
		Route(lg, m.Renorm, idx, w)
		for j, e := range idx {
			for i, v := range swiglu(&m.Experts[e], xr) {
				out[t*dim+i] += float64(w[j]) * float64(v)
			}
		}
		if m.Shared != nil {
			sg := make([]float32, 1)
			p.MatVec(m.SharedGate, xr, sg)
			g := 1 / (1 + math.Exp(-float64(sg[0])))
			for i, v := range swiglu(m.Shared, xr) {
				out[t*dim+i] += g * float64(v)
			}
		}
	}
	return out
}

func randMoE(t testing.TB, r *rand.Rand, d quant.DType, E, k, dim, inter int, shared bool) *MoE {
	m := &MoE{TopK: k, Renorm: true, Experts: make([]Expert, E)}
	m.Router, _ = randMat(t, r, d, E, dim)
	ex := func() Expert {
		g, _ := randMat(t, r, d, inter, dim)
		u, _ := randMat(t, r, d, inter, dim)
		dn, _ := randMat(t, r, d, dim, inter)
		return Expert{g, u, dn}
	}
	for e := range m.Experts {
		m.Experts[e] = ex()
	}
	if shared {
		s := ex()
		m.Shared = &s
		m.SharedGate, _ = randMat(t, r, d, 1, dim)
	}
	if err := m.Check(dim); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestMoEForwardMatchesPerToken runs the grouped MoE (each expert once
// over its gathered rows) against the per-token reference, with and
// without a shared expert, f32 and q8_row weights, decode (T=1) and
// prefill chunks; it also checks that only the selected experts' bytes
// are counted.
func TestMoEForwardMatchesPerToken(t *testing.T) {
	pool := NewPool(2)
	defer pool.Close()
	const E, k, dim, inter = 8, 2, 64, 32
	for _, d := range []quant.DType{quant.F32, quant.Q8Row, quant.Q82F} {
		for _, shared := range []bool{false, true} {
			for _, T := range []int{1, 5, 33} {
				t.Run(fmt.Sprintf("%s/shared=%v/T=%d", d, shared, T), func(t *testing.T) {
					r := rand.New(rand.NewPCG(uint64(T), 11))
					m := randMoE(t, r, d, E, k, dim, inter, shared)
					x := randVec(r, T*dim)
					want := refMoE(pool, m, x, T)
					got := make([]float32, T*dim)
					var s MoEScratch
					MoEForward(pool, m, x, T, got, &s)
					var e, scale float64
					for i, v := range got {
						e = math.Max(e, math.Abs(float64(v)-want[i]))
						scale = math.Max(scale, math.Abs(want[i]))
					}
					// The int8 activations of the quantized formats are
					// quantized per row in MatMul as in MatVec; the two
					// sum in different orders.
					if e > 1e-5*math.Max(1, scale) {
						t.Fatalf("grouped differs from per-token by %.3g (scale %.3g)", e, scale)
					}
					if T == 1 {
						want := int64(len(m.Router.Data))
						if shared {
							want += int64(len(m.Shared.Gate.Data) + len(m.Shared.Up.Data) + len(m.Shared.Down.Data) + len(m.SharedGate.Data))
						}
						want += int64(k) * m.ExpertBytes(0)
						if s.Bytes != want {
							t.Fatalf("read %d bytes, want %d (router, %d experts, shared)", s.Bytes, want, k)
						}
					}
				})
			}
		}
	}
}

// TestMoEPack checks that a packed MoE gives bit for bit the original's
// outputs (decode and a prefill chunk, every CPU weight format with a
// shared expert), that its experts lie in one huge-page-aligned buffer in
// order (gate, up, down per expert, 64-byte aligned), that the router and
// the shared expert are the original's, and that the original is intact.
func TestMoEPack(t *testing.T) {
	pool := NewPool(2)
	defer pool.Close()
	const E, k, dim, inter = 6, 2, 64, 96
	for _, d := range []quant.DType{quant.F32, quant.Q8Row, quant.Q82F, quant.Q4TP} {
		r := rand.New(rand.NewPCG(7, uint64(d)))
		m := randMoE(t, r, d, E, k, dim, inter, true)
		orig := m.Experts[0].Gate.Data[:8:8]
		orig = append([]byte(nil), orig...)
		p, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		if p.Router != m.Router || p.Shared != m.Shared || p.SharedGate != m.SharedGate || p.TopK != m.TopK || p.Renorm != m.Renorm {
			t.Fatalf("%s: Pack changed the router, shared expert or routing", d)
		}
		base := uintptr(unsafe.Pointer(&p.Experts[0].Gate.Data[0]))
		if base%hugemem.PageSize != 0 {
			t.Fatalf("%s: packed experts start at %#x", d, base)
		}
		off := uintptr(0)
		for e := range p.Experts {
			for i, w := range []*Mat{p.Experts[e].Gate, p.Experts[e].Up, p.Experts[e].Down} {
				o := []*Mat{m.Experts[e].Gate, m.Experts[e].Up, m.Experts[e].Down}[i]
				if at := uintptr(unsafe.Pointer(&w.Data[0])) - base; at != off {
					t.Fatalf("%s: expert %d matrix %d at offset %d, want %d", d, e, i, at, off)
				}
				if !bytes.Equal(w.Data, o.Data) || w == o || &w.Data[0] == &o.Data[0] {
					t.Fatalf("%s: expert %d matrix %d is not a copy of the original", d, e, i)
				}
				off += uintptr(len(w.Data)+63) &^ 63
			}
		}
		if int64(off) != m.PackedBytes() {
			t.Fatalf("%s: packed %d bytes, PackedBytes says %d", d, off, m.PackedBytes())
		}
		if !bytes.Equal(m.Experts[0].Gate.Data[:8], orig) {
			t.Fatalf("%s: Pack changed the original", d)
		}
		for _, T := range []int{1, 7} {
			x := randVec(r, T*dim)
			want, got := make([]float32, T*dim), make([]float32, T*dim)
			var s1, s2 MoEScratch
			MoEForward(pool, m, x, T, want, &s1)
			MoEForward(pool, p, x, T, got, &s2)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s T=%d: packed output[%d] = %g, original %g", d, T, i, got[i], want[i])
				}
			}
			if s1.Bytes != s2.Bytes {
				t.Fatalf("%s T=%d: packed read %d bytes, original %d", d, T, s2.Bytes, s1.Bytes)
			}
		}
	}
}

// randQ8 is a q8_row matrix of random bytes (scales 0.01), made without
// the encoder so that benchmarks can allocate hundreds of MB quickly. Its
// bytes are cut from *slab when it has room (matrices laid out one after
// another, as in a model file), else allocated alone.
func randQ8(b testing.TB, seed *uint64, rows, cols int, slab *[]byte) *Mat {
	n := rows*cols + 2*rows
	var data []byte
	if len(*slab) >= n {
		data, *slab = (*slab)[:n:n], (*slab)[(n+63)&^63:]
	} else {
		data = make([]byte, n)
	}
	for i := 0; i+8 <= rows*cols; i += 8 {
		*seed = *seed*6364136223846793005 + 1442695040888963407
		binary.LittleEndian.PutUint64(data[i:], *seed)
	}
	for i := range rows {
		data[rows*cols+2*i], data[rows*cols+2*i+1] = 0x1f, 0x21
	}
	m, err := NewMat(quant.Q8Row, rows, cols, data)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// BenchmarkMoEDecodeBandwidthShare decodes one token through the MoE
// layers of a small Qwen3-MoE shape (4 layers of 32 experts, top 4,
// hidden 1024, expert width 768, q8_row: 300 MB of experts, far beyond the
// caches) and reports the bytes actually read (router + the selected
// experts) per second as a share of a read probe run before each token
// in the same loop (%bw), as kernels' BenchmarkDecodeBandwidthShare does
// for dense matrices. The layers run as the CPU device runs them, their
// experts packed into huge pages (MoE.Pack); inplace%bw is the same
// layers read where they were laid out (one Go-heap slab of 4 KB pages,
// as a model file's mapping), alternated token by token with the packed
// ones.
func BenchmarkMoEDecodeBandwidthShare(b *testing.B) {
	if testing.Short() {
		b.Skip("allocates 600 MB of experts")
	}
	const layers, E, k, dim, inter = 4, 32, 4, 1024, 768
	p := NewPool(0)
	defer p.Close()
	seed := uint64(3)
	// One slab for all layers, as the weights of a model file are.
	slab := make([]byte, layers*(E*3*(inter*dim+2*max(inter, dim)+64)+E*dim+2*E+64))
	moes, packed := make([]*MoE, layers), make([]*MoE, layers)
	for l := range moes {
		m := &MoE{Router: randQ8(b, &seed, E, dim, &slab), TopK: k, Renorm: true, Experts: make([]Expert, E)}
		for e := range m.Experts {
			m.Experts[e] = Expert{randQ8(b, &seed, inter, dim, &slab), randQ8(b, &seed, inter, dim, &slab), randQ8(b, &seed, dim, inter, &slab)}
		}
		moes[l] = m
		var err error
		if packed[l], err = m.Pack(); err != nil {
			b.Fatal(err)
		}
	}
	buf := make([]byte, 256<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	r := rand.New(rand.NewPCG(1, 2))
	x, out := make([]float32, dim), make([]float32, dim)
	var s MoEScratch
	var shares, inplace, toks, bws []float64
	var sum atomic.Uint64
	token := func(ms []*MoE) (share, tok, bw float64) {
		t0 := time.Now()
		var wg sync.WaitGroup
		per := len(buf) / p.Workers()
		for w := range p.Workers() {
			wg.Go(func() { sum.Add(streamRead(buf[w*per : (w+1)*per])) })
		}
		wg.Wait()
		bw = float64(len(buf)) / time.Since(t0).Seconds()
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		t1 := time.Now()
		var bytes int64
		for _, m := range ms {
			MoEForward(p, m, x, 1, out, &s)
			bytes += s.Bytes
		}
		dt := time.Since(t1).Seconds()
		return float64(bytes) / dt / bw, 1 / dt, bw
	}
	for b.Loop() {
		sh, tok, bw := token(packed)
		shares, toks, bws = append(shares, sh), append(toks, tok), append(bws, bw/1e9)
		sh, _, _ = token(moes)
		inplace = append(inplace, sh)
	}
	b.ReportMetric(100*median(shares), "%bw")
	b.ReportMetric(100*median(inplace), "inplace%bw")
	b.ReportMetric(median(toks), "tok/s")
	b.ReportMetric(median(bws), "readGB/s")
}
