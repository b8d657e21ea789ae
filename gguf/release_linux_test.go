//go:build linux

package gguf

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// rssFile returns the file-backed resident set of this process in bytes.
func rssFile(t *testing.T) int64 {
	t.Helper()
	fd, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status:", err)
	}
	defer fd.Close()
	sc := bufio.NewScanner(fd)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "RssFile:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Skip("no RssFile line in /proc/self/status")
	return 0
}

// TestReleaseDropsPages checks that dequantizing a tensor maps its pages
// into the process and Release takes them out again.
func TestReleaseDropsPages(t *testing.T) {
	const n = 8 << 20 // 8 Mi Q8_0 elements, 8.5 MiB
	path := filepath.Join(t.TempDir(), "big.gguf")
	w := NewWriter()
	if err := w.AddRaw("w", TypeQ8_0, []int{n}, make([]byte, n/32*34)); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dst := make([]float32, n)
	before := rssFile(t)
	if err := f.ReadFloat32Into("w", dst); err != nil {
		t.Fatal(err)
	}
	read := rssFile(t)
	f.Release("w")
	released := rssFile(t)
	size := int64(n / 32 * 34)
	t.Logf("RssFile: before %d MiB, after read %d MiB, after Release %d MiB", before>>20, read>>20, released>>20)
	if read-before < size/2 {
		t.Skipf("reading mapped only %d bytes; page accounting differs here", read-before)
	}
	if read-released < size/2 {
		t.Fatalf("Release freed only %d of %d bytes", read-released, size)
	}
}
