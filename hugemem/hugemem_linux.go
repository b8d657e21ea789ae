package hugemem

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// alloc maps n bytes rounded up to whole huge pages, aligned to one (one
// extra page is mapped and the unaligned ends unmapped), and advises
// MADV_HUGEPAGE. It returns the aligned mapping.
func alloc(n int) ([]byte, bool, error) {
	size := (n + PageSize - 1) &^ (PageSize - 1)
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(size+PageSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, false, err
	}
	raw := unsafe.Slice((*byte)(p), size+PageSize)
	lead := int((PageSize - uintptr(p)%PageSize) % PageSize)
	if lead > 0 {
		if err := unix.MunmapPtr(unsafe.Pointer(&raw[0]), uintptr(lead)); err != nil {
			_ = unix.MunmapPtr(p, uintptr(len(raw)))
			return nil, false, err
		}
	}
	mem := raw[lead : lead+size : lead+size]
	if tail := PageSize - lead; tail > 0 {
		if err := unix.MunmapPtr(unsafe.Pointer(&raw[lead+size]), uintptr(tail)); err != nil {
			free(mem)
			return nil, false, err
		}
	}
	huge := unix.Madvise(mem, unix.MADV_HUGEPAGE) == nil
	return mem, huge, nil
}

func free(mem []byte) { _ = unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(mem)), uintptr(len(mem))) }

// Enabled reports whether transparent huge pages are on for advised
// memory ("always" or "madvise" in the kernel's setting).
func Enabled() bool {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	return err == nil && thpEnabled(string(b))
}

// thpEnabled parses the setting, e.g. "always [madvise] never".
func thpEnabled(s string) bool {
	return strings.Contains(s, "[always]") || strings.Contains(s, "[madvise]")
}

// Available returns the memory the kernel estimates can be allocated
// without swapping (MemAvailable), or -1 when it cannot be read.
func Available() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return -1
	}
	return memAvailable(b)
}

// memAvailable parses /proc/meminfo's MemAvailable line (in kB).
func memAvailable(b []byte) int64 {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kb < 0 {
				return -1
			}
			return kb << 10
		}
	}
	return -1
}
