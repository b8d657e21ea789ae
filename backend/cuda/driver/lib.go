// Package driver binds the CUDA driver API (libcuda.so.1) from Go without
// cgo, through purego: devices, the primary context on a locked OS thread,
// modules, memory, streams, events, launches and graphs.
//
// Every call runs on one goroutine locked to its OS thread (a Device's
// thread; a context is current per OS thread and goroutines migrate), so the
// API is a closure run there: dev.Do(func(c *Ctx) error { ... }). Values the
// driver writes (handles, sizes) land in memory outside the Go heap owned
// by that thread, and kernel argument blocks are marshalled there too, so
// no Go pointer is ever retained by the driver (purego follows cgo's
// pointer rules).
//
// Errors are *Error values naming the call and the CUresult's name; a
// sticky error (an illegal address, a failed launch) poisons the device and
// every later call fails with ErrPoisoned. Without a driver or a device,
// Open fails with an error wrapping ErrNoDevice that says why in one line.
package driver

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/ebitengine/purego"
)

// libNames are tried in order by Load.
var libNames = []string{"libcuda.so.1", "libcuda.so"}

// lib holds the resolved entry points of the driver library.
type lib struct {
	handle uintptr
	fn     map[string]uintptr
}

// required are the entry points without which the binding does not load;
// optional ones (newer drivers) are looked up but may be missing.
var required = []string{
	"cuInit", "cuDriverGetVersion", "cuGetErrorName", "cuGetErrorString",
	"cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName", "cuDeviceGetAttribute", "cuDeviceTotalMem_v2",
	"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2", "cuCtxSetCurrent", "cuCtxSynchronize",
	"cuMemGetInfo_v2", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemHostAlloc", "cuMemFreeHost",
	"cuMemHostGetDevicePointer_v2",
	"cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemcpyDtoD_v2",
	"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoDAsync_v2",
	"cuMemsetD8_v2", "cuMemsetD32_v2", "cuMemsetD8Async", "cuMemsetD32Async",
	"cuStreamCreate", "cuStreamDestroy_v2", "cuStreamSynchronize", "cuStreamQuery",
	"cuEventCreate", "cuEventDestroy_v2", "cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuStreamWaitEvent",
	"cuModuleLoadData", "cuModuleUnload", "cuModuleGetFunction", "cuFuncGetAttribute", "cuFuncSetAttribute",
	"cuLaunchKernel",
	"cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags", "cuGraphLaunch",
	"cuGraphDestroy", "cuGraphExecDestroy", "cuGraphGetNodes",
}

var optional = []string{
	"cuFuncGetParamInfo",           // CUDA 12.4
	"cuLaunchKernelEx",             // CUDA 12.0
	"cuOccupancyMaxActiveClusters", // CUDA 12.0
	"cuGraphExecUpdate_v2",         // CUDA 12.0
	"cuEventElapsedTime_v2",        // CUDA 12.8
	"cuEventElapsedTime",           // older name, same meaning for our use
	"cuDevicePrimaryCtxReset_v2",
}

var (
	loadOnce sync.Once
	loaded   *lib
	loadErr  error
)

// load opens the driver library once per process.
func load() (*lib, error) {
	loadOnce.Do(func() { loaded, loadErr = openLib(libNames) })
	return loaded, loadErr
}

func openLib(names []string) (*lib, error) {
	if runtime.GOOS != "linux" {
		return nil, noDevice("the CUDA binding supports linux only (this is %s)", runtime.GOOS)
	}
	var h uintptr
	var firstErr error
	for _, n := range names {
		var err error
		h, err = purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			break
		}
		if firstErr == nil {
			firstErr = fmt.Errorf("dlopen %s: %v", n, err)
		}
	}
	if h == 0 {
		return nil, noDevice("cannot load the CUDA driver library (%v)", firstErr)
	}
	l := &lib{handle: h, fn: map[string]uintptr{}}
	for _, s := range required {
		p, err := purego.Dlsym(h, s)
		if err != nil || p == 0 {
			return nil, noDevice("the CUDA driver library lacks %s (driver too old?)", s)
		}
		l.fn[s] = p
	}
	for _, s := range optional {
		if p, err := purego.Dlsym(h, s); err == nil && p != 0 {
			l.fn[s] = p
		}
	}
	return l, nil
}

// has reports whether an entry point was found.
func (l *lib) has(name string) bool { return l.fn[name] != 0 }
