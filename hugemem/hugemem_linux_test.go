package hugemem

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for s, want := range map[string]bool{
		"always [madvise] never\n": true,
		"[always] madvise never\n": true,
		"always madvise [never]\n": false,
		"":                         false,
	} {
		if got := thpEnabled(s); got != want {
			t.Errorf("thpEnabled(%q) = %v, want %v", s, got, want)
		}
	}
	for s, want := range map[string]int64{
		"MemTotal:       24683620 kB\nMemFree:        23271740 kB\nMemAvailable:   24014492 kB\n": 24014492 << 10,
		"MemTotal: 5 kB\n":      -1,
		"MemAvailable: x kB\n":  -1,
		"MemAvailable: -4 kB\n": -1,
	} {
		if got := memAvailable([]byte(s)); got != want {
			t.Errorf("memAvailable(%q) = %d, want %d", s, got, want)
		}
	}
	if Available() <= 0 {
		t.Errorf("Available() = %d on Linux", Available())
	}
}

// TestAllocReleased drops 32 buffers of 64 MB and checks that the
// process's mapped memory (VmSize) shrinks back once the collector has
// run their cleanups.
func TestAllocReleased(t *testing.T) {
	before := vmSize(t)
	for range 32 {
		b, err := Alloc(64 << 20)
		if err != nil {
			t.Fatal(err)
		}
		m := b.Bytes()
		m[0], m[len(m)-1] = 1, 2
	}
	if grown := vmSize(t) - before; grown < 32*64<<20 {
		t.Fatalf("VmSize grew by %d MB with 2048 MB allocated", grown>>20)
	}
	var grown int64
	for range 50 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
		if grown = vmSize(t) - before; grown < 256<<20 {
			return
		}
	}
	t.Fatalf("VmSize still %d MB above its start after the buffers became unreachable", grown>>20)
}

func vmSize(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status:", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmSize:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmSize in /proc/self/status")
	return 0
}
