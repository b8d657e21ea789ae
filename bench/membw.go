// Package bench measures inference speed the way llama-bench does (prompt
// processing and token generation, repeated, mean ± sd) and the machine's
// memory read bandwidth in the same run, so decode speed can be read as a
// fraction of the physical limit.
package bench

import (
	"runtime"
	"sync"
	"time"
)

// ReadBandwidth measures the streaming read bandwidth of the machine with
// the given number of goroutines: each sums its own contiguous part of a
// buffer of size bytes (larger than the caches); the best of reps passes
// is returned in bytes per second. Each pass is run twice, with the plain
// Go loop the project's targets were measured with and with 256-bit loads
// (amd64), and the faster counts: a kernel cannot read faster than the
// better of the two.
func ReadBandwidth(size int64, threads, reps int) float64 {
	scalar, wide := ReadBandwidths(size, threads, reps)
	return max(scalar, wide)
}

// ReadBandwidths returns the bandwidth of the plain Go loop and of the
// wide-load loop (0 where the CPU has none).
func ReadBandwidths(size int64, threads, reps int) (scalar, wide float64) {
	scalar = readBandwidth(size, threads, reps, false)
	if _, ok := sumWide(make([]uint64, 64)); ok {
		wide = readBandwidth(size, threads, reps, true)
	}
	return scalar, wide
}

// Prober measures read bandwidth repeatedly over one buffer allocated once,
// so probes interleaved with other work cost no allocation or page faults.
type Prober struct {
	buf     []uint64
	threads int
}

// NewProber allocates and touches a buffer of size bytes.
func NewProber(size int64, threads int) *Prober {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	buf := make([]uint64, size/8)
	for i := range buf { // fault every page in before timing
		buf[i] = uint64(i)
	}
	return &Prober{buf: buf, threads: threads}
}

// Measure returns the best of reps passes of the faster loop, in bytes/s.
func (p *Prober) Measure(reps int) float64 {
	bw := p.measure(reps, false)
	if _, ok := sumWide(p.buf[:64]); ok {
		bw = max(bw, p.measure(reps, true))
	}
	return bw
}

func readBandwidth(size int64, threads, reps int, useWide bool) float64 {
	return NewProber(size, threads).measure(reps, useWide)
}

func (p *Prober) measure(reps int, useWide bool) float64 {
	buf, threads := p.buf, p.threads
	n := len(buf)
	best := 0.0
	var sink uint64
	var mu sync.Mutex
	for r := 0; r < reps; r++ {
		var wg sync.WaitGroup
		per := n / threads
		t0 := time.Now()
		for k := 0; k < threads; k++ {
			part := buf[k*per : (k+1)*per]
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, ok := uint64(0), false
				if useWide {
					s, ok = sumWide(part)
				}
				if !ok {
					s = sumWords(part)
				}
				mu.Lock()
				sink += s
				mu.Unlock()
			}()
		}
		wg.Wait()
		bw := float64(per*threads*8) / time.Since(t0).Seconds()
		best = max(best, bw)
	}
	sinkHole = sink
	return best
}

var sinkHole uint64

// sumWords adds the words with eight independent accumulators so the
// loads, not the adds, set the pace.
func sumWords(b []uint64) uint64 {
	var s0, s1, s2, s3, s4, s5, s6, s7 uint64
	i := 0
	for ; i+8 <= len(b); i += 8 {
		w := b[i : i+8 : i+8]
		s0 += w[0]
		s1 += w[1]
		s2 += w[2]
		s3 += w[3]
		s4 += w[4]
		s5 += w[5]
		s6 += w[6]
		s7 += w[7]
	}
	for ; i < len(b); i++ {
		s0 += b[i]
	}
	return s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7
}
