package bench

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:noescape
func sumAVX2(p *byte, n int) uint64

// sumWide adds the words of b with 256-bit loads when the CPU has AVX2.
func sumWide(b []uint64) (uint64, bool) {
	if !cpu.X86.HasAVX2 || len(b) < 32 {
		return 0, false
	}
	n := len(b) / 32 * 32
	s := sumAVX2((*byte)(unsafe.Pointer(&b[0])), n*8)
	for _, w := range b[n:] {
		s += w
	}
	return s, true
}
