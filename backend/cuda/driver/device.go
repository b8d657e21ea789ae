package driver

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"golang.org/x/sys/unix"
)

// Scratch memory of a device thread, outside the Go heap: out-parameters
// of driver calls at the start, then the argument block of a launch (the
// kernelParams pointer array, then the values it points at).
const (
	scratchSize   = 128 << 10
	scratchOut    = 0         // out-parameters, 4 KB
	scratchPtrs   = 4 << 10   // kernelParams, up to MaxParams pointers
	scratchArgs   = 8 << 10   // parameter values
	scratchConfig = 120 << 10 // CUlaunchConfig and its attributes
	// MaxParams bounds the parameters of one kernel.
	MaxParams = 256
	// MaxArgBytes bounds the packed parameter bytes of one launch (the
	// driver's own limit is 4 KB, 32 KB from CUDA 12.1 on Volta and later).
	MaxArgBytes = scratchConfig - scratchArgs
)

// Device attributes (CUdevice_attribute values from cuda.h).
const (
	attrMaxThreadsPerBlock     = 1
	attrWarpSize               = 10
	attrClockRate              = 13
	attrMultiprocessorCount    = 16
	attrIntegrated             = 18
	attrCanMapHostMemory       = 19
	attrMemoryClockRate        = 36
	attrGlobalMemoryBusWidth   = 37
	attrL2CacheSize            = 38
	attrUnifiedAddressing      = 41
	attrComputeCapabilityMaj   = 75
	attrComputeCapabilityMin   = 76
	attrMaxSharedPerBlockOptin = 97
)

// Info describes a device as the driver reports it.
type Info struct {
	Ordinal          int
	Name             string
	Major, Minor     int   // compute capability
	SMs              int   // multiprocessors
	TotalMem         int64 // bytes
	L2Bytes          int
	MaxSharedOptin   int // bytes of shared memory a block may opt in to
	MaxThreads       int // per block
	WarpSize         int
	ClockKHz         int
	MemClockKHz      int
	BusWidthBits     int
	Integrated       bool
	CanMapHost       bool
	UnifiedAddresses bool
	DriverVersion    int // e.g. 13000 for CUDA 13.0
}

// Device is one GPU with its primary context, retained and current on a
// dedicated OS thread that makes every driver call.
type Device struct {
	lib  *lib
	info Info
	dev  int32
	pctx uintptr // the primary context

	mu      sync.Mutex // one Do at a time
	work    chan func()
	stopped chan struct{}
	closed  bool
	ctx     Ctx
}

// Ctx is the handle through which driver calls are made; it is valid only
// inside the closure given to Device.Do, on the device's thread.
type Ctx struct {
	d       *Device
	active  bool
	scratch []byte // mmapped, outside the Go heap
	poison  error  // the sticky error that killed the context, if any
}

// Open loads the driver, initialises it and makes device ordinal's primary
// context current on a new locked OS thread. Without a driver library or a
// device the error wraps ErrNoDevice and says why.
func Open(ordinal int) (*Device, error) {
	l, err := load()
	if err != nil {
		return nil, err
	}
	d := &Device{lib: l, work: make(chan func()), stopped: make(chan struct{})}
	d.ctx.d = d
	ready := make(chan error, 1)
	go d.loop(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	err = d.Do(func(c *Ctx) error { return c.open(ordinal) })
	if err != nil {
		d.stop()
		return nil, err
	}
	return d, nil
}

// loop is the device thread: it locks itself to an OS thread, maps its
// scratch memory and runs closures until stopped.
func (d *Device) loop(ready chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
	defer close(d.stopped)
	mem, err := unix.Mmap(-1, 0, scratchSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		ready <- fmt.Errorf("cuda: scratch memory: %w", err)
		return
	}
	defer unix.Munmap(mem)
	d.ctx.scratch = mem
	ready <- nil
	for f := range d.work {
		f()
	}
}

func (c *Ctx) open(ordinal int) error {
	if err := c.call("cuInit", 0); err != nil {
		if IsCode(err, ErrNoDeviceCode) {
			return noDevice("the driver reports no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE)")
		}
		return noDevice("cuInit failed: %v", err)
	}
	if err := c.call("cuDriverGetVersion", c.out(0)); err != nil {
		return err
	}
	ver := int(c.i32(0))
	if err := c.call("cuDeviceGetCount", c.out(0)); err != nil {
		return noDevice("cuDeviceGetCount: %v", err)
	}
	n := int(c.i32(0))
	if n == 0 {
		return noDevice("the driver (version %d) reports no CUDA device", ver)
	}
	if ordinal < 0 || ordinal >= n {
		return noDevice("device %d requested, the driver reports %d device(s)", ordinal, n)
	}
	if err := c.call("cuDeviceGet", c.out(0), uintptr(ordinal)); err != nil {
		return err
	}
	d := c.d
	d.dev = c.i32(0)
	info := Info{Ordinal: ordinal, DriverVersion: ver}
	if err := c.call("cuDeviceGetName", c.out(64), 256, uintptr(d.dev)); err != nil {
		return err
	}
	info.Name = cString(c.scratch[64 : 64+256])
	if err := c.call("cuDeviceTotalMem_v2", c.out(0), uintptr(d.dev)); err != nil {
		return err
	}
	info.TotalMem = int64(c.u64(0))
	for _, a := range []struct {
		attr int
		dst  *int
	}{
		{attrComputeCapabilityMaj, &info.Major}, {attrComputeCapabilityMin, &info.Minor},
		{attrMultiprocessorCount, &info.SMs}, {attrL2CacheSize, &info.L2Bytes},
		{attrMaxSharedPerBlockOptin, &info.MaxSharedOptin}, {attrMaxThreadsPerBlock, &info.MaxThreads},
		{attrWarpSize, &info.WarpSize}, {attrClockRate, &info.ClockKHz},
		{attrMemoryClockRate, &info.MemClockKHz}, {attrGlobalMemoryBusWidth, &info.BusWidthBits},
	} {
		v, err := c.attribute(a.attr)
		if err != nil {
			return err
		}
		*a.dst = v
	}
	for _, a := range []struct {
		attr int
		dst  *bool
	}{
		{attrIntegrated, &info.Integrated}, {attrCanMapHostMemory, &info.CanMapHost},
		{attrUnifiedAddressing, &info.UnifiedAddresses},
	} {
		v, err := c.attribute(a.attr)
		if err != nil {
			return err
		}
		*a.dst = v != 0
	}
	if err := c.call("cuDevicePrimaryCtxRetain", c.out(0), uintptr(d.dev)); err != nil {
		return err
	}
	d.pctx = uintptr(c.u64(0))
	if err := c.call("cuCtxSetCurrent", d.pctx); err != nil {
		c.call("cuDevicePrimaryCtxRelease_v2", uintptr(d.dev))
		return err
	}
	d.info = info
	return nil
}

func (c *Ctx) attribute(attr int) (int, error) {
	if err := c.call("cuDeviceGetAttribute", c.out(0), uintptr(attr), uintptr(c.d.dev)); err != nil {
		return 0, fmt.Errorf("attribute %d: %w", attr, err)
	}
	return int(c.i32(0)), nil
}

// Info returns what the driver reported about the device at Open.
func (d *Device) Info() Info { return d.info }

// Do runs f on the device thread with the context current and returns its
// error. Calls are serialised; f must not retain c, and must not call Do
// (it would wait for itself).
func (d *Device) Do(f func(c *Ctx) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	var err error
	returned := false // f came back (false after done: it ended the thread)
	done := make(chan struct{})
	fn := func() {
		defer close(done)
		defer func() { d.ctx.active = false }()
		d.ctx.active = true
		err = f(&d.ctx)
		returned = true
	}
	select {
	case d.work <- fn:
	case <-d.stopped:
		d.closed = true
		return ErrClosed
	}
	// The loop runs fn as soon as it receives it, and fn's deferred close
	// of done runs even when f ends the thread.
	<-done
	if !returned {
		// The thread is exiting (its deferred close of done ran first):
		// wait until it has.
		<-d.stopped
	}
	select {
	case <-d.stopped:
		// f ended the thread (runtime.Goexit, e.g. t.Fatal inside a
		// closure): the context is gone with it.
		d.closed = true
		return fmt.Errorf("cuda: the device thread exited inside Do (do not call runtime.Goexit or t.Fatal there): %w", ErrClosed)
	default:
	}
	return err
}

// Close synchronises the context, releases the primary context and ends
// the device thread. Memory, modules, streams and graphs still held are
// freed with the context when no one else retains it.
func (d *Device) Close() error {
	err := d.Do(func(c *Ctx) error {
		var errs []error
		if c.poison == nil {
			errs = append(errs, c.call("cuCtxSynchronize"))
		}
		errs = append(errs, c.callAnyway("cuDevicePrimaryCtxRelease_v2", uintptr(c.d.dev)))
		return errors.Join(errs...)
	})
	if errors.Is(err, ErrClosed) {
		return nil
	}
	d.stop()
	return err
}

func (d *Device) stop() {
	d.mu.Lock()
	if !d.closed {
		d.closed = true
		close(d.work)
	}
	d.mu.Unlock()
	<-d.stopped
}

// threadAlive reports whether the device thread still runs.
func (d *Device) threadAlive() bool {
	select {
	case <-d.stopped:
		return false
	default:
		return true
	}
}

// Poisoned returns the sticky error that killed the context, or nil.
func (c *Ctx) Poisoned() error { return c.poison }

// call invokes a driver entry point and turns its CUresult into an error.
// A sticky result poisons the context; a poisoned context refuses calls.
//
//go:uintptrescapes
func (c *Ctx) call(name string, args ...uintptr) error {
	if !c.active {
		return fmt.Errorf("cuda: %s called outside Device.Do", name)
	}
	if c.poison != nil {
		return fmt.Errorf("%w (%v): %s refused", ErrPoisoned, c.poison, name)
	}
	return c.result(name, c.raw(name, args...))
}

// callAnyway is call without the poison check (for releasing resources).
//
//go:uintptrescapes
func (c *Ctx) callAnyway(name string, args ...uintptr) error {
	return c.result(name, c.raw(name, args...))
}

//go:uintptrescapes
func (c *Ctx) raw(name string, args ...uintptr) Result {
	fn := c.d.lib.fn[name]
	if fn == 0 {
		return ErrNotFound
	}
	r1, _, _ := purego.SyscallN(fn, args...)
	return Result(int32(uint32(r1)))
}

func (c *Ctx) result(name string, r Result) error {
	if r == Success {
		return nil
	}
	e := c.errorOf(name, r)
	if r.sticky() && c.poison == nil {
		c.poison = e
	}
	return e
}

// errorOf builds the error of a failed call with the result's name and
// description from the driver.
func (c *Ctx) errorOf(name string, r Result) *Error {
	e := &Error{Call: name, Code: r, Name: fmt.Sprintf("CUresult %d", int32(r))}
	if c.d.lib.fn[name] == 0 {
		e.Name = "entry point not in this driver"
		return e
	}
	slot := c.out(4000)
	if c.raw("cuGetErrorName", uintptr(r), slot) == Success {
		if s := cStringAt(uintptr(c.u64(4000))); s != "" {
			e.Name = s
		}
	}
	if c.raw("cuGetErrorString", uintptr(r), slot) == Success {
		e.Desc = cStringAt(uintptr(c.u64(4000)))
	}
	return e
}

// out returns the address of scratch byte off for an out-parameter.
func (c *Ctx) out(off int) uintptr { return uintptr(unsafe.Pointer(&c.scratch[scratchOut+off])) }

func (c *Ctx) i32(off int) int32 { return *(*int32)(unsafe.Pointer(&c.scratch[scratchOut+off])) }
func (c *Ctx) u64(off int) uint64 {
	return *(*uint64)(unsafe.Pointer(&c.scratch[scratchOut+off]))
}
func (c *Ctx) f32(off int) float32 {
	return *(*float32)(unsafe.Pointer(&c.scratch[scratchOut+off]))
}

// cString returns the NUL-terminated string at the start of b.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// cStringAt reads a NUL-terminated string the driver owns (static storage
// in libcuda, never the Go heap), at most 1 KB of it.
func cStringAt(p uintptr) string {
	if p == 0 {
		return ""
	}
	var b []byte
	for i := range 1024 {
		c := *(*byte)(unsafe.Add(cPointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// cPointer turns an address outside the Go heap (driver or mmapped
// memory) into a pointer. The double conversion keeps vet's unsafeptr
// check quiet; it is sound only for memory the Go collector does not own.
func cPointer(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }
