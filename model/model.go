package model

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync/atomic"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/cmf"
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

// Runnable lists the architectures the forward pass runs.
func Runnable() []string {
	names := slices.Collect(maps.Keys(families))
	sort.Strings(names)
	return names
}

// LoadOptions tune Load.
type LoadOptions struct {
	// Device runs the model (backend/cpu.New for the CPU); required. The
	// model does not own it: close it after the model.
	Device backend.Device
	// Batch is the most positions one prefill step of Forward processes
	// together (0: 64); longer prompts are processed in steps of Batch.
	Batch int
}

// Logits selects what Forward returns.
type Logits int

const (
	LastLogits Logits = iota // the logits of the last position: [vocab]
	AllLogits                // the logits of every position: [len(tokens) × vocab]
	NoLogits                 // none: only fill the cache
)

// Model is a decoder ready to run on a device: its weights are resident
// there (on the CPU, views into the CMF mapping, which must stay open while
// the model is used).
type Model struct {
	Arch cmf.Arch

	cfg   config
	dev   backend.Device
	batch int
	spec  backend.SeqSpec
	w     weights
	hy    []hyLayer         // hybrid models (hybrid.go): the layers; w.layers is empty
	step  func(backend.Ops) // one step of the network over a batch's rows
	// id names step in the batches (backend.Batch.Step): the step's
	// launches depend on the batch's shape and the weights alone.
	id uint64
}

// modelIDs hands out Model.id.
var modelIDs atomic.Uint64

// Load builds a runnable model over an open CMF file: it checks the
// architecture, then every tensor's presence, format and shape, and makes
// the weights resident on the device.
func Load(m *cmf.Model, opt LoadOptions) (*Model, error) {
	a := m.Header.Arch
	fam, ok := families[a.ArchName]
	if !ok {
		if slices.Contains(Supported, a.ArchName) {
			return nil, fmt.Errorf("model: architecture %q is not runnable on CPU yet (CPU runs %v)", a.ArchName, Runnable())
		}
		return nil, fmt.Errorf("model: unknown architecture %q (CPU runs %v)", a.ArchName, Runnable())
	}
	if opt.Device == nil {
		return nil, fmt.Errorf("model: no device to load %s on", a.ArchName)
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
	spec := cfg.seqSpec()
	if fam.hybrid {
		spec = hybridSpec(&cfg, &a) // the K/V of full-attention layers only, the linear-attention state, the experts' scratch
	}
	if p, ok := opt.Device.(backend.Planner); ok {
		if err := p.Plan(weightBytes(m, &a), spec, cfg.widest()); err != nil {
			return nil, fmt.Errorf("model: %s: %w", a.ArchName, err)
		}
	}
	ld := &loader{m: m, dev: opt.Device}
	rope, err := opt.Device.NewRope(ropeConfig(&a))
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", a.ArchName, err)
	}
	md := &Model{Arch: a, cfg: cfg, dev: opt.Device, batch: opt.Batch, id: modelIDs.Add(1)}
	if fam.hybrid {
		md.w, md.hy = loadHybrid(ld, &cfg, &a, rope)
		md.spec, md.step = spec, md.hybridStep
	} else {
		md.w = loadWeights(ld, &cfg, rope)
		md.spec, md.step = spec, md.decoderStep
	}
	if ld.err != nil {
		return nil, fmt.Errorf("model: %s: %w", a.ArchName, ld.err)
	}
	if md.batch <= 0 {
		md.batch = 64
		if p, ok := opt.Device.(backend.PrefillSizer); ok && p.PrefillRows() > 0 {
			md.batch = p.PrefillRows()
		}
	}
	return md, nil
}

// weightBytes sums the stored bytes of the network's tensors.
func weightBytes(m *cmf.Model, a *cmf.Arch) int64 {
	ts, err := Tensors(a)
	if err != nil {
		return 0
	}
	var n int64
	for _, t := range ts {
		if e, _, err := m.TensorData(t.Name); err == nil {
			n += e.Size
		}
	}
	return n
}

// Device returns the device the model runs on.
func (m *Model) Device() backend.Device { return m.dev }

// Close releases nothing today (the device is the caller's); it is kept so
// that a model's life is explicit.
func (m *Model) Close() {}

// ropeConfig maps the header's RoPE description to the backend's.
func ropeConfig(a *cmf.Arch) backend.RopeConfig {
	c := backend.RopeConfig{
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
	dev backend.Device
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

// mat makes a [rows, cols] weight matrix resident.
func (ld *loader) mat(name string, rows, cols int) backend.Mat {
	t, data := ld.tensor(name, rows, cols)
	if t == nil {
		return nil
	}
	m, err := ld.dev.LoadMat(name, t.DType, rows, cols, data)
	if err != nil {
		ld.fail(fmt.Errorf("tensor %q (%s): %w", name, t.DType, err))
		return nil
	}
	return m
}

// vec decodes a [n] vector (a norm weight or a bias) and makes it
// resident; an absent optional vector is nil.
func (ld *loader) vec(name string, n int) backend.Vec { return ld.arr(name, n) }

// arr decodes a float tensor of the given shape (a norm weight, a bias,
// conv weights) and makes it resident as a flat vector.
func (ld *loader) arr(name string, shape ...int) backend.Vec {
	t, data := ld.tensor(name, shape...)
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
	bv, err := ld.dev.LoadVec(v)
	if err != nil {
		ld.fail(fmt.Errorf("tensor %q: %w", name, err))
		return nil
	}
	return bv
}
