// Package cpu is the CPU backend: backend.Ops over the kernels package
// (SIMD matvec/matmul per weight format, run by a persistent worker pool),
// with weights used in place in the memory-mapped CMF file and each
// sequence's K/V cache in host memory.
//
// A step's rows (one token each, from one or several sequences) go through
// every projection as one matrix product, so a batch of N decoding
// sequences reads each weight once, like a prefill chunk of N positions.
package cpu

import (
	"fmt"
	"sync"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/kernels"
	"github.com/cortiq/cortiq/quant"
)

// Device runs steps on the CPU. Steps of different sequences may run
// concurrently (the worker pool serialises the big operations).
type Device struct {
	pool    *kernels.Pool
	ownPool bool
	obs     backend.Observer

	mu     sync.Mutex
	free   []*state // run states not in use
	blocks blocks   // the kernels' views of MoE and DeltaNet weights
}

// New starts a CPU device with a pool of threads workers (0: the
// machine's physical cores).
func New(threads int) *Device {
	return &Device{pool: kernels.NewPool(threads), ownPool: true}
}

// NewWithPool makes a CPU device over an existing worker pool, which the
// caller keeps and closes.
func NewWithPool(p *kernels.Pool) *Device { return &Device{pool: p} }

// Name says what runs the steps.
func (d *Device) Name() string {
	return fmt.Sprintf("cpu (%d threads, %s)", d.pool.Workers(), kernels.ISA())
}

// Threads returns the number of workers.
func (d *Device) Threads() int { return d.pool.Workers() }

// Close stops the worker pool if New started it.
func (d *Device) Close() error {
	if d.ownPool {
		d.pool.Close()
		d.ownPool = false
	}
	return nil
}

// SetObserver installs o (nil removes it); it is called from the goroutine
// that runs a step. Not to be called during a step.
func (d *Device) SetObserver(o backend.Observer) { d.obs = o }

// mat is a weight matrix viewed in place.
type mat struct {
	*kernels.Mat
	name string
}

func (m *mat) DType() quant.DType     { return m.Mat.DType }
func (m *mat) Dims() (rows, cols int) { return m.Rows, m.Cols }

// LoadMat views the matrix in place in data.
func (d *Device) LoadMat(name string, dt quant.DType, rows, cols int, data []byte) (backend.Mat, error) {
	m, err := kernels.NewMat(dt, rows, cols, data)
	if err != nil {
		return nil, fmt.Errorf("cpu: tensor %q (%s): %w", name, dt, err)
	}
	return &mat{Mat: m, name: name}, nil
}

type vec []float32

func (v vec) Len() int { return len(v) }

// LoadVec keeps v (not copied).
func (d *Device) LoadVec(v []float32) (backend.Vec, error) { return vec(v), nil }

type rope struct{ *kernels.Rope }

// NewRope computes the frequency table.
func (d *Device) NewRope(c backend.RopeConfig) (backend.Rope, error) {
	r, err := kernels.NewRope(c)
	if err != nil {
		return nil, err
	}
	return rope{r}, nil
}

// vecOf returns a Vec's values (nil for none).
func vecOf(v backend.Vec) []float32 {
	if v == nil {
		return nil
	}
	return v.(vec)
}

func matOf(m backend.Mat) *mat { return m.(*mat) }

// Run runs step over b's rows.
func (d *Device) Run(b *backend.Batch, step func(backend.Ops)) error {
	if len(b.Seqs) != len(b.Tokens) {
		return fmt.Errorf("cpu: %d sequences but %d token lists", len(b.Seqs), len(b.Tokens))
	}
	seen := make(map[*seq]bool, len(b.Seqs))
	for i, s := range b.Seqs {
		c, ok := s.(*seq)
		if !ok {
			return fmt.Errorf("cpu: sequence %d belongs to another device", i)
		}
		if seen[c] {
			return fmt.Errorf("cpu: sequence %d appears twice in one step", i)
		}
		seen[c] = true
		if n := len(b.Tokens[i]); n == 0 || c.n+n > c.ctx {
			return fmt.Errorf("cpu: sequence %d: %d tokens at position %d, context %d", i, n, c.n, c.ctx)
		}
	}
	st := d.get()
	defer d.put(st)
	if err := st.begin(d, b); err != nil {
		return err
	}
	step(st)
	if st.err != nil {
		return st.err
	}
	for i, s := range b.Seqs {
		s.(*seq).n += len(b.Tokens[i])
	}
	return nil
}

func (d *Device) get() *state {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n := len(d.free); n > 0 {
		st := d.free[n-1]
		d.free = d.free[:n-1]
		return st
	}
	return &state{}
}

func (d *Device) put(st *state) {
	st.b, st.dev = nil, nil
	d.mu.Lock()
	d.free = append(d.free, st)
	d.mu.Unlock()
}

var _ backend.Device = (*Device)(nil)
var _ backend.Observable = (*Device)(nil)
