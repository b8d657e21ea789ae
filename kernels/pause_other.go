//go:build !amd64 || purego

package kernels

// spinPause would tell the CPU that the caller is in a spin-wait loop.
func spinPause() {}
