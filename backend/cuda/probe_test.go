package cuda

import (
	"strings"
	"testing"
)

// probeSize: the default buffer is 1 GiB, a probe never takes more than
// half the free memory, sizes are whole 16-byte words, and too little
// free memory is an error that says how much there is.
func TestProbeSize(t *testing.T) {
	for _, c := range []struct{ want, free, n int64 }{
		{0, 100 << 30, 1 << 30},
		{-5, 100 << 30, 1 << 30},
		{4 << 30, 100 << 30, 4 << 30},
		{4 << 30, 3 << 30, 3 << 29},
		{1<<30 + 7, 100 << 30, 1 << 30},
		{1 << 30, 64<<20 + 33, 32<<20 + 16},
	} {
		n, err := probeSize(c.want, c.free)
		if err != nil || n != c.n {
			t.Errorf("probeSize(%d, %d) = %d, %v; want %d", c.want, c.free, n, err, c.n)
		}
	}
	if n, err := probeSize(1<<30, 20<<20); err == nil || !strings.Contains(err.Error(), "free") {
		t.Errorf("probeSize with 20 MiB free = %d, %v; want an error", n, err)
	}
}

// ReadProbe on a device that is not open (the fake has no driver device)
// is an error, not a panic.
func TestReadProbeNeedsDevice(t *testing.T) {
	d := fakeOpen(newFake(t, 1), Options{Seqs: 1, Ctx: 16})
	if g, err := d.ReadProbe(1 << 30); err == nil {
		t.Fatalf("ReadProbe on the fake = %g GB/s, want an error", g)
	}
}
