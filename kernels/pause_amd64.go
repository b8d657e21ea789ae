//go:build amd64 && !purego

package kernels

// spinPause tells the CPU that the caller is in a spin-wait loop.
//
//go:noescape
func spinPause()
