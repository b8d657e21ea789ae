//go:build !amd64 || purego

package kernels

// Without assembly only the plain Go kernels exist.

func bestISA() isaLevel { return isaGeneric }

func installISA(isaLevel) {}
