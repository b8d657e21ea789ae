package cuda

import (
	"errors"
	"fmt"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/cuda/driver"
)

// probeRuns is how many timed probe_read launches ReadProbe takes the best
// of (after one untimed launch that warms the buffer's TLB entries).
const probeRuns = 5

// defaultProbeBytes is ReadProbe's buffer when asked for none: 1 GiB,
// far beyond the L2 (50 MB on an H200), so every byte comes from HBM.
const defaultProbeBytes = 1 << 30

// minProbeBytes is the smallest buffer a probe is worth timing over: at
// a few TB/s, smaller reads last only microseconds, near the events'
// resolution.
const minProbeBytes = 16 << 20

// probeSize picks the probe's buffer: want bytes (defaultProbeBytes when
// want ≤ 0), at most half of the free device memory, a multiple of the
// probe's 16-byte words.
func probeSize(want, free int64) (int64, error) {
	if want <= 0 {
		want = defaultProbeBytes
	}
	n := min(want, free/2) &^ 15
	if n < minProbeBytes {
		return 0, fmt.Errorf("cuda: read probe: %s free, a probe needs %s", gb(free), gb(2*minProbeBytes))
	}
	return n, nil
}

// ReadProbe measures the device's read bandwidth in GB/s: probe_read
// streams a fresh buffer of about bytes (see probeSize) on the device's
// stream, timed with a pair of events around each launch; the best of
// probeRuns launches. The buffer is freed before it returns. It takes the
// step lock: it never overlaps a step.
func (d *Device) ReadProbe(bytes int64) (float64, error) {
	if d.dev == nil || d.mod == nil {
		return 0, errors.New("cuda: read probe: the device is not open")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var best float64
	err := d.dev.Do(func(c *driver.Ctx) (err error) {
		free, _, err := c.MemInfo()
		if err != nil {
			return err
		}
		n, err := probeSize(bytes, free)
		if err != nil {
			return err
		}
		buf, err := c.Alloc(n)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, c.Free(buf)) }()
		sink, err := c.Alloc(16)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, c.Free(sink)) }()
		e0, err := c.NewEvent(0)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, c.DestroyEvent(e0)) }()
		e1, err := c.NewEvent(0)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, c.DestroyEvent(e1)) }()
		if err := c.MemsetD8Async(buf, 1, n, d.strm); err != nil {
			return err
		}
		l := d.mod.On(c, d.strm, false)
		for i := range probeRuns + 1 {
			if err := c.Record(e0, d.strm); err != nil {
				return err
			}
			if err := l.ProbeRead(buf, n/16, sink, d.info.SMs); err != nil {
				return err
			}
			if err := c.Record(e1, d.strm); err != nil {
				return err
			}
			if err := c.EventSync(e1); err != nil {
				return err
			}
			ms, err := c.Elapsed(e0, e1)
			if err != nil {
				return err
			}
			if i > 0 && ms > 0 {
				best = max(best, float64(n)/1e6/float64(ms))
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("cuda: read probe: %w", err)
	}
	if best <= 0 {
		return 0, errors.New("cuda: read probe: no launch took measurable time")
	}
	return best, nil
}

var _ backend.Prober = (*Device)(nil)
