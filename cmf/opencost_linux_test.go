package cmf

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// TestOpenCostIndependentOfSize opens a tiny model and an 8 GiB (sparse)
// one with the same directory shape and compares the work each Open and
// Close does, not its time (a busy machine changes times, not these
// counts): the bytes read by read(2) calls (/proc/self/io rchar) and the
// page faults (getrusage). Touching the 8 GiB of data would read or fault
// in gigabytes; the allowance is 64 KiB and 64 faults over the tiny file.
// BenchmarkOpen times both.
func TestOpenCostIndependentOfSize(t *testing.T) {
	if testing.Short() {
		t.Skip("writes an 8 GiB sparse file")
	}
	if _, _, err := readWork(); err != nil {
		t.Skipf("no work counters on this system: %v", err)
	}
	dir := t.TempDir()
	tiny, big := filepath.Join(dir, "tiny.cmf"), filepath.Join(dir, "big.cmf")
	makeSparse(t, tiny, 1<<10)
	makeSparse(t, big, 1<<33)
	// The least of 5 opens: garbage collection and other goroutines add
	// faults now and then, never fewer.
	work := func(p string) (rd, faults int64) {
		rd, faults = -1, -1
		for range 5 {
			r0, f0, _ := readWork()
			m, err := OpenWith(p, OpenOptions{NoVerify: true}) // the structural open; weights are hashed once per file identity
			if err != nil {
				t.Fatal(err)
			}
			m.Close()
			r1, f1, _ := readWork()
			if rd < 0 || r1-r0 < rd {
				rd = r1 - r0
			}
			if faults < 0 || f1-f0 < faults {
				faults = f1 - f0
			}
		}
		return rd, faults
	}
	ar, af := work(tiny)
	br, bf := work(big)
	t.Logf("open+close: tiny %d bytes read, %d page faults; 8 GiB %d bytes read, %d page faults", ar, af, br, bf)
	if br > ar+64<<10 || bf > af+64 {
		t.Fatalf("opening 8 GiB read %d bytes with %d page faults; a tiny file %d bytes and %d faults", br, bf, ar, af)
	}
}

// readWork returns this process's bytes read by read(2)-family calls and
// its page faults (minor and major) so far.
func readWork() (rchar, faults int64, err error) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("rchar: ")); ok {
			if rchar, err = strconv.ParseInt(string(v), 10, 64); err != nil {
				return 0, 0, err
			}
		}
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, err
	}
	return rchar, int64(ru.Minflt + ru.Majflt), nil
}
