//go:build amd64 && !purego

package kernels

import "github.com/cortiq/cortiq/quant"

// batchKernel is one of the MatMul kernel choices of a format, for the
// benchmarks and tests that compare them.
type batchKernel struct {
	name string
	use  func() (restore func())
}

// smallBatchKernels lists the int8 MatMul kernels of this build for
// format d (q4tp, q8_row, q8_2f): the transposed one where it applies
// ("") and the chunked one ("/chunked").
func smallBatchKernels(d quant.DType) []batchKernel {
	force := func(v bool) func() func() {
		return func() func() {
			if d == quant.Q4TP {
				prev := q4tpTransposed
				q4tpTransposed = func(gpr, _ int) bool { return v && gpr%16 == 0 }
				return func() { q4tpTransposed = prev }
			}
			prev := q8Transposed
			q8Transposed = func(c, _ int) bool { return v && c%512 == 0 }
			return func() { q8Transposed = prev }
		}
	}
	return []batchKernel{{"", force(true)}, {"/chunked", force(false)}}
}
