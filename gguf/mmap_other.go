//go:build !unix

package gguf

import (
	"io"
	"os"
)

// mapFile reads the whole file where mmap is not available.
func mapFile(f *os.File, size int64) (data []byte, mapped bool, err error) {
	if size <= 0 {
		return nil, false, nil
	}
	data = make([]byte, size)
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, false, err
	}
	return data, false, nil
}

func unmap([]byte) error { return nil }

func advise([]byte, int64, int64, int) {}

const (
	adviceSequential = 0
	adviceDontNeed   = 0
	adviceWillNeed   = 0
)
