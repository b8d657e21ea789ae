package driver

import (
	"bytes"
	"fmt"
	"unsafe"
)

// Module is a loaded CUmodule; Func a kernel in it (CUfunction).
type (
	Module uintptr
	Func   uintptr
)

// LoadModule loads a cubin or fatbin image, or PTX text (which the driver
// then compiles: slow, and it fails on PTX newer than the driver).
func (c *Ctx) LoadModule(image []byte) (Module, error) {
	if len(image) == 0 {
		return 0, fmt.Errorf("cuda: LoadModule: empty image")
	}
	img := image
	if isPTX(image) && image[len(image)-1] != 0 {
		img = append(bytes.Clone(image), 0) // PTX must be NUL-terminated
	}
	if err := c.call("cuModuleLoadData", c.out(0), uintptr(unsafe.Pointer(&img[0]))); err != nil {
		return 0, err
	}
	return Module(c.u64(0)), nil
}

// isPTX tells PTX text from an ELF cubin or a fatbin.
func isPTX(b []byte) bool {
	return !bytes.HasPrefix(b, []byte("\x7fELF")) && !bytes.HasPrefix(b, []byte{0x50, 0xed, 0x55, 0xba})
}

// UnloadModule unloads a module; its functions become invalid.
func (c *Ctx) UnloadModule(m Module) error {
	if m == 0 {
		return nil
	}
	return c.callAnyway("cuModuleUnload", uintptr(m))
}

// Function returns the kernel called name (an extern "C" name) in m.
func (c *Ctx) Function(m Module, name string) (Func, error) {
	const off = 1024 // name buffer in the out-parameter area
	if len(name) == 0 || len(name) >= 2048 || bytes.IndexByte([]byte(name), 0) >= 0 {
		return 0, fmt.Errorf("cuda: bad kernel name %q", name)
	}
	copy(c.scratch[scratchOut+off:], name)
	c.scratch[scratchOut+off+len(name)] = 0
	if err := c.call("cuModuleGetFunction", c.out(0), uintptr(m), c.out(off)); err != nil {
		return 0, fmt.Errorf("kernel %s: %w", name, err)
	}
	return Func(c.u64(0)), nil
}

// Param is one kernel parameter as cuFuncGetParamInfo reports it.
type Param struct{ Offset, Size int }

// HasParamInfo reports whether the driver can list kernel parameters
// (cuFuncGetParamInfo, CUDA 12.4 and later).
func (c *Ctx) HasParamInfo() bool { return c.d.lib.has("cuFuncGetParamInfo") }

// Params lists f's parameters (offset and size in the parameter block).
func (c *Ctx) Params(f Func) ([]Param, error) {
	if !c.HasParamInfo() {
		return nil, fmt.Errorf("cuda: cuFuncGetParamInfo is not in this driver (needs CUDA 12.4)")
	}
	var ps []Param
	for i := 0; i < MaxParams+1; i++ {
		r := c.raw("cuFuncGetParamInfo", uintptr(f), uintptr(i), c.out(0), c.out(8))
		if r == ErrInvalidValue {
			return ps, nil // past the last parameter
		}
		if err := c.result("cuFuncGetParamInfo", r); err != nil {
			return nil, err
		}
		ps = append(ps, Param{Offset: int(c.u64(0)), Size: int(c.u64(8))})
	}
	return nil, fmt.Errorf("cuda: kernel has more than %d parameters", MaxParams)
}

// Function attributes (CUfunction_attribute).
const (
	FuncMaxThreadsPerBlock = 0
	FuncSharedSizeBytes    = 1
	FuncLocalSizeBytes     = 3
	FuncNumRegs            = 4
	FuncMaxDynamicShared   = 8
)

// FuncAttr reads a function attribute.
func (c *Ctx) FuncAttr(f Func, attr int) (int, error) {
	if err := c.call("cuFuncGetAttribute", c.out(0), uintptr(attr), uintptr(f)); err != nil {
		return 0, err
	}
	return int(c.i32(0)), nil
}

// SetMaxDynamicShared lets f launch with up to n bytes of dynamic shared
// memory (beyond 48 KB a kernel must opt in).
func (c *Ctx) SetMaxDynamicShared(f Func, n int) error {
	return c.call("cuFuncSetAttribute", uintptr(f), FuncMaxDynamicShared, uintptr(n))
}
