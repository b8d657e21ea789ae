package cuda

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/backendtest"
	"github.com/cortiq/cortiq/backend/cpu"
	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/quant"
)

// hybridNet is a two-layer hybrid network (layer 0 Gated DeltaNet in
// Qwen3-Next's grouped layout, layer 1 attention) in f32, built through
// the Device interface so that the same weights run on any device.
type hybridNet struct {
	embed backend.Mat
	gdn   *backend.DeltaNet
	attn  *backend.Attention
	head  backend.Head
	spec  backend.SeqSpec
}

const hybridH, hybridVocab = 64, 40

func newHybridNet(t *testing.T, dev backend.Device) *hybridNet {
	t.Helper()
	r := rand.New(rand.NewPCG(5, 9))
	mat := func(name string, rows, cols int, scale float32) backend.Mat {
		w := make([]float32, rows*cols)
		for i := range w {
			w[i] = (r.Float32()*2 - 1) * scale
		}
		m, err := dev.LoadMat(name, quant.F32, rows, cols, f32Bytes(w))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	vec := func(n int, base, scale float32) backend.Vec {
		v := make([]float32, n)
		for i := range v {
			v[i] = base + (r.Float32()*2-1)*scale
		}
		p, err := dev.LoadVec(v)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	H := hybridH
	norm := func() backend.Norm { return backend.Norm{W: vec(H, 1, 0.1), Eps: 1e-6} }
	s := backend.DeltaNetShape{KeyHeads: 2, ValueHeads: 4, KeyDim: 16, ValueDim: 8, ConvKernel: 4}
	kd, vd, cd := s.Dims()
	n := &hybridNet{embed: mat("embed", hybridVocab, H, 1)}
	n.gdn = &backend.DeltaNet{Norm: norm(), Shape: s, QKVZ: mat("qkvz", 2*kd+2*vd, H, 0.15), BA: mat("ba", 2*s.ValueHeads, H, 0.15),
		Conv: vec(cd*s.ConvKernel, 0, 0.3), ALog: vec(s.ValueHeads, -1.5, 0.5), DtBias: vec(s.ValueHeads, 0, 0.5),
		GateNorm: backend.Norm{W: vec(s.ValueDim, 1, 0.1), Eps: 1e-6}, Out: mat("out", H, vd, 0.1)}
	rp, err := dev.NewRope(backend.RopeConfig{HeadDim: 16, Theta: 10000, MaxPositions: 128})
	if err != nil {
		t.Fatal(err)
	}
	n.attn = &backend.Attention{Norm: norm(), Q: mat("q", 64, H, 0.1), K: mat("k", 32, H, 0.1), V: mat("v", 32, H, 0.1),
		O: mat("o", H, 64, 0.1), Rope: rp, Heads: 4, KVHeads: 2, HeadDim: 16}
	n.head = backend.Head{Norm: norm(), W: mat("head", hybridVocab, H, 0.2)}
	n.spec = backend.SeqSpec{Layers: 2, Attention: []int{1}, KVHeads: 2, HeadDim: 16, DeltaNet: []int{0}, DeltaNetShape: s}
	return n
}

func (n *hybridNet) step(ops backend.Ops) {
	ops.Embed(n.embed)
	ops.DeltaNet(n.gdn, 0)
	ops.Attention(n.attn, 1)
	ops.Head(&n.head)
}

// run appends toks to s and returns the last row's logits.
func (n *hybridNet) run(t *testing.T, dev backend.Device, s backend.Seq, toks ...int) []float32 {
	t.Helper()
	b := &backend.Batch{Seqs: []backend.Seq{s}, Tokens: [][]int{toks}, Logits: backend.LastLogits, Out: make([]float32, hybridVocab)}
	if err := dev.Run(b, n.step); err != nil {
		t.Fatal(err)
	}
	return b.Out
}

// TestStateSaverOnFake: the cuda sequence's linear-attention state
// (backend.StateSaver) on the fake with the kernels' models, on a hybrid
// network: SaveState after a prefill and a decode step equals the CPU
// backend's SaveState after the same tokens (same layout and values, to
// rounding); a new sequence given the saved state (RestoreState) and the
// K/V prefix (CopyPrefix) continues exactly as the original did; a
// sequence emptied by Truncate(0) starts again from a zero state (so does
// a new sequence in a released slot), and other truncations and malformed
// restores are refused.
func TestStateSaverOnFake(t *testing.T) {
	f := newFake(t, 4)
	f.numeric, f.decoded = true, map[string][]float32{}
	d := fakeOpen(f, Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: true})
	c := cpu.New(1)
	defer c.Close()
	gn, cn := newHybridNet(t, d), newHybridNet(t, c)
	prompt := []int{3, 17, 5, 29, 11}
	ga, err := d.NewSeq(gn.spec, 64)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := c.NewSeq(cn.spec, 64)
	if err != nil {
		t.Fatal(err)
	}
	first := gn.run(t, d, ga, prompt...)
	if nm := backendtest.NMSE(first, cn.run(t, c, ca, prompt...)); nm > 1e-9 {
		t.Fatalf("prefill logits NMSE %.3g against the CPU", nm)
	}
	gn.run(t, d, ga, 7)
	cn.run(t, c, ca, 7)
	saved := ga.(backend.StateSaver).SaveState(nil)
	want := ca.(backend.StateSaver).SaveState(nil)
	if len(saved) != int(gn.spec.StateBytes()/4) || len(saved) != len(want) {
		t.Fatalf("saved %d values, the CPU %d, the spec %d", len(saved), len(want), gn.spec.StateBytes()/4)
	}
	if nm := backendtest.NMSE(saved, want); nm > 1e-10 {
		t.Fatalf("saved state NMSE %.3g against the CPU's", nm)
	}
	next := gn.run(t, d, ga, 23)
	if nm := backendtest.NMSE(next, cn.run(t, c, ca, 23)); nm > 1e-9 {
		t.Fatalf("decode logits NMSE %.3g against the CPU", nm)
	}
	// Resume a second sequence from the snapshot at length 6.
	gb, err := d.NewSeq(gn.spec, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := gb.(backend.StateSaver).CopyPrefix(ga, 6); err != nil {
		t.Fatal(err)
	}
	if err := gb.(backend.StateSaver).RestoreState(saved, 6); err != nil {
		t.Fatal(err)
	}
	if gb.Len() != 6 {
		t.Fatalf("restored length %d", gb.Len())
	}
	resumed := gn.run(t, d, gb, 23)
	for i := range next {
		if resumed[i] != next[i] {
			t.Fatalf("logit %d after the restore: %g, the original sequence %g", i, resumed[i], next[i])
		}
	}
	// Refusals.
	if err := ga.Truncate(3); !errors.Is(err, backend.ErrNotRewindable) {
		t.Fatalf("Truncate(3) of a linear-attention sequence: %v", err)
	}
	if err := gb.(backend.StateSaver).RestoreState(saved[1:], 6); err == nil {
		t.Fatal("a state of the wrong size was restored")
	}
	if err := gb.(backend.StateSaver).RestoreState(saved, 65); err == nil {
		t.Fatal("a state was restored beyond the context")
	}
	// Emptied, a sequence starts again from zero.
	if err := ga.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if again := gn.run(t, d, ga, prompt...); backendtest.NMSE(again, first) != 0 {
		t.Fatalf("after Truncate(0) the prefill gives other logits (NMSE %.3g)", backendtest.NMSE(again, first))
	}
	d.Release(gb)
	gc, err := d.NewSeq(gn.spec, 64) // gb's slot, its state non-zero until NewSeq
	if err != nil {
		t.Fatal(err)
	}
	if again := gn.run(t, d, gc, prompt...); backendtest.NMSE(again, first) != 0 {
		t.Fatalf("a new sequence in a used slot gives other logits (NMSE %.3g)", backendtest.NMSE(again, first))
	}
	if z := gc.(backend.StateSaver).SaveState(nil); backendtest.NMSE(z, ga.(backend.StateSaver).SaveState(nil)) != 0 {
		t.Fatal("two sequences after the same prompt hold different states")
	}
	if f.replays == 0 {
		t.Fatal("no decode step was replayed from a graph (the resumed decode must be one)")
	}
}

// TestPlanCountsLinearState: the memory plan's KV counts every sequence's
// K/V and Gated DeltaNet state, and the step scratch the block's buffers
// (dn_proj, dn_conv, dn_o and the chunked rule's dn_chunk at MaxRows rows).
func TestPlanCountsLinearState(t *testing.T) {
	f := newFake(t, 4)
	d := fakeOpen(f, Options{Seqs: 3, Ctx: 100, MaxRows: 32})
	s := backend.DeltaNetShape{KeyHeads: 16, ValueHeads: 32, KeyDim: 128, ValueDim: 128, ConvKernel: 4}
	dense := backend.SeqSpec{Layers: 4, Attention: []int{3}, KVHeads: 2, HeadDim: 256}
	hybrid := dense
	hybrid.DeltaNet, hybrid.DeltaNetShape = []int{0, 1, 2}, s
	if err := d.Plan(1<<20, dense, 2048); err != nil {
		t.Fatal(err)
	}
	p0 := d.MemoryPlan()
	if err := d.Plan(1<<20, hybrid, 2048); err != nil {
		t.Fatal(err)
	}
	p1 := d.MemoryPlan()
	state := int64(3) * 3 * 4 * (3*(2*16*128+32*128) + 32*128*128) // seqs × layers × (conv + S) f32
	if p1.KV-p0.KV != state {
		t.Fatalf("K/V plan %d with the DeltaNet layers, %d without: +%d, want +%d", p1.KV, p0.KV, p1.KV-p0.KV, state)
	}
	chunk := int64(4 * 32 * 32 * (128 + 3*128 + kern.DNChunk + 4)) // dn_chunk: MaxRows × value heads × [U W Qe Kd M e^Γn pad]
	if scratch := int64(4*32*((2*2048+2*4096+64)+8192+4096)) + chunk; p1.Scratch-p0.Scratch != scratch {
		t.Fatalf("scratch +%d with the DeltaNet layers, want +%d", p1.Scratch-p0.Scratch, scratch)
	}
}
