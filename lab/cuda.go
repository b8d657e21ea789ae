package lab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/quant"
)

// The GPU lab: the walk's tensors uploaded once into one device buffer,
// every CUDA variant timed over the whole walk with events, round-robin, in
// three launch modes (serial launches, one captured graph, a graph of PDL
// launches), and checked against arm 0 (the production kernels) on the
// first layer's groups and the head.

// Launch modes of the GPU lab.
const (
	ModeSerial = "serial"    // one cuLaunchKernel per kernel from the host
	ModeGraph  = "graph"     // the walk captured once into a graph
	ModePDL    = "graph+pdl" // the same with programmatic dependent launch (weights fetched before the wait)
)

// Modes lists the launch modes in the order the lab runs them.
var Modes = []string{ModeSerial, ModeGraph, ModePDL}

// kspec is one lab kernel: its name in csrc/lab.cu, the rows each warp of
// its 128-thread block computes, and whether it reads int8 activations
// (lab_quant_x first; perm: the q4tp nibble order).
type kspec struct {
	name string
	rpw  int
	int8 bool
	perm bool
}

// CUDAVariant is one GPU kernel variant: per format the kernel it runs
// (formats it has none for run the production kernel).
type CUDAVariant struct {
	Name string
	Doc  string
	// Tol is the largest |Δ|/rms from arm 0 accepted (0: bitwise);
	// negative: no output to check (the loads-only ceiling).
	Tol    float64
	q4, q8 *kspec
	merged bool // q|k|v and gate|up of q4tp as one lab_q4_hlfm launch
}

// Tolerances of the GPU variants against the production kernels, in
// worst |Δ|/rms over layer 0's outputs and the head's.
const (
	// TolSameOrder: the same per-lane summation order as production,
	// expected bitwise; the margin only admits a compiler contracting
	// differently.
	TolSameOrder = 1e-6
	// TolReassoc: float32 sums in another order (two lanes per group,
	// the −8 folded into Σx): reassociation only.
	TolReassoc = 1e-5
	// TolInt8: activations quantized to int8 per block of 32 (d =
	// absmax/127): an error of at most d/2 per element, so |Δy| ≤
	// Σ_blocks d/2·Σ|w|. Relative to a tensor's RMS it is worst on
	// short rows: TestInt8ToleranceOnCPU measures 1.5e-2 on the lab's
	// input over its odd shapes (worst: 64 columns) and asks for half of
	// this; the CPU lab's int8-vs-float32 tolerance is the same 5e-2.
	TolInt8 = 5e-2
)

// Production's q4tp and q8_row kernels run on int8 activations (matvec.cu's
// mq_* kernels), so every checked variant — float32 activations, or the
// lab's own int8 quantizer, which rounds x/d where production rounds
// x·(127/amax) — is held to TolInt8 against arm 0; TolSameOrder and
// TolReassoc apply again to variants of the int8 kernel itself.

// CUDAVariants is the GPU variant table; the first is arm 0 (production).
func CUDAVariants() []CUDAVariant {
	q4 := func(name string, rpw int) *kspec { return &kspec{name: name, rpw: rpw} }
	return []CUDAVariant{
		{Name: "prod", Doc: "production: mv_q4tp_r1 / mv_q8row_r1 of matvec.cu (int8 activations quantized per block in shared memory, dp4a, a warp per row, double-buffered 16-byte loads)"},
		{Name: "cur", Tol: TolInt8, q4: q4("lab_q4_cur", 4), Doc: "seed's cur: ladder in shared memory, 4 rows a warp, no double buffering"},
		{Name: "shf", Tol: TolInt8, q4: q4("lab_q4_shf", 4), Doc: "seed's shf: ladder rung in a register fetched by warp shuffle, 4 rows a warp, no double buffering"},
		{Name: "hlf", Tol: TolInt8, q4: q4("lab_q4_hlf", 4), Doc: "two lanes per group (8 bytes each), 4 rows a warp"},
		{Name: "hlfm", Tol: TolInt8, q4: q4("lab_q4_hlf", 4), merged: true, Doc: "hlf with q|k|v and gate|up merged into one launch (lab_q4_hlfm)"},
		{Name: "hma", Tol: TolInt8, q4: q4("lab_q4_hma", 4), Doc: "two lanes per group, llama.cpp's masked nibbles (x prescaled by 16^-k, −8·Σx folded in)"},
		{Name: "lma", Tol: TolInt8, q4: q4("lab_q4_lma", 2), Doc: "masked nibbles, a lane per group, 2 rows a warp"},
		{Name: "lmb", Tol: TolInt8, q4: q4("lab_q4_lmb", 4), Doc: "masked nibbles, a lane per group, 4 rows a warp"},
		{Name: "lm8", Tol: TolInt8, q4: q4("lab_q4_lm8", 8), Doc: "masked nibbles, a lane per group, 8 rows a warp"},
		{Name: "lmd", Tol: TolInt8, q4: q4("lab_q4_lmd", 2), Doc: "masked nibbles in production's access pattern (2 rows a warp, double-buffered streaming 16-byte loads)"},
		{Name: "dp4a", Tol: TolInt8, q4: &kspec{name: "lab_q4_dp4a", rpw: 2, int8: true, perm: true}, q8: &kspec{name: "lab_q8_dp4a", rpw: 2, int8: true},
			Doc: "int8 activations (lab_quant_x once per group: blocks of 32 with a scale, as llama.cpp's mmvq) and dp4a, 2 rows a warp"},
		{Name: "loads", Tol: -1, q4: q4("lab_q4_loads", 2), q8: &kspec{name: "lab_q8_loads", rpw: 2},
			Doc: "loads-only ceiling: production's addresses and bytes (weights, codes, ladder, x), XORed, no math"},
	}
}

// covers reports whether v has its own kernel for a format.
func (v CUDAVariant) covers(d quant.DType) bool {
	return d == quant.Q4TP && v.q4 != nil || d == quant.Q8Row && v.q8 != nil
}

// Layout places the walk's tensors in one device buffer: tensor j of group
// i at Offs[i][j], every offset a multiple of LayoutAlign.
type Layout struct {
	Offs  [][]int64
	Bytes int64 // the buffer's size
	// MaxCols is the widest input (x and the int8 buffers are sized for
	// it, rounded up to whole blocks of 32); MaxOut the most outputs one
	// group writes (its tensors' rows end to end).
	MaxCols, MaxOut int
}

// LayoutAlign is the alignment of every tensor in the device buffer (the
// 16-byte loads need 16; 256 matches cuMemAlloc's own).
const LayoutAlign = 256

// NewLayout computes the upload layout of a walk.
func NewLayout(groups []Group) Layout {
	var l Layout
	for _, g := range groups {
		offs := make([]int64, len(g))
		out := 0
		for j, t := range g {
			offs[j] = l.Bytes
			l.Bytes += (int64(len(t.M.Data)) + LayoutAlign - 1) / LayoutAlign * LayoutAlign
			l.MaxCols = max(l.MaxCols, t.M.Cols)
			out += t.M.Rows
		}
		l.Offs = append(l.Offs, offs)
		l.MaxOut = max(l.MaxOut, out)
	}
	l.MaxCols = (l.MaxCols + 31) / 32 * 32
	return l
}

// bufs are the device buffers of a lab run.
type bufs struct {
	W, X, XS, XQ, XD, Y driver.DevicePtr
	SMs                 int // the device's multiprocessors (production launch shapes; 0: kern.DefaultSMs)
}

// launch is one kernel launch of a plan.
type launch struct {
	name string
	cfg  driver.Config
	args *driver.Args
}

// planGroup returns the launches of variant v for group gi: each tensor's
// output at Y + (rows of the tensors before it in the group).
func planGroup(v CUDAVariant, g Group, gi int, l Layout, b bufs) ([]launch, error) {
	var ls []launch
	add := func(name string, grid, block int, a *driver.Args) {
		ls = append(ls, launch{name, driver.Config{Grid: driver.D1(grid), Block: driver.D1(block)}, a})
	}
	w := func(j int) driver.DevicePtr { return b.W.Add(l.Offs[gi][j]) }
	if v.merged && len(g) > 1 && len(g) <= 3 && !slices.ContainsFunc(g, func(t Tensor) bool { return t.M.DType != quant.Q4TP || t.M.Cols != g[0].M.Cols }) {
		rs := [3]int{}
		ws := [3]driver.DevicePtr{w(0), w(0), w(0)}
		warps := 0
		for j, t := range g {
			rs[j], ws[j] = t.M.Rows, w(j)
			warps += (t.M.Rows + 3) / 4
		}
		add("lab_q4_hlfm", (warps+3)/4, 128, new(driver.Args).Ptr(ws[0]).Ptr(ws[1]).Ptr(ws[2]).Int(rs[0]).Int(rs[1]).Int(rs[2]).
			Int(g[0].M.Cols).Ptr(b.X).Ptr(b.Y))
		return ls, nil
	}
	quantized := -1 // perm of the int8 activations now in XQ
	yoff := 0
	for j, t := range g {
		rows, cols := t.M.Rows, t.M.Cols
		y := b.Y.Add(int64(4 * yoff))
		yoff += rows
		var k *kspec
		switch t.M.DType {
		case quant.Q4TP:
			k = v.q4
		case quant.Q8Row:
			k = v.q8
		}
		if k == nil {
			x := b.X
			switch t.M.DType {
			case quant.F32, quant.F16, quant.BF16, quant.Q8Row, quant.Q4TP:
			case quant.Q82F:
				x = b.XS
				add("q82f_prescale", (cols+255)/256, 256, new(driver.Args).Ptr(w(j)).I64(quant.Q82FColOffset(rows, cols)).Int(cols).
					Ptr(b.X).Int(cols).Ptr(b.XS).Int(cols))
			default:
				return nil, fmt.Errorf("lab: tensor %s: no CUDA matvec for %s", t.Name, t.M.DType)
			}
			if t.M.DType == quant.Q4TP && cols%32 != 0 {
				return nil, fmt.Errorf("lab: tensor %s: q4tp with %d columns", t.Name, cols)
			}
			d := t.M.DType
			if d == quant.Q82F {
				d = quant.Q8Row // its quants on the prescaled x
			}
			name, cfg, err := kern.MatvecLaunch(d, rows, cols, 1, b.SMs)
			if err != nil {
				return nil, fmt.Errorf("lab: tensor %s: %w", t.Name, err)
			}
			a := new(driver.Args).Ptr(w(j)).Int(rows).Int(cols).Ptr(x).Int(cols).Ptr(y).Int(rows).Ptr(0).Int(0)
			if d == quant.Q8Row || d == quant.Q4TP {
				// The quantized-activation kernels' parameters (kern.MQ).
				a = kern.MQ{W: [3]driver.DevicePtr{w(j)}, Rows: [3]int{rows}, Cols: cols, X: x, Ldx: cols, Y: y, Ldy: rows}.Pack(new(driver.Args), 0)
			}
			ls = append(ls, launch{name, cfg, a})
			continue
		}
		if k.int8 {
			if p := b2i(k.perm); quantized != p {
				add("lab_quant_x", ((cols+31)/32+3)/4, 128, new(driver.Args).Ptr(b.X).Int(cols).Ptr(b.XQ).Ptr(b.XD).Int(p))
				quantized = p
			}
			add(k.name, (rows+4*k.rpw-1)/(4*k.rpw), 128, new(driver.Args).Ptr(w(j)).Int(rows).Int(cols).Ptr(b.XQ).Ptr(b.XD).Ptr(y))
			continue
		}
		add(k.name, (rows+4*k.rpw-1)/(4*k.rpw), 128, new(driver.Args).Ptr(w(j)).Int(rows).Int(cols).Ptr(b.X).Ptr(y))
	}
	return ls, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkPlan verifies every launch against the manifest: the kernel exists
// and the packed parameters have its sizes.
func checkPlan(m *kern.Manifest, ls []launch) error {
	for _, x := range ls {
		k, ok := m.Kernel(x.name)
		if !ok {
			return fmt.Errorf("lab: kernel %s is not in the CUDA build", x.name)
		}
		ps := make([]driver.Param, len(k.Params))
		for i, n := range k.Params {
			ps[i] = driver.Param{Size: n}
		}
		if err := x.args.Check(ps); err != nil {
			return fmt.Errorf("lab: %s: %w", x.name, err)
		}
	}
	return nil
}

// SelectCUDA keeps the named variants (comma-separated; empty: all) with
// production first, and drops those that run no kernel of their own on
// this walk's formats.
func SelectCUDA(vs []CUDAVariant, list string, groups []Group) ([]CUDAVariant, error) {
	var dts []quant.DType
	for _, g := range groups {
		for _, t := range g {
			if !slices.Contains(dts, t.M.DType) {
				dts = append(dts, t.M.DType)
			}
		}
	}
	useful := func(v CUDAVariant) bool { return slices.ContainsFunc(dts, v.covers) }
	out := []CUDAVariant{vs[0]}
	if strings.TrimSpace(list) == "" {
		for _, v := range vs[1:] {
			if useful(v) {
				out = append(out, v)
			}
		}
		return out, nil
	}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		i := slices.IndexFunc(vs, func(v CUDAVariant) bool { return v.Name == n })
		if i < 0 {
			var have []string
			for _, v := range vs {
				have = append(have, v.Name)
			}
			return nil, fmt.Errorf("lab: no CUDA variant %q (have %s)", n, strings.Join(have, ", "))
		}
		if !useful(vs[i]) {
			return nil, fmt.Errorf("lab: CUDA variant %s has no kernel for this model's formats %v", n, dts)
		}
		if i > 0 && !slices.ContainsFunc(out, func(v CUDAVariant) bool { return v.Name == n }) {
			out = append(out, vs[i])
		}
	}
	return out, nil
}

// CUDAOptions configures RunCUDA.
type CUDAOptions struct {
	Ordinal  int
	Rounds   int
	Variants string   // comma-separated CUDA variants (empty: all that apply)
	Modes    []string // launch modes (nil: Modes)
	ForcePTX bool     // load the PTX even on a device the cubin fits
}

// arm is one timed (variant, mode).
type arm struct {
	v     int // index into the variants
	mode  string
	plan  []launch
	graph driver.GraphExec
}

// launchModes validates the modes asked for (nil: all) and returns them
// trimmed, once each, serial first (arm 0 is production in serial launches).
func launchModes(asked []string) ([]string, error) {
	if asked == nil {
		asked = Modes
	}
	modes := []string{ModeSerial}
	for _, m := range asked {
		m = strings.TrimSpace(m)
		if !slices.Contains(Modes, m) {
			return nil, fmt.Errorf("lab: no launch mode %q (have %s)", m, strings.Join(Modes, ", "))
		}
		if !slices.Contains(modes, m) {
			modes = append(modes, m)
		}
	}
	return modes, nil
}

// RunCUDA runs the GPU lab on device opt.Ordinal: without a usable GPU it
// returns the driver's error (wrapping driver.ErrNoDevice).
func RunCUDA(ctx context.Context, groups []Group, opt CUDAOptions) (*Report, error) {
	if len(groups) == 0 || opt.Rounds < 1 {
		return nil, fmt.Errorf("lab: nothing to run (%d groups, %d rounds)", len(groups), opt.Rounds)
	}
	vs, err := SelectCUDA(CUDAVariants(), opt.Variants, groups)
	if err != nil {
		return nil, err
	}
	modes, err := launchModes(opt.Modes)
	if err != nil {
		return nil, err
	}
	dev, err := driver.Open(opt.Ordinal)
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	defer dev.Close()
	s := &session{d: dev, groups: groups, vs: vs, lay: NewLayout(groups)}
	s.b.SMs = dev.Info().SMs
	defer s.release()
	if err := dev.Do(s.setup(opt.ForcePTX)); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	info := dev.Info()
	rep := &Report{Rounds: opt.Rounds, Groups: len(groups), Date: nowUTC(),
		Device: fmt.Sprintf("cuda:%d %s (%d SMs, driver %d, %s)", info.Ordinal, info.Name, info.SMs, info.DriverVersion, s.m.Source)}
	for _, g := range groups {
		for _, t := range g {
			rep.WalkBytes += t.Bytes
			rep.Tensors++
		}
	}
	if rep.ReadProbeGBps, err = s.probe(); err != nil {
		return nil, fmt.Errorf("lab: read probe: %w", err)
	}
	checks, err := s.check()
	if err != nil {
		return nil, err
	}
	// The arms: every variant in every mode; a mode that fails to build
	// (a driver without PDL in graphs) is dropped with a note.
	var arms []arm
	for vi, v := range vs {
		var plan []launch
		for gi, g := range groups {
			ls, err := planGroup(v, g, gi, s.lay, s.b)
			if err != nil {
				return nil, err
			}
			plan = append(plan, ls...)
		}
		if err := checkPlan(s.m.Manifest, plan); err != nil {
			return nil, err
		}
		for _, mode := range modes {
			a := arm{v: vi, mode: mode, plan: plan}
			if mode != ModeSerial {
				err := dev.Do(func(c *driver.Ctx) error {
					var err error
					a.graph, err = s.capture(c, plan, mode == ModePDL)
					return err
				})
				if err != nil {
					if vi == 0 {
						return nil, fmt.Errorf("lab: %s of arm 0: %w", mode, err)
					}
					rep.Notes = append(rep.Notes, fmt.Sprintf("%s+%s not run: %v", v.Name, mode, err))
					continue
				}
				s.graphs = append(s.graphs, a.graph)
			}
			arms = append(arms, a)
		}
	}
	rep.Results = make([]Result, len(arms))
	for i, a := range arms {
		v := vs[a.v]
		r := &rep.Results[i]
		r.Variant, r.Mode, r.Doc, r.Tol = v.Name, a.mode, v.Doc+productionShare(v, groups, rep.WalkBytes), v.Tol
		if a.mode != ModeSerial {
			r.Variant += "+" + a.mode
		}
		c := checks[a.v]
		r.Worst, r.Check, r.Failed = c.Worst, c.Check, c.Failed
	}
	// One untimed walk of every arm (first graph launches upload the graph),
	// then the rounds.
	for round := -1; round < opt.Rounds; round++ {
		for i, a := range arms {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			var ms float32
			if err := dev.Do(func(c *driver.Ctx) error {
				var err error
				ms, err = s.time(c, a)
				return err
			}); err != nil {
				return nil, fmt.Errorf("lab: %s: %w", rep.Results[i].Variant, err)
			}
			if round >= 0 {
				rep.Results[i].Times = append(rep.Results[i].Times, float64(ms))
			}
		}
	}
	rep.summarize()
	return rep, nil
}

// productionShare says which of the walk's formats v runs with the
// production kernel, and their share of the walk's bytes ("" for arm 0
// and for a variant with a kernel for every format).
func productionShare(v CUDAVariant, groups []Group, total int64) string {
	if v.q4 == nil && v.q8 == nil || total <= 0 {
		return ""
	}
	by := map[quant.DType]int64{}
	var order []quant.DType
	for _, g := range groups {
		for _, t := range g {
			if !v.covers(t.M.DType) {
				if by[t.M.DType] == 0 {
					order = append(order, t.M.DType)
				}
				by[t.M.DType] += t.Bytes
			}
		}
	}
	var parts []string
	for _, d := range order {
		parts = append(parts, fmt.Sprintf("%s %.0f%%", d, 100*float64(by[d])/float64(total)))
	}
	if len(parts) == 0 {
		return ""
	}
	return " [production kernel for " + strings.Join(parts, ", ") + " of the walk's bytes]"
}

// session holds a GPU lab's device state.
type session struct {
	d      *driver.Device
	m      *kern.Module
	groups []Group
	vs     []CUDAVariant
	lay    Layout
	b      bufs
	sink   driver.DevicePtr
	stream driver.Stream
	e0, e1 driver.Event
	graphs []driver.GraphExec
}

// setup loads the kernels, allocates the buffers, uploads the walk and
// the input, and creates the stream and events.
func (s *session) setup(forcePTX bool) func(c *driver.Ctx) error {
	return func(c *driver.Ctx) error {
		var err error
		if s.m, err = kern.Load(c, s.d.Info(), forcePTX); err != nil {
			return err
		}
		nb := s.lay.MaxCols / 32
		for _, p := range []struct {
			dst *driver.DevicePtr
			n   int64
		}{
			{&s.b.W, s.lay.Bytes}, {&s.b.X, 4 * int64(s.lay.MaxCols)}, {&s.b.XS, 4 * int64(s.lay.MaxCols)},
			{&s.b.XQ, int64(s.lay.MaxCols)}, {&s.b.XD, 8 * int64(nb)}, {&s.b.Y, 4 * int64(s.lay.MaxOut)}, {&s.sink, 16},
		} {
			if *p.dst, err = c.Alloc(max(p.n, 16)); err != nil {
				return err
			}
		}
		for gi, g := range s.groups {
			for j, t := range g {
				if err := c.HtoD(s.b.W.Add(s.lay.Offs[gi][j]), t.M.Data); err != nil {
					return err
				}
			}
		}
		x := input(s.lay.MaxCols)
		xb := make([]byte, 4*len(x))
		for i, v := range x {
			binary.LittleEndian.PutUint32(xb[4*i:], math.Float32bits(v))
		}
		if err := c.HtoD(s.b.X, xb); err != nil {
			return err
		}
		if s.stream, err = c.NewStream(driver.StreamNonBlocking); err != nil {
			return err
		}
		if s.e0, err = c.NewEvent(driver.EventDefault); err != nil {
			return err
		}
		s.e1, err = c.NewEvent(driver.EventDefault)
		return err
	}
}

// release frees what setup and the arms made.
func (s *session) release() {
	s.d.Do(func(c *driver.Ctx) error {
		for _, g := range s.graphs {
			c.DestroyGraphExec(g)
		}
		for _, e := range []driver.Event{s.e0, s.e1} {
			if e != 0 {
				c.DestroyEvent(e)
			}
		}
		if s.stream != 0 {
			c.DestroyStream(s.stream)
		}
		for _, p := range []driver.DevicePtr{s.b.W, s.b.X, s.b.XS, s.b.XQ, s.b.XD, s.b.Y, s.sink} {
			if p != 0 {
				c.Free(p)
			}
		}
		if s.m != nil {
			s.m.Unload(c)
		}
		return nil
	})
}

// probe measures the read bandwidth over the weight buffer: the best of
// five probe_read runs.
func (s *session) probe() (float64, error) {
	n16 := s.lay.Bytes / 16
	var best float64
	for range 6 {
		err := s.d.Do(func(c *driver.Ctx) error {
			if err := c.Record(s.e0, s.stream); err != nil {
				return err
			}
			if err := s.m.On(c, s.stream, false).ProbeRead(s.b.W, n16, s.sink, s.d.Info().SMs); err != nil {
				return err
			}
			if err := c.Record(s.e1, s.stream); err != nil {
				return err
			}
			if err := c.EventSync(s.e1); err != nil {
				return err
			}
			ms, err := c.Elapsed(s.e0, s.e1)
			if err == nil && ms > 0 {
				best = max(best, float64(16*n16)/1e6/float64(ms))
			}
			return err
		})
		if err != nil {
			return 0, err
		}
	}
	return best, nil
}

// queue launches a plan on the session's stream.
func (s *session) queue(c *driver.Ctx, plan []launch, pdl bool) error {
	for _, x := range plan {
		f, err := s.m.Func(x.name)
		if err != nil {
			return err
		}
		cfg := x.cfg
		cfg.Stream, cfg.PDL = s.stream, pdl
		if cfg.Shared > 48<<10 {
			if err := c.SetMaxDynamicShared(f, cfg.Shared); err != nil {
				return fmt.Errorf("%s: %w", x.name, err)
			}
		}
		if err := c.Launch(f, cfg, x.args); err != nil {
			return fmt.Errorf("%s: %w", x.name, err)
		}
	}
	return nil
}

// capture records a plan into an executable graph.
func (s *session) capture(c *driver.Ctx, plan []launch, pdl bool) (driver.GraphExec, error) {
	if err := c.BeginCapture(s.stream, driver.CaptureThreadLocal); err != nil {
		return 0, err
	}
	qerr := s.queue(c, plan, pdl)
	g, err := c.EndCapture(s.stream)
	if err = errors.Join(qerr, err); err != nil {
		c.DestroyGraph(g)
		return 0, err
	}
	defer c.DestroyGraph(g)
	return c.Instantiate(g)
}

// time runs one arm's walk between two events and returns the milliseconds.
func (s *session) time(c *driver.Ctx, a arm) (float32, error) {
	if err := c.Record(s.e0, s.stream); err != nil {
		return 0, err
	}
	var err error
	if a.mode == ModeSerial {
		err = s.queue(c, a.plan, false)
	} else {
		err = c.GraphLaunch(a.graph, s.stream)
	}
	if err != nil {
		return 0, err
	}
	if err := c.Record(s.e1, s.stream); err != nil {
		return 0, err
	}
	if err := c.EventSync(s.e1); err != nil {
		return 0, err
	}
	return c.Elapsed(s.e0, s.e1)
}

// output runs variant v on group gi alone (serial launches, Y first
// filled with NaN so an output never written shows) and returns its outputs.
func (s *session) output(v CUDAVariant, gi int) ([]float32, error) {
	g := s.groups[gi]
	ls, err := planGroup(v, g, gi, s.lay, s.b)
	if err != nil {
		return nil, err
	}
	if err := checkPlan(s.m.Manifest, ls); err != nil {
		return nil, err
	}
	n := 0
	for _, t := range g {
		n += t.M.Rows
	}
	raw := make([]byte, 4*n)
	err = s.d.Do(func(c *driver.Ctx) error {
		if err := c.MemsetD32Async(s.b.Y, 0x7fc00000, int64(s.lay.MaxOut), s.stream); err != nil {
			return err
		}
		if err := s.queue(c, ls, false); err != nil {
			return err
		}
		if err := c.StreamSync(s.stream); err != nil {
			return err
		}
		return c.DtoH(raw, s.b.Y)
	})
	if err != nil {
		return nil, fmt.Errorf("lab: %s on group %d: %w", v.Name, gi, err)
	}
	y := make([]float32, n)
	for i := range y {
		y[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return y, nil
}

// check compares every variant's outputs on the first layer's groups and
// the head with arm 0's, tensor by tensor.
func (s *session) check() ([]Result, error) {
	probe := append(seq(min(4, len(s.groups)-1)), len(s.groups)-1)
	ref := make([][]float32, len(probe))
	for i, gi := range probe {
		var err error
		if ref[i], err = s.output(s.vs[0], gi); err != nil {
			return nil, err
		}
		if j := slices.IndexFunc(ref[i], func(y float32) bool { return y != y }); j >= 0 {
			return nil, fmt.Errorf("lab: arm 0 left output %d of group %d unwritten (or NaN)", j, gi)
		}
	}
	out := make([]Result, len(s.vs))
	for vi, v := range s.vs {
		r := &out[vi]
		r.Tol = v.Tol
		if v.Tol < 0 {
			r.Check = "n/a"
			continue
		}
		exact := true
		for i, gi := range probe {
			got, err := s.output(v, gi)
			if err != nil {
				return nil, err
			}
			off := 0
			for _, t := range s.groups[gi] {
				e, w := compare(ref[i][off:off+t.M.Rows], got[off:off+t.M.Rows])
				exact = exact && e
				r.Worst = max(r.Worst, w)
				off += t.M.Rows
			}
		}
		r.setCheck(exact)
	}
	return out, nil
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}
