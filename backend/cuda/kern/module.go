package kern

import (
	"fmt"
	"slices"
	"sync"

	"github.com/cortiq/cortiq/backend/cuda/driver"
)

// Module is the embedded build loaded into a context: its functions are
// resolved once, and their parameter lists checked at load against the
// manifest (and against the driver's cuFuncGetParamInfo where it has it).
type Module struct {
	Manifest *Manifest
	Source   string // "cubin sm_90a" or "ptx compute_90"
	// SMs is the device's multiprocessor count (launch shapes that size
	// their grid to the device use it; 0 means DefaultSMs).
	SMs int
	// ClusterCaps are the device's cluster capacities (ClusterCaps; Load
	// makes them the process's), ClusterCapsErr why they are estimates.
	ClusterCaps    ClusterCaps
	ClusterCapsErr error
	mod            driver.Module
	funcs          map[string]driver.Func
	// optin: the dynamic shared memory each kernel was let use
	// (cuFuncSetAttribute once per kernel and size, not per launch).
	mu    sync.Mutex
	optin map[string]int
}

// OptIn lets kernel name launch with n bytes of dynamic shared memory
// (needed where they and its static shared memory pass 48 KB); it calls
// the driver only when n exceeds what the kernel was already let use.
func (m *Module) OptIn(c *driver.Ctx, name string, n int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.optin[name] >= n {
		return nil
	}
	f, err := m.Func(name)
	if err != nil {
		return err
	}
	if err := c.SetMaxDynamicShared(f, n); err != nil {
		return fmt.Errorf("kern: %s: %w", name, err)
	}
	if m.optin == nil {
		m.optin = map[string]int{}
	}
	m.optin[name] = n
	return nil
}

// Load loads the embedded kernels into c's context: the cubin on a device
// of the compute capability it was built for (9.0), else the PTX, which
// the driver compiles (slow; fails when the PTX is newer than the driver).
// forcePTX loads the PTX in any case.
func Load(c *driver.Ctx, info driver.Info, forcePTX bool) (*Module, error) {
	m, err := ReadManifest()
	if err != nil {
		return nil, err
	}
	if !m.Built() {
		return nil, fmt.Errorf("kern: no CUDA build is embedded (run scripts/build-cuda where nvcc is)")
	}
	useCubin := !forcePTX && info.Major == 9 && info.Minor == 0
	var img []byte
	src := "ptx " + m.PTX.Arch
	if useCubin {
		img, err = Cubin()
		src = "cubin " + m.Cubin.Arch
	} else {
		img, err = PTX()
	}
	if err != nil {
		return nil, err
	}
	h, err := c.LoadModule(img)
	if err != nil {
		return nil, fmt.Errorf("kern: loading the %s: %w", src, err)
	}
	mod := &Module{Manifest: m, Source: src, SMs: info.SMs, mod: h, funcs: map[string]driver.Func{}}
	for _, k := range m.Kernels {
		f, err := c.Function(h, k.Name)
		if err != nil {
			c.UnloadModule(h)
			return nil, fmt.Errorf("kern: %w", err)
		}
		if c.HasParamInfo() {
			ps, err := c.Params(f)
			if err != nil {
				c.UnloadModule(h)
				return nil, fmt.Errorf("kern: %s: %w", k.Name, err)
			}
			sizes := make([]int, len(ps))
			for i, p := range ps {
				sizes[i] = p.Size
			}
			if !slices.Equal(sizes, k.Params) {
				c.UnloadModule(h)
				return nil, fmt.Errorf("kern: %s: the driver reports parameter sizes %v, the manifest %v", k.Name, sizes, k.Params)
			}
		}
		mod.funcs[k.Name] = f
	}
	mod.ClusterCaps, mod.ClusterCapsErr = mod.queryClusterCaps(c)
	SetClusterCaps(mod.ClusterCaps)
	return mod, nil
}

// queryClusterCaps asks the driver how many clusters of each compiled size
// the wide tiles run at once on c's device, with the 64-token half tile's
// shared memory (the most of any wide tile) standing for all. Sizes not
// compiled, or every size when the driver cannot answer (the error says
// why), get the H200's figures scaled by the device's SMs.
func (m *Module) queryClusterCaps(c *driver.Ctx) (ClusterCaps, error) {
	var caps ClusterCaps
	sms := m.SMs
	if sms <= 0 {
		sms = DefaultSMs
	}
	for ks := range caps {
		caps[ks] = H200ClusterCaps[ks] * sms / DefaultSMs
	}
	for _, ks := range gemmqWideKS {
		suffix := fmt.Sprintf("_w64k%d", ks)
		name := "gemmh_q4tp" + suffix
		f, err := m.Func(name)
		if err != nil {
			return caps, err
		}
		shared := 0
		for _, t := range GemmHTiles() {
			if t.Suffix == suffix {
				shared = t.Shared("q4tp")
			}
		}
		if err := m.OptIn(c, name, shared); err != nil {
			return caps, err
		}
		n, err := c.MaxActiveClusters(f, driver.Config{Grid: driver.D3(1, ks, 1), Block: driver.D1(256), Shared: shared})
		if err != nil {
			return caps, fmt.Errorf("kern: %s: %w", name, err)
		}
		if n <= 0 {
			return caps, fmt.Errorf("kern: %s: the driver reports %d active clusters", name, n)
		}
		caps[ks] = n
	}
	return caps, nil
}

// Func returns a kernel by name.
func (m *Module) Func(name string) (driver.Func, error) {
	f, ok := m.funcs[name]
	if !ok {
		return 0, fmt.Errorf("kern: no kernel %q in the embedded build", name)
	}
	return f, nil
}

// Launch runs a kernel by name after checking the packed arguments
// against its parameter sizes.
func (m *Module) Launch(c *driver.Ctx, name string, cfg driver.Config, a *driver.Args) error {
	f, err := m.Func(name)
	if err != nil {
		return err
	}
	k, _ := m.Manifest.Kernel(name)
	if err := a.Check(paramsOf(k)); err != nil {
		return fmt.Errorf("kern: %s: %w", name, err)
	}
	if err := c.Launch(f, cfg, a); err != nil {
		return fmt.Errorf("kern: %s: %w", name, err)
	}
	return nil
}

func paramsOf(k Kernel) []driver.Param {
	ps := make([]driver.Param, len(k.Params))
	for i, n := range k.Params {
		ps[i] = driver.Param{Size: n}
	}
	return ps
}

// Unload releases the module.
func (m *Module) Unload(c *driver.Ctx) error { return c.UnloadModule(m.mod) }
