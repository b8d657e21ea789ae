package cuda

import (
	"fmt"
	"io"
	"sort"

	"github.com/cortiq/cortiq/backend/cuda/driver"
)

// profile times every kernel of eager steps with CUDA events (an event
// after each launch, one at the step's start): the interval between two
// events is a kernel's run plus any idle gap before it. Options.Profile
// (a writer) turns it on and graphs off; Close writes the table there.
type profile struct {
	rows   int  // profile only steps of this many rows (0: all)
	skip   bool // this step is not profiled
	pool   []driver.Event
	used   int
	names  []string
	stats  map[string]*kstat
	steps  int
	stepMs float64
}

type kstat struct {
	calls int
	ms    float64
}

// mark records an event after the launch of name ("" for the step's
// start marker).
func (p *profile) mark(c *driver.Ctx, s driver.Stream, name string) error {
	if p.skip {
		return nil
	}
	if p.used == len(p.pool) {
		e, err := c.NewEvent(driver.EventDefault)
		if err != nil {
			return err
		}
		p.pool = append(p.pool, e)
	}
	if err := c.Record(p.pool[p.used], s); err != nil {
		return err
	}
	p.used++
	p.names = append(p.names, name)
	return nil
}

// collect adds the finished step's intervals (the stream was synced).
func (p *profile) collect(c *driver.Ctx) error {
	if p.skip {
		return nil
	}
	defer func() { p.used, p.names = 0, p.names[:0] }()
	if p.used < 2 {
		return nil
	}
	if p.stats == nil {
		p.stats = map[string]*kstat{}
	}
	for i := 1; i < p.used; i++ {
		ms, err := c.Elapsed(p.pool[i-1], p.pool[i])
		if err != nil {
			return err
		}
		k := p.stats[p.names[i]]
		if k == nil {
			k = &kstat{}
			p.stats[p.names[i]] = k
		}
		k.calls++
		k.ms += float64(ms)
		p.stepMs += float64(ms)
	}
	p.steps++
	return nil
}

func (p *profile) destroy(c *driver.Ctx) {
	for _, e := range p.pool {
		c.DestroyEvent(e)
	}
	p.pool = nil
}

// WriteProfile prints the per-kernel times of the profiled steps (nothing
// without Options.Profile): calls, total and mean µs, share of the steps'
// time, sorted by total.
func (d *Device) WriteProfile(w io.Writer) {
	p := d.prof
	if p == nil || p.steps == 0 {
		return
	}
	type row struct {
		name string
		k    *kstat
	}
	var rows []row
	for n, k := range p.stats {
		rows = append(rows, row{n, k})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].k.ms > rows[j].k.ms })
	fmt.Fprintf(w, "cuda profile: %d eager steps, %.3f ms a step (kernels and the gaps before them, by events)\n", p.steps, p.stepMs/float64(p.steps))
	fmt.Fprintf(w, "%-22s %8s %12s %10s %7s\n", "kernel", "calls", "total ms", "mean µs", "share")
	for _, r := range rows {
		fmt.Fprintf(w, "%-22s %8d %12.3f %10.2f %6.1f%%\n", r.name, r.k.calls, r.k.ms, 1e3*r.k.ms/float64(r.k.calls), 100*r.k.ms/p.stepMs)
	}
}
