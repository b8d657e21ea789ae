package driver

import (
	"fmt"
	"unsafe"
)

// DevicePtr is a device address (CUdeviceptr).
type DevicePtr uint64

// Add returns p advanced by off bytes.
func (p DevicePtr) Add(off int64) DevicePtr { return DevicePtr(int64(p) + off) }

// HostBuf is page-locked host memory from cuMemHostAlloc: the only host
// memory asynchronous copies accept (the Go heap may be reused as soon as
// a call returns, while an asynchronous copy reads it later).
type HostBuf struct {
	ptr   uintptr
	n     int
	dev   DevicePtr // device address of mapped memory, 0 unless mapped
	freed bool
}

// Host allocation flags (CU_MEMHOSTALLOC_*).
const (
	HostPortable      = 0x01
	HostDeviceMap     = 0x02 // mapped into the device address space (a flag the device can write and the host poll)
	HostWriteCombined = 0x04
)

// Bytes returns the buffer's memory. It stays valid until FreeHost.
func (h *HostBuf) Bytes() []byte {
	if h == nil || h.freed || h.n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(cPointer(h.ptr)), h.n)
}

// Len returns the buffer's size in bytes.
func (h *HostBuf) Len() int { return h.n }

// Device returns the device address of a buffer allocated with
// HostDeviceMap (0 otherwise).
func (h *HostBuf) Device() DevicePtr { return h.dev }

// MemInfo returns the free and total device memory in bytes.
func (c *Ctx) MemInfo() (free, total int64, err error) {
	if err := c.call("cuMemGetInfo_v2", c.out(0), c.out(8)); err != nil {
		return 0, 0, err
	}
	return int64(c.u64(0)), int64(c.u64(8)), nil
}

// Alloc allocates n bytes of device memory (256-byte aligned).
func (c *Ctx) Alloc(n int64) (DevicePtr, error) {
	if n <= 0 {
		return 0, fmt.Errorf("cuda: Alloc of %d bytes", n)
	}
	if err := c.call("cuMemAlloc_v2", c.out(0), uintptr(n)); err != nil {
		return 0, fmt.Errorf("allocating %d bytes: %w", n, err)
	}
	return DevicePtr(c.u64(0)), nil
}

// Free releases device memory from Alloc.
func (c *Ctx) Free(p DevicePtr) error {
	if p == 0 {
		return nil
	}
	return c.callAnyway("cuMemFree_v2", uintptr(p))
}

// HostAlloc allocates n bytes of page-locked host memory with the given
// flags (HostPortable, HostDeviceMap, HostWriteCombined).
func (c *Ctx) HostAlloc(n int, flags uint32) (*HostBuf, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cuda: HostAlloc of %d bytes", n)
	}
	if err := c.call("cuMemHostAlloc", c.out(0), uintptr(n), uintptr(flags)); err != nil {
		return nil, fmt.Errorf("allocating %d pinned bytes: %w", n, err)
	}
	h := &HostBuf{ptr: uintptr(c.u64(0)), n: n}
	if flags&HostDeviceMap != 0 {
		if err := c.call("cuMemHostGetDevicePointer_v2", c.out(0), h.ptr, 0); err != nil {
			c.callAnyway("cuMemFreeHost", h.ptr)
			return nil, err
		}
		h.dev = DevicePtr(c.u64(0))
	}
	return h, nil
}

// FreeHost releases pinned memory; its Bytes must no longer be used.
func (c *Ctx) FreeHost(h *HostBuf) error {
	if h == nil || h.freed {
		return nil
	}
	h.freed = true
	return c.callAnyway("cuMemFreeHost", h.ptr)
}

// HtoD copies src to device memory at dst and returns when done. src may
// be any host memory, the Go heap included (the driver does not keep it).
func (c *Ctx) HtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return c.call("cuMemcpyHtoD_v2", uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)))
}

// DtoH copies device memory at src into dst and returns when done.
func (c *Ctx) DtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return c.call("cuMemcpyDtoH_v2", uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)))
}

// DtoD copies n bytes between device buffers.
func (c *Ctx) DtoD(dst, src DevicePtr, n int64) error {
	if n == 0 {
		return nil
	}
	return c.call("cuMemcpyDtoD_v2", uintptr(dst), uintptr(src), uintptr(n))
}

// HtoDAsync queues a copy of h[off:off+n] to dst on stream s.
func (c *Ctx) HtoDAsync(dst DevicePtr, h *HostBuf, off, n int, s Stream) error {
	if err := h.check(off, n); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	return c.call("cuMemcpyHtoDAsync_v2", uintptr(dst), h.ptr+uintptr(off), uintptr(n), uintptr(s))
}

// DtoHAsync queues a copy of n bytes at src into h[off:] on stream s.
func (c *Ctx) DtoHAsync(h *HostBuf, off int, src DevicePtr, n int, s Stream) error {
	if err := h.check(off, n); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	return c.call("cuMemcpyDtoHAsync_v2", h.ptr+uintptr(off), uintptr(src), uintptr(n), uintptr(s))
}

// DtoDAsync queues a device-to-device copy on stream s.
func (c *Ctx) DtoDAsync(dst, src DevicePtr, n int64, s Stream) error {
	if n == 0 {
		return nil
	}
	return c.call("cuMemcpyDtoDAsync_v2", uintptr(dst), uintptr(src), uintptr(n), uintptr(s))
}

func (h *HostBuf) check(off, n int) error {
	if h == nil || h.freed {
		return fmt.Errorf("cuda: copy with a freed or nil pinned buffer")
	}
	if off < 0 || n < 0 || off+n > h.n {
		return fmt.Errorf("cuda: copy of [%d,%d) outside a %d-byte pinned buffer", off, off+n, h.n)
	}
	return nil
}

// MemsetD8 sets n bytes at p to v.
func (c *Ctx) MemsetD8(p DevicePtr, v byte, n int64) error {
	return c.call("cuMemsetD8_v2", uintptr(p), uintptr(v), uintptr(n))
}

// MemsetD32 sets n 32-bit words at p (4-byte aligned) to v.
func (c *Ctx) MemsetD32(p DevicePtr, v uint32, n int64) error {
	return c.call("cuMemsetD32_v2", uintptr(p), uintptr(v), uintptr(n))
}

// MemsetD8Async queues MemsetD8 on stream s.
func (c *Ctx) MemsetD8Async(p DevicePtr, v byte, n int64, s Stream) error {
	return c.call("cuMemsetD8Async", uintptr(p), uintptr(v), uintptr(n), uintptr(s))
}

// MemsetD32Async queues MemsetD32 on stream s.
func (c *Ctx) MemsetD32Async(p DevicePtr, v uint32, n int64, s Stream) error {
	return c.call("cuMemsetD32Async", uintptr(p), uintptr(v), uintptr(n), uintptr(s))
}

// Synchronize waits for all work in the context.
func (c *Ctx) Synchronize() error { return c.call("cuCtxSynchronize") }
