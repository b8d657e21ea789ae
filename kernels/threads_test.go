package kernels

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

func TestCountCores(t *testing.T) {
	dir := t.TempDir()
	// Two packages, two cores each, two threads per core; cpu7 offline.
	for cpu := range 8 {
		d := filepath.Join(dir, "cpu"+string(rune('0'+cpu)))
		if err := os.MkdirAll(filepath.Join(d, "topology"), 0o755); err != nil {
			t.Fatal(err)
		}
		write := func(name, v string) {
			if err := os.WriteFile(filepath.Join(d, name), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write("topology/physical_package_id", string(rune('0'+cpu/4)))
		write("topology/core_id", string(rune('0'+cpu%2)))
		if cpu == 7 {
			write("online", "0")
		}
	}
	if got := countCores(dir); got != 4 {
		t.Fatalf("countCores = %d, want 4", got)
	}
	if got := countCores(filepath.Join(dir, "nothing")); got != 0 {
		t.Fatalf("countCores of a missing directory = %d, want 0", got)
	}
	if n := DefaultThreads(); n < 1 {
		t.Fatalf("DefaultThreads = %d", n)
	}
}

type countTask struct{ n atomic.Int64 }

func (c *countTask) Run(lo, hi, _ int) { c.n.Add(int64(hi - lo)) }

// TestPoolParkAndWake runs operations after the workers have parked and
// while they spin, and closes a pool with parked workers.
func TestPoolParkAndWake(t *testing.T) {
	p := NewPool(3)
	var c countTask
	for round := range 6 {
		if round%2 == 1 {
			time.Sleep(2 * spinTime) // let the workers park
		}
		for range 100 {
			p.For(999, minParallelWork, &c)
		}
	}
	if got := c.n.Load(); got != 6*100*999 {
		t.Fatalf("covered %d indexes, want %d", got, 6*100*999)
	}
	time.Sleep(2 * spinTime)
	p.Close()
	p.Close()
}
