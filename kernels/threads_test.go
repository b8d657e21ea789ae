package kernels

import (
	"os"
	"path/filepath"
	"runtime"
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

// lateTask counts, per index, how often it ran, and fails when two
// goroutines use one worker index at once (per-worker scratch would be
// shared) or when a unit runs after its operation returned.
type lateTask struct {
	seen []atomic.Int32
	busy []atomic.Int32 // per worker index
	done atomic.Bool
	bad  atomic.Int32
}

func (l *lateTask) Run(lo, hi, w int) {
	if l.busy[w].Add(1) != 1 || l.done.Load() {
		l.bad.Add(1)
	}
	for i := lo; i < hi; i++ {
		l.seen[i].Add(1)
	}
	l.busy[w].Add(-1)
}

// TestPoolLateWorkers runs operations separated by pauses around the
// workers' spin time, so that workers wake while an operation is under
// way or after it has ended: every index runs exactly once, inside its
// operation, and no worker index is used twice at a time.
func TestPoolLateWorkers(t *testing.T) {
	p := NewPool(3)
	defer p.Close()
	var tasks []*lateTask
	for i := range 300 {
		n := 1 + i*7%200
		l := &lateTask{seen: make([]atomic.Int32, n), busy: make([]atomic.Int32, 3)}
		p.For(n, minParallelWork, l)
		l.done.Store(true)
		tasks = append(tasks, l)
		if i%3 == 0 {
			time.Sleep(time.Duration(i%5) * spinTime / 2)
		}
	}
	time.Sleep(4 * spinTime) // a straggler would write now
	for i, l := range tasks {
		if b := l.bad.Load(); b != 0 {
			t.Fatalf("operation %d: %d units ran concurrently on one worker index or after the operation returned", i, b)
		}
		for j := range l.seen {
			if s := l.seen[j].Load(); s != 1 {
				t.Fatalf("operation %d: index %d ran %d times", i, j, s)
			}
		}
	}
}

// TestPoolDoesNotWaitForIdleWorker runs operations with one P, so that
// the workers' goroutines cannot run while the caller does: the caller
// takes every unit itself and must not wait for them (a wait costs at
// least waitSpin per operation). Best of three tries, for a busy machine.
func TestPoolDoesNotWaitForIdleWorker(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	p := NewPool(2)
	defer p.Close()
	const ops = 200
	var c countTask
	best := time.Hour
	for range 3 {
		t0 := time.Now()
		for range ops {
			p.For(64, minParallelWork, &c)
		}
		best = min(best, time.Since(t0))
	}
	if got := c.n.Load(); got != 3*ops*64 {
		t.Fatalf("covered %d indexes, want %d", got, 3*ops*64)
	}
	if best >= ops*waitSpin {
		t.Fatalf("%d operations took %v with the workers unable to run: the caller waits for them", ops, best)
	}
	t.Logf("%d operations in %v", ops, best)
}

// slowTask is lateTask whose units on workers other than the caller take
// 3·waitSpin, so that the caller blocks in wait for them.
type slowTask struct{ lateTask }

func (s *slowTask) Run(lo, hi, w int) {
	if w != 0 {
		time.Sleep(3 * waitSpin)
	}
	s.lateTask.Run(lo, hi, w)
}

// TestPoolCallerBlocks makes the caller wait past waitSpin for workers
// inside an operation (the blocking path of wait and leave): every index
// still runs once, inside its operation.
func TestPoolCallerBlocks(t *testing.T) {
	p := NewPool(3)
	defer p.Close()
	var tasks []*slowTask
	for i := range 60 {
		s := &slowTask{lateTask{seen: make([]atomic.Int32, 64), busy: make([]atomic.Int32, 3)}}
		p.For(64, minParallelWork, s)
		s.done.Store(true)
		tasks = append(tasks, s)
		if i%4 == 0 {
			time.Sleep(spinTime)
		}
	}
	time.Sleep(10 * waitSpin)
	for i, s := range tasks {
		if b := s.bad.Load(); b != 0 {
			t.Fatalf("operation %d: %d units ran concurrently on one worker index or after the operation returned", i, b)
		}
		for j := range s.seen {
			if n := s.seen[j].Load(); n != 1 {
				t.Fatalf("operation %d: index %d ran %d times", i, j, n)
			}
		}
	}
}
