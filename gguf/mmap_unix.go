//go:build unix

package gguf

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// mapFile maps the whole file read-only; mapped reports whether the bytes
// are a mapping (to be released with unmap, and open to madvise).
func mapFile(f *os.File, size int64) (data []byte, mapped bool, err error) {
	if size <= 0 {
		return nil, false, nil
	}
	if int64(int(size)) != size {
		return nil, false, fmt.Errorf("file of %d bytes is too large to map", size)
	}
	data, err = unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, false, fmt.Errorf("mmap: %w", err)
	}
	return data, true, nil
}

func unmap(data []byte) error { return unix.Munmap(data) }

// advise applies a madvise hint to the pages covering data[off:off+n] of a
// mapping. Hints are best effort, so errors are ignored.
func advise(data []byte, off, n int64, advice int) {
	if n <= 0 || len(data) == 0 {
		return
	}
	ps := int64(os.Getpagesize())
	start := off &^ (ps - 1)
	end := min((off+n+ps-1)&^(ps-1), int64(len(data)))
	if start >= end {
		return
	}
	_ = unix.Madvise(data[start:end], advice)
}

const (
	adviceSequential = unix.MADV_SEQUENTIAL
	adviceDontNeed   = unix.MADV_DONTNEED
	adviceWillNeed   = unix.MADV_WILLNEED
)
