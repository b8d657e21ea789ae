//go:build !amd64 || purego

package kernels

import "github.com/cortiq/cortiq/quant"

type batchKernel struct {
	name string
	use  func() (restore func())
}

// smallBatchKernels: one MatMul kernel per format in this build.
func smallBatchKernels(quant.DType) []batchKernel {
	return []batchKernel{{"", func() func() { return func() {} }}}
}
