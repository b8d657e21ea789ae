package driver

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// D1 is a one-dimensional shape; D2 and D3 are two- and three-.
func D1(x int) Dim3       { return Dim3{uint32(x), 1, 1} }
func D2(x, y int) Dim3    { return Dim3{uint32(x), uint32(y), 1} }
func D3(x, y, z int) Dim3 { return Dim3{uint32(x), uint32(y), uint32(z)} }

// Config is a launch: shape, dynamic shared memory, stream, and whether
// the kernel may start before its predecessor on the stream finishes
// (programmatic dependent launch: the kernel must then wait with
// griddepcontrol.wait before it reads what the predecessor wrote).
type Config struct {
	Grid, Block Dim3
	Shared      int
	Stream      Stream
	PDL         bool
}

// Layout of CUlaunchConfig and CUlaunchAttribute (cuda.h, CUDA 12 and 13,
// 64-bit): the config is 56 bytes, an attribute 72 (id, 4 bytes of pad,
// a 64-byte value union).
const (
	launchConfigSize              = 56
	launchAttrSize                = 72
	attrProgrammaticSerialization = 6 // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
)

// Launch runs kernel f with the packed arguments a. With cfg.PDL it goes
// through cuLaunchKernelEx (CUDA 12.0 and later).
func (c *Ctx) Launch(f Func, cfg Config, a *Args) error {
	params, err := c.marshal(a)
	if err != nil {
		return err
	}
	g, b := cfg.Grid, cfg.Block
	if g.X == 0 || g.Y == 0 || g.Z == 0 || b.X == 0 || b.Y == 0 || b.Z == 0 {
		return fmt.Errorf("cuda: launch with an empty grid %v or block %v", g, b)
	}
	if cfg.Shared < 0 {
		return fmt.Errorf("cuda: launch with %d bytes of shared memory", cfg.Shared)
	}
	if !cfg.PDL {
		return c.call("cuLaunchKernel", uintptr(f),
			uintptr(g.X), uintptr(g.Y), uintptr(g.Z), uintptr(b.X), uintptr(b.Y), uintptr(b.Z),
			uintptr(cfg.Shared), uintptr(cfg.Stream), params, 0)
	}
	if !c.d.lib.has("cuLaunchKernelEx") {
		return fmt.Errorf("cuda: programmatic dependent launch needs cuLaunchKernelEx (CUDA 12.0)")
	}
	conf := c.scratch[scratchConfig : scratchConfig+launchConfigSize+launchAttrSize]
	clear(conf)
	putLaunchConfig(conf, cfg, uintptr(unsafe.Pointer(&conf[launchConfigSize])))
	return c.call("cuLaunchKernelEx", uintptr(unsafe.Pointer(&conf[0])), uintptr(f), params, 0)
}

// MaxActiveClusters is how many clusters of kernel f (its cluster shape
// compiled in, __cluster_dims__) the device runs at once when launched as
// cfg (grid, block, dynamic shared memory; f must already be let use that
// much): cuOccupancyMaxActiveClusters, CUDA 12.0. A cluster's blocks share
// one GPC, so this can be less than the SMs' block slots divided by the
// cluster size.
func (c *Ctx) MaxActiveClusters(f Func, cfg Config) (int, error) {
	if !c.d.lib.has("cuOccupancyMaxActiveClusters") {
		return 0, fmt.Errorf("cuda: cluster occupancy needs cuOccupancyMaxActiveClusters (CUDA 12.0)")
	}
	conf := c.scratch[scratchConfig : scratchConfig+launchConfigSize+launchAttrSize]
	clear(conf)
	cfg.PDL = false
	putLaunchConfig(conf, cfg, 0)
	if err := c.call("cuOccupancyMaxActiveClusters", c.out(0), uintptr(f), uintptr(unsafe.Pointer(&conf[0]))); err != nil {
		return 0, err
	}
	return int(c.i32(0)), nil
}

// putLaunchConfig writes a CUlaunchConfig into b: with cfg.PDL one
// attribute (programmatic stream serialisation allowed) at address attrs,
// which must be b[launchConfigSize:], else none.
func putLaunchConfig(b []byte, cfg Config, attrs uintptr) {
	le := binary.LittleEndian
	for i, v := range []uint32{cfg.Grid.X, cfg.Grid.Y, cfg.Grid.Z, cfg.Block.X, cfg.Block.Y, cfg.Block.Z, uint32(cfg.Shared)} {
		le.PutUint32(b[4*i:], v)
	}
	le.PutUint64(b[32:], uint64(cfg.Stream))
	if !cfg.PDL {
		return
	}
	le.PutUint64(b[40:], uint64(attrs))
	le.PutUint32(b[48:], 1)
	a := b[launchConfigSize:]
	le.PutUint32(a[0:], attrProgrammaticSerialization)
	le.PutUint32(a[8:], 1) // value.programmaticStreamSerializationAllowed
}

// marshal copies a's block into the thread's scratch memory and returns
// the address of the kernelParams array (0 for no parameters).
func (c *Ctx) marshal(a *Args) (uintptr, error) {
	if a == nil || a.Len() == 0 {
		return 0, nil
	}
	if a.err != nil {
		return 0, a.err
	}
	if a.Len() > MaxParams || a.Size() > MaxArgBytes {
		return 0, fmt.Errorf("cuda: %d parameters of %d bytes exceed the launcher's %d / %d", a.Len(), a.Size(), MaxParams, MaxArgBytes)
	}
	vals := c.scratch[scratchArgs : scratchArgs+a.Size()]
	copy(vals, a.buf)
	base := uintptr(unsafe.Pointer(&c.scratch[scratchArgs]))
	ptrs := c.scratch[scratchPtrs : scratchPtrs+8*a.Len()]
	for i, off := range a.offs {
		binary.LittleEndian.PutUint64(ptrs[8*i:], uint64(base+uintptr(off)))
	}
	return uintptr(unsafe.Pointer(&ptrs[0])), nil
}
