package cuda_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/backendtest"
	"github.com/cortiq/cortiq/backend/cpu"
	"github.com/cortiq/cortiq/backend/cuda"
	"github.com/cortiq/cortiq/quant"
)

// open opens GPU 0 for the tests, or skips with the reason.
func open(t *testing.T, opt cuda.Options) *cuda.Device {
	t.Helper()
	d, err := cuda.Open(opt)
	if errors.Is(err, backend.ErrNoDevice) {
		t.Skipf("no GPU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestOpenWithoutGPU runs everywhere: without a usable GPU, Open fails with
// backend.ErrNoDevice and one line saying why; with one, it opens.
func TestOpenWithoutGPU(t *testing.T) {
	d, err := cuda.Open(cuda.Options{Seqs: 1, Ctx: 16})
	if err == nil {
		t.Logf("a GPU is present: %s", d.Name())
		d.Close()
		return
	}
	if !errors.Is(err, backend.ErrNoDevice) {
		t.Fatalf("Open without a GPU: %v does not wrap ErrNoDevice", err)
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || len(msg) < 20 {
		t.Fatalf("the reason should be one informative line: %q", msg)
	}
	if _, err := cuda.Open(cuda.Options{}); err == nil || errors.Is(err, backend.ErrNoDevice) {
		t.Fatalf("Open without a K/V pool size must be refused as a usage error: %v", err)
	}
}

// TestGPUParity runs the parity suite on the GPU (default options: the
// int8 GEMM for every step of more than 8 rows) against the CPU backend:
// every op × format × attention variant × schedule. Quantized formats are
// held to 1e-5: the int8 GEMM and the mq_* matvecs quantize activations
// per block of 32 as the CPU's kernels do, so only float rounding is left
// (TestGPUMMQParity logs the distances; the fake's models,
// TestParitySuiteNumericOnFakeMMQ, are within 3e-7).
func TestGPUParity(t *testing.T) {
	parityAgainstCPU(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64}, 1e-5, 1e-5)
}

// parityAgainstCPU runs the parity suite on a device opened with opt
// against the CPU backend: f32 held to 1e-10, q8_row and q8_2f to q8, q4tp
// to q4, the float16 formats to 1e-9.
func parityAgainstCPU(t *testing.T, opt cuda.Options, q8, q4 float64) {
	parityAgainstCPUTol(t, opt, 1e-10, 1e-9, q8, q4)
}

// parityAgainstCPUTol is parityAgainstCPU with the float formats'
// tolerances given too (f32, and f16 / bf16).
func parityAgainstCPUTol(t *testing.T, opt cuda.Options, f32, f16, q8, q4 float64) {
	g := open(t, opt)
	c := cpu.New(2)
	defer c.Close()
	backendtest.Parity(t, g, c, func(k backendtest.Case) float64 {
		switch k.DType {
		case quant.F32:
			return f32
		case quant.Q8Row, quant.Q82F:
			return q8
		case quant.Q4TP:
			return q4
		}
		return f16
	})
}

// TestGPUParityKVF16: the parity suite with Options.KVF16 (float16 K/V
// cache: rope_qk_append_h, attn_tiles_h) against the CPU's float32 cache,
// the quantized formats within 1e-4 (the cache's rounding; the fake's
// model of the same kernels, TestParitySuiteNumericOnFakeKVF16, saw at
// most 4e-5), the float cases, which keep the float32 cache (the pool
// rebuilt between the cases), at TestGPUParity's tolerances.
func TestGPUParityKVF16(t *testing.T) {
	parityAgainstCPUTol(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: true, KVF16: true}, 1e-10, 1e-9, 1e-4, 1e-4)
}

// TestGPUParityF16Wide: the parity suite with Options.F16Wide, where
// q4tp's steps of 33 to 64 rows take the half wide tiles (f16
// activations and weights: kern.GemmQ.F16, with attn_tiles' f16 copy for
// o_proj and SwiGLU in gate|up's epilogue) and the rest the int8 GEMM:
// q4tp held to TestGPUParityBF16GEMM's 3e-4 (the CPU rounds activations
// to int8 per block of 32, this path to f16), the other quantized formats
// to 1e-5.
func TestGPUParityF16Wide(t *testing.T) {
	parityAgainstCPU(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64, F16Wide: true}, 1e-5, 3e-4)
}

// TestGPUParityBF16GEMM: the parity suite with Options.NoMMQ (steps of
// more than 8 rows over quantized weights on the bf16 tensor-core GEMM).
// The CPU runs quantized formats on int8 activations; this path on bf16
// ones. The kernels' exact models on the fake device
// (TestParitySuiteNumericOnFake) are already 1.1e-4 from the CPU here, so
// 1e-4 would fail correct kernels.
func TestGPUParityBF16GEMM(t *testing.T) {
	parityAgainstCPU(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64, NoMMQ: true}, 3e-4, 3e-4)
}

// runCase runs case k over sched on d. A case d does not implement yet (an
// error wrapping backend.ErrUnsupported) is logged as NOT RUN and reported
// as not run, as backendtest.Parity does; any other error fails the test.
func runCase(t *testing.T, d backend.Device, k backendtest.Case, sched []backendtest.Step, seed uint64) ([]float32, bool) {
	t.Helper()
	out, err := backendtest.Run(d, k, sched, seed)
	if errors.Is(err, backend.ErrUnsupported) {
		t.Logf("NOT RUN: %s on %s: %v", k.Name, d.Name(), err)
		return nil, false
	}
	if err != nil {
		t.Fatalf("%s on %s: %v", k.Name, d.Name(), err)
	}
	return out, true
}

// dense reports a case of the ops the CUDA device implements today (the
// llama/qwen2/qwen3 blocks): such a case must run, never be NOT RUN.
func dense(k backendtest.Case) bool {
	return (k.Op == "attention" && !k.Gated) || k.Op == "mlp" || k.Op == "head"
}

// compareRuns runs each case on a and b and fails where their logits are
// not identical; unsupported cases are NOT RUN, except dense ones, which
// fail. It fails when no case was compared and returns how many were.
func compareRuns(t *testing.T, a, b backend.Device, cases []backendtest.Case, sched []backendtest.Step, seed uint64, what string) int {
	t.Helper()
	return compareRunsTol(t, a, b, cases, sched, seed, what, 0)
}

// compareRunsTol is compareRuns holding the logits to an NMSE of tol
// instead of bit equality.
func compareRunsTol(t *testing.T, a, b backend.Device, cases []backendtest.Case, sched []backendtest.Step, seed uint64, what string, tol float64) int {
	t.Helper()
	n := 0
	for _, k := range cases {
		x, ok := runCase(t, a, k, sched, seed)
		if !ok {
			if dense(k) {
				t.Errorf("%s: a dense case is not supported on %s", k.Name, a.Name())
			}
			continue
		}
		y, ok := runCase(t, b, k, sched, seed)
		if !ok {
			t.Errorf("%s: runs on %s but not on %s", k.Name, a.Name(), b.Name())
			continue
		}
		if e := backendtest.NMSE(x, y); !(e <= tol) {
			t.Errorf("%s: %s (NMSE %.3g)", k.Name, what, e)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no case was compared")
	}
	t.Logf("%d of %d cases compared", n, len(cases))
	return n
}

// TestGPUEagerEqualsPlain: the same schedule with a sync after every op
// gives identical logits.
func TestGPUEagerEqualsPlain(t *testing.T) {
	g := open(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64})
	e := open(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64, Eager: true})
	s := backendtest.Schedules()["three_sequences"]
	compareRuns(t, g, e, backendtest.Cases()[:6], s, 2, "eager and plain differ")
}

// TestGPUMemoryPlan: a plan that does not fit is refused naming the
// numbers, before anything is uploaded.
func TestGPUMemoryPlan(t *testing.T) {
	g := open(t, cuda.Options{Seqs: 1, Ctx: 16})
	spec := backend.SeqSpec{Layers: 1, Attention: []int{0}, KVHeads: 1, HeadDim: 8}
	err := g.Plan(1<<50, spec, 64)
	if err == nil || !strings.Contains(err.Error(), "is free") {
		t.Fatalf("a 1 PB model was planned: %v", err)
	}
	if err := g.Plan(1<<20, spec, 64); err != nil {
		t.Fatal(err)
	}
}

// TestGPUGraphReplayEqualsEager: decode steps replayed from captured
// graphs give exactly the logits of eager launches, across lengths (the
// graph reads lengths on the device) and batch shapes, for every attention
// case the device implements (gated attention is NOT RUN until it does;
// the dense cases must all be compared).
func TestGPUGraphReplayEqualsEager(t *testing.T) {
	g := open(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: true})
	e := open(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64, Eager: true})
	sched := []backendtest.Step{{{0, 7}, {1, 3}, {2, 12}}}
	for range 20 {
		sched = append(sched, backendtest.Step{{0, 1}, {1, 1}, {2, 1}})
	}
	for range 5 {
		sched = append(sched, backendtest.Step{{1, 1}})
	}
	var cases []backendtest.Case
	for _, k := range backendtest.Cases() {
		if k.Op == "attention" {
			cases = append(cases, k)
		}
	}
	compareRuns(t, g, e, cases, sched, 4, "replayed graphs differ from eager launches")
	if g.Replays() == 0 {
		t.Fatal("no step was replayed from a graph")
	}
}

// TestGPUFusedEqualsUnfused: decode steps with the norm and SwiGLU in the
// quantized matvecs' prologues (and q|k|v, gate|up stacked in one launch)
// give the logits of separate rmsnorm/silu_mul launches: the prologue
// computes the same float32 values (Σx² in another order), so the int8
// activations agree.
func TestGPUFusedEqualsUnfused(t *testing.T) {
	g := open(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64})
	u := open(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64, NoFusion: true})
	ran := 0
	for _, k := range backendtest.Cases() {
		if k.DType != quant.Q8Row && k.DType != quant.Q4TP {
			continue
		}
		s := backendtest.Schedules()["three_sequences"]
		a, err := backendtest.Run(g, k, s, 2)
		if errors.Is(err, backend.ErrUnsupported) {
			t.Logf("NOT RUN: %s: %v", k.Name, err)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := backendtest.Run(u, k, s, 2)
		if err != nil {
			t.Fatal(err)
		}
		if n := backendtest.NMSE(a, b); n > 1e-9 {
			t.Errorf("%s: fused and unfused decode differ (NMSE %.3g)", k.Name, n)
		}
		ran++
	}
	if ran == 0 {
		t.Fatal("no q8_row or q4tp case ran")
	}
}

// TestGPUBranchEqualsSerial: by default (not Options.NoBranch) the MoE
// cases with a shared expert run its decode launches on the side stream (forked and
// joined inside each replayed graph) and give the logits of the default
// single stream, eager and from graphs, over decode steps of three
// sequences: the same kernels, the shared gate|up's norm in its own
// prologue (Σx² summed in another order, so within 1e-9, not bitwise).
func TestGPUBranchEqualsSerial(t *testing.T) {
	sched := []backendtest.Step{{{0, 7}, {1, 3}, {2, 12}}}
	for range 12 {
		sched = append(sched, backendtest.Step{{0, 1}, {1, 1}, {2, 1}})
	}
	for _, graphs := range []bool{false, true} {
		b := open(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: graphs})
		s := open(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: graphs, NoBranch: true})
		var cases []backendtest.Case
		for _, k := range backendtest.Cases() {
			if k.Op == "moe" && k.Shared && (k.DType == quant.Q4TP || k.DType == quant.Q8Row) {
				cases = append(cases, k)
			}
		}
		compareRunsTol(t, b, s, cases, sched, 6, fmt.Sprintf("the side stream's logits differ from one stream's (graphs %v)", graphs), 1e-9)
		if graphs && b.Replays() == 0 {
			t.Fatal("no step was replayed from a graph")
		}
	}
}

// TestGPUReadProbe: the device's read probe (backend.Prober, what cortiq
// bench compares decode rows with) gives a bandwidth the GPU can have
// (targets.md: 4547 GB/s best of 10 on the H200; kern's
// BenchmarkGPUReadProbe measured 4513), over the default, a small and an
// odd-sized buffer.
func TestGPUReadProbe(t *testing.T) {
	g := open(t, cuda.Options{Seqs: 1, Ctx: 16})
	var p backend.Prober = g
	for _, n := range []int64{0, 64 << 20, 1<<30 + 5} {
		gbps, err := p.ReadProbe(n)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("read probe over %d bytes (0: 1 GiB): %.0f GB/s", n, gbps)
		if !(gbps > 50 && gbps < 50000) {
			t.Errorf("read probe over %d bytes: %g GB/s", n, gbps)
		}
	}
}

// TestGPUPDLEqualsPlain: programmatic dependent launch (every kernel
// starting while its predecessor finishes, graphs recorded with it) gives
// the logits of plain launches, bit for bit, for every case the device
// runs: a kernel that read an input before griddepcontrol.wait would show
// here as a difference.
func TestGPUPDLEqualsPlain(t *testing.T) {
	p := open(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: true, PDL: true})
	g := open(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: true})
	ran := 0
	for _, k := range backendtest.Cases() {
		for name, s := range backendtest.Schedules() {
			a, err := backendtest.Run(p, k, s, 2)
			if errors.Is(err, backend.ErrUnsupported) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			b, err := backendtest.Run(g, k, s, 2)
			if err != nil {
				t.Fatal(err)
			}
			if n := backendtest.NMSE(a, b); n != 0 {
				t.Errorf("%s/%s: PDL launches differ from plain ones (NMSE %.3g)", k.Name, name, n)
			}
			ran++
		}
	}
	if ran == 0 {
		t.Fatal("no case ran")
	}
	t.Logf("%d case × schedule pairs compared", ran)
}

// TestGPUGreedyIDs: greedy ids picked on the GPU (Batch.Next: only the ids
// come back) are the argmax of the logits the same steps return, for
// every dense case and schedule (ties to the lowest id).
func TestGPUGreedyIDs(t *testing.T) {
	open(t, cuda.Options{Seqs: 1, Ctx: 16}) // skips without a GPU
	backendtest.CheckGreedy(t, func() backend.Device {
		d, err := cuda.Open(cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: true, PDL: true})
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
}

// TestGPUMMQParity: by default (not Options.NoMMQ: steps of more than 8 rows over
// q8_row, q8_2f and q4tp on the int8 tensor-core GEMM) every quantized
// case × schedule gives the CPU backend's logits to rounding (NMSE 1e-5):
// the int8 GEMM quantizes activations as the CPU does, so it models the
// CPU's arithmetic, where the bf16 GEMM rounds activations differently
// (its distance to the CPU, up to ~9e-4 on MoE cases whose routing flips
// on a near tie, is logged beside it; TestGPUParity judges that path).
func TestGPUMMQParity(t *testing.T) {
	q := open(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64})
	g := open(t, cuda.Options{Seqs: 4, Ctx: 128, MaxRows: 64, NoMMQ: true})
	c := cpu.New(2)
	defer c.Close()
	ran := 0
	for _, k := range backendtest.Cases() {
		if k.DType != quant.Q8Row && k.DType != quant.Q82F && k.DType != quant.Q4TP {
			continue
		}
		for name, s := range backendtest.Schedules() {
			a, ok := runCase(t, q, k, s, 3)
			if !ok {
				continue
			}
			b, _ := runCase(t, g, k, s, 3)
			want, _ := runCase(t, c, k, s, 3)
			nd, nc, ndc := backendtest.NMSE(a, b), backendtest.NMSE(a, want), backendtest.NMSE(b, want)
			if nc > 1e-5 || nc != nc {
				t.Errorf("%s / %s: MMQ against the CPU NMSE %.3g (tolerance 1e-5; against the bf16 GEMM %.3g)", k.Name, name, nc, nd)
			}
			if name == "prefill9+decode" || name == "decode_across_64" {
				t.Logf("%s / %s: NMSE MMQ–default %.3g, MMQ–CPU %.3g, default–CPU %.3g", k.Name, name, nd, nc, ndc)
			}
			ran++
		}
	}
	if ran == 0 {
		t.Fatal("no quantized case ran")
	}
}

// TestGPUPrefillAttentionMMA: a 100-row prefill chunk over quantized
// weights with the float16 cache runs its attention on attn_mma_h (the
// fake's TestPrefillChunksTakeAttnMMA checks the choice): heads of 64 and
// 128 dimensions, q8_row and q4tp, the chunk then two decode steps, within
// TestGPUParityKVF16's 1e-4 of the CPU's float32 cache, and within 1e-4 of
// the same device on attn_tiles_h (Options.NoAttnMMA).
func TestGPUPrefillAttentionMMA(t *testing.T) {
	base, ok := backendtest.CaseNamed("attention/q4tp/hd64")
	if !ok {
		t.Fatal("no attention/q4tp/hd64 case in backendtest.Cases")
	}
	mma := open(t, cuda.Options{Seqs: 1, Ctx: 128, MaxRows: 128, KVF16: true})
	tiles := open(t, cuda.Options{Seqs: 1, Ctx: 128, MaxRows: 128, KVF16: true, NoAttnMMA: true})
	c := cpu.New(2)
	defer c.Close()
	sched := []backendtest.Step{{{0, 100}}, {{0, 1}}, {{0, 1}}}
	for _, hd := range []int{64, 128} {
		for _, dt := range []quant.DType{quant.Q8Row, quant.Q4TP} {
			k := base
			k.HeadDim, k.Rope.HeadDim, k.DType = hd, hd, dt
			k.Name = fmt.Sprintf("attention/%s/hd%d", dt, hd)
			got, err := backendtest.Run(mma, k, sched, 7)
			if err != nil {
				t.Fatal(err)
			}
			alt, err := backendtest.Run(tiles, k, sched, 7)
			if err != nil {
				t.Fatal(err)
			}
			want, err := backendtest.Run(c, k, sched, 7)
			if err != nil {
				t.Fatal(err)
			}
			ec, et := backendtest.NMSE(got, want), backendtest.NMSE(got, alt)
			t.Logf("%s: NMSE %.3g against the CPU, %.3g against attn_tiles_h (which is %.3g from the CPU)", k.Name, ec, et, backendtest.NMSE(alt, want))
			if ec > 1e-4 || et > 1e-4 || ec != ec || et != et {
				t.Errorf("%s: NMSE %.3g against the CPU, %.3g against attn_tiles_h (tolerance 1e-4)", k.Name, ec, et)
			}
		}
	}
}
