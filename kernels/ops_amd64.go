//go:build amd64 && !purego

package kernels

//go:noescape
func dotAVX512(a, b *float32, n int) float32

//go:noescape
func axpyAVX512(y *float32, a float32, x *float32, n int)

//go:noescape
func siluMulAVX512(a, b *float32, n int)

// The wrappers get slices of equal, non-zero length.

func dotOpAVX512(a, b []float32) float32 { return dotAVX512(&a[0], &b[0], len(a)) }

func axpyOpAVX512(y []float32, a float32, x []float32) { axpyAVX512(&y[0], a, &x[0], len(y)) }

func siluMulOpAVX512(a, b []float32) { siluMulAVX512(&a[0], &b[0], len(a)) }

//go:noescape
func expSumAVX512(x *float32, n int, mx float32) float64

func expSumOpAVX512(x []float32, mx float32) float64 { return expSumAVX512(&x[0], len(x), mx) }

func streamOpAVX512(b []byte) uint64 { return streamAVX512(&b[0], len(b)) }
