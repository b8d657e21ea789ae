package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/backendtest"
	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/rope"
)

// The tests of this file run the ops' host side against a fake device
// (fakeGPU): every launch is checked against the embedded manifest (the
// kernel exists, the packed parameter sizes are its C parameters'), against
// the launch shape its csrc comment documents, and every pointer it is
// given against the allocations, over the extent the kernel reads or
// writes. Positions and slots are read back from the staged inputs as the
// kernels would read them.

// fakeAlloc is one fake device allocation; mem backs the small ones.
type fakeAlloc struct {
	base driver.DevicePtr
	n    int64
	mem  []byte
}

type fakeCall struct {
	name string
	cfg  driver.Config
	args []byte
	offs []int
	side bool // launched on the side stream (the shared expert's branch: Options.NoBranch)
}

type fakeGPU struct {
	t         testing.TB
	man       *kern.Manifest
	next      driver.DevicePtr
	allocs    []*fakeAlloc
	stageMem  []byte
	capturing bool
	graphs    map[driver.GraphExec][]fakeCall
	nextExec  driver.GraphExec
	calls     []fakeCall // every launch queued (not while capturing)
	captured  []fakeCall
	replays   int
	seqs      int // slots of the K/V pool
	// expect, when set, gives each row's expected position and slot.
	expectPos, expectSlot []int
	// stepID is the Batch.Step of the batches step makes.
	stepID uint64
	d      *Device // the device whose staged inputs positions are read from
	// numeric runs each launch's model (fakeexec_test.go) on the memory.
	numeric bool
	decoded map[string][]float32
	// clock is the fake's device time: a kernel launched eagerly takes
	// fakeKernel, a replayed graph fakeKernel+fakeGap per kernel in it;
	// marks are the timing events' readings of it.
	clock time.Duration
	marks map[int]time.Duration
	// onSide: launches go to the side stream; forked: a fork not joined yet.
	onSide, forked bool
	// lastActQ is the last gemmq_actq launched (a gemmq_* must read its quants).
	lastActQ *fakeCall
	// halfIn is the last f16 activations a launch wrote for the half wide
	// tiles (gemmh_acth, attn_tiles' copy, a SwiGLU gemmh_*): a gemmh_*
	// must read them.
	halfIn struct {
		p       driver.DevicePtr
		cols, T int
	}
}

// The fake's device times (TestStepTimer).
const fakeKernel, fakeGap = 10 * time.Microsecond, 2 * time.Microsecond

// side and join model the side stream: launches between side(true) and
// side(false) are marked as the side's; a fork while forked, a join with
// nothing forked, or a graph ended with a side not joined is an error.
func (f *fakeGPU) side(on bool) error {
	if on == f.onSide {
		return fmt.Errorf("fake: side(%v) while on the side is %v", on, f.onSide)
	}
	if on && f.forked {
		return fmt.Errorf("fake: a second fork before the join")
	}
	f.onSide = on
	if on {
		f.forked = true
	}
	return nil
}

func (f *fakeGPU) join() error {
	if !f.forked || f.onSide {
		return fmt.Errorf("fake: join without a fork (or still launching on the side)")
	}
	f.forked = false
	return nil
}

func (f *fakeGPU) record(i int) error {
	if f.capturing {
		return fmt.Errorf("fake: timing event %d recorded into a graph", i)
	}
	if f.marks == nil {
		f.marks = map[int]time.Duration{}
	}
	f.marks[i] = f.clock
	return nil
}

func (f *fakeGPU) since(i, j int) (float32, error) {
	a, ok := f.marks[i]
	b, ok2 := f.marks[j]
	if !ok || !ok2 {
		return 0, fmt.Errorf("fake: timing events %d, %d not recorded", i, j)
	}
	return float32(float64(b-a) / float64(time.Millisecond)), nil
}

// inputs returns the staged-inputs buffer and its rows.
func (f *fakeGPU) inputs() (driver.DevicePtr, int) {
	return f.d.st.bufs["inputs"].p, f.d.opt.MaxRows
}

func newFake(t testing.TB, seqs int) *fakeGPU {
	t.Helper()
	m, err := kern.ReadManifest()
	if err != nil {
		t.Fatal(err)
	}
	if !m.Built() {
		t.Fatal("the embedded kernel build is missing")
	}
	return &fakeGPU{t: t, man: m, next: 0x7f0000000000, stageMem: make([]byte, 1<<20), graphs: map[driver.GraphExec][]fakeCall{}, seqs: seqs}
}

func (f *fakeGPU) memInfo() (free, total int64, err error) { return 1 << 40, 1 << 40, nil }

func (f *fakeGPU) alloc(n int64) (driver.DevicePtr, error) {
	if f.capturing {
		f.t.Errorf("allocation of %d bytes while capturing", n)
	}
	if n <= 0 {
		return 0, fmt.Errorf("fake: alloc of %d", n)
	}
	a := &fakeAlloc{base: f.next, n: n}
	if n <= 64<<20 {
		a.mem = make([]byte, n)
	}
	f.allocs = append(f.allocs, a)
	f.next = f.next.Add((n + 4096 + 255) &^ 255) // a gap: an overrun lands outside every allocation
	return a.base, nil
}

func (f *fakeGPU) free(p driver.DevicePtr) error {
	if f.capturing {
		f.t.Errorf("free while capturing")
	}
	for i, a := range f.allocs {
		if a.base == p {
			f.allocs = append(f.allocs[:i], f.allocs[i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("fake: free of %#x, not an allocation", p)
}

// find returns the allocation holding [p, p+n), or nil.
func (f *fakeGPU) find(p driver.DevicePtr, n int64) *fakeAlloc {
	for _, a := range f.allocs {
		if p >= a.base && int64(p-a.base)+n <= a.n {
			return a
		}
	}
	return nil
}

func (f *fakeGPU) sync() error {
	if f.capturing {
		f.t.Errorf("stream sync while capturing")
	}
	return nil
}

func (f *fakeGPU) stage() []byte { return f.stageMem }

func (f *fakeGPU) htod(dst driver.DevicePtr, off, n int) error {
	if f.capturing {
		f.t.Errorf("host-to-device copy while capturing")
	}
	a := f.find(dst, int64(n))
	if a == nil || off < 0 || off+n > len(f.stageMem) {
		return fmt.Errorf("fake: htod of %d bytes to %#x from stage offset %d", n, dst, off)
	}
	if a.mem != nil {
		copy(a.mem[dst-a.base:], f.stageMem[off:off+n])
	}
	return nil
}

func (f *fakeGPU) dtoh(off int, src driver.DevicePtr, n int) error {
	a := f.find(src, int64(n))
	if a == nil || off < 0 || off+n > len(f.stageMem) {
		return fmt.Errorf("fake: dtoh of %d bytes from %#x to stage offset %d", n, src, off)
	}
	if a.mem != nil {
		copy(f.stageMem[off:off+n], a.mem[src-a.base:])
	}
	return nil
}

func (f *fakeGPU) dtod(dst, src driver.DevicePtr, n int64) error {
	a, b := f.find(dst, n), f.find(src, n)
	if a == nil || b == nil {
		return fmt.Errorf("fake: dtod of %d bytes %#x → %#x outside the allocations", n, src, dst)
	}
	if f.numeric {
		copy(f.bytesAt(dst, n), f.bytesAt(src, n))
	}
	return nil
}

func (f *fakeGPU) zero(p driver.DevicePtr, n int64) error {
	if f.capturing {
		return fmt.Errorf("fake: memset while capturing")
	}
	if f.find(p, n) == nil {
		return fmt.Errorf("fake: memset of %d bytes at %#x outside the allocations", n, p)
	}
	if f.numeric {
		clear(f.bytesAt(p, n))
	}
	return nil
}

func (f *fakeGPU) beginCapture() error {
	if f.capturing {
		return fmt.Errorf("fake: capture begun twice")
	}
	f.capturing, f.captured = true, nil
	return nil
}

func (f *fakeGPU) endCapture() (driver.GraphExec, error) {
	if !f.capturing {
		return 0, fmt.Errorf("fake: capture ended without beginning")
	}
	f.capturing = false
	if f.forked || f.onSide {
		return 0, fmt.Errorf("fake: capture ended with the side stream not joined")
	}
	f.nextExec++
	f.graphs[f.nextExec] = f.captured
	return f.nextExec, nil
}

func (f *fakeGPU) graphLaunch(e driver.GraphExec) error {
	if _, ok := f.graphs[e]; !ok {
		return fmt.Errorf("fake: launch of graph %d, destroyed or never made", e)
	}
	f.replays++
	f.clock += time.Duration(len(f.graphs[e])) * (fakeKernel + fakeGap)
	if f.numeric {
		for i := range f.graphs[e] {
			f.exec(&f.graphs[e][i])
		}
	}
	return nil
}

func (f *fakeGPU) profStart() error { return nil }
func (f *fakeGPU) profEnd() error   { return nil }

func (f *fakeGPU) destroyGraph(e driver.GraphExec) error {
	if _, ok := f.graphs[e]; !ok {
		return fmt.Errorf("fake: graph %d destroyed twice", e)
	}
	delete(f.graphs, e)
	return nil
}

// Parameter readers over a packed call.
func (c *fakeCall) ptr(i int) driver.DevicePtr {
	return driver.DevicePtr(binary.LittleEndian.Uint64(c.args[c.offs[i]:]))
}
func (c *fakeCall) int(i int) int { return int(int32(binary.LittleEndian.Uint32(c.args[c.offs[i]:]))) }
func (c *fakeCall) i64(i int) int64 {
	return int64(binary.LittleEndian.Uint64(c.args[c.offs[i]:]))
}

func (f *fakeGPU) launch(name string, cfg driver.Config, a *driver.Args) error {
	k, ok := f.man.Kernel(name)
	if !ok {
		return fmt.Errorf("fake: no kernel %q in the manifest", name)
	}
	ps := make([]driver.Param, len(k.Params))
	for i, n := range k.Params {
		ps[i] = driver.Param{Size: n}
	}
	if err := a.Check(ps); err != nil {
		return fmt.Errorf("fake: %s: %w", name, err)
	}
	c := fakeCall{name: name, cfg: cfg, args: append([]byte(nil), a.Bytes()...), side: f.onSide}
	for i := range a.Len() {
		c.offs = append(c.offs, a.Offset(i))
	}
	if err := f.checkCall(&c); err != nil {
		return fmt.Errorf("fake: %s (grid %v, block %v): %w", name, cfg.Grid, cfg.Block, err)
	}
	if name == "gemmq_actq" || name == "gemmq_actq_pro" {
		q := c
		f.lastActQ = &q
	}
	switch {
	case name == "gemmh_acth":
		f.halfIn.p, f.halfIn.cols, f.halfIn.T = c.ptr(3), c.int(2), int(c.cfg.Grid.Y)
	case (strings.HasPrefix(name, "attn_tiles") || strings.HasPrefix(name, "attn_mma_h")) && c.ptr(16) != 0:
		f.halfIn.p, f.halfIn.cols, f.halfIn.T = c.ptr(16), c.int(10)*c.int(12), int(c.cfg.Grid.Z)
	}
	if f.capturing {
		f.captured = append(f.captured, c)
	} else {
		f.calls = append(f.calls, c)
		f.clock += fakeKernel
		if f.numeric {
			f.exec(&c)
		}
	}
	return nil
}

// span fails unless [p, p+n) lies in one allocation.
func (f *fakeGPU) span(what string, p driver.DevicePtr, n int64) error {
	if n <= 0 {
		return fmt.Errorf("%s: extent of %d bytes", what, n)
	}
	if f.find(p, n) == nil {
		return fmt.Errorf("%s: [%#x, +%d) is not inside one allocation", what, p, n)
	}
	return nil
}

// optSpan is span for an optional pointer (0: absent, no error).
func (f *fakeGPU) optSpan(what string, p driver.DevicePtr, n int64) error {
	if p == 0 {
		return nil
	}
	return f.span(what, p, n)
}

// normedRope reports whether a launch so far was a rope_qk_append that
// applies q or k norms itself.
func (f *fakeGPU) normedRope() bool {
	for _, c := range f.calls {
		if strings.HasPrefix(c.name, "rope_qk_append") && (c.ptr(13) != 0 || c.ptr(14) != 0) {
			return true
		}
	}
	return false
}

// rowsSpan is the extent of R rows of width n floats at stride ld.
func rowsSpan(R, ld, n int) int64 { return 4 * (int64(R-1)*int64(ld) + int64(n)) }

// ints reads n int32 values at p from the fake memory.
func (f *fakeGPU) ints(p driver.DevicePtr, n int) ([]int, error) {
	a := f.find(p, 4*int64(n))
	if a == nil || a.mem == nil {
		return nil, fmt.Errorf("int32[%d] at %#x is not inside one allocation", n, p)
	}
	v := make([]int, n)
	for i := range v {
		v[i] = int(int32(binary.LittleEndian.Uint32(a.mem[int(p-a.base)+4*i:])))
	}
	return v, nil
}

func weightBytes(family string, rows, cols int) int64 {
	dt := map[string]quant.DType{"f32": quant.F32, "f16": quant.F16, "bf16": quant.BF16, "q8row": quant.Q8Row, "q82f": quant.Q82F, "q4tp": quant.Q4TP}[family]
	n, _ := quant.ExpectedBytes(dt, []int{rows, cols})
	return n
}

func want(cond bool, format string, a ...any) error {
	if cond {
		return nil
	}
	return fmt.Errorf(format, a...)
}

// checkKV checks the rows' positions and slots (as the kernels read them)
// against the expected ones and the cache extent they address.
func (f *fakeGPU) checkKV(c *fakeCall, posArg, slotArg, kcArg, vcArg int, R, nkv, hd, ctx int) error {
	pos, err := f.ints(c.ptr(posArg), R)
	if err != nil {
		return fmt.Errorf("pos: %w", err)
	}
	slot, err := f.ints(c.ptr(slotArg), R)
	if err != nil {
		return fmt.Errorf("slot: %w", err)
	}
	// The launch's first row within the step, from where its positions
	// are read; its slots must be read from the same row.
	in, M := f.inputs()
	r0 := int(int64(c.ptr(posArg))-int64(in.Add(4*int64(M)))) / 4
	if r0 < 0 || r0+R > M || c.ptr(posArg) != in.Add(4*int64(M+r0)) || c.ptr(slotArg) != in.Add(4*int64(2*M+r0)) {
		return fmt.Errorf("positions at %#x, slots at %#x: not rows %d.. of the staged inputs at %#x (%d rows)", c.ptr(posArg), c.ptr(slotArg), r0, in, M)
	}
	for r := range R {
		if e := r0 + r; f.expectPos != nil && (e >= len(f.expectPos) || pos[r] != f.expectPos[e] || slot[r] != f.expectSlot[e]) {
			return fmt.Errorf("row %d reads position %d slot %d, the step has %v, %v", e, pos[r], slot[r], f.expectPos, f.expectSlot)
		}
		if slot[r] < 0 || slot[r] >= f.seqs || pos[r] < 0 || pos[r] >= ctx {
			return fmt.Errorf("row %d: position %d slot %d outside the pool", r, pos[r], slot[r])
		}
		es := int64(4)
		if strings.HasSuffix(c.name, "_h") || strings.HasPrefix(c.name, "attn_mma_h") {
			es = 2 // a float16 cache
		}
		end := es * ((int64(slot[r]*nkv+nkv-1)*int64(ctx)+int64(pos[r]))*int64(hd) + int64(hd))
		for _, i := range []int{kcArg, vcArg} {
			if err := f.span("cache", c.ptr(i), end); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkCall checks one launch against its kernel's documented shape.
func (f *fakeGPU) checkCall(c *fakeCall) error {
	g, b := c.cfg.Grid, c.cfg.Block
	name := c.name
	switch {
	case strings.HasPrefix(name, "embed_"):
		rows, cols, ldo, R := c.int(1), c.int(2), c.int(5), int(g.X)
		ids, err := f.ints(c.ptr(3), R)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if id < 0 || id >= rows {
				return fmt.Errorf("id %d outside the table of %d", id, rows)
			}
		}
		return errorsJoin(want(b.X == 256 && g.Y == 1 && c.cfg.Shared == 0, "shape"),
			f.span("W", c.ptr(0), weightBytes(strings.TrimPrefix(name, "embed_"), rows, cols)),
			f.span("out", c.ptr(4), rowsSpan(R, ldo, cols)))
	case name == "rmsnorm":
		R, ldx, ldy, n := int(g.X), c.int(1), c.int(4), c.int(5)
		return errorsJoin(want(b.X == 256 && g.Y == 1, "shape"), want(ldx >= n && ldy >= n, "ld"),
			f.span("x", c.ptr(0), rowsSpan(R, ldx, n)), f.span("w", c.ptr(2), 4*int64(n)), f.span("y", c.ptr(3), rowsSpan(R, ldy, n)))
	case name == "head_rmsnorm":
		nh, R, ldx, hd := int(g.X), int(g.Y), c.int(1), c.int(3)
		return errorsJoin(want(b.X == 32, "block %v", b), want(ldx >= nh*hd, "ld"),
			f.span("x", c.ptr(0), rowsSpan(R, ldx, nh*hd)), f.span("w", c.ptr(2), 4*int64(hd)))
	case strings.HasPrefix(name, "mv_q8row_"), strings.HasPrefix(name, "mv_q4tp_"):
		parts := strings.Split(name, "_") // mv, family, rR
		R, _ := strconv.Atoi(strings.TrimPrefix(parts[2], "r"))
		rows := [3]int{c.int(3), c.int(4), c.int(5)}
		cols, ldx, xoff, ldy, pro := c.int(6), c.int(8), c.int(9), c.int(11), c.int(18)
		N := rows[0] + rows[1] + rows[2]
		dt := map[string]quant.DType{"q8row": quant.Q8Row, "q4tp": quant.Q4TP}[parts[1]]
		_, wantCfg, err := kern.MatvecLaunch(dt, N, cols, max(R, 1), 132) // the fake device has 132 SMs
		xw := cols
		if pro == kern.ProSilu {
			xw = xoff + cols
		}
		errs := []error{want(R >= 1 && R <= 8, "R %d", R), err, want(pro >= kern.ProPlain && pro <= kern.ProSilu, "prologue %d", pro),
			want(g == wantCfg.Grid && b == wantCfg.Block && c.cfg.Shared == wantCfg.Shared, "shape"),
			want(ldx >= xw && ldy >= N && rows[0] > 0, "ld"),
			f.span("x", c.ptr(7), rowsSpan(R, ldx, xw)), f.span("y", c.ptr(10), rowsSpan(R, ldy, N))}
		for j := range 3 {
			if rows[j] > 0 {
				errs = append(errs, f.span("W", c.ptr(j), weightBytes(parts[1], rows[j], cols)))
				if bias := c.ptr(12 + j); bias != 0 {
					errs = append(errs, f.span("bias", bias, 4*int64(rows[j])))
				}
			}
		}
		if pro == kern.ProNorm || pro == kern.ProNorm1 {
			errs = append(errs, f.span("norm", c.ptr(16), 4*int64(cols)))
		}
		return errorsJoin(errs...)
	case strings.HasPrefix(name, "mv_") && !strings.HasPrefix(name, "mv_moe_"):
		parts := strings.Split(name, "_") // mv, family, rR
		R, _ := strconv.Atoi(strings.TrimPrefix(parts[2], "r"))
		rows, cols, ldx, ldy := c.int(1), c.int(2), c.int(4), c.int(6)
		dt := map[string]quant.DType{"f32": quant.F32, "f16": quant.F16, "bf16": quant.BF16, "q8row": quant.Q8Row, "q4tp": quant.Q4TP}[parts[1]]
		_, wantCfg, err := kern.MatvecLaunch(dt, rows, cols, max(R, 1), 132) // the fake device has 132 SMs
		errs := []error{want(R >= 1 && R <= 8, "R %d", R), err,
			want(g == wantCfg.Grid && b == wantCfg.Block && c.cfg.Shared == wantCfg.Shared, "shape"),
			want(ldx >= cols && ldy >= rows, "ld"),
			f.span("W", c.ptr(0), weightBytes(parts[1], rows, cols)),
			f.span("x", c.ptr(3), rowsSpan(R, ldx, cols)), f.span("y", c.ptr(5), rowsSpan(R, ldy, rows))}
		if bias := c.ptr(7); bias != 0 {
			errs = append(errs, f.span("bias", bias, 4*int64(rows)))
		}
		return errorsJoin(errs...)
	case name == "gemmq_actq":
		ldx, cols, T := c.int(1), c.int(2), int(g.Y)
		q, s := kern.GemmQScratch(cols, T)
		return errorsJoin(want(c.cfg == kern.ActQuantLaunch(cols, T), "shape"), want(ldx >= cols && cols%32 == 0, "ld"),
			f.span("X", c.ptr(0), rowsSpan(T, ldx, cols)), f.span("XQ", c.ptr(3), q), f.span("D", c.ptr(4), s))
	case name == "gemmq_actq_pro":
		ldx, cols, T, pro := c.int(1), c.int(2), int(g.Y), c.int(6)
		q, s := kern.GemmQScratch(cols, T)
		errs := []error{want(c.cfg == kern.ActProLaunch(cols, T, pro), "shape"), want(ldx >= cols && cols%32 == 0, "ld"),
			want(pro == kern.ProNorm || pro == kern.ProSilu, "prologue %d", pro),
			f.span("X", c.ptr(0), rowsSpan(T, ldx, cols)), f.span("XQ", c.ptr(3), q), f.span("D", c.ptr(4), s)}
		if pro == kern.ProNorm {
			errs = append(errs, f.span("norm weight", c.ptr(8), 4*int64(cols)))
		} else {
			errs = append(errs, f.span("U", c.ptr(7), rowsSpan(T, ldx, cols)))
		}
		return errorsJoin(errs...)
	case name == "gemmh_acth":
		ldx, cols, T, pro := c.int(1), c.int(2), int(g.Y), c.int(4)
		errs := []error{want(c.cfg == kern.ActProLaunch(cols, T, pro), "shape"), want(ldx >= cols && cols%32 == 0, "ld"),
			want(pro == kern.ProPlain || pro == kern.ProNorm || pro == kern.ProSilu, "prologue %d", pro),
			f.span("X", c.ptr(0), rowsSpan(T, ldx, cols)), f.span("XH", c.ptr(3), kern.GemmHScratch(cols, T))}
		switch pro {
		case kern.ProNorm:
			errs = append(errs, f.span("norm weight", c.ptr(6), 4*int64(cols)))
		case kern.ProSilu:
			errs = append(errs, f.span("U", c.ptr(5), rowsSpan(T, ldx, cols)))
		}
		return errorsJoin(errs...)
	case strings.HasPrefix(name, "gemmh_q4tp_w"):
		gb := fakeGemmHArgs(c)
		cols, ldy, T, total := gb.cols, gb.ldy, gb.T, gb.total()
		stacked := kern.GemmQ{Rows: gb.parts[0].rows}
		for _, p := range gb.parts[1:] {
			if p.rows > 0 {
				stacked.More = append(stacked.More, kern.GemmQPart{Rows: p.rows})
			}
		}
		hout, ldh := c.ptr(15), c.int(16)
		stacked.SwiGLU, stacked.Ldh = hout, ldh
		wantName, wcfg, err := stacked.HalfLaunch(kern.GemmHSuffix(stacked.StackedRows(), cols, T), T)
		errs := []error{err, want(name == wantName && g == wcfg.Grid && b == wcfg.Block && c.cfg.Shared == wcfg.Shared,
			"shape (want %s %v, %d B shared)", wantName, wcfg.Grid, wcfg.Shared),
			want(ldy >= total && cols%32 == 0 && T <= 64, "ld"),
			f.span("XH", gb.xq, kern.GemmHScratch(cols, T))}
		if hout != 0 {
			errs = append(errs, want(c.int(14) == 0, "SwiGLU with accumulate"), f.span("hout", hout, kern.GemmHScratch(ldh, T)))
		} else {
			errs = append(errs, f.span("Y", gb.y, rowsSpan(T, ldy, total)))
		}
		for _, p := range gb.parts {
			if p.rows > 0 {
				errs = append(errs, want(p.w%16 == 0, "alignment"), f.span("W", p.w, weightBytes("q4tp", p.rows, cols)))
				if p.bias != 0 {
					errs = append(errs, f.span("bias", p.bias, 4*int64(p.rows)))
				}
			}
		}
		if f.halfIn.p != gb.xq || f.halfIn.cols != cols || f.halfIn.T != T {
			errs = append(errs, fmt.Errorf("not preceded by a launch writing its f16 activations (%d rows × %d)", T, cols))
		}
		if hout != 0 {
			f.halfIn.p, f.halfIn.cols, f.halfIn.T = hout, ldh, T
		}
		return errorsJoin(errs...)
	case strings.HasPrefix(name, "gemmq_") && !strings.HasPrefix(name, "gemmq_moe_"):
		fam := strings.Split(name, "_")[1]
		suffix := strings.TrimPrefix(name, "gemmq_"+fam)
		perm := kern.GemmQPerm(fam, suffix)
		gq := fakeGemmQArgs(c, kern.WideParams(suffix))
		cols, ldy, T, total := gq.cols, gq.ldy, gq.T, gq.total()
		stacked := kern.GemmQ{Rows: gq.parts[0].rows, Cols: cols}
		for _, p := range gq.parts[1:] {
			if p.rows > 0 {
				stacked.More = append(stacked.More, kern.GemmQPart{Rows: p.rows})
			}
		}
		wantName, wcfg, err := stacked.Launch(fam, stacked.Suffix(fam, T), T)
		q, s := kern.GemmQScratch(cols, T)
		errs := []error{err, want(name == wantName && g == wcfg.Grid && b == wcfg.Block && c.cfg.Shared == wcfg.Shared,
			"shape (want %s %v, %d B shared)", wantName, wcfg.Grid, wcfg.Shared),
			want(ldy >= total && cols%32 == 0, "ld"),
			f.span("XQ", gq.xq, q), f.span("D", gq.d, s), f.span("Y", gq.y, rowsSpan(T, ldy, total))}
		for j, p := range gq.parts {
			if p.rows == 0 {
				errs = append(errs, want(j > 0 && (j == 2 || gq.parts[2].rows == 0), "an empty part before a used one"))
				continue
			}
			errs = append(errs, want(p.w%16 == 0, "alignment"), f.span("W", p.w, weightBytes(fam, p.rows, cols)))
			if p.bias != 0 {
				errs = append(errs, f.span("bias", p.bias, 4*int64(p.rows)))
			}
		}
		// The quants must be this step's: the last gemmq_actq launched
		// wrote them, over these T rows and columns, in this tile's order.
		if f.lastActQ == nil || f.lastActQ.ptr(3) != gq.xq || f.lastActQ.ptr(4) != gq.d ||
			f.lastActQ.int(2) != cols || int(f.lastActQ.cfg.Grid.Y) != T || f.lastActQ.int(5) != perm {
			errs = append(errs, fmt.Errorf("not preceded by a gemmq_actq of its quants (%d rows × %d, perm %d)", T, cols, perm))
		}
		return errorsJoin(errs...)
	case strings.HasPrefix(name, "gemm_"):
		rows, cols, ldx, ldy, T := c.int(1), c.int(2), c.int(4), c.int(6), c.int(7)
		fam := strings.TrimSuffix(strings.TrimPrefix(name, "gemm_"), "_t64")
		bm := 128
		if strings.HasSuffix(name, "_t64") {
			bm = 64
		}
		errs := []error{want(int(g.X) == (rows+127)/128 && int(g.Y) == (T+bm-1)/bm && b.X == 256, "shape"),
			want(ldx >= cols && ldy >= rows, "ld"),
			f.span("W", c.ptr(0), weightBytes(fam, rows, cols)),
			f.span("X", c.ptr(3), rowsSpan(T, ldx, cols)), f.span("Y", c.ptr(5), rowsSpan(T, ldy, rows))}
		if bias := c.ptr(8); bias != 0 {
			errs = append(errs, f.span("bias", bias, 4*int64(rows)))
		}
		return errorsJoin(errs...)
	case strings.HasPrefix(name, "mm_"):
		rows, cols, ldx, ldy, T := c.int(1), c.int(2), c.int(4), c.int(6), c.int(7)
		fam := strings.TrimSuffix(strings.TrimPrefix(name, "mm_"), "_t16")
		dt, ok := map[string]quant.DType{"f32": quant.F32, "f16": quant.F16, "bf16": quant.BF16}[fam]
		wn, wg, wb := kern.FloatMatmulLaunch(dt, rows, T, 132) // the fake device has 132 SMs
		errs := []error{want(ok && wn == name && g == wg && b == wb && c.cfg.Shared == 0, "shape"),
			want(T > 8 && ldx >= cols && ldy >= rows, "ld"),
			f.span("W", c.ptr(0), weightBytes(fam, rows, cols)),
			f.span("X", c.ptr(3), rowsSpan(T, ldx, cols)), f.span("Y", c.ptr(5), rowsSpan(T, ldy, rows))}
		if bias := c.ptr(8); bias != 0 {
			errs = append(errs, f.span("bias", bias, 4*int64(rows)))
		}
		return errorsJoin(errs...)
	case name == "q82f_prescale":
		off, cols, ldx, ldxs, R := c.i64(1), c.int(2), c.int(4), c.int(6), int(g.Y)
		return errorsJoin(want(int(g.X) == (cols+255)/256 && b.X == 256, "shape"), want(ldx >= cols && ldxs >= cols, "ld"),
			f.span("W col field", c.ptr(0), off+4*int64(cols)),
			f.span("x", c.ptr(3), rowsSpan(R, ldx, cols)), f.span("xs", c.ptr(5), rowsSpan(R, ldxs, cols)))
	case name == "rope_qk_append" || name == "rope_qk_append_h":
		ld, nq, nkv, hd, rot, ctx := c.int(1), c.int(2), c.int(3), c.int(4), c.int(5), c.int(12)
		R := int(g.Y)
		return errorsJoin(want(int(g.X) == nq+nkv && b.X == 64, "shape"), want(ld >= (nq+2*nkv)*hd, "ld %d", ld),
			want(rot <= hd && rot%2 == 0, "rot %d", rot),
			f.span("qkv", c.ptr(0), rowsSpan(R, ld, (nq+2*nkv)*hd)), f.span("inv", c.ptr(6), 4*int64(max(rot/2, 1))),
			f.checkKV(c, 8, 9, 10, 11, R, nkv, hd, ctx), f.optSpan("q norm", c.ptr(13), 4*int64(hd)),
			f.optSpan("k norm", c.ptr(14), 4*int64(hd)), want(c.int(16) == 0 || c.int(16) == 1, "one_plus %d", c.int(16)))
	case name == "attn_split":
		ldq, nq, nkv, hd, ctx, nsplit := c.int(1), c.int(7), c.int(8), c.int(9), c.int(10), c.int(11)
		R := int(g.Z)
		return errorsJoin(want(int(g.X) == nsplit && int(g.Y) == nkv && b.X == 128, "shape"),
			want(c.cfg.Shared == 4*8*(hd+2)*4, "shared %d", c.cfg.Shared), want(nq%nkv == 0 && hd <= 256, "heads"),
			f.span("q", c.ptr(0), rowsSpan(R, ldq, nq*hd)), f.span("part", c.ptr(6), 4*int64(R*nq*nsplit*(hd+2))),
			f.checkKV(c, 4, 5, 2, 3, R, nkv, hd, ctx))
	case name == "attn_tiles" || name == "attn_tiles_h" || strings.HasPrefix(name, "attn_mma_h_d"):
		ldq, ldo, nq, nkv, hd, ctx, nsplit := c.int(1), c.int(9), c.int(10), c.int(11), c.int(12), c.int(13), c.int(14)
		R, f16, mma := int(g.Z), name != "attn_tiles", strings.HasPrefix(name, "attn_mma_h_d")
		threads, shared, fits := 128, kern.AttnTilesShared(hd, f16), kern.AttnTilesFits(hd, ldq, f16)
		if mma {
			threads, shared = 32*kern.AttnMMAWarps(hd), kern.AttnMMAShared(hd)
			fits = nkv > 0 && name == kern.AttnMMAKernel(hd) && kern.AttnMMAFits(hd, ldq, nq/nkv)
		}
		errs := []error{want(int(g.X) == nsplit && int(g.Y) == nkv && int(b.X) == threads, "shape"),
			want(c.cfg.Shared == shared, "shared %d", c.cfg.Shared),
			want(nq%nkv == 0 && fits && ldo%4 == 0 && ldo >= nq*hd, "heads"),
			want(nsplit >= 1 && nsplit <= kern.AttnTilesMaxSplits, "splits %d", nsplit),
			f.span("q", c.ptr(0), rowsSpan(R, ldq, nq*hd)), f.span("out", c.ptr(8), rowsSpan(R, ldo, nq*hd)),
			f.checkKV(c, 4, 5, 2, 3, R, nkv, hd, ctx)}
		if nsplit > 1 {
			errs = append(errs, f.span("part", c.ptr(6), 4*int64(R*nq*nsplit*(hd+2))), f.span("cnt", c.ptr(7), 4*int64(R*nkv)))
		}
		if c.ptr(16) != 0 {
			errs = append(errs, want(nq*hd%32 == 0, "f16 copy of %d columns", nq*hd), f.span("outh", c.ptr(16), kern.GemmHScratch(nq*hd, R)))
		}
		return errorsJoin(errs...)
	case name == "attn_rope_tiles" || name == "attn_rope_tiles_h":
		ldq, ldo, nq, nkv, hd, ctx, nsplit, rot := c.int(1), c.int(9), c.int(10), c.int(11), c.int(12), c.int(13), c.int(14), c.int(19)
		R, f16 := int(g.Z), name == "attn_rope_tiles_h"
		errs := []error{want(int(g.X) == nsplit && int(g.Y) == nkv && b.X == 128, "shape"),
			want(c.cfg.Shared == kern.AttnTilesShared(hd, f16), "shared %d", c.cfg.Shared),
			want(nq%nkv == 0 && kern.AttnTilesFits(hd, ldq, f16) && ldo%4 == 0 && ldo >= nq*hd && ldq >= (nq+2*nkv)*hd, "heads"),
			want(nsplit >= 1 && nsplit <= kern.AttnTilesMaxSplits, "splits %d", nsplit),
			want(rot <= hd && rot%2 == 0, "rot %d", rot), want(c.ptr(16) == 0, "an f16 copy"),
			f.span("qkv", c.ptr(0), rowsSpan(R, ldq, (nq+2*nkv)*hd)), f.span("out", c.ptr(8), rowsSpan(R, ldo, nq*hd)),
			f.span("inv", c.ptr(17), 4*int64(max(rot/2, 1))), f.optSpan("q norm", c.ptr(20), 4*int64(hd)),
			f.optSpan("k norm", c.ptr(21), 4*int64(hd)), want(c.int(23) == 0 || c.int(23) == 1, "one_plus %d", c.int(23)),
			f.checkKV(c, 4, 5, 2, 3, R, nkv, hd, ctx)}
		if nsplit > 1 {
			errs = append(errs, f.span("part", c.ptr(6), 4*int64(R*nq*nsplit*(hd+2))), f.span("cnt", c.ptr(7), 4*int64(R*nkv)))
		}
		// Each row appends its own key and reads its own cache: the rows
		// must be distinct sequences (a decode step).
		if slot, err := f.ints(c.ptr(5), R); err == nil {
			seen := map[int]bool{}
			for _, sl := range slot {
				errs = append(errs, want(!seen[sl], "two rows of sequence slot %d", sl))
				seen[sl] = true
			}
		}
		return errorsJoin(errs...)
	case name == "attn_merge":
		ldo, nq, hd, nsplit := c.int(2), c.int(3), c.int(4), c.int(5)
		R := int(g.Y)
		return errorsJoin(want(int(g.X) == nq && b.X == 128, "shape"), want(ldo >= nq*hd, "ld"),
			f.span("part", c.ptr(0), 4*int64(R*nq*nsplit*(hd+2))), f.span("out", c.ptr(1), rowsSpan(R, ldo, nq*hd)))
	case name == "gate_split":
		lds, ldq, ldg, nq, hd, kv, R := c.int(1), c.int(3), c.int(5), c.int(6), c.int(7), c.int(8), int(g.Y)
		qd := nq * hd
		return errorsJoin(want(int(g.X) == (qd+kv+255)/256 && b.X == 256, "shape"), want(lds >= 2*qd+kv && ldq >= qd+kv && ldg >= qd, "ld"),
			f.span("src", c.ptr(0), rowsSpan(R, lds, 2*qd+kv)), f.span("qkv", c.ptr(2), rowsSpan(R, ldq, qd+kv)), f.span("gate", c.ptr(4), rowsSpan(R, ldg, qd)))
	case name == "gate_mul":
		ldy, ldg, n, R := c.int(1), c.int(3), c.int(4), int(g.Y)
		return errorsJoin(want(int(g.X) == (n+255)/256 && b.X == 256, "shape"), want(ldy >= n && ldg >= n, "ld"),
			f.span("y", c.ptr(0), rowsSpan(R, ldy, n)), f.span("g", c.ptr(2), rowsSpan(R, ldg, n)))
	case name == "moe_route":
		ldl, E, k, R := c.int(1), c.int(2), c.int(3), int(g.X)
		return errorsJoin(want(b.X == 256 && ldl >= E && k >= 1 && k <= E, "shape"),
			f.span("logits", c.ptr(0), rowsSpan(R, ldl, E)), f.span("ids", c.ptr(5), 4*int64(R*k)), f.span("w", c.ptr(6), 4*int64(R*k)))
	case name == "moe_router_f32":
		ldx, H, E, k, ldl, ldxb, R := c.int(1), c.int(6), c.int(7), c.int(8), c.int(11), c.int(15), int(g.Y)
		gate := b2i(c.ptr(17) != 0)
		return errorsJoin(want(int(g.X) == (E+gate+kern.MoERouterRows-1)/kern.MoERouterRows && b.X == 32*kern.MoERouterRows && c.cfg.Shared == 0, "shape"),
			want((c.ptr(17) != 0) == (c.ptr(18) != 0) && c.ptr(17)%16 == 0, "shared gate"),
			f.optSpan("shared gate", c.ptr(17), 4*int64(H)), f.optSpan("sg", c.ptr(18), 4*int64(R)),
			want(kern.MoERouterFits(E, H, c.ptr(5)) && k >= 1 && k <= E && ldl >= E && ldx >= H && ldxb >= H, "sizes"),
			f.span("x", c.ptr(0), rowsSpan(R, ldx, H)), f.span("norm", c.ptr(2), 4*int64(H)), f.span("router", c.ptr(5), 4*int64(E*H)),
			f.span("logits", c.ptr(10), rowsSpan(R, ldl, E)), f.span("ids", c.ptr(12), 4*int64(R*k)), f.span("w", c.ptr(13), 4*int64(R*k)),
			f.span("xb", c.ptr(14), rowsSpan(R, ldxb, H)), f.span("cnt", c.ptr(16), 4*int64(R)))
	case strings.HasPrefix(name, "mv_moe_ff_"):
		E, nslot, k, I, H, ldx, ldgu, ldy := c.int(2), c.int(4), c.int(5), c.int(6), c.int(7), c.int(9), c.int(11), c.int(13)
		R := nslot / max(k, 1)
		errs := []error{want(b.X == 512 && g == kern.MoEFFGrid(nslot, k, I, H, 132) && int(g.X) <= 132 && c.cfg.Shared == kern.MoEFFShared(nslot, k, I, H), "shape"),
			want(k >= 1 && nslot%k == 0 && nslot <= 64 && ldx >= H && ldgu >= 2*I && ldy >= H && E >= 1, "sizes"),
			f.span("gate|up table", c.ptr(0), 16*int64(E)), f.span("down table", c.ptr(1), 8*int64(E)), f.span("ids", c.ptr(3), 4*int64(nslot)),
			f.span("x", c.ptr(8), rowsSpan(R, ldx, H)), f.span("gu", c.ptr(10), rowsSpan(nslot, ldgu, 2*I)),
			f.span("y", c.ptr(12), rowsSpan(R, ldy, H)), f.span("w", c.ptr(14), 4*int64(nslot)), f.span("bar", c.ptr(17), 8)}
		if c.ptr(15) != 0 {
			errs = append(errs, f.span("shared", c.ptr(15), rowsSpan(R, ldy, H)), f.span("gate", c.ptr(16), 4*int64(R)))
		}
		return errorsJoin(errs...)
	case strings.HasPrefix(name, "mv_moe_dc_"):
		E, nslot, k, rowsE, cols, ldx, xoff, pro, ldy := c.int(1), c.int(3), c.int(4), c.int(5), c.int(6), c.int(8), c.int(9), c.int(10), c.int(12)
		R := nslot / max(k, 1)
		errs := []error{want(b.X == 512 && g == kern.MoEDownCombineGrid(R, rowsE, 132) && c.cfg.Shared == kern.MatvecShared(cols, nslot), "shape"),
			want(k >= 1 && nslot%k == 0 && nslot <= 64 && (pro == kern.ProSilu || pro == kern.ProPlain && xoff == 0) && ldx >= xoff+cols && ldy >= rowsE && E >= 1, "sizes"),
			f.span("table", c.ptr(0), 8*int64(E)), f.span("ids", c.ptr(2), 4*int64(nslot)), f.span("x", c.ptr(7), rowsSpan(nslot, ldx, xoff+cols)),
			f.span("y", c.ptr(11), rowsSpan(R, ldy, rowsE)), f.span("w", c.ptr(13), 4*int64(nslot))}
		if c.ptr(14) != 0 {
			errs = append(errs, f.span("shared", c.ptr(14), rowsSpan(R, ldy, rowsE)), f.span("gate", c.ptr(15), 4*int64(R)))
		}
		return errorsJoin(errs...)
	case strings.HasPrefix(name, "mv_moe_"):
		E, nmat := c.int(1), c.int(2)
		nslot, k, rowsE, cols, ldx, xoff, xmode, ldy, pro := c.int(4), c.int(5), c.int(6), c.int(7), c.int(9), c.int(10), c.int(11), c.int(13), c.int(14)
		nx := nslot / k
		if xmode == kern.MoEXSlot {
			nx = nslot
		}
		xw := cols
		if pro == kern.ProSilu {
			xw = xoff + cols
		}
		dt := map[string]quant.DType{"q8row": quant.Q8Row, "q4tp": quant.Q4TP, "f32": quant.F32, "f16": quant.F16, "bf16": quant.BF16}[strings.TrimPrefix(name, "mv_moe_")]
		out := nmat * rowsE // y's row: both products, or (kern.MoEXGLU) their SwiGLU
		if xmode == kern.MoEXGLU {
			out = rowsE
		}
		return errorsJoin(want(b.X == 512 && g == kern.MoEMatvecGrid(nslot, nmat, rowsE, 132) && c.cfg.Shared == kern.MoEMatvecSharedFor(dt, cols, nx), "shape"),
			want(nslot%k == 0 && (nx <= 64 && nslot <= kern.MoESlots || c.cfg.Shared == 0) && ldx >= xw && ldy >= out && E >= 1 && (nmat == 1 || nmat == 2), "ld"),
			want(xmode >= kern.MoEXRow && xmode <= kern.MoEXGLU && (xmode != kern.MoEXGLU || nmat == 2 && kern.MoEGLUFits(dt, cols)), "xmode %d", xmode),
			f.span("table", c.ptr(0), 8*int64(nmat*E)),
			f.span("ids", c.ptr(3), 4*int64(nslot)), f.span("x", c.ptr(8), rowsSpan(nx, ldx, xw)), f.span("y", c.ptr(12), rowsSpan(nslot, ldy, out)))
	case name == "moe_combine":
		ldx, ldy, k, n, R := c.int(1), c.int(3), c.int(5), c.int(8), int(g.Y)
		yrows := R * k
		if c.ptr(9) != 0 { // sorted rows of the grouped path: bounded by the inverse map's values (checked numerically)
			yrows = 1
		}
		errs := []error{want(int(g.X) == (n+255)/256 && b.X == 256, "shape"), want(ldx >= n && ldy >= n, "ld"),
			f.span("x", c.ptr(0), rowsSpan(R, ldx, n)), f.span("y", c.ptr(2), rowsSpan(yrows, ldy, n)), f.span("w", c.ptr(4), 4*int64(R*k))}
		if c.ptr(9) != 0 {
			errs = append(errs, f.span("inv", c.ptr(9), 4*int64(R*k)))
		}
		if c.ptr(6) != 0 {
			errs = append(errs, f.span("shared", c.ptr(6), rowsSpan(R, ldy, n)), f.span("gate", c.ptr(7), 4*int64(R)))
		}
		return errorsJoin(errs...)
	case name == "moe_sort":
		nslot, E, ntile := c.int(1), c.int(2), c.int(6)
		sg, sb := kern.MoESortLaunch(E)
		return errorsJoin(want(g == sg && b == sb, "shape"),
			want(nslot >= 1 && nslot <= kern.MoEMaxSlots && E >= 1 && E <= kern.MoEMaxExperts && ntile >= kern.MoETiles(nslot, E), "sizes"),
			f.span("ids", c.ptr(0), 4*int64(nslot)), f.span("perm", c.ptr(3), 4*int64(ntile*kern.MoETile)),
			f.span("inv", c.ptr(4), 4*int64(nslot)), f.span("tile", c.ptr(5), 4*int64(ntile)))
	case name == "moe_gather_q":
		cols, rows := c.int(2), int(g.X)
		return errorsJoin(want(b.X == 128 && cols%32 == 0 && rows%kern.MoETile == 0, "shape"),
			f.span("perm", c.ptr(4), 4*int64(rows)), f.span("tile", c.ptr(5), 4*int64(rows/kern.MoETile)),
			f.span("xqs", c.ptr(6), int64(rows)*int64(cols)), f.span("ds", c.ptr(7), 4*int64(rows)*int64(cols/32)))
	case strings.HasPrefix(name, "gemmq_moe_"):
		rowsE, cols, ldy, T := c.int(2), c.int(3), c.int(7), c.int(8)
		wg, wb := kern.GemmQMoELaunch(rowsE, T/kern.MoETile)
		return errorsJoin(want(g == wg && b == wb && T%kern.MoETile == 0 && cols%32 == 0, "shape"), want(ldy >= rowsE, "ld"),
			f.span("tile", c.ptr(1), 4*int64(T/kern.MoETile)), f.span("xqs", c.ptr(4), int64(T)*int64(cols)),
			f.span("ds", c.ptr(5), 4*int64(T)*int64(cols/32)), f.span("y", c.ptr(6), rowsSpan(T, ldy, rowsE)))
	case name == "argmax":
		ld, n, R := c.int(1), c.int(2), int(g.X)
		return errorsJoin(want(b.X == 1024 && g.Y == 1, "shape"), want(ld >= n && n > 0, "ld"),
			f.span("logits", c.ptr(0), rowsSpan(R, ld, n)), f.span("next", c.ptr(3), 4*int64(R)))
	case name == "silu_mul":
		ldi, ldh, n, R := c.int(2), c.int(4), c.int(5), int(g.Y)
		return errorsJoin(want(int(g.X) == (n+255)/256 && b.X == 256, "shape"), want(ldi >= n && ldh >= n, "ld"),
			f.span("g", c.ptr(0), rowsSpan(R, ldi, n)), f.span("u", c.ptr(1), rowsSpan(R, ldi, n)),
			f.span("h", c.ptr(3), rowsSpan(R, ldh, n)))
	case name == "dn_conv", name == "dn_conv_step", name == "dn_conv_state", name == "dn_rule", strings.HasPrefix(name, "dn_chunk_"), name == "dn_gnorm":
		return f.checkDN(c)
	}
	return fmt.Errorf("no check written for kernel %s", name)
}

func errorsJoin(errs ...error) error {
	var msgs []string
	for _, e := range errs {
		if e != nil {
			msgs = append(msgs, e.Error())
		}
	}
	if msgs == nil {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}

// testNet is a one-layer network resident on the fake device.
type testNet struct {
	embed *mat
	attn  *backend.Attention
	mlp   *backend.MLP
	head  backend.Head
}

func (n *testNet) step(ops backend.Ops) {
	ops.Embed(n.embed)
	if n.attn != nil {
		ops.Attention(n.attn, 0)
	}
	if n.mlp != nil {
		ops.MLP(n.mlp)
	}
	ops.Head(&n.head)
}

type netShape struct {
	dt                    quant.DType
	H, I, nq, nkv, hd, V  int
	bias, qknorm, dynamic bool
}

func (f *fakeGPU) mat(t *testing.T, dt quant.DType, rows, cols int) *mat {
	n, err := quant.ExpectedBytes(dt, []int{rows, cols})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := f.alloc(n)
	m := &mat{dt: dt, rows: rows, cols: cols, p: p}
	if dt == quant.Q82F {
		m.colOff = quant.Q82FColOffset(rows, cols)
	}
	return m
}

func (f *fakeGPU) vec(n int) *vec {
	p, _ := f.alloc(4 * int64(n))
	return &vec{n: n, p: p}
}

func (f *fakeGPU) net(t *testing.T, s netShape) *testNet {
	norm := func(n int) backend.Norm { return backend.Norm{W: f.vec(n), Eps: 1e-6} }
	n := &testNet{embed: f.mat(t, s.dt, s.V, s.H)}
	cfg := rope.Config{HeadDim: s.hd, Theta: 10000, MaxPositions: 128}
	if s.dynamic {
		cfg.Type, cfg.Factor, cfg.MaxPositions = "dynamic", 2, 4
	}
	tab, err := rope.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	inv, _ := f.alloc(4 * int64(tab.Dim()/2))
	a := &backend.Attention{Norm: norm(s.H), Q: f.mat(t, s.dt, s.nq*s.hd, s.H), K: f.mat(t, s.dt, s.nkv*s.hd, s.H),
		V: f.mat(t, s.dt, s.nkv*s.hd, s.H), O: f.mat(t, s.dt, s.H, s.nq*s.hd), Rope: &ropeTab{t: tab, inv: inv, mscale: 1},
		Heads: s.nq, KVHeads: s.nkv, HeadDim: s.hd}
	if s.bias {
		a.BQ, a.BK, a.BV, a.BO = f.vec(s.nq*s.hd), f.vec(s.nkv*s.hd), f.vec(s.nkv*s.hd), f.vec(s.H)
	}
	if s.qknorm {
		qn, kn := norm(s.hd), norm(s.hd)
		a.QNorm, a.KNorm = &qn, &kn
	}
	n.attn = a
	n.mlp = &backend.MLP{Norm: norm(s.H), Gate: f.mat(t, s.dt, s.I, s.H), Up: f.mat(t, s.dt, s.I, s.H), Down: f.mat(t, s.dt, s.H, s.I)}
	if s.bias {
		n.mlp.BGate, n.mlp.BUp, n.mlp.BDown = f.vec(s.I), f.vec(s.I), f.vec(s.H)
	}
	n.head = backend.Head{Norm: norm(s.H), W: f.mat(t, s.dt, s.V, s.H)}
	return n
}

// fakeDevice is a Device whose K/V pool lives on f (no GPU).
func fakeDevice(t *testing.T, f *fakeGPU, opt Options, spec backend.SeqSpec) *Device {
	d := fakeOpen(f, opt)
	per := int64(opt.Seqs) * int64(spec.KVHeads) * int64(opt.Ctx) * int64(spec.HeadDim) * 4
	d.kc, d.vc = make([]driver.DevicePtr, spec.Layers), make([]driver.DevicePtr, spec.Layers)
	for _, l := range spec.Attention {
		d.kc[l], _ = f.alloc(per)
		d.vc[l], _ = f.alloc(per)
	}
	d.spec = &spec
	for i := opt.Seqs - 1; i >= 0; i-- {
		d.free = append(d.free, i)
	}
	return d
}

// fakeOpen is a Device on f, as Open makes one on a GPU (no K/V pool yet).
func fakeOpen(f *fakeGPU, opt Options) *Device {
	d := &Device{opt: opt, info: driver.Info{SMs: 132, Name: "fake"}}
	if d.opt.MaxRows == 0 {
		d.opt.MaxRows = 512
	}
	d.do = func(fn func(r runner) error) error { return fn(f) }
	f.d = d
	return d
}

// step runs one batch on the fake as Run does on the GPU.
func (f *fakeGPU) step(t *testing.T, d *Device, seqs []*seq, tokens [][]int, logits backend.Logits, n *testNet, vocab int) error {
	t.Helper()
	b := &backend.Batch{Tokens: tokens, Logits: logits, Step: f.stepID}
	f.expectPos, f.expectSlot = nil, nil
	for i, s := range seqs {
		b.Seqs = append(b.Seqs, s)
		for j := range tokens[i] {
			f.expectPos = append(f.expectPos, s.n+j)
			f.expectSlot = append(f.expectSlot, s.slot)
		}
	}
	wanted := b.Rows()
	if logits == backend.LastLogits {
		wanted = len(seqs)
	}
	b.Out = make([]float32, wanted*vocab)
	if err := d.check(b); err != nil {
		return err
	}
	if err := d.runStep(f, b, n.step); err != nil {
		return err
	}
	for i, s := range seqs {
		s.n += len(tokens[i])
	}
	return nil
}

func toks(n, base int) []int {
	v := make([]int, n)
	for i := range v {
		v[i] = (base + 7*i) % 40 // every test vocabulary holds 40 tokens
	}
	return v
}

// TestLaunchesMatchKernels runs every op in every weight format over
// prefill chunks (matvec and GEMM paths), mixed batches and decode, and
// checks every launch against the manifest, its documented launch shape
// and the allocations.
func TestLaunchesMatchKernels(t *testing.T) {
	for _, mmq := range []bool{false, true} {
		testLaunchesMatchKernels(t, mmq)
	}
}

// testLaunchesMatchKernels: with mmq (not Options.NoMMQ) the 12-row prefill of
// quantized weights takes the int8 GEMM (gemmq_actq, then gemmq_<fam>*).
func testLaunchesMatchKernels(t *testing.T, mmq bool) {
	for _, dt := range []quant.DType{quant.F32, quant.F16, quant.BF16, quant.Q8Row, quant.Q82F, quant.Q4TP} {
		for _, sh := range []netShape{
			{H: 64, I: 96, nq: 4, nkv: 2, hd: 16, V: 72},
			{H: 64, I: 160, nq: 8, nkv: 1, hd: 32, V: 50, bias: true, qknorm: true},
		} {
			sh.dt = dt
			t.Run(fmt.Sprintf("%s/nq%d_nkv%d/mmq%v", dt, sh.nq, sh.nkv, mmq), func(t *testing.T) {
				f := newFake(t, 4)
				spec := backend.SeqSpec{Layers: 1, Attention: []int{0}, KVHeads: sh.nkv, HeadDim: sh.hd}
				d := fakeDevice(t, f, Options{Seqs: 4, Ctx: 64, MaxRows: 32, NoMMQ: !mmq}, spec)
				n := f.net(t, sh)
				s := []*seq{{d: d, slot: 2, ctx: 64}, {d: d, slot: 0, ctx: 64}, {d: d, slot: 3, ctx: 40}}
				steps := []struct {
					seqs   []int
					tokens []int
					logits backend.Logits
				}{
					{[]int{0}, []int{12}, backend.AllLogits},             // GEMM path for quantized weights
					{[]int{1, 2}, []int{3, 9}, backend.LastLogits},       // gather of last rows
					{[]int{0, 1, 2}, []int{1, 1, 1}, backend.LastLogits}, // decode
					{[]int{2, 0}, []int{5, 1}, backend.NoLogits},
					{[]int{0}, []int{1}, backend.AllLogits},
				}
				for i, st := range steps {
					var ss []*seq
					var tk [][]int
					for j, k := range st.seqs {
						ss = append(ss, s[k])
						tk = append(tk, toks(st.tokens[j], i+k))
					}
					if err := f.step(t, d, ss, tk, st.logits, n, sh.V); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
				}
				var used int64
				for _, b := range d.st.bufs {
					used += b.n
				}
				widest := max(sh.H, (sh.nq+2*sh.nkv)*sh.hd, 2*sh.I, sh.V)
				if plan := scratchBytes(d.opt.MaxRows, widest, spec, d.info.SMs, !d.opt.NoMMQ); used > plan {
					t.Errorf("the steps' scratch is %d bytes, the plan's bound %d", used, plan)
				}
				names := map[string]bool{}
				for _, c := range f.calls {
					name := c.name
					if i := strings.LastIndex(name, "_r"); strings.HasPrefix(name, "mv_") && i > 0 {
						name = name[:i]
					}
					name = strings.TrimSuffix(name, "_t64s") // the int8 GEMM's stacked 64-token tile
					name = strings.TrimSuffix(name, "_t64")  // the GEMM's 64-token tile
					name = strings.TrimSuffix(name, "_d64")  // the int8 GEMM's decode tile
					if i := max(strings.LastIndex(name, "_s"), strings.LastIndex(name, "_w")); (strings.HasPrefix(name, "gemmq_") || strings.HasPrefix(name, "gemmh_")) && i > 0 {
						name = name[:i] // the int8 GEMM's small-batch and wide tiles (_s16h, _w16k8, ...)
					}
					names[name] = true
				}
				fam, _ := kernelFormat(dt)
				for _, k := range []string{"rmsnorm", "rope_qk_append", "attn_tiles", "silu_mul", "mv_" + fam} {
					if k == "silu_mul" && mmq && names["gemmq_actq_pro"] {
						continue // SwiGLU in the down projection's quantizer (and the matvec's prologue)
					}
					if !names[k] {
						t.Errorf("no %s was launched (launched: %v)", k, names)
					}
				}
				if names["head_rmsnorm"] {
					t.Errorf("the q/k norms ran apart from rope_qk_append (launched: %v)", names)
				}
				if sh.qknorm != f.normedRope() {
					t.Errorf("q/k norms %v, rope_qk_append with norm weights %v", sh.qknorm, f.normedRope())
				}
				quantized := dt != quant.F32 && dt != quant.F16 && dt != quant.BF16
				if quantized && !mmq && !names["gemm_"+fam] {
					t.Errorf("the 12-row prefill of %s did not take the GEMM", dt)
				}
				if quantized && mmq && (!names["gemmq_"+fam] || !names["gemmq_actq"] || names["gemm_"+fam] || names["gemmh_acth"]) {
					t.Errorf("the 12-row prefill of %s with MMQ did not take the int8 GEMM alone (launched: %v)", dt, names)
				}
				if !mmq && names["gemmq_actq"] {
					t.Errorf("the int8 GEMM ran with Options.NoMMQ")
				}
				if dt == quant.Q82F && !names["q82f_prescale"] {
					t.Errorf("q8_2f ran without its prescale")
				}
			})
		}
	}
}

// TestQKVSideBySide checks the layout rope_qk_append and attn_tiles expect:
// q, k and v of a row side by side at stride (nq+2·nkv)·hd, attention
// reading q from the row start and writing att at stride nq·hd.
func TestQKVSideBySide(t *testing.T) {
	f := newFake(t, 2)
	sh := netShape{dt: quant.F32, H: 64, I: 96, nq: 4, nkv: 2, hd: 16, V: 40, bias: true}
	d := fakeDevice(t, f, Options{Seqs: 2, Ctx: 32, MaxRows: 8}, backend.SeqSpec{Layers: 1, Attention: []int{0}, KVHeads: 2, HeadDim: 16})
	n := f.net(t, sh)
	s := &seq{d: d, slot: 1, ctx: 32}
	if err := f.step(t, d, []*seq{s}, [][]int{toks(3, 1)}, backend.LastLogits, n, sh.V); err != nil {
		t.Fatal(err)
	}
	qd, kvd := sh.nq*sh.hd, sh.nkv*sh.hd
	ld := qd + 2*kvd
	var ys []driver.DevicePtr
	var rope, split *fakeCall
	for i := range f.calls {
		c := &f.calls[i]
		switch {
		case strings.HasPrefix(c.name, "mv_") && len(ys) < 3:
			if c.int(6) != ld {
				t.Errorf("q/k/v matvec %d writes at stride %d, want %d", len(ys), c.int(6), ld)
			}
			ys = append(ys, c.ptr(5))
		case c.name == "rope_qk_append":
			rope = c
		case c.name == "attn_tiles":
			split = c
		case c.name == "attn_split" || c.name == "attn_merge":
			t.Errorf("%s launched for %d-dimension heads (attn_tiles serves them)", c.name, sh.hd)
		}
	}
	if len(ys) != 3 || rope == nil || split == nil {
		t.Fatalf("the attention launches are missing: %d projections, rope %v, attention %v", len(ys), rope != nil, split != nil)
	}
	if ys[1] != ys[0].Add(int64(4*qd)) || ys[2] != ys[0].Add(int64(4*(qd+kvd))) {
		t.Errorf("q, k, v at %#x, %#x, %#x: not side by side", ys[0], ys[1], ys[2])
	}
	if rope.ptr(0) != ys[0] || rope.int(1) != ld || split.ptr(0) != ys[0] || split.int(1) != ld {
		t.Errorf("rope_qk_append / attn_tiles do not read the fused q|k|v rows")
	}
	if split.int(9) != qd {
		t.Errorf("attn_tiles writes att at stride %d, want %d", split.int(9), qd)
	}
	if rope.ptr(10) != d.kc[0] || rope.ptr(11) != d.vc[0] || split.ptr(2) != d.kc[0] || split.ptr(3) != d.vc[0] {
		t.Errorf("the append and the attention use different caches")
	}
}

// TestGraphReplayChecksLaunches: a decode shape is captured after its
// first eager step, replayed when the next step packs the same launches,
// and not replayed for another network of the same shape (other weights),
// nor for a batch whose tokens fall outside the table.
func TestGraphReplayChecksLaunches(t *testing.T) {
	f := newFake(t, 4)
	sh := netShape{dt: quant.Q4TP, H: 64, I: 96, nq: 4, nkv: 2, hd: 16, V: 72}
	spec := backend.SeqSpec{Layers: 1, Attention: []int{0}, KVHeads: 2, HeadDim: 16}
	d := fakeDevice(t, f, Options{Seqs: 4, Ctx: 64, MaxRows: 16, Graphs: true}, spec)
	a, b := f.net(t, sh), f.net(t, sh)
	s := []*seq{{d: d, slot: 0, ctx: 64}, {d: d, slot: 1, ctx: 64}}
	if err := f.step(t, d, s, [][]int{toks(4, 1), toks(6, 2)}, backend.LastLogits, a, sh.V); err != nil {
		t.Fatal(err)
	}
	dec := func(n *testNet) {
		t.Helper()
		if err := f.step(t, d, s, [][]int{{3}, {5}}, backend.LastLogits, n, sh.V); err != nil {
			t.Fatal(err)
		}
	}
	dec(a) // eager, then captured
	if len(f.graphs) != 1 || f.replays != 0 {
		t.Fatalf("after the first decode step: %d graphs, %d replays", len(f.graphs), f.replays)
	}
	dec(a)
	dec(a)
	if f.replays != 2 {
		t.Fatalf("%d replays of the same network's decode steps, want 2", f.replays)
	}
	dec(b) // other weights: eager and recaptured, never the old graph
	if f.replays != 2 || len(f.graphs) != 1 {
		t.Fatalf("another network's step replayed the graph (%d replays, %d graphs)", f.replays, len(f.graphs))
	}
	dec(b)
	if f.replays != 3 {
		t.Fatalf("the recaptured graph was not replayed (%d)", f.replays)
	}
	if err := f.step(t, d, s, [][]int{{3}, {sh.V}}, backend.LastLogits, b, sh.V); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Fatalf("a token outside the table on the replay path: %v", err)
	}
	// A bigger logits buffer moves the scratch: the graph must not replay
	// with the old address.
	if err := f.step(t, d, s, [][]int{toks(6, 3), toks(7, 4)}, backend.AllLogits, b, sh.V); err != nil {
		t.Fatal(err)
	}
	before := f.replays
	dec(b)
	if f.replays != before {
		t.Fatalf("a graph was replayed after its logits buffer moved")
	}
}

// TestDynamicRopePerSequence: with dynamic RoPE each sequence of a step
// gets its own frequencies, uploaded on the step's stream, and its own
// rope_qk_append over its rows; such steps are never captured.
func TestDynamicRopePerSequence(t *testing.T) {
	f := newFake(t, 4)
	sh := netShape{dt: quant.F32, H: 64, I: 96, nq: 4, nkv: 2, hd: 16, V: 40, dynamic: true}
	d := fakeDevice(t, f, Options{Seqs: 4, Ctx: 64, MaxRows: 16, Graphs: true}, backend.SeqSpec{Layers: 1, Attention: []int{0}, KVHeads: 2, HeadDim: 16})
	n := f.net(t, sh)
	s := []*seq{{d: d, slot: 3, ctx: 64}, {d: d, slot: 1, ctx: 64}}
	for i, tk := range [][][]int{{toks(2, 0), toks(9, 1)}, {{1}, {2}}, {{1}, {2}}} {
		f.calls = nil
		rows := []int{len(tk[0]), len(tk[1])}
		lens := []int{s[0].n + rows[0], s[1].n + rows[1]}
		if err := f.step(t, d, s, tk, backend.LastLogits, n, sh.V); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		var ropes []*fakeCall
		for k := range f.calls {
			if f.calls[k].name == "rope_qk_append" {
				ropes = append(ropes, &f.calls[k])
			}
		}
		if len(ropes) != 2 || int(ropes[0].cfg.Grid.Y) != rows[0] || int(ropes[1].cfg.Grid.Y) != rows[1] {
			t.Fatalf("step %d: %d rope launches, want one per sequence over its rows", i, len(ropes))
		}
		if ropes[0].ptr(6) == ropes[1].ptr(6) {
			t.Fatalf("step %d: both sequences use one frequency table", i)
		}
		// The second sequence's frequencies as the fake's memory holds them.
		a := f.find(ropes[1].ptr(6), 4*int64(sh.hd/2))
		got := math.Float32frombits(binary.LittleEndian.Uint32(a.mem[ropes[1].ptr(6)-a.base+4:]))
		tab := n.attn.Rope.(*ropeTab).t
		inv, _ := tab.Freqs(lens[1], make([]float32, sh.hd/2))
		if got != inv[1] {
			t.Fatalf("step %d: sequence 1's second frequency on the device is %g, want %g (length %d)", i, got, inv[1], lens[1])
		}
	}
	if f.replays != 0 || len(f.graphs) != 0 {
		t.Fatalf("a dynamic-RoPE step was captured or replayed")
	}
}

// TestAttnPartBound: one partials buffer of attnPartRows rows serves every
// step of up to MaxRows rows, for both attention kernels' split counts.
func TestAttnPartBound(t *testing.T) {
	for name, splits := range map[string]func(sms, nkv, rows int) int{"attn_split": attnSplits, "attn_tiles": kern.AttnTilesSplits} {
		for _, sms := range []int{1, 16, 78, 132, 144} {
			for nkv := 1; nkv <= 16; nkv++ {
				for _, M := range []int{1, 7, 64, 512} {
					bound := attnPartRows(sms, nkv, M, splits)
					for R := 1; R <= M; R++ {
						if need := R * splits(sms, nkv, R); need > bound {
							t.Fatalf("%s: sms %d nkv %d: %d rows × %d splits = %d > bound %d", name, sms, nkv, R, splits(sms, nkv, R), need, bound)
						}
						if n := splits(sms, nkv, R); n < 1 || n > kern.AttnTilesMaxSplits {
							t.Fatalf("%s: sms %d nkv %d rows %d: %d splits", name, sms, nkv, R, n)
						}
					}
				}
			}
		}
	}
}

// TestStagedInputsLayout: ids, positions and slots land at offsets 0,
// 4·MaxRows and 8·MaxRows of the inputs buffer.
func TestStagedInputsLayout(t *testing.T) {
	f := newFake(t, 4)
	sh := netShape{dt: quant.F32, H: 64, I: 96, nq: 4, nkv: 2, hd: 16, V: 40}
	const M = 16
	d := fakeDevice(t, f, Options{Seqs: 4, Ctx: 64, MaxRows: M}, backend.SeqSpec{Layers: 1, Attention: []int{0}, KVHeads: 2, HeadDim: 16})
	n := f.net(t, sh)
	s := []*seq{{d: d, slot: 2, ctx: 64, n: 5}, {d: d, slot: 0, ctx: 64, n: 1}}
	tk := [][]int{{4, 9}, {11, 12, 13}}
	if err := f.step(t, d, s, tk, backend.NoLogits, n, sh.V); err != nil {
		t.Fatal(err)
	}
	in := d.st.bufs["inputs"].p
	ids, _ := f.ints(in, 5)
	pos, _ := f.ints(in.Add(4*M), 5)
	slot, _ := f.ints(in.Add(8*M), 5)
	if fmt.Sprint(ids, pos, slot) != "[4 9 11 12 13] [5 6 1 2 3] [2 2 0 0 0]" {
		t.Fatalf("staged ids %v positions %v slots %v", ids, pos, slot)
	}
}

// TestStageHoldsMaxRows: the staged inputs and the dynamic-RoPE tables of
// a step of maxRows rows fit the pinned stage.
func TestStageHoldsMaxRows(t *testing.T) {
	if need := 12*maxRows + maxRows*4*attnMaxHeadDim/2; need > stageBytes {
		t.Fatalf("a step of %d rows stages %d bytes, the stage holds %d", maxRows, need, stageBytes)
	}
	if _, err := Open(Options{Seqs: 1, Ctx: 1, MaxRows: maxRows + 1}); err == nil || !strings.Contains(err.Error(), "MaxRows") {
		t.Fatalf("MaxRows beyond the grid limit: %v", err)
	}
}

// TestParitySuiteOnFake drives the GPU parity suite's every case and
// schedule (backend/backendtest, as TestGPUParity does on a GPU) through
// the device on the fake: weights, vectors and RoPE tables uploaded through
// the stage, the K/V pool rebuilt between cases of different shapes, graphs
// captured and checked, and every launch checked as above (the logits are
// the fake's zeros: numbers are the GPU session's).
func TestParitySuiteOnFake(t *testing.T) {
	f := newFake(t, 4)
	d := fakeOpen(f, Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: true})
	runs := 0
	for _, c := range backendtest.Cases() {
		for name, sched := range backendtest.Schedules() {
			if _, err := backendtest.Run(d, c, sched, 11); notYet(err) {
				t.Logf("%s: NOT RUN (%v)", c.Name, err)
				continue
			} else if err != nil {
				t.Fatalf("%s / %s: %v", c.Name, name, err)
			}
			runs++
		}
	}
	if f.replays == 0 {
		t.Fatal("no decode step of the suite was replayed from a graph")
	}
	t.Logf("%d runs, %d launches, %d graph replays", runs, len(f.calls), f.replays)
	// A sequence of another model while one is live is refused.
	s, err := d.NewSeq(backend.SeqSpec{Layers: 1, Attention: []int{0}, KVHeads: 2, HeadDim: 16}, 16)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.NewSeq(backend.SeqSpec{Layers: 1, Attention: []int{0}, KVHeads: 1, HeadDim: 16}, 16); err == nil {
		t.Fatal("a second model's sequence took a slot of a live pool")
	}
	d.Release(s)
	if _, err := d.NewSeq(backend.SeqSpec{Layers: 1, Attention: []int{0}, KVHeads: 1, HeadDim: 16}, 16); err != nil {
		t.Fatalf("an empty pool was not rebuilt: %v", err)
	}
}

// notYet reports an error of an op the device does not implement yet (the
// text of backend.ErrUnsupported, where the boundary has it: such parity
// cases are not compared, as backendtest.Parity does).
func notYet(err error) bool {
	return err != nil && strings.Contains(err.Error(), "not supported by this device yet")
}

// TestStepTimer: with timing on, the first decode step runs eagerly with
// each kernel between timing events (never recorded into a graph), later
// decode steps are timed whole around the replayed graph, prefill steps
// are not timed, figures restart with TimeSteps(true) and stop with
// TimeSteps(false). The fake's clock gives each kernel 10 µs and each
// replayed kernel a 2 µs gap: the figures must be exactly those.
func TestStepTimer(t *testing.T) {
	f := newFake(t, 4)
	d := fakeOpen(f, Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: true})
	var k backendtest.Case
	for _, c := range backendtest.Cases() {
		if c.Name == "attention/f32" {
			k = c
		}
	}
	sched := []backendtest.Step{{{Seq: 0, Tokens: 5}}}
	for range 6 {
		sched = append(sched, backendtest.Step{{Seq: 0, Tokens: 1}})
	}
	for round := range 2 {
		d.TimeSteps(true)
		before := f.replays
		if _, err := backendtest.Run(d, k, sched, 3); err != nil {
			t.Fatal(err)
		}
		got := d.StepTimes()
		if len(f.graphs) != 1 {
			t.Fatalf("%d graphs, want 1", len(f.graphs))
		}
		var n int
		for _, g := range f.graphs {
			n = len(g)
		}
		want := backend.StepTimes{Steps: 5, Graphs: 5, StepTime: 5 * time.Duration(n) * (fakeKernel + fakeGap),
			Kernels: n, KernelTime: time.Duration(n) * fakeKernel}
		if n == 0 || f.replays-before != 5 || !closeTimes(got, want) {
			t.Fatalf("round %d: %d kernels a step, %d replays: step times %+v, want %+v", round, n, f.replays-before, got, want)
		}
		// The host's share: the check and the wait are parts of Run's wall time.
		if got.HostRun <= 0 || got.HostCheck < 0 || got.HostWait < 0 || got.HostCheck+got.HostWait > got.HostRun {
			t.Fatalf("round %d: host times run %v, check %v, wait %v", round, got.HostRun, got.HostCheck, got.HostWait)
		}
	}
	d.TimeSteps(false)
	if _, err := backendtest.Run(d, k, sched, 3); err != nil {
		t.Fatal(err)
	}
	if got := d.StepTimes(); got != (backend.StepTimes{}) {
		t.Fatalf("timing off: %+v", got)
	}
}

// closeTimes compares step times to within 1 ns per step (the events'
// float32 milliseconds round).
func closeTimes(a, b backend.StepTimes) bool {
	near := func(x, y time.Duration, n int) bool { return (x - y).Abs() <= time.Duration(n+1)*time.Nanosecond }
	return a.Steps == b.Steps && a.Graphs == b.Graphs && a.Kernels == b.Kernels &&
		near(a.StepTime, b.StepTime, a.Steps) && near(a.KernelTime, b.KernelTime, a.Kernels)
}

// dnCall decodes a dn_* launch's parameters (deltanet.cu) into the
// geometry and pointers kern.DeltaNet packs, and its rows.
func dnCall(c *fakeCall) (kern.DeltaNet, int) {
	var k kern.DeltaNet
	R := int(c.cfg.Grid.Y)
	switch c.name {
	case "dn_conv", "dn_conv_step":
		k = kern.DeltaNet{Proj: c.ptr(0), Ldp: c.int(1), Grouped: c.int(2) != 0, KeyHeads: c.int(3), KeyDim: c.int(4), ValueHeads: c.int(5),
			ValueDim: c.int(6), ConvW: c.ptr(7), ConvKernel: c.int(8), State: c.ptr(9), Slot: c.ptr(11), Conv: c.ptr(12), Ldc: c.int(13)}
	case "dn_conv_state":
		k = kern.DeltaNet{Proj: c.ptr(0), Ldp: c.int(1), Grouped: c.int(2) != 0, KeyHeads: c.int(3), KeyDim: c.int(4), ValueHeads: c.int(5),
			ValueDim: c.int(6), ConvKernel: c.int(7), State: c.ptr(8), Slot: c.ptr(10)}
	case "dn_rule", "dn_chunk_prep", "dn_chunk_state", "dn_gnorm":
		k = kern.DeltaNet{Conv: c.ptr(0), Ldc: c.int(1), Proj: c.ptr(2), Ldp: c.int(3), Grouped: c.int(4) != 0, KeyHeads: c.int(5), KeyDim: c.int(6),
			ValueHeads: c.int(7), ValueDim: c.int(8), ALog: c.ptr(9), Dt: c.ptr(10), NormW: c.ptr(11), Eps: c.f32(12), State: c.ptr(13),
			Slot: c.ptr(16), Out: c.ptr(18), Ldo: c.int(19)}
		R = c.int(17) // the grid's y is the step's sequences
	}
	return k, R
}

// dnSeqs is the number of sequences of a step's rows (runs of one slot).
func dnSeqs(slots []int) int {
	n := 0
	for r, s := range slots {
		if r == 0 || slots[r-1] != s {
			n++
		}
	}
	return n
}

// checkDN checks a dn_* launch: its shape is kern.DeltaNet's, the state
// stride (and dn_rule's S offset) the pool's, its slots are the staged
// inputs' from row 0 with each sequence's rows consecutive, and every
// operand lies inside its allocation.
func (f *fakeGPU) checkDN(c *fakeCall) error {
	k, R := dnCall(c)
	stride, slotArg := 0, 0
	switch c.name {
	case "dn_conv", "dn_conv_step":
		stride, slotArg = c.int(10), 11
	case "dn_conv_state":
		stride, slotArg = c.int(9), 10
	case "dn_rule", "dn_chunk_prep", "dn_chunk_state", "dn_gnorm":
		stride, slotArg = c.int(14), 16
	}
	if k.KeyHeads <= 0 || k.ValueHeads <= 0 || k.ValueHeads%k.KeyHeads != 0 || k.KeyDim <= 0 || k.ValueDim <= 0 {
		return fmt.Errorf("geometry %+v", k)
	}
	_, vd, cd := k.Dims()
	nv := k.ValueHeads
	in, M := f.inputs()
	errs := []error{want(k.Ldp >= k.ProjWidth(), "ldp %d for %d", k.Ldp, k.ProjWidth()),
		f.span("proj", k.Proj, rowsSpan(R, k.Ldp, k.ProjWidth())),
		want(c.ptr(slotArg) == in.Add(int64(8*M)), "slots at %#x, not the staged inputs' row 0 (%#x)", c.ptr(slotArg), in.Add(int64(8*M)))}
	slots, err := f.ints(c.ptr(slotArg), R)
	if err != nil {
		return err
	}
	seen := map[int]bool{}
	for r, s := range slots {
		if s < 0 || s >= f.seqs {
			errs = append(errs, fmt.Errorf("row %d: slot %d outside the pool", r, s))
		}
		if r > 0 && slots[r-1] != s && seen[s] {
			errs = append(errs, fmt.Errorf("row %d: slot %d's rows are not consecutive", r, s))
		}
		seen[s] = true
	}
	rule := c.name == "dn_rule" || strings.HasPrefix(c.name, "dn_chunk_") || c.name == "dn_gnorm"
	if rule {
		k.ConvKernel = c.int(15)/cd + 1
		errs = append(errs, want(c.int(15) == (k.ConvKernel-1)*cd, "S offset %d", c.int(15)))
	}
	errs = append(errs, want(stride == k.StateFloats(), "stride %d, a slot holds %d", stride, k.StateFloats()),
		f.span("state", k.State, 4*int64(f.seqs)*int64(stride)))
	if c.name == "dn_conv_step" && dnSeqs(slots) != R {
		errs = append(errs, fmt.Errorf("dn_conv_step over %d rows of %d sequences (one row a sequence)", R, dnSeqs(slots)))
	}
	switch c.name {
	case "dn_conv", "dn_conv_step", "dn_conv_state":
		want := k.ConvLaunch(R)
		errs = append(errs, func() error {
			if c.cfg.Grid != want.Grid || c.cfg.Block != want.Block || c.cfg.Shared != 0 {
				return fmt.Errorf("shape (want %+v)", want)
			}
			return nil
		}())
		if c.name != "dn_conv_state" {
			errs = append(errs, f.span("w", k.ConvW, 4*int64(cd*k.ConvKernel)), f.span("out", k.Conv, rowsSpan(R, k.Ldc, cd)))
		}
	case "dn_chunk_prep", "dn_chunk_state", "dn_gnorm":
		p, sc, nc := k.ChunkLaunches(R, dnSeqs(slots))
		w := map[string]driver.Config{"dn_chunk_prep": p, "dn_chunk_state": sc, "dn_gnorm": nc}[c.name]
		errs = append(errs, want(R >= 1 && R <= M && R > dnSeqs(slots), "R %d (of %d sequences)", R, dnSeqs(slots)),
			want(k.ChunkFits(), "heads %d×%d", k.KeyDim, k.ValueDim),
			want(c.cfg.Grid == w.Grid && c.cfg.Block == w.Block && c.cfg.Shared == w.Shared, "shape (want %+v)", w),
			want(k.Ldc >= cd && k.Ldo >= vd, "ld"), f.span("conv", k.Conv, rowsSpan(R, k.Ldc, cd)),
			f.span("out", k.Out, rowsSpan(R, k.Ldo, vd)), f.span("A_log", k.ALog, 4*int64(nv)), f.span("dt_bias", k.Dt, 4*int64(nv)),
			f.span("norm", k.NormW, 4*int64(k.ValueDim)), f.span("X", c.ptr(20), k.ChunkScratch(R)))
	case "dn_rule":
		w := k.RuleLaunch(dnSeqs(slots))
		errs = append(errs, want(R >= 1 && R <= M, "R %d", R), want(c.cfg.Grid == w.Grid && c.cfg.Block == w.Block && c.cfg.Shared == w.Shared, "shape (want %+v)", w),
			want(k.Ldc >= cd && k.Ldo >= vd, "ld"), f.span("conv", k.Conv, rowsSpan(R, k.Ldc, cd)),
			f.span("out", k.Out, rowsSpan(R, k.Ldo, vd)), f.span("A_log", k.ALog, 4*int64(nv)), f.span("dt_bias", k.Dt, 4*int64(nv)),
			f.span("norm", k.NormW, 4*int64(k.ValueDim)))
	}
	return errorsJoin(errs...)
}
