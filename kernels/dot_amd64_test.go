//go:build amd64 && !purego

package kernels

import "github.com/cortiq/cortiq/quant"

// batchKernel is one of the MatMul kernel choices of a format, for the
// benchmarks and tests that compare them.
type batchKernel struct {
	name string
	use  func() (restore func())
}

// smallBatchKernels lists the q4tp MatMul kernels of this build: the
// transposed one where it applies ("") and the chunked one ("/chunked").
func smallBatchKernels(d quant.DType) []batchKernel {
	if d != quant.Q4TP {
		return []batchKernel{{"", func() func() { return func() {} }}}
	}
	force := func(v bool) func() func() {
		return func() func() {
			prev := q4tpTransposed
			q4tpTransposed = func(gpr, _ int) bool { return v && gpr%16 == 0 }
			return func() { q4tpTransposed = prev }
		}
	}
	return []batchKernel{{"", force(true)}, {"/chunked", force(false)}}
}
