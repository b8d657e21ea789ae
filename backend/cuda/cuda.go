// Package cuda is the CUDA backend: backend.Device on an NVIDIA GPU through
// the driver API (backend/cuda/driver, no cgo) and the kernels of
// backend/cuda/kern. Weights are uploaded once, unconverted, from the CMF
// bytes through pinned staging; each sequence owns a slot of a K/V pool
// sized at Open; a step stages its token ids, positions and slots with one
// host-to-device copy, runs the ops' kernels on one stream, and copies the
// logits back.
//
// Status: written against the kernels' documented launch shapes and
// checked on the CPU only (this file compiles and its no-GPU paths are
// tested); the parity suite (backend/backendtest) has not yet run on a GPU.
// docs/gpu.md says what has and has not been verified.
package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/rope"
)

// Options size a device at Open.
type Options struct {
	Ordinal int // which GPU
	// Seqs and Ctx size the K/V pool: Seqs sequences of up to Ctx
	// positions each (fixed at Open so memory is checked once, up front).
	Seqs, Ctx int
	// MaxRows bounds the rows of one step (prefill chunk or batch); 0: 512.
	MaxRows int
	// Progress, when set, is told the bytes uploaded so far of the
	// weights planned by Plan.
	Progress func(done, total int64)
	// Eager synchronises after every launch (debugging: an error is
	// reported by the op that caused it) and never records graphs.
	Eager bool
	// Graphs records each decode shape (rows, logits kind) as a CUDA graph
	// after its first eager step and replays it for later steps of that
	// shape whose launches (kernels, shapes, argument bytes), packed on
	// the host first, equal the recording's.
	Graphs bool
	// PDL launches every kernel with programmatic dependent launch: a
	// kernel starts while the one before it finishes (the kernels load
	// weights before griddepcontrol.wait and read their inputs after it).
	PDL bool
	// KVF16 keeps the K/V cache in float16 (rounded to nearest even as
	// it is appended; attention reads it with attn_tiles_h): half the
	// memory and half the bytes attention reads, as llama.cpp's default
	// f16 cache. Only for models whose matrices are mostly quantized
	// (by bytes, when the first sequence allocates the pool: a memory plan
	// made before the weights load counts float32), and heads whose size
	// is a multiple of 8; the rest keep float32.
	KVF16 bool
	// PDLRows: steps of at most this many rows launch with PDL (0: 64,
	// or CORTIQ_CUDA_PDL_ROWS where set: an experiment's override).
	// Larger prefill steps measured slower with it (the next GEMM's early
	// blocks hold multiprocessors the current one needs); 64-row decode
	// steps faster (H200, 8B q4tp, stop 20: 64 streams through the server
	// 6,402 tok/s against 6,234 at 8 rows, 16 sequences 3,001 against 2,864).
	PDLRows int
	// NoFusion runs decode steps without the fused matvec prologues
	// (separate rmsnorm and silu_mul launches): the parity tests compare
	// both.
	NoFusion bool
	// MoEFF runs a fused decode step's experts as one launch, mv_moe_ff_*
	// (gate|up, a grid barrier, down and combine), instead of two (mv_moe_*
	// gate|up, mv_moe_dc_* down and combine). Off by default: on the H200
	// the one launch's step was 2–3% slower (docs/benchmarks.md, stop 25).
	MoEFF bool
	// NoBranch keeps a decode step's shared expert (Qwen3-Next's MoE
	// blocks) on the step's stream. By default it runs on a second stream
	// beside the router and the routed experts' gate|up launch, joined
	// before the down launch that adds it (a fork and a join in the step's
	// graph), its gate|up with the block's norm in its prologue: on the
	// H200 the Qwen3-Next-80B-A3B synth's decode step 3,772 → 3,550 µs,
	// tg64 254 → 265.5 tok/s (`cortiq bench -p 512 -n 64 -r 2`, both
	// settings interleaved in one call: docs/benchmarks.md, stop 28 run 5).
	// CORTIQ_CUDA_BRANCH=0 sets it.
	NoBranch bool
	// NoDeltaChunks runs the Gated DeltaNet rule of prefill steps row by
	// row (dn_rule, the decode form) instead of in chunks (dn_chunk_prep,
	// dn_chunk_state, dn_gnorm: the WY form of kernels.DeltaRule.Chunked,
	// taken when a sequence has at least DeltaChunkMin rows in the step
	// and the heads fit kern.DeltaNet.ChunkFits). CORTIQ_CUDA_DNCHUNK=0
	// sets it.
	NoDeltaChunks bool
	// CheckEveryStep packs every decode step to compare it with its graph
	// before replaying it, even when the step and its shape are the last
	// checked replay's (Batch.Step; for comparisons and tests).
	CheckEveryStep bool
	// NoMoEGroups runs every mixture-of-experts step one matvec per (row,
	// slot) (mv_moe_*) instead of grouping steps of more than 8 rows by
	// expert (moe_sort + gemmq_moe_*): the parity tests compare both.
	NoMoEGroups bool
	// NoMMQ runs the steps of more than 8 rows (prefill chunks, batched
	// decode) over q8_row, q8_2f and q4tp weights on the bf16 tensor-core
	// GEMM (kern.Gemm: bf16 activations, f32 accumulation) instead of the
	// default int8 one (kern.GemmQ: activations quantized per block of 32
	// as the matvecs and the CPU do, so its results equal the CPU's to
	// float32 rounding). Tensors whose width is not whole blocks of 32
	// always take the bf16 GEMM.
	NoMMQ bool
	// F16Wide runs q4tp's batched-decode steps of 33 to 64 rows on the half
	// wide tiles (kern.GemmQ.F16: activations and weights — each group's
	// rung folded in — rounded to f16, f32 sums: closer to exact arithmetic
	// than the int8 quants, but not the CPU's rule) instead of the int8
	// wide tiles, whose results equal the CPU's to float32 rounding.
	F16Wide bool
	// NoAttnMMA keeps those half-GEMM steps' attention, and that of
	// prefill chunks of more than 64 rows over a quantized o_proj, on
	// attn_tiles_h (CUDA cores, q and the weights in f32) instead of the
	// tensor-core attn_mma_h (q·scale and the softmax weights rounded to
	// f16; hd 64 or 128). CORTIQ_CUDA_ATTN=tiles sets it.
	NoAttnMMA bool
	// AttnMMAAll runs every step's attention with the f16 cache on
	// attn_mma_h where the head fits, decode steps included (an
	// experiment's switch: CORTIQ_CUDA_ATTN=mma).
	AttnMMAAll bool
	// RopeFold runs decode steps' RoPE and K/V append inside the
	// attention launch (attn_rope_tiles: the same bits, one launch fewer
	// a layer) instead of as their own launch (rope_qk_append) before
	// attn_tiles. Off by default: on the H200 the 30B-A3B synth's decode
	// step (`cortiq bench -p 512 -n 128 -r 2`, against the default in the
	// same call) was 2,602 → 2,772 µs with it (docs/benchmarks.md, stop 28
	// run 4: the fused kernel's norm, rotation and append chain, three
	// heads a warp in turn, took as long as the two launches).
	// CORTIQ_CUDA_ROPE=fold sets it.
	RopeFold bool
	// Profile, when set, times every kernel of every step with events
	// (steps run eagerly: no graphs) and Close writes the table to it.
	Profile io.Writer
	// ProfileRows, when positive, profiles only the steps of that many
	// rows (e.g. 64: a 64-sequence decode step without the prefills).
	ProfileRows int
}

// Device is one GPU.
type Device struct {
	opt  Options
	dev  *driver.Device
	info driver.Info
	mod  *kern.Module
	strm driver.Stream
	// side is the stream a step's independent branch runs on (the shared
	// expert's, unless Options.NoBranch), forked from strm at forkEv and joined back at joinEv;
	// onSide routes launches to it.
	side           driver.Stream
	forkEv, joinEv driver.Event
	onSide         bool
	// do runs f on the device thread with a runner for the device's
	// stream (the CPU tests give a fake).
	do func(f func(r runner) error) error

	mu       sync.Mutex // one step at a time
	stage    *driver.HostBuf
	planned  int64 // weight bytes Plan announced
	memPlan  MemoryPlan
	uploaded int64
	allocs   []driver.DevicePtr

	spec   *backend.SeqSpec // fixed by the first NewSeq
	kc, vc []driver.DevicePtr
	kvHalf bool // kc, vc hold float16 (Options.KVF16 where the heads fit)
	// Bytes of the float (f32, f16, bf16) and quantized matrices loaded
	// since the last NewSeq (a new model's): the float16 cache is for
	// models mostly quantized. NewSeq decides from them and clears them.
	floatBytes, quantBytes int64
	kvWant                 bool // the last model's choice (kvHalfFor)
	// ls is, per Gated DeltaNet layer, the linear-attention state of every
	// slot: per slot [conv (K−1)×conv_dim | S nv×dk×dv] float32 (the
	// CPU's SaveState layout), zeroed for each new sequence.
	ls   []driver.DevicePtr
	free []int // free K/V slots

	st        *state
	graphs    map[graphKey]graph
	replays   int
	unchecked int
	optin     map[string]int                // kernels' opted-in dynamic shared memory (device thread only)
	prof      *profile                      // Options.Profile
	moeDone   map[string][]driver.DevicePtr // MoE expert tables as written (device thread only)
	moeNames  map[*backend.MoE]string       // their scratch names (device thread only)

	timing *backend.StepTimes // StepTimer figures, nil: not timing
	// hostTimed: the step runStep just ran was timed whole (Run adds its
	// wall time to timing.HostRun).
	hostTimed bool
	// gen counts the changes to what a step's launches may depend on
	// (uploads, sequence state, scratch growth: every mutate and every
	// step not replayed); memo is the last checked replay (memo.go).
	gen    atomic.Uint64
	memo   replayMemo
	events []driver.Event // its timing events, made on first use
}

// stageBytes is the pinned staging buffer used for uploads and per-step
// inputs and outputs.
const stageBytes = 64 << 20

// maxRows bounds Options.MaxRows: rows are a grid's y or z dimension in
// most kernels (at most 65535). A step stages ids, positions and slots (12
// bytes a row) and, for dynamic RoPE, up to one table of frequencies per
// sequence (128 floats at the kernels' widest head) after them; the stage
// holds both for maxRows rows (TestStageHoldsMaxRows).
const maxRows = 65535

// Open opens GPU opt.Ordinal and loads the kernels. Without a usable GPU
// the error wraps backend.ErrNoDevice and says why in one line.
func Open(opt Options) (*Device, error) {
	if opt.Seqs <= 0 || opt.Ctx <= 0 {
		return nil, fmt.Errorf("cuda: Open needs the K/V pool size (Seqs %d, Ctx %d)", opt.Seqs, opt.Ctx)
	}
	if opt.MaxRows <= 0 {
		opt.MaxRows = 512
	}
	if opt.MaxRows > maxRows {
		return nil, fmt.Errorf("cuda: MaxRows %d exceeds the %d the staging buffer holds", opt.MaxRows, maxRows)
	}
	dev, err := driver.Open(opt.Ordinal)
	if err != nil {
		if errors.Is(err, driver.ErrNoDevice) {
			return nil, fmt.Errorf("%w: %v", backend.ErrNoDevice, err)
		}
		return nil, fmt.Errorf("cuda: %w", err)
	}
	if opt.Profile != nil {
		opt.Graphs = false
	}
	if opt.PDLRows <= 0 {
		opt.PDLRows = 64
		if n, err := strconv.Atoi(os.Getenv("CORTIQ_CUDA_PDL_ROWS")); err == nil && n > 0 {
			opt.PDLRows = n
		}
	}
	switch os.Getenv("CORTIQ_CUDA_ATTN") {
	case "tiles":
		opt.NoAttnMMA = true
	case "mma":
		opt.AttnMMAAll = true
	}
	if os.Getenv("CORTIQ_CUDA_BRANCH") == "0" {
		opt.NoBranch = true
	}
	if os.Getenv("CORTIQ_CUDA_DNCHUNK") == "0" {
		opt.NoDeltaChunks = true
	}
	if os.Getenv("CORTIQ_CUDA_ROPE") == "fold" {
		opt.RopeFold = true
	}
	d := &Device{opt: opt, dev: dev, info: dev.Info()}
	if opt.Profile != nil {
		d.prof = &profile{rows: opt.ProfileRows}
	}
	d.do = func(f func(r runner) error) error {
		return dev.Do(func(c *driver.Ctx) error { return f(gpuRunner{c: c, d: d}) })
	}
	err = dev.Do(func(c *driver.Ctx) error {
		var err error
		if d.mod, err = kern.Load(c, d.info, false); err != nil {
			return err
		}
		if d.mod.ClusterCapsErr != nil {
			slog.Warn("cuda: cluster occupancy unknown; the GEMMs' K splits assume the H200's, scaled by the SMs",
				"err", d.mod.ClusterCapsErr, "caps", d.mod.ClusterCaps[1:])
		} else {
			slog.Debug("cuda: cluster capacities", "caps", d.mod.ClusterCaps[1:])
		}
		if d.strm, err = c.NewStream(driver.StreamNonBlocking); err != nil {
			return err
		}
		if d.side, err = c.NewStream(driver.StreamNonBlocking); err != nil {
			return err
		}
		if d.forkEv, err = c.NewEvent(driver.EventDisableTiming); err != nil {
			return err
		}
		if d.joinEv, err = c.NewEvent(driver.EventDisableTiming); err != nil {
			return err
		}
		d.stage, err = c.HostAlloc(stageBytes, 0)
		return err
	})
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("cuda: %w", err)
	}
	return d, nil
}

// Name says which GPU runs the steps.
// mutate runs f on the device thread as a change of the device's state
// (no replay skips its check across it).
func (d *Device) mutate(f func(r runner) error) error {
	d.gen.Add(1)
	return d.do(f)
}

func (d *Device) Name() string {
	return fmt.Sprintf("cuda:%d (%s, %d SMs, kernels: %s)", d.opt.Ordinal, d.info.Name, d.info.SMs, d.mod.Source)
}

// Close frees everything and releases the GPU.
func (d *Device) Close() error {
	if d.dev == nil {
		return nil
	}
	if d.prof != nil {
		d.WriteProfile(d.opt.Profile)
		d.dev.Do(func(c *driver.Ctx) error { d.prof.destroy(c); return nil })
	}
	err := d.dev.Close()
	d.dev = nil
	return err
}

// PrefillRows is the prefill chunk the device prefers
// (backend.PrefillSizer): every row its step scratch holds, so a prompt
// runs as few, wide matrix products.
func (d *Device) PrefillRows() int { return d.opt.MaxRows }

// MemoryPlan is what a model needs on the device. KV counts the
// sequences' whole state: the K/V pool and the Gated DeltaNet layers'
// linear-attention state.
type MemoryPlan struct {
	Weights, KV, Scratch, Free int64
}

// Need is the bytes the plan needs in all.
func (p MemoryPlan) Need() int64 { return p.Weights + p.KV + p.Scratch }

// Plan checks, before any weight is uploaded, that weights of weightBytes,
// the K/V pool of Options.Seqs × Options.Ctx positions of spec, and the
// step scratch fit the device's free memory; the error names every number.
func (d *Device) Plan(weightBytes int64, spec backend.SeqSpec, widest int) error {
	p, err := d.plan(weightBytes, spec, widest)
	d.memPlan = p
	return err
}

// MemoryPlan returns the last plan Plan checked.
func (d *Device) MemoryPlan() MemoryPlan { return d.memPlan }

func (d *Device) plan(weightBytes int64, spec backend.SeqSpec, widest int) (MemoryPlan, error) {
	p := MemoryPlan{Weights: weightBytes, KV: int64(d.opt.Seqs) * (d.kvBytes(spec) + spec.StateBytes())}
	p.Scratch = scratchBytes(d.opt.MaxRows, widest, spec, d.info.SMs, !d.opt.NoMMQ)
	err := d.mutate(func(r runner) error {
		free, _, err := r.memInfo()
		p.Free = free
		return err
	})
	if err != nil {
		return p, fmt.Errorf("cuda: %w", err)
	}
	if p.Need() > p.Free {
		return p, fmt.Errorf("cuda: the model needs %s on %s (weights %s, K/V %s for %d sequences × %d positions, scratch %s) but %s is free; lower --ctx or --parallel, or run on the CPU",
			gb(p.Need()), d.info.Name, gb(p.Weights), gb(p.KV), d.opt.Seqs, d.opt.Ctx, gb(p.Scratch), gb(p.Free))
	}
	d.planned = weightBytes
	return p, nil
}

func gb(n int64) string { return fmt.Sprintf("%.2f GB", float64(n)/1e9) }

// mat is a resident weight matrix.
type mat struct {
	name       string
	dt         quant.DType
	rows, cols int
	p          driver.DevicePtr
	colOff     int64 // q8_2f: byte offset of the column field
}

func (m *mat) DType() quant.DType     { return m.dt }
func (m *mat) Dims() (rows, cols int) { return m.rows, m.cols }

// kernelFormat names a format in the kernels' entry points.
func kernelFormat(dt quant.DType) (string, error) {
	switch dt {
	case quant.F32:
		return "f32", nil
	case quant.F16:
		return "f16", nil
	case quant.BF16:
		return "bf16", nil
	case quant.Q8Row, quant.Q82F:
		return "q8row", nil // q8_2f: prescale, then q8_row's kernel
	case quant.Q4TP:
		return "q4tp", nil
	}
	return "", fmt.Errorf("cuda: no kernels for weight format %s", dt)
}

// upload copies b to a new device allocation through the pinned stage.
func (d *Device) upload(b []byte) (driver.DevicePtr, error) {
	var p driver.DevicePtr
	err := d.mutate(func(r runner) error {
		var err error
		if p, err = r.alloc(int64(max(len(b), 16))); err != nil {
			return err
		}
		d.allocs = append(d.allocs, p)
		stage := r.stage()
		for off := 0; off < len(b); off += len(stage) {
			n := min(len(stage), len(b)-off)
			copy(stage[:n], b[off:off+n])
			if err := r.htod(p.Add(int64(off)), 0, n); err != nil {
				return err
			}
			// The stage is reused by the next piece: wait for this one.
			if err := r.sync(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("cuda: upload of %d bytes: %w", len(b), err)
	}
	d.uploaded += int64(len(b))
	if d.opt.Progress != nil && d.planned > 0 {
		d.opt.Progress(d.uploaded, d.planned)
	}
	return p, nil
}

// LoadMat uploads the matrix's stored bytes unconverted.
func (d *Device) LoadMat(name string, dt quant.DType, rows, cols int, data []byte) (backend.Mat, error) {
	if _, err := kernelFormat(dt); err != nil {
		return nil, fmt.Errorf("cuda: tensor %q: %w", name, err)
	}
	want, err := quant.ExpectedBytes(dt, []int{rows, cols})
	if err != nil || want != int64(len(data)) {
		return nil, fmt.Errorf("cuda: tensor %q: %d bytes for a %s %d×%d matrix (%v)", name, len(data), dt, rows, cols, err)
	}
	p, err := d.upload(data)
	if err != nil {
		return nil, fmt.Errorf("cuda: tensor %q: %w", name, err)
	}
	m := &mat{name: name, dt: dt, rows: rows, cols: cols, p: p}
	if dt == quant.F32 || dt == quant.F16 || dt == quant.BF16 {
		d.floatBytes += int64(len(data))
	} else {
		d.quantBytes += int64(len(data))
	}
	if dt == quant.Q82F {
		m.colOff = quant.Q82FColOffset(rows, cols)
	}
	return m, nil
}

// vec is a resident float32 vector.
type vec struct {
	n int
	p driver.DevicePtr
}

func (v *vec) Len() int { return v.n }

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// LoadVec uploads v.
func (d *Device) LoadVec(v []float32) (backend.Vec, error) {
	p, err := d.upload(f32Bytes(v))
	if err != nil {
		return nil, err
	}
	return &vec{n: len(v), p: p}, nil
}

// ropeTab is a resident rotary table.
type ropeTab struct {
	t      *rope.Table
	inv    driver.DevicePtr
	mscale float32
}

func (r *ropeTab) Dim() int { return r.t.Dim() }

// NewRope computes the table on the host and uploads its frequencies.
// Dynamic scaling recomputes them per step (Run).
func (d *Device) NewRope(c backend.RopeConfig) (backend.Rope, error) {
	t, err := rope.New(c)
	if err != nil {
		return nil, err
	}
	inv, scale := t.Freqs(0, nil)
	buf := make([]float32, max(len(inv), 1))
	copy(buf, inv)
	p, err := d.upload(f32Bytes(buf))
	if err != nil {
		return nil, err
	}
	return &ropeTab{t: t, inv: p, mscale: scale}, nil
}

// seq is a sequence's slot in the K/V pool.
type seq struct {
	d    *Device
	slot int
	ctx  int
	n    int
}

func (s *seq) Len() int { return s.n }
func (s *seq) Cap() int { return s.ctx }
func (s *seq) Bytes() int64 {
	return s.d.kvBytes(*s.d.spec) + s.d.spec.StateBytes()
}

// kvHalfFor reports whether spec's K/V cache is float16 on d: with
// Options.KVF16, heads that fit attn_tiles_h, and a model whose matrices
// are mostly quantized (those loaded since the last NewSeq; none loaded:
// the last model's choice). Float models keep float32: their results are
// held to 1e-4 of the logits' RMS against a float64 run of transformers,
// and a float16 cache alone moved the f32 fixtures 3e-4 (H200, stop 20).
func (d *Device) kvHalfFor(spec backend.SeqSpec) bool {
	mostlyQuant := d.kvWant
	if d.floatBytes+d.quantBytes > 0 {
		mostlyQuant = d.quantBytes > d.floatBytes
	}
	return d.opt.KVF16 && kern.AttnTilesFits(spec.HeadDim, 8, true) && mostlyQuant
}

// kvBytes is one sequence's K/V cache on d (float16 halves spec.KVBytes):
// the pool's element once it is allocated, else what allocKV would pick.
func (d *Device) kvBytes(spec backend.SeqSpec) int64 {
	if d.spec != nil && d.kvHalf || d.spec == nil && d.kvHalfFor(spec) {
		return spec.KVBytes(d.opt.Ctx) / 2
	}
	return spec.KVBytes(d.opt.Ctx)
}

// kvElem is the K/V cache's element size in bytes.
func (d *Device) kvElem() int64 {
	if d.kvHalf {
		return 2
	}
	return 4
}

// Truncate keeps the first n positions; a sequence with linear-attention
// state can only be emptied (its state zeroed) or kept as is.
func (s *seq) Truncate(n int) error {
	if n < 0 || n > s.n {
		return fmt.Errorf("cuda: truncate to %d positions, the sequence holds %d", n, s.n)
	}
	if len(s.d.spec.DeltaNet) > 0 && n != s.n {
		if n != 0 {
			return fmt.Errorf("cuda: truncate to %d of %d positions: %w", n, s.n, backend.ErrNotRewindable)
		}
		s.d.mu.Lock()
		err := s.d.zeroState(s.slot)
		s.d.mu.Unlock()
		if err != nil {
			return err
		}
	}
	s.n = n
	return nil
}

// NewSeq takes a free slot of the K/V pool (allocated at the first call
// for Options.Seqs sequences of Options.Ctx positions).
func (d *Device) NewSeq(spec backend.SeqSpec, ctx int) (backend.Seq, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ctx <= 0 || ctx > d.opt.Ctx {
		return nil, fmt.Errorf("cuda: context %d outside 1..%d (the K/V pool was sized at Open)", ctx, d.opt.Ctx)
	}
	if err := checkSpec(spec); err != nil {
		return nil, err
	}
	// A model loaded since the last NewSeq decides the cache's element.
	if d.floatBytes+d.quantBytes > 0 {
		d.kvWant = d.quantBytes > d.floatBytes
		d.floatBytes, d.quantBytes = 0, 0
	}
	if d.spec != nil && (!sameSpec(*d.spec, spec) || d.kvHalf != d.kvHalfFor(spec)) {
		if len(d.free) != d.opt.Seqs {
			return nil, fmt.Errorf("cuda: a K/V pool serves one model's sequences (%d of another model's are live)", d.opt.Seqs-len(d.free))
		}
		// Every slot is free: the pool is rebuilt for the new model.
		if err := d.freeKV(); err != nil {
			return nil, err
		}
	}
	if d.spec == nil {
		if err := d.allocKV(spec); err != nil {
			return nil, err
		}
	}
	if len(d.free) == 0 {
		return nil, fmt.Errorf("cuda: all %d sequence slots are in use", d.opt.Seqs)
	}
	s := &seq{d: d, slot: d.free[len(d.free)-1], ctx: ctx}
	if err := d.zeroState(s.slot); err != nil {
		return nil, err
	}
	d.free = d.free[:len(d.free)-1]
	return s, nil
}

// checkSpec validates a sequence spec's layers and DeltaNet shape.
func checkSpec(spec backend.SeqSpec) error {
	att := map[int]bool{}
	for _, l := range spec.Attention {
		if l < 0 || l >= spec.Layers {
			return fmt.Errorf("cuda: attention layer %d of %d", l, spec.Layers)
		}
		att[l] = true
	}
	if len(spec.DeltaNet) == 0 {
		return nil
	}
	g := spec.DeltaNetShape
	if g.KeyHeads <= 0 || g.ValueHeads <= 0 || g.ValueHeads%g.KeyHeads != 0 || g.KeyDim <= 0 || g.ValueDim <= 0 || g.ConvKernel < 2 {
		return fmt.Errorf("cuda: Gated DeltaNet state of shape %+v", g)
	}
	for _, l := range spec.DeltaNet {
		if l < 0 || l >= spec.Layers || att[l] {
			return fmt.Errorf("cuda: Gated DeltaNet layer %d of %d (or also an attention layer)", l, spec.Layers)
		}
		att[l] = true
	}
	return nil
}

// zeroState zeroes slot's linear-attention state in every DeltaNet layer
// (a new or emptied sequence), through zeros in the stage (d.mu held).
func (d *Device) zeroState(slot int) error {
	if d.spec == nil || len(d.spec.DeltaNet) == 0 {
		return nil
	}
	per := d.spec.DeltaNetShape.StateBytes()
	err := d.mutate(func(r runner) error {
		stage := r.stage()
		n := int(min(int64(len(stage)), per))
		clear(stage[:n])
		for _, l := range d.spec.DeltaNet {
			base := d.ls[l].Add(int64(slot) * per)
			for off := int64(0); off < per; off += int64(n) {
				if err := r.htod(base.Add(off), 0, int(min(int64(n), per-off))); err != nil {
					return err
				}
			}
		}
		return r.sync() // the stage is reused after the copies
	})
	if err != nil {
		return fmt.Errorf("cuda: zeroing the linear-attention state of slot %d: %w", slot, err)
	}
	return nil
}

// stateCopy copies slot's linear-attention state of every DeltaNet layer
// (in the spec's order) to host (toHost) or from it, through the stage.
func (d *Device) stateCopy(slot int, host []float32, toHost bool) error {
	per := d.spec.DeltaNetShape.StateBytes()
	return d.mutate(func(r runner) error {
		stage := r.stage()
		chunk := int64(len(stage)) &^ 3
		h := 0 // floats of host done
		for _, l := range d.spec.DeltaNet {
			base := d.ls[l].Add(int64(slot) * per)
			for off := int64(0); off < per; off += chunk {
				n := int(min(chunk, per-off))
				view := unsafe.Slice((*float32)(unsafe.Pointer(&stage[0])), n/4)
				if toHost {
					if err := r.dtoh(0, base.Add(off), n); err != nil {
						return err
					}
					if err := r.sync(); err != nil {
						return err
					}
					copy(host[h:], view)
				} else {
					copy(view, host[h:h+n/4])
					if err := r.htod(base.Add(off), 0, n); err != nil {
						return err
					}
					if err := r.sync(); err != nil {
						return err
					}
				}
				h += n / 4
			}
		}
		return nil
	})
}

// SaveState copies the sequence's linear-attention state (every DeltaNet
// layer's conv inputs and matrices, the CPU's layout) into dst
// (backend.StateSaver). A failed copy is logged and returns an empty
// slice, which RestoreState refuses.
func (s *seq) SaveState(dst []float32) []float32 {
	d := s.d
	n := int(d.spec.StateBytes() / 4)
	if cap(dst) < n {
		dst = make([]float32, n)
	}
	dst = dst[:n]
	if n == 0 || s.slot < 0 {
		return dst[:0]
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.stateCopy(s.slot, dst, true); err != nil {
		slog.Error("cuda: saving a sequence's linear-attention state", "err", err)
		return dst[:0]
	}
	return dst
}

// RestoreState sets the linear-attention state to one SaveState returned
// at length n, and the length to n.
func (s *seq) RestoreState(state []float32, n int) error {
	d := s.d
	if want := int(d.spec.StateBytes() / 4); len(state) != want || want == 0 || s.slot < 0 {
		return fmt.Errorf("cuda: restore a state of %d values into a sequence of %d", len(state), want)
	}
	if n < 0 || n > s.ctx {
		return fmt.Errorf("cuda: restore to length %d, context %d", n, s.ctx)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.stateCopy(s.slot, state, false); err != nil {
		return fmt.Errorf("cuda: restoring the linear-attention state: %w", err)
	}
	s.n = n
	return nil
}

// CopyPrefix copies src's K/V rows [0, n) of every attention layer into
// s (device-to-device).
func (s *seq) CopyPrefix(src backend.Seq, n int) error {
	c, ok := src.(*seq)
	d := s.d
	if !ok || c.d != d || c.slot < 0 || s.slot < 0 {
		return fmt.Errorf("cuda: copy a prefix between sequences of different devices (or a released one)")
	}
	if n < 0 || n > c.ctx || n > s.ctx {
		return fmt.Errorf("cuda: copy %d positions between contexts of %d and %d", n, c.ctx, s.ctx)
	}
	if n == 0 || c == s {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	nkv, hd, ctx, es := int64(d.spec.KVHeads), int64(d.spec.HeadDim), int64(d.opt.Ctx), d.kvElem()
	err := d.mutate(func(r runner) error {
		for _, l := range d.spec.Attention {
			for _, p := range []driver.DevicePtr{d.kc[l], d.vc[l]} {
				for h := range nkv {
					dst := p.Add(es * ((int64(s.slot)*nkv + h) * ctx * hd))
					from := p.Add(es * ((int64(c.slot)*nkv + h) * ctx * hd))
					if err := r.dtod(dst, from, es*int64(n)*hd); err != nil {
						return err
					}
				}
			}
		}
		return r.sync()
	})
	if err != nil {
		return fmt.Errorf("cuda: copying a %d-position prefix: %w", n, err)
	}
	return nil
}

func sameSpec(a, b backend.SeqSpec) bool {
	return a.Layers == b.Layers && a.KVHeads == b.KVHeads && a.HeadDim == b.HeadDim && slices.Equal(a.Attention, b.Attention) &&
		slices.Equal(a.DeltaNet, b.DeltaNet) && (len(a.DeltaNet) == 0 || a.DeltaNetShape == b.DeltaNetShape)
}

// allocKV allocates every attention layer's pool:
// cache[((slot·nkv + h)·ctx + t)·hd + d], float32 or (kvHalfFor) float16.
func (d *Device) allocKV(spec backend.SeqSpec) error {
	d.kvHalf = d.kvHalfFor(spec)
	per := int64(d.opt.Seqs) * int64(spec.KVHeads) * int64(d.opt.Ctx) * int64(spec.HeadDim) * d.kvElem()
	d.kc, d.vc = make([]driver.DevicePtr, spec.Layers), make([]driver.DevicePtr, spec.Layers)
	err := d.mutate(func(r runner) error {
		for _, l := range spec.Attention {
			for _, dst := range []*driver.DevicePtr{&d.kc[l], &d.vc[l]} {
				p, err := r.alloc(per)
				if err != nil {
					return err
				}
				*dst = p
				d.allocs = append(d.allocs, p)
			}
		}
		if len(spec.DeltaNet) > 0 {
			d.ls = make([]driver.DevicePtr, spec.Layers)
		}
		for _, l := range spec.DeltaNet {
			p, err := r.alloc(int64(d.opt.Seqs) * spec.DeltaNetShape.StateBytes())
			if err != nil {
				return err
			}
			d.ls[l] = p
			d.allocs = append(d.allocs, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cuda: K/V pool of %s (and linear-attention state of %s): %w", gb(2*per*int64(len(spec.Attention))),
			gb(int64(d.opt.Seqs)*spec.StateBytes()), err)
	}
	sp := spec
	d.spec = &sp
	for i := d.opt.Seqs - 1; i >= 0; i-- {
		d.free = append(d.free, i)
	}
	return nil
}

// freeKV frees the K/V pool (every slot free, no step in flight).
func (d *Device) freeKV() error {
	err := d.mutate(func(r runner) error {
		var errs []error
		for _, ps := range [][]driver.DevicePtr{d.kc, d.vc, d.ls} {
			for _, p := range ps {
				if p != 0 {
					errs = append(errs, r.free(p))
					d.allocs = slices.DeleteFunc(d.allocs, func(q driver.DevicePtr) bool { return q == p })
				}
			}
		}
		return errors.Join(errs...)
	})
	d.kc, d.vc, d.ls, d.free, d.spec = nil, nil, nil, nil, nil
	if err != nil {
		return fmt.Errorf("cuda: freeing the K/V pool: %w", err)
	}
	return nil
}

// Release returns a sequence's slot to the pool.
func (d *Device) Release(s backend.Seq) {
	if c, ok := s.(*seq); ok && c.d == d && c.slot >= 0 {
		d.mu.Lock()
		d.free = append(d.free, c.slot)
		c.slot = -1
		d.mu.Unlock()
	}
}

var (
	_ backend.Device     = (*Device)(nil)
	_ backend.Planner    = (*Device)(nil)
	_ backend.Releaser   = (*Device)(nil)
	_ backend.StepTimer  = (*Device)(nil)
	_ backend.StateSaver = (*seq)(nil)
)
