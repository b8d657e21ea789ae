package cpu

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/hugemem"
	"github.com/cortiq/cortiq/kernels"
)

// The MoE and Gated DeltaNet blocks (backend.Ops MoE, DeltaNet) on the
// kernels' block operations (kernels.MoEForward, kernels.GDN).

// hybridState is a step's scratch for the two blocks.
type hybridState struct {
	moe kernels.MoEScratch
	gdn kernels.GDNScratch
}

// blocks caches the kernels' view of each block's weights, built on first
// use (one per backend weight struct, which the model keeps for its life;
// the device keeps the entries, and with them the weight structs, until it
// is closed: one device per loaded model, as engine.Open does).
type blocks struct {
	mu    sync.Mutex
	moe   map[*backend.MoE]*kernels.MoE
	gdn   map[*backend.DeltaNet]*kernels.GDN
	names map[*kernels.Mat]string // tensor names, for the observer
	// packed is the expert bytes copied into huge pages so far; noPack
	// stops further copies (no memory left, or the copy failed).
	packed int64
	noPack bool
}

// view returns m's kernel matrix and records its name; the caller holds b.mu.
func (b *blocks) view(m backend.Mat) *kernels.Mat {
	if m == nil {
		return nil
	}
	cm := matOf(m)
	if b.names == nil {
		b.names = map[*kernels.Mat]string{}
	}
	b.names[cm.Mat] = cm.name
	return cm.Mat
}

func (b *blocks) name(m *kernels.Mat) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.names[m]
}

// observer returns the kernels' observation hook reporting to the
// device's observer under the tensors' names, or nil without one.
func (st *state) observer() func(m *kernels.Mat, x []float32, rows, cols int) {
	obs := st.dev.obs
	if obs == nil {
		return nil
	}
	return func(m *kernels.Mat, x []float32, rows, cols int) {
		obs.Observe(st.dev.blocks.name(m), x, rows, cols)
	}
}

// pack returns m with its routed experts copied into huge pages
// (kernels.MoE.Pack: decode reads them ~8% faster than in place in the
// file's 4 KB pages), or m itself when the kernel has transparent huge
// pages off, when the copy would take more than half the memory still
// available (the file's pages stay cached but can be reclaimed), or when
// the copy fails. The caller holds b.mu.
func (b *blocks) pack(m *kernels.MoE) *kernels.MoE {
	if b.noPack || !hugemem.Enabled() {
		return m
	}
	n := m.PackedBytes()
	if avail := hugemem.Available(); avail < 0 || 2*n > avail {
		slog.Warn("cpu: MoE experts stay in the file's mapping (4 KB pages): not enough memory to copy them into huge pages", "layer_bytes", n, "available", avail, "packed_so_far", b.packed)
		b.noPack = true
		return m
	}
	p, err := m.Pack()
	if err != nil {
		slog.Warn("cpu: MoE experts stay in the file's mapping", "err", err)
		b.noPack = true
		return m
	}
	for e := range m.Experts {
		b.names[p.Experts[e].Gate] = b.names[m.Experts[e].Gate]
		b.names[p.Experts[e].Up] = b.names[m.Experts[e].Up]
		b.names[p.Experts[e].Down] = b.names[m.Experts[e].Down]
	}
	b.packed += n
	return p
}

func (b *blocks) moeOf(w *backend.MoE) (*kernels.MoE, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if m, ok := b.moe[w]; ok {
		return m, nil
	}
	m := &kernels.MoE{Router: b.view(w.Router), TopK: w.TopK, Renorm: w.Renorm, Experts: make([]kernels.Expert, len(w.Experts))}
	for e, x := range w.Experts {
		m.Experts[e] = kernels.Expert{Gate: b.view(x.Gate), Up: b.view(x.Up), Down: b.view(x.Down)}
	}
	if w.Shared != nil {
		m.Shared = &kernels.Expert{Gate: b.view(w.Shared.Gate), Up: b.view(w.Shared.Up), Down: b.view(w.Shared.Down)}
		m.SharedGate = b.view(w.SharedGate)
	}
	if err := m.Check(m.Router.Cols); err != nil {
		return nil, err
	}
	m = b.pack(m)
	if b.moe == nil {
		b.moe = map[*backend.MoE]*kernels.MoE{}
	}
	b.moe[w] = m
	return m, nil
}

func (b *blocks) gdnOf(w *backend.DeltaNet, dim int) (*kernels.GDN, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if g, ok := b.gdn[w]; ok {
		return g, nil
	}
	s := w.Shape
	g := &kernels.GDN{
		Rule: kernels.DeltaRule{KeyHeads: s.KeyHeads, ValueHeads: s.ValueHeads, KeyDim: s.KeyDim, ValueDim: s.ValueDim},
		Conv: s.ConvKernel, QKVZ: b.view(w.QKVZ), BA: b.view(w.BA), QKV: b.view(w.QKV), Z: b.view(w.Z), B: b.view(w.B), A: b.view(w.A),
		ConvW: vecOf(w.Conv), ALog: vecOf(w.ALog), DtBias: vecOf(w.DtBias), Norm: vecOf(w.GateNorm.W), Out: b.view(w.Out), Eps: w.GateNorm.Eps,
	}
	if err := g.Check(dim); err != nil {
		return nil, err
	}
	if b.gdn == nil {
		b.gdn = map[*backend.DeltaNet]*kernels.GDN{}
	}
	b.gdn[w] = g
	return g, nil
}

// MoE adds the mixture-of-experts block to x: all rows of the step (of
// every sequence) are routed together, so each selected expert is read
// once per step.
func (st *state) MoE(w *backend.MoE) {
	if st.err != nil {
		return
	}
	m, err := st.dev.blocks.moeOf(w)
	if err != nil {
		st.fail(fmt.Errorf("cpu: moe: %w", err))
		return
	}
	T, H := st.rows, m.Router.Cols
	x, xb := st.x[:T*H], grow(&st.xb, T*H)
	// xb = post_attention_layernorm(x); x += moe(xb)
	norm(xb, x, &w.Norm)
	st.hy.moe.Observe = st.observer()
	kernels.MoEForward(st.dev.pool, m, xb, T, x, &st.hy.moe)
}

// DeltaNet adds layer's Gated DeltaNet block to x, one sequence's rows at
// a time (each runs on its own state; a sequence's rows are consecutive).
func (st *state) DeltaNet(w *backend.DeltaNet, layer int) {
	if st.err != nil {
		return
	}
	H, _ := w.Out.Dims() // out_proj is (H, vd)
	g, err := st.dev.blocks.gdnOf(w, H)
	if err != nil {
		st.fail(fmt.Errorf("cpu: deltanet layer %d: %w", layer, err))
		return
	}
	T := st.rows
	x, xb := st.x[:T*H], grow(&st.xb, T*H)
	// xb = input_layernorm(x)
	norm(xb, x, &w.Norm)
	st.hy.gdn.Observe = st.observer()
	r := 0
	for i, toks := range st.b.Tokens {
		c := st.b.Seqs[i].(*seq)
		if c.gdn == nil || len(c.gdn[layer].S) == 0 {
			st.fail(fmt.Errorf("cpu: sequence %d has no deltanet state for layer %d", i, layer))
			return
		}
		n := len(toks)
		// x += GatedDeltaNet(xb) over the sequence's rows, advancing its state.
		g.Forward(st.dev.pool, xb[r*H:(r+n)*H], n, H, x[r*H:(r+n)*H], &c.gdn[layer], &st.hy.gdn)
		r += n
	}
}
