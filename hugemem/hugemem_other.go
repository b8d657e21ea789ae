//go:build !linux

package hugemem

import "unsafe"

// alloc falls back to the Go heap, aligned to a huge page.
func alloc(n int) ([]byte, bool, error) {
	size := (n + PageSize - 1) &^ (PageSize - 1)
	raw := make([]byte, size+PageSize)
	off := 0
	for uintptr(unsafe.Pointer(&raw[off]))%PageSize != 0 {
		off++
	}
	return raw[off : off+size : off+size], false, nil
}

func free([]byte) {}

// Enabled reports false: huge pages are only requested on Linux.
func Enabled() bool { return false }

// Available returns -1: unknown.
func Available() int64 { return -1 }
