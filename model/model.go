package model

import (
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/kernels"
	"github.com/cortiq/cortiq/quant"
)

// family is what one architecture file (llama.go, qwen2.go, qwen3.go)
// contributes to the shared decoder: it checks the arch's flags against
// what the family allows and says which optional parts the decoder uses.
type family struct {
	name     string
	features func(a *cmf.Arch) (features, error)
	hybrid   bool // MoE and/or linear-attention layers: hybrid.go
}

// features are the optional parts of the Llama-lineage decoder.
type features struct {
	qkvBias bool // q/k/v projections carry a bias
	outBias bool // o_proj carries a bias
	mlpBias bool // gate/up/down carry biases
	qkNorm  bool // RMSNorm over head_dim on q and k before RoPE
}

var families = map[string]family{}

func register(f family) { families[f.name] = f }

// Runnable lists the architectures the CPU forward pass runs.
func Runnable() []string {
	names := slices.Collect(maps.Keys(families))
	sort.Strings(names)
	return names
}

// LoadOptions tune Load.
type LoadOptions struct {
	// Pool runs the kernels; nil starts a pool of Threads workers that
	// Close stops.
	Pool    *kernels.Pool
	Threads int // workers of the pool Load starts (0: GOMAXPROCS)
	// Batch is the most positions one prefill step processes together
	// (0: 64); longer prompts are processed in steps of Batch. It sizes a
	// Cache's run state.
	Batch int
}

// Logits selects what Forward returns.
type Logits int

const (
	LastLogits Logits = iota // the logits of the last position: [vocab]
	AllLogits                // the logits of every position: [len(tokens) × vocab]
	NoLogits                 // none: only fill the cache
)

// Model is a dense decoder (llama, qwen2, qwen3) ready to run on the CPU:
// its weights are views into the CMF mapping, which must stay open while
// the model is used.
type Model struct {
	Arch cmf.Arch

	cfg     config
	pool    *kernels.Pool
	ownPool bool
	batch   int
	rope    *kernels.Rope
	w       weights
	hy      []hyLayer // hybrid models (hybrid.go): the layers; w.layers is empty
	obs     *observer // set by SetObserver (decoder.go); nil costs one check per layer
}

// Load builds a runnable model over an open CMF file: it checks the
// architecture, then every tensor's presence, format and shape, and views
// the weights in place.
func Load(m *cmf.Model, opt LoadOptions) (*Model, error) {
	a := m.Header.Arch
	fam, ok := families[a.ArchName]
	if !ok {
		if slices.Contains(Supported, a.ArchName) {
			return nil, fmt.Errorf("model: architecture %q is not runnable on CPU yet (CPU runs %v)", a.ArchName, Runnable())
		}
		return nil, fmt.Errorf("model: unknown architecture %q (CPU runs %v)", a.ArchName, Runnable())
	}
	f, err := fam.features(&a)
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", a.ArchName, err)
	}
	newCfg := newConfig
	if fam.hybrid {
		newCfg = newHybridConfig
	}
	cfg, err := newCfg(&a, f)
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", a.ArchName, err)
	}
	rope, err := kernels.NewRope(ropeConfig(&a))
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", a.ArchName, err)
	}
	ld := &loader{m: m}
	var w weights
	var hy []hyLayer
	if fam.hybrid {
		w, hy = loadHybrid(ld, &cfg, &a)
	} else {
		w = loadWeights(ld, &cfg)
	}
	if ld.err != nil {
		return nil, fmt.Errorf("model: %s: %w", a.ArchName, ld.err)
	}
	md := &Model{Arch: a, cfg: cfg, rope: rope, w: w, hy: hy, pool: opt.Pool, batch: opt.Batch}
	if md.batch <= 0 {
		md.batch = 64
	}
	if md.pool == nil {
		md.pool, md.ownPool = kernels.NewPool(opt.Threads), true
	}
	return md, nil
}

// Close stops the worker pool if Load started it. The CMF file is the
// caller's to close, after the model.
func (m *Model) Close() {
	if m.ownPool {
		m.pool.Close()
		m.ownPool = false
	}
}

// ropeConfig maps the header's RoPE description to the kernel's.
func ropeConfig(a *cmf.Arch) kernels.RopeConfig {
	c := kernels.RopeConfig{
		HeadDim: a.HeadDim, PartialRotaryFactor: a.PartialRotaryFactor, Theta: a.RopeTheta,
		MaxPositions: a.MaxPositionEmbeddings,
	}
	if s := a.RopeScaling; s != nil {
		c.Type, c.Factor, c.OriginalMaxPos = s.Type, s.Factor, s.OriginalMaxPositionEmbeddings
		c.LowFreqFactor, c.HighFreqFactor = s.LowFreqFactor, s.HighFreqFactor
		c.BetaFast, c.BetaSlow, c.AttnFactor = s.BetaFast, s.BetaSlow, s.AttentionFactor
		c.MScale, c.MScaleAllDim, c.Truncate = s.MScale, s.MScaleAllDim, s.Truncate
		c.FreqFactors = s.FreqFactors
	}
	return c
}

// loader looks tensors up, checks them and keeps the first error.
type loader struct {
	m   *cmf.Model
	err error
}

func (ld *loader) fail(err error) {
	if ld.err == nil {
		ld.err = err
	}
}

func (ld *loader) tensor(name string, shape ...int) (*cmf.Tensor, []byte) {
	if ld.err != nil {
		return nil, nil
	}
	t, data, err := ld.m.TensorData(name)
	if err != nil {
		ld.fail(fmt.Errorf("tensor %q is missing", name))
		return nil, nil
	}
	if !slices.Equal(t.Shape, shape) {
		ld.fail(fmt.Errorf("tensor %q has shape %v, the architecture needs %v", name, t.Shape, shape))
		return nil, nil
	}
	return t, data
}

// mat views a [rows, cols] weight matrix in place.
func (ld *loader) mat(name string, rows, cols int) *kernels.Mat {
	t, data := ld.tensor(name, rows, cols)
	if t == nil {
		return nil
	}
	m, err := kernels.NewMat(t.DType, rows, cols, data)
	if err != nil {
		ld.fail(fmt.Errorf("tensor %q (%s): %w", name, t.DType, err))
		return nil
	}
	return m
}

// vec decodes a [n] vector (a norm weight or a bias) to float32.
func (ld *loader) vec(name string, n int) []float32 {
	t, data := ld.tensor(name, n)
	if t == nil {
		return nil
	}
	switch t.DType {
	case quant.F32, quant.F16, quant.BF16:
	default:
		ld.fail(fmt.Errorf("tensor %q is %s; vectors must be f32, f16 or bf16", name, t.DType))
		return nil
	}
	v, err := quant.Decode(t.DType, data, t.Shape)
	if err != nil {
		ld.fail(fmt.Errorf("tensor %q: %w", name, err))
		return nil
	}
	return v
}
