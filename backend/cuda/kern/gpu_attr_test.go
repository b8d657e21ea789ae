package kern_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/backend/cuda/kern"
)

// The loaded kernels' registers and local memory as the driver reports
// them (the lab's first look), and no kernel with more than a little
// local memory: a large stack frame means an array left registers.
func TestGPUKernelAttributes(t *testing.T) {
	g := newGPU(t)
	man, err := kern.ReadManifest()
	if err != nil {
		t.Fatal(err)
	}
	g.do(func(c *driver.Ctx) error {
		for _, k := range man.Kernels {
			f, err := g.m.Func(k.Name)
			if err != nil {
				return err
			}
			regs, err := c.FuncAttr(f, driver.FuncNumRegs)
			if err != nil {
				return err
			}
			local, err := c.FuncAttr(f, driver.FuncLocalSizeBytes)
			if err != nil {
				return err
			}
			maxT, err := c.FuncAttr(f, driver.FuncMaxThreadsPerBlock)
			if err != nil {
				return err
			}
			t.Logf("%-16s regs %3d  local %4d B  max threads %4d", k.Name, regs, local, maxT)
			if local > 64 {
				t.Errorf("%s uses %d bytes of local memory", k.Name, local)
			}
			if need := blockOf(k.Name); maxT < need {
				t.Errorf("%s is launched with %d threads, the driver allows %d", k.Name, need, maxT)
			}
		}
		return nil
	})
}

// blockOf is the block size the launchers use for a kernel.
func blockOf(name string) int {
	switch {
	case name == "argmax" || name == "sample":
		return 1024
	case strings.HasPrefix(name, "attn_mma_h_d"):
		hd, _ := strconv.Atoi(strings.TrimPrefix(name, "attn_mma_h_d"))
		return 32 * kern.AttnMMAWarps(hd)
	case strings.HasPrefix(name, "mv_q8row_") || strings.HasPrefix(name, "mv_q4tp_"):
		return 512
	case strings.HasPrefix(name, "gemm_"), strings.HasPrefix(name, "gemmq_"):
		return 256
	case name == "rmsnorm" || name == "silu_mul" || name == "add" || name == "q82f_prescale" ||
		name == "probe_read" || strings.HasPrefix(name, "embed_"):
		return 256
	}
	return 128
}
