// Package backendtest is the parity harness for backend.Device
// implementations (llama.cpp's test-backend-ops is the model): every op ×
// weight format × shape runs on the device under test and on a reference
// device, and their logits are compared by normalised squared error. Each
// case is a one-block network (embedding, one op, head) with random
// weights, driven over schedules that cover prefill chunks of 1…9 rows,
// decode across the 64-position boundary, and steps that mix several
// sequences.
package backendtest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/sample"
)

// Case is one parity case: an op with its options in one weight format.
type Case struct {
	Name    string
	Op      string // "attention", "mlp", "head", "moe", "deltanet"
	DType   quant.DType
	H, I    int // hidden and MLP widths (multiples of 32 so q4tp holds them)
	Heads   int
	KVHeads int
	HeadDim int
	Vocab   int
	Bias    bool
	QKNorm  bool
	OnePlus bool
	Rope    backend.RopeConfig
	Gated   bool // attention: q_proj with the per-head output gate
	// moe: Experts of width I, TopK routed (renormalised when Renorm),
	// plus a shared expert of width I when Shared.
	Experts, TopK  int
	Renorm, Shared bool
	// deltanet: the layer's shape; Grouped selects Qwen3-Next's
	// in_proj_qkvz/in_proj_ba layout, else Qwen3.5's split projections.
	DeltaNet backend.DeltaNetShape
	Grouped  bool
}

// Cases returns the standard cases: every op in every weight format, and
// the attention variants (GQA ratios, biases, q/k norm, zero-centred norms,
// partial rotary, each RoPE scaling type) in f32 and q4tp.
func Cases() []Case {
	base := Case{H: 64, I: 96, Heads: 4, KVHeads: 2, HeadDim: 16, Vocab: 72, Rope: backend.RopeConfig{HeadDim: 16, Theta: 10000, MaxPositions: 128}}
	var cs []Case
	for _, d := range []quant.DType{quant.F32, quant.F16, quant.BF16, quant.Q8Row, quant.Q82F, quant.Q4TP} {
		for _, op := range []string{"head", "attention", "mlp"} {
			c := base
			c.Name, c.Op, c.DType = op+"/"+d.String(), op, d
			cs = append(cs, c)
		}
	}
	variants := []func(*Case){
		func(c *Case) { c.Name += "/mqa"; c.KVHeads = 1 },
		func(c *Case) { c.Name += "/mha_bias"; c.KVHeads, c.Bias = 4, true },
		func(c *Case) { c.Name += "/qknorm_oneplus"; c.QKNorm, c.OnePlus = true, true },
		func(c *Case) { c.Name += "/partial"; c.Rope.PartialRotaryFactor = 0.25 },
		func(c *Case) {
			c.Name += "/llama3"
			c.Rope.Type, c.Rope.Factor, c.Rope.LowFreqFactor, c.Rope.HighFreqFactor, c.Rope.OriginalMaxPos = "llama3", 8, 1, 4, 32
		},
		func(c *Case) { c.Name += "/yarn"; c.Rope.Type, c.Rope.Factor, c.Rope.OriginalMaxPos = "yarn", 4, 32 },
		func(c *Case) { c.Name += "/linear"; c.Rope.Type, c.Rope.Factor = "linear", 2 },
		func(c *Case) {
			c.Name += "/dynamic"
			c.Rope.Type, c.Rope.Factor, c.Rope.MaxPositions = "dynamic", 2, 16
		},
	}
	for _, d := range []quant.DType{quant.F32, quant.Q4TP} {
		for _, v := range variants {
			c := base
			c.Name, c.Op, c.DType = "attention/"+d.String(), "attention", d
			v(&c)
			cs = append(cs, c)
		}
	}
	// Heads of 6 dimensions: not a multiple of 4, so a GPU runs them on
	// attn_split + attn_merge, not attn_tiles (f32 only: 4·6 columns are
	// no whole block of a quantized format).
	h6 := base
	h6.Name, h6.Op, h6.DType, h6.HeadDim, h6.Rope.HeadDim = "attention/f32/hd6", "attention", quant.F32, 6, 6
	cs = append(cs, h6)
	// Heads of 64 dimensions, a GQA group of 4, q4tp: the size a GPU's
	// half-GEMM steps run on the tensor-core attention (attn_mma_h).
	h64 := base
	h64.Name, h64.Op, h64.DType, h64.HeadDim, h64.Rope.HeadDim, h64.KVHeads = "attention/q4tp/hd64", "attention", quant.Q4TP, 64, 64, 1
	cs = append(cs, h64)
	mb := base
	mb.Name, mb.Op, mb.DType, mb.Bias = "mlp/q8_2f/bias", "mlp", quant.Q82F, true
	cs = append(cs, mb)
	// The blocks of the MoE / hybrid models.
	for _, d := range []quant.DType{quant.F32, quant.Q8Row, quant.Q82F, quant.Q4TP} {
		g := base
		g.Name, g.Op, g.DType, g.Gated, g.QKNorm, g.OnePlus = "attention/"+d.String()+"/gated_partial", "attention", d, true, true, true
		g.Rope.PartialRotaryFactor = 0.25
		m := base
		m.Name, m.Op, m.DType, m.I, m.Experts, m.TopK, m.Renorm = "moe/"+d.String(), "moe", d, 32, 8, 2, true
		ms := m
		ms.Name, ms.Shared, ms.Renorm = ms.Name+"/shared_norenorm", true, false
		cs = append(cs, g, m, ms)
		for _, grouped := range []bool{false, true} {
			n := base
			n.Name, n.Op, n.DType, n.Grouped = "deltanet/"+d.String()+"/split", "deltanet", d, grouped
			if grouped {
				n.Name = "deltanet/" + d.String() + "/grouped"
			}
			n.DeltaNet = backend.DeltaNetShape{KeyHeads: 2, ValueHeads: 4, KeyDim: 16, ValueDim: 8, ConvKernel: 4}
			cs = append(cs, n)
		}
	}
	return cs
}

// net is a one-block network resident on a device.
type net struct {
	embed backend.Mat
	attn  *backend.Attention
	mlp   *backend.MLP
	moe   *backend.MoE
	gdn   *backend.DeltaNet
	head  backend.Head
	spec  backend.SeqSpec
}

func (n *net) step(ops backend.Ops) {
	ops.Embed(n.embed)
	if n.attn != nil {
		ops.Attention(n.attn, 0)
	}
	if n.gdn != nil {
		ops.DeltaNet(n.gdn, 0)
	}
	if n.mlp != nil {
		ops.MLP(n.mlp)
	}
	if n.moe != nil {
		ops.MoE(n.moe)
	}
	ops.Head(&n.head)
}

// encoded caches encoded weights: every schedule and device of a case
// uses the same bytes, and q4tp encoding is slow.
var encoded sync.Map

func encode(c Case, dt quant.DType, name string, seed uint64, w []float32, rows, cols int) ([]byte, error) {
	key := fmt.Sprintf("%+v/%s/%d", c, name, seed)
	if b, ok := encoded.Load(key); ok {
		return b.([]byte), nil
	}
	b, err := quant.Encode(dt, w, []int{rows, cols}, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: encode %s: %w", c.Name, name, err)
	}
	encoded.Store(key, b)
	return b, nil
}

// build makes c's random weights (the same for a seed on every device)
// resident on dev.
func build(dev backend.Device, c Case, seed uint64) (*net, error) {
	r := rand.New(rand.NewPCG(seed, 77))
	var err error
	matAs := func(dt quant.DType, name string, rows, cols int, sd float64) backend.Mat {
		if err != nil {
			return nil
		}
		w := make([]float32, rows*cols)
		for i := range w {
			w[i] = float32(r.NormFloat64() * sd)
		}
		b, e := encode(c, dt, name, seed, w, rows, cols)
		if e != nil {
			err = e
			return nil
		}
		var m backend.Mat
		m, err = dev.LoadMat(name, dt, rows, cols, b)
		return m
	}
	mat := func(name string, rows, cols int, sd float64) backend.Mat { return matAs(c.DType, name, rows, cols, sd) }
	vec := func(n int, mean, sd float64) backend.Vec {
		if err != nil {
			return nil
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(mean + r.NormFloat64()*sd)
		}
		var bv backend.Vec
		bv, err = dev.LoadVec(v)
		return bv
	}
	normMean := 1.0
	if c.OnePlus {
		normMean = 0
	}
	norm := func(n int) backend.Norm {
		return backend.Norm{W: vec(n, normMean, 0.1), Eps: 1e-6, OnePlus: c.OnePlus}
	}
	n := &net{embed: mat("embed", c.Vocab, c.H, 0.5), spec: backend.SeqSpec{Layers: 1, KVHeads: c.KVHeads, HeadDim: c.HeadDim}}
	switch c.Op {
	case "attention":
		qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
		var rope backend.Rope
		if err == nil {
			rope, err = dev.NewRope(c.Rope)
		}
		qrows := qd
		if c.Gated {
			qrows *= 2
		}
		a := &backend.Attention{
			Norm: norm(c.H), Q: mat("q", qrows, c.H, 0.2), K: mat("k", kvd, c.H, 0.2), V: mat("v", kvd, c.H, 0.1),
			O: mat("o", c.H, qd, 0.1), Rope: rope, Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Gated: c.Gated,
		}
		if c.Bias {
			a.BQ, a.BK, a.BV, a.BO = vec(qd, 0, 0.1), vec(kvd, 0, 0.1), vec(kvd, 0, 0.1), vec(c.H, 0, 0.1)
		}
		if c.QKNorm {
			qn, kn := norm(c.HeadDim), norm(c.HeadDim)
			a.QNorm, a.KNorm = &qn, &kn
		}
		n.attn, n.spec.Attention = a, []int{0}
	case "mlp":
		m := &backend.MLP{Norm: norm(c.H), Gate: mat("gate", c.I, c.H, 0.1), Up: mat("up", c.I, c.H, 0.1), Down: mat("down", c.H, c.I, 0.1)}
		if c.Bias {
			m.BGate, m.BUp, m.BDown = vec(c.I, 0, 0.1), vec(c.I, 0, 0.1), vec(c.H, 0, 0.1)
		}
		n.mlp = m
	case "moe":
		// The router and the shared expert's gate in float32, as the
		// importer stores them (convert's policy).
		m := &backend.MoE{Norm: norm(c.H), Router: matAs(quant.F32, "router", c.Experts, c.H, 0.5), TopK: c.TopK, Renorm: c.Renorm}
		for e := range c.Experts {
			p := fmt.Sprintf("expert%d.", e)
			m.Experts = append(m.Experts, backend.Expert{Gate: mat(p+"gate", c.I, c.H, 0.1), Up: mat(p+"up", c.I, c.H, 0.1), Down: mat(p+"down", c.H, c.I, 0.1)})
		}
		if c.Shared {
			m.Shared = &backend.Expert{Gate: mat("shared.gate", c.I, c.H, 0.1), Up: mat("shared.up", c.I, c.H, 0.1), Down: mat("shared.down", c.H, c.I, 0.1)}
			m.SharedGate = matAs(quant.F32, "shared_gate", 1, c.H, 0.2)
		}
		n.moe = m
		n.spec.MoE = backend.MoEShape{Experts: c.Experts, TopK: c.TopK, Inter: c.I}
		if c.Shared {
			n.spec.MoE.SharedInter = c.I
		}
	case "deltanet":
		s := c.DeltaNet
		kd, vd, cd := s.Dims()
		nv := s.ValueHeads
		g := &backend.DeltaNet{Norm: norm(c.H), Shape: s, Out: mat("out", c.H, vd, 0.1)}
		if c.Grouped {
			g.QKVZ, g.BA = mat("qkvz", 2*kd+2*vd, c.H, 0.15), mat("ba", 2*nv, c.H, 0.15)
		} else {
			g.QKV, g.Z, g.B, g.A = mat("qkv", 2*kd+vd, c.H, 0.15), mat("z", vd, c.H, 0.15), mat("b", nv, c.H, 0.15), mat("a", nv, c.H, 0.15)
		}
		g.Conv = vec(cd*s.ConvKernel, 0, 0.3)
		g.ALog, g.DtBias = vec(nv, -1.5, 0.5), vec(nv, 0, 0.5)
		g.GateNorm = backend.Norm{W: vec(s.ValueDim, 1, 0.1), Eps: 1e-6}
		n.gdn, n.spec.DeltaNet, n.spec.DeltaNetShape = g, []int{0}, s
	}
	n.head = backend.Head{Norm: norm(c.H), W: mat("head", c.Vocab, c.H, 0.2)}
	return n, err
}

// CaseNamed returns the case of Cases called name, or false.
func CaseNamed(name string) (Case, bool) {
	for _, c := range Cases() {
		if c.Name == name {
			return c, true
		}
	}
	return Case{}, false
}

// Step is one step of a schedule: for each listed sequence, the number of
// new tokens it gets.
type Step []struct{ Seq, Tokens int }

// Schedules returns the standard schedules: prefill chunks of 1…9 rows
// followed by decode; a sequence decoded across position 64; and steps of
// three sequences at different lengths mixing decode rows and a prefill
// chunk.
func Schedules() map[string][]Step {
	s := map[string][]Step{}
	for t := 1; t <= 9; t++ {
		s[fmt.Sprintf("prefill%d+decode", t)] = []Step{{{0, t}}, {{0, 1}}, {{0, 1}}}
	}
	long := []Step{{{0, 60}}}
	for range 8 {
		long = append(long, Step{{0, 1}})
	}
	s["decode_across_64"] = long
	s["three_sequences"] = []Step{
		{{0, 5}, {1, 2}, {2, 9}},
		{{0, 1}, {1, 1}, {2, 1}},
		{{1, 4}, {0, 1}},
		{{0, 1}, {1, 1}, {2, 1}},
	}
	return s
}

// Run drives a case's network on dev over a schedule and returns the
// logits of every row of every step, in order.
func Run(dev backend.Device, c Case, sched []Step, seed uint64) ([]float32, error) {
	n, err := build(dev, c, seed)
	if err != nil {
		return nil, err
	}
	seqs := map[int]backend.Seq{}
	defer func() {
		for _, s := range seqs {
			backend.Release(dev, s)
		}
	}()
	tok := rand.New(rand.NewPCG(seed, 3))
	var out []float32
	for si, st := range sched {
		b := &backend.Batch{Logits: backend.AllLogits}
		for _, e := range st {
			s, ok := seqs[e.Seq]
			if !ok {
				if s, err = dev.NewSeq(n.spec, 128); err != nil {
					return nil, err
				}
				seqs[e.Seq] = s
			}
			toks := make([]int, e.Tokens)
			for i := range toks {
				toks[i] = tok.IntN(c.Vocab)
			}
			b.Seqs, b.Tokens = append(b.Seqs, s), append(b.Tokens, toks)
		}
		b.Out = make([]float32, b.Rows()*c.Vocab)
		if err := dev.Run(b, n.step); err != nil {
			return nil, fmt.Errorf("%s step %d: %w", c.Name, si, err)
		}
		out = append(out, b.Out...)
	}
	return out, nil
}

// NMSE is Σ(got−want)² / Σwant².
func NMSE(got, want []float32) float64 {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - float64(w)
		num += d * d
		den += float64(w) * float64(w)
	}
	if den == 0 {
		return num
	}
	return num / den
}

// Parity runs every case over every schedule on dev and ref and fails
// where the logits' NMSE exceeds tol(case). A case dev does not implement
// yet (an error wrapping backend.ErrUnsupported) is not compared; each is
// logged as NOT RUN.
func Parity(t *testing.T, dev, ref backend.Device, tol func(Case) float64) {
	t.Helper()
	for _, c := range Cases() {
		for name, sched := range Schedules() {
			got, err := Run(dev, c, sched, 11)
			if errors.Is(err, backend.ErrUnsupported) {
				t.Logf("NOT RUN: %s on %s: %v", c.Name, dev.Name(), err)
				break
			}
			if err != nil {
				t.Fatalf("%s on %s: %v", c.Name, dev.Name(), err)
			}
			want, err := Run(ref, c, sched, 11)
			if err != nil {
				t.Fatalf("%s on %s: %v", c.Name, ref.Name(), err)
			}
			if len(got) != len(want) {
				t.Fatalf("%s/%s: %d logits vs %d", c.Name, name, len(got), len(want))
			}
			e := NMSE(got, want)
			if math.IsNaN(e) || e > tol(c) {
				t.Errorf("%s/%s: NMSE %.3g on %s vs %s (tolerance %.1g)", c.Name, name, e, dev.Name(), ref.Name(), tol(c))
			}
		}
	}
}

// Serial splits every step of sched into one step per sequence, in the
// same order: run serially it must give the same logits, row for row, as
// the batched schedule (batching must not change results).
func Serial(sched []Step) []Step {
	var out []Step
	for _, st := range sched {
		for _, e := range st {
			out = append(out, Step{e})
		}
	}
	return out
}

// RunLast runs sched like Run but asks for each sequence's last logits
// (LastLogits), or, with greedy, for its greedy next token on the device
// (Batch.Next; the device must be a backend.Argmaxer). It returns the
// logits of every step's sequences in order, or their ids.
func RunLast(dev backend.Device, c Case, sched []Step, seed uint64, greedy bool) ([]float32, []int32, error) {
	var mode func(int) bool // nil: logits only
	if greedy {
		mode = func(int) bool { return false }
	}
	return runLast(dev, c, sched, seed, mode, false)
}

// RunMixed runs sched like RunLast with greedy ids for every sequence of
// every step, and also asks for the logits of the sequences for which
// want(k) is true, k counting the sequences of all steps in order
// (Batch.LogitsOf). It returns those logits, in order, and every id. The
// logits go to one buffer per sequence (Batch.OutRows).
func RunMixed(dev backend.Device, c Case, sched []Step, seed uint64, want func(k int) bool) ([]float32, []int32, error) {
	return runLast(dev, c, sched, seed, want, true)
}

// RunLastRows is RunLast without greedy ids, each sequence's logits
// written to a buffer of its own (Batch.OutRows) instead of one block.
func RunLastRows(dev backend.Device, c Case, sched []Step, seed uint64) ([]float32, error) {
	out, _, err := runLast(dev, c, sched, seed, nil, true)
	return out, err
}

func runLast(dev backend.Device, c Case, sched []Step, seed uint64, want func(int) bool, rowsOut bool) ([]float32, []int32, error) {
	n, err := build(dev, c, seed)
	if err != nil {
		return nil, nil, err
	}
	seqs := map[int]backend.Seq{}
	defer func() {
		for _, s := range seqs {
			backend.Release(dev, s)
		}
	}()
	tok := rand.New(rand.NewPCG(seed, 3))
	var out []float32
	var ids []int32
	for si, st := range sched {
		b := &backend.Batch{Logits: backend.LastLogits}
		for _, e := range st {
			s, ok := seqs[e.Seq]
			if !ok {
				if s, err = dev.NewSeq(n.spec, 128); err != nil {
					return nil, nil, err
				}
				seqs[e.Seq] = s
			}
			toks := make([]int, e.Tokens)
			for i := range toks {
				toks[i] = tok.IntN(c.Vocab)
			}
			b.Seqs, b.Tokens = append(b.Seqs, s), append(b.Tokens, toks)
		}
		if want != nil {
			b.Next = make([]int32, len(b.Seqs))
			for i := range b.Seqs {
				if want(len(ids) + i) {
					b.LogitsOf = append(b.LogitsOf, i)
				}
			}
			b.Out = make([]float32, len(b.LogitsOf)*c.Vocab)
		} else {
			b.Out = make([]float32, len(b.Seqs)*c.Vocab)
		}
		if rowsOut {
			for len(b.Out) > 0 {
				b.OutRows, b.Out = append(b.OutRows, b.Out[:c.Vocab:c.Vocab]), b.Out[c.Vocab:]
			}
			b.Out = nil
		}
		if err := dev.Run(b, n.step); err != nil {
			return nil, nil, fmt.Errorf("%s step %d: %w", c.Name, si, err)
		}
		for _, r := range b.OutRows {
			out = append(out, r...)
		}
		out, ids = append(out, b.Out...), append(ids, b.Next...)
	}
	return out, ids, nil
}

// CheckGreedy runs every case and schedule twice on fresh devices from
// open: once for the last logits, once for the device's greedy ids
// (Batch.Next), and fails unless each id is the argmax of its logits
// (sample.Greedy: ties to the lowest id). It also runs the logits into
// per-sequence rows (Batch.OutRows) and a mixed step (ids for every
// sequence, logits for every other one: Batch.LogitsOf into OutRows),
// which must give the same logits and ids. Cases a device does not
// implement are skipped; it fails when none ran.
func CheckGreedy(t *testing.T, open func() backend.Device) {
	t.Helper()
	ran := 0
	// Two devices for every case, as Parity uses one: opening a pair per
	// case × schedule (and closing them only at the end) took 97 s on the
	// H200.
	a, b := open(), open()
	defer a.Close()
	defer b.Close()
	for _, k := range Cases() {
		for name, s := range Schedules() {
			lg, _, err := RunLast(a, k, s, 5, false)
			if errors.Is(err, backend.ErrUnsupported) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			_, ids, err := RunLast(b, k, s, 5, true)
			if err != nil {
				t.Fatal(err)
			}
			for i, id := range ids {
				want, err := sample.Greedy(lg[i*k.Vocab : (i+1)*k.Vocab])
				if err != nil {
					t.Fatal(err)
				}
				if id != want {
					t.Fatalf("%s/%s: row %d: device greedy id %d, argmax of the logits %d", k.Name, name, i, id, want)
				}
			}
			rl, err := RunLastRows(a, k, s, 5)
			if err != nil {
				t.Fatal(err)
			}
			if e := NMSE(rl, lg); len(rl) != len(lg) || e > 1e-10 {
				t.Fatalf("%s/%s: logits to per-sequence rows (Batch.OutRows) differ from one block: %d vs %d, NMSE %.3g", k.Name, name, len(rl), len(lg), e)
			}
			// One step, both kinds of rows: every other sequence's
			// logits come back beside every id (Batch.LogitsOf).
			odd := func(k int) bool { return k%2 == 1 }
			ml, mids, err := RunMixed(a, k, s, 5, odd)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(mids, ids) {
				t.Fatalf("%s/%s: ids with LogitsOf %v, without %v", k.Name, name, mids, ids)
			}
			var wantL []float32
			for i := range ids {
				if odd(i) {
					wantL = append(wantL, lg[i*k.Vocab:(i+1)*k.Vocab]...)
				}
			}
			if len(ml) != len(wantL) {
				t.Fatalf("%s/%s: %d logits for LogitsOf, want %d", k.Name, name, len(ml), len(wantL))
			}
			if e := NMSE(ml, wantL); e > 1e-10 {
				t.Fatalf("%s/%s: LogitsOf rows differ from the logits-only run: NMSE %.3g", k.Name, name, e)
			}
			for j := 0; j < len(ml)/k.Vocab; j++ {
				want, err := sample.Greedy(ml[j*k.Vocab : (j+1)*k.Vocab])
				if err != nil {
					t.Fatal(err)
				}
				if id := mids[2*j+1]; id != want {
					t.Fatalf("%s/%s: row %d: device greedy id %d, argmax of the same step's logits %d", k.Name, name, 2*j+1, id, want)
				}
			}
			ran++
		}
	}
	if ran == 0 {
		t.Fatal("no case ran")
	}
}
