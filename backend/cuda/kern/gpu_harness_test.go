package kern_test

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/quant"
)

// gpu runs each device operation as its own Device.Do from the test
// goroutine, so a failure can t.Fatal (never inside a closure, which runs
// on the device thread).
type gpu struct {
	t    *testing.T
	d    *driver.Device
	m    *kern.Module
	ptrs []driver.DevicePtr
	busy bool // inside do
}

// newGPU opens device 0 with the embedded kernels, or skips the test with
// the reason there is no GPU.
func newGPU(t *testing.T) *gpu {
	t.Helper()
	d, err := driver.Open(0)
	if errors.Is(err, driver.ErrNoDevice) {
		t.Skipf("no GPU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	g := &gpu{t: t, d: d}
	err = d.Do(func(c *driver.Ctx) error {
		var err error
		g.m, err = loadForTest(c, d)
		return err
	})
	if err != nil {
		d.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Do(func(c *driver.Ctx) error {
			for _, p := range g.ptrs {
				c.Free(p)
			}
			return nil
		})
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return g
}

// loadForTest loads the kernels, the PTX when CORTIQ_CUDA_PTX=1.
func loadForTest(c *driver.Ctx, d *driver.Device) (*kern.Module, error) {
	return kern.Load(c, d.Info(), os.Getenv("CORTIQ_CUDA_PTX") == "1")
}

func (g *gpu) do(f func(c *driver.Ctx) error) {
	g.t.Helper()
	if g.busy {
		// Device.Do runs f on the device's one thread: a nested call (an
		// upload inside g.run's function) would wait for itself forever.
		// It runs on the device's goroutine, where t.Fatal may not be called.
		panic("gpu harness: nested device call (upload before g.run)")
	}
	g.busy = true
	defer func() { g.busy = false }()
	if err := g.d.Do(f); err != nil {
		g.t.Fatal(err)
	}
}

// upload copies b to new device memory (at least 16 bytes, 256-aligned).
func (g *gpu) upload(b []byte) driver.DevicePtr {
	g.t.Helper()
	var p driver.DevicePtr
	g.do(func(c *driver.Ctx) error {
		var err error
		if p, err = c.Alloc(int64(max(len(b), 16))); err != nil {
			return err
		}
		g.ptrs = append(g.ptrs, p)
		if err := c.HtoD(p, b); err != nil {
			return err
		}
		// A copy from pageable memory may still be in flight when HtoD
		// returns, and work on non-blocking streams does not wait for it.
		return c.Synchronize()
	})
	return p
}

func (g *gpu) f32(v []float32) driver.DevicePtr { return g.upload(f32bytes(v)) }

func (g *gpu) i32(v []int32) driver.DevicePtr {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return g.upload(b)
}

// zeros allocates n float32s of zeros.
func (g *gpu) zeros(n int) driver.DevicePtr { return g.upload(make([]byte, 4*n)) }

// randomMat uploads a rows×cols matrix of r's values (scale 0.05) encoded
// as dt.
func (g *gpu) randomMat(r *rng, dt quant.DType, rows, cols int) driver.DevicePtr {
	g.t.Helper()
	b, err := quant.Encode(dt, r.vec(rows*cols, 0.05), []int{rows, cols}, nil)
	if err != nil {
		g.t.Fatal(err)
	}
	return g.upload(b)
}

// moeRouting is R rows' routing to k of E experts, distinct within a row
// (row·a + j·5 mod E), and positive weights from r.
func moeRouting(r *rng, R, k, E, a int) ([]int32, []float32) {
	ids := make([]int32, R*k)
	for row := range R {
		for j := range k {
			ids[row*k+j] = int32((row*a + j*5) % E)
		}
	}
	wv := r.vec(R*k, 0.5)
	for i := range wv {
		wv[i] = float32(math.Abs(float64(wv[i])))
	}
	return ids, wv
}

func (g *gpu) readBytes(p driver.DevicePtr, n int) []byte {
	g.t.Helper()
	b := make([]byte, n)
	g.do(func(c *driver.Ctx) error { return c.DtoH(b, p) })
	return b
}

func (g *gpu) readF32(p driver.DevicePtr, n int) []float32 { return bytesf32(g.readBytes(p, 4*n)) }

func (g *gpu) readI32(p driver.DevicePtr, n int) []int32 {
	b := g.readBytes(p, 4*n)
	v := make([]int32, n)
	for i := range v {
		v[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func (g *gpu) write(p driver.DevicePtr, b []byte) {
	g.t.Helper()
	g.do(func(c *driver.Ctx) error {
		if err := c.HtoD(p, b); err != nil {
			return err
		}
		return c.Synchronize() // see upload
	})
}

// launch runs one kernel and waits for it.
func (g *gpu) launch(name string, grid, block driver.Dim3, shared int, a *driver.Args) {
	g.t.Helper()
	g.do(func(c *driver.Ctx) error {
		if shared > 48<<10 {
			f, err := g.m.Func(name)
			if err != nil {
				return err
			}
			if err := c.SetMaxDynamicShared(f, shared); err != nil {
				return err
			}
		}
		if err := g.m.Launch(c, name, driver.Config{Grid: grid, Block: block, Shared: shared}, a); err != nil {
			return err
		}
		return c.Synchronize()
	})
}

// run queues work through a typed launcher on the default stream and
// waits for it.
func (g *gpu) run(f func(l *kern.Launcher) error) {
	g.t.Helper()
	g.do(func(c *driver.Ctx) error {
		if err := f(g.m.On(c, 0, false)); err != nil {
			return err
		}
		return c.Synchronize()
	})
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func bytesf32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// rng is a small deterministic generator for test data.
type rng uint64

func (r *rng) next() uint64 {
	*r += 0x9E3779B97F4A7C15
	z := uint64(*r)
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	return z ^ z>>31
}

// normal returns a roughly normal value (sum of uniforms).
func (r *rng) normal() float32 {
	var s float64
	for range 4 {
		s += float64(r.next()>>11)/(1<<53) - 0.5
	}
	return float32(s * math.Sqrt(3))
}

func (r *rng) vec(n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = r.normal() * scale
	}
	return v
}
