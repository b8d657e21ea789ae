package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cortiq/cortiq/backend/cuda"
	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/sample"
	"github.com/cortiq/cortiq/synth"
	"github.com/cortiq/cortiq/tokenizer"
)

var (
	tinyOnce sync.Once
	tinyPath string
	tinyErr  error
)

// tinyModel synthesizes the tiny_llama shape (hidden 64, 2 layers, a
// 300-token byte vocabulary: every id but the specials has text) once per
// test run: a model whose step is so cheap that the server's own work
// shows.
func tinyModel(tb testing.TB) string {
	tb.Helper()
	tinyOnce.Do(func() {
		tinyPath = filepath.Join(fixtureDir, "tiny_llama.cmf")
		a, err := synth.Arch("tiny_llama", "")
		if err != nil {
			tinyErr = err
			return
		}
		_, tinyErr = synth.Write(context.Background(), tinyPath, a, quant.Q8Row, synth.Options{Seed: 3})
	})
	if tinyErr != nil {
		tb.Fatal(tinyErr)
	}
	return tinyPath
}

// loadEngine opens the model at path for seqs sequences of ctxLen tokens:
// on the GPU with CORTIQ_LOAD_DEVICE=cuda (graphs and PDL, as cortiq serve
// opens it; CORTIQ_CUDA_MMQ=0 selects the bf16 GEMM), else on the CPU.
func loadEngine(tb testing.TB, path string, seqs, ctxLen int) *engine.Engine {
	tb.Helper()
	opt := engine.Options{}
	if os.Getenv("CORTIQ_LOAD_DEVICE") == "cuda" {
		dev, err := cuda.Open(cuda.Options{Seqs: seqs, Ctx: ctxLen, Graphs: true, PDL: true, NoMMQ: os.Getenv("CORTIQ_CUDA_MMQ") == "0", F16Wide: os.Getenv("CORTIQ_CUDA_MMQ") != "int8",
			KVF16: os.Getenv("CORTIQ_CUDA_KV") != "f32"}) // as cortiq serve opens it
		if err != nil {
			tb.Fatal(err)
		}
		opt.Device, opt.OwnDevice = dev, true
	}
	e, err := engine.Open(path, opt)
	if err != nil {
		tb.Fatal(err)
	}
	return e
}

// stepLog collects the scheduler's steps (Config.onStep).
type stepLog struct {
	mu    sync.Mutex
	steps []stepInfo
}

func (l *stepLog) record(s stepInfo) {
	l.mu.Lock()
	l.steps = append(l.steps, s)
	l.mu.Unlock()
}

func (l *stepLog) take() []stepInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.steps
	l.steps = nil
	return s
}

// steadyPeriods returns, for each pair of consecutive steps that both
// decode exactly n sequences (no prefill, no row missing), the loop's
// period (start to start) and the engine time of the first step.
func steadyPeriods(steps []stepInfo, n int) (period, eng, loop []time.Duration) {
	for k := 0; k+1 < len(steps); k++ {
		a, b := steps[k], steps[k+1]
		if a.rows == n && a.decode == n && b.rows == n && b.decode == n {
			p := b.start.Sub(a.start)
			period, eng, loop = append(period, p), append(eng, a.engine), append(loop, p-a.engine)
		}
	}
	return period, eng, loop
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// maxStepRows bounds the rows of one step in BenchmarkServeStep (a CUDA
// device is opened for 512).
const maxStepRows = 512

// engineSteps decodes newTok tokens in each of the sessions together from
// the prompts (StepNext over the prompts, as many at a time as fit
// maxStepRows, then one StepNext per token, each sequence's greedy id fed
// back, as a greedy server step runs) and returns the time of each decode
// step.
func engineSteps(tb testing.TB, e *engine.Engine, ss []*engine.Session, prompts [][]int, newTok int) []time.Duration {
	tb.Helper()
	next := make([]int, len(ss))
	toks := make([][]int, len(ss))
	for _, s := range ss {
		s.Reset()
	}
	per := max(1, maxStepRows/len(prompts[0]))
	for a := 0; a < len(ss); a += per {
		b := min(a+per, len(ss))
		if _, err := e.StepNext(ss[a:b], prompts[a:b], nil, next[a:b]); err != nil {
			tb.Fatal(err)
		}
	}
	var dts []time.Duration
	for range newTok - 1 {
		for i := range toks {
			toks[i] = next[i : i+1]
		}
		t0 := time.Now()
		if _, err := e.StepNext(ss, toks, nil, next); err != nil {
			tb.Fatal(err)
		}
		dts = append(dts, time.Since(t0))
	}
	return dts
}

// BenchmarkServeStep measures the server's host overhead per batched
// decode step against the engine's own step on the same model, in the same
// run. Each iteration decodes CORTIQ_LOAD_TOKENS (64) tokens after prompts
// of CORTIQ_LOAD_PROMPT (16) tokens in 64 sequences twice: once by calling
// engine.StepNext directly (greedy ids fed back: what cortiq bench
// --batches 64 times, but from the same positions as the server), once
// through the server (64 concurrent streaming completions over loopback
// HTTP, temperature 0, no logprobs, usage counted, as the load test's
// usage variant). For the server the step time is the scheduler loop's
// period between two consecutive steps that both decode all 64 sequences,
// so it holds the server's work around the step (emitting tokens, waking
// the streams, building the next batch) and whatever the stream handlers
// take from the step by running beside it.
//
// Metrics (medians over the steady steps): engine-us/step, server-us/step,
// host-us/step (their difference), server/engine (the ratio: 1 is no
// overhead), engine-tok/s and server-tok/s (64 / step time),
// in-loop-engine-us/step (the engine step as timed inside the server) and
// loop-us/step (the loop's own work between two engine steps: emitting the
// tokens, bookkeeping, building the next batch). On the CPU the step
// shares the cores with the stream handlers, so in-loop-engine-us/step is
// above engine-us/step; on a GPU the handlers run on other cores and
// loop-us/step is the host share that stays serial.
//
// CORTIQ_SERVE_PPROF=PREFIX writes PREFIX.cpu, PREFIX.mutex and
// PREFIX.block profiles of the server rounds only.
//
// CORTIQ_LOAD_MODE=logprobs makes the server's requests ask for logprobs
// (every row's logits to the host, sampled there) while the engine side
// stays on ids: the ratio then also holds the logits path.
//
// The model is a synthesized tiny_llama (a step of some tens of
// microseconds, so the server's share shows) unless CORTIQ_LOAD_MODEL
// names one; CORTIQ_LOAD_DEVICE=cuda runs it on the GPU.
//
//	go test ./server -run '^$' -bench ServeStep -benchtime 3x
func BenchmarkServeStep(b *testing.B) {
	path := os.Getenv("CORTIQ_LOAD_MODEL")
	if path == "" {
		path = tinyModel(b)
	}
	const streams = 64
	promptLen, newTok := 16, 64
	if v := os.Getenv("CORTIQ_LOAD_TOKENS"); v != "" {
		fmt.Sscan(v, &newTok)
	}
	if v := os.Getenv("CORTIQ_LOAD_PROMPT"); v != "" {
		fmt.Sscan(v, &promptLen)
	}
	mode := withUsage
	if os.Getenv("CORTIQ_LOAD_MODE") == "logprobs" {
		mode = withLogprobs
	}
	ctxLen := promptLen + newTok + 16
	e := loadEngine(b, path, 2*streams, ctxLen)
	defer e.Close()
	tap := newTokenTap()
	steps := &stepLog{}
	// The streams are admitted together (admitAt) and as many prompts
	// prefill in one step as fit maxStepRows beside the decode rows
	// (PrefillSeqs), so that all of them decode together through most of
	// the reply.
	chunk := min(promptLen, 256)
	pre := max(1, (maxStepRows-streams)/chunk)
	s := New(Config{Parallel: streams, Queue: streams, Ctx: ctxLen, PrefillChunk: chunk, PrefillSeqs: pre, ModelName: "m", admitAt: streams,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), onToken: tap.record, onStep: steps.record})
	if err := s.Attach(e); err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(s)
	defer func() { ts.CloseClientConnections(); s.Close(); ts.Close() }()
	ss := make([]*engine.Session, streams)
	prompts := make([][]int, streams)
	for i := range ss {
		var err error
		if ss[i], err = e.NewSession(ctxLen); err != nil {
			b.Fatal(err)
		}
		defer ss[i].Close()
		prompts[i] = make([]int, promptLen)
		for k := range prompts[i] {
			prompts[i][k] = 1 + (i*31+k*7)%200 // as runLoad's prompts
		}
	}
	// Warm up both (pages the weights in; on a GPU records the graphs).
	engineSteps(b, e, ss, prompts, min(newTok, 4))
	runLoad(b, ts.URL, streams, streams, promptLen, min(newTok, 4), mode, tap)
	steps.take()

	prof := startProfiles(b, os.Getenv("CORTIQ_SERVE_PPROF"))
	var engAll, srvAll, inLoop, loop []time.Duration
	b.ResetTimer()
	for range b.N {
		engAll = append(engAll, engineSteps(b, e, ss, prompts, newTok)...)
		prof.resume()
		runLoad(b, ts.URL, streams, streams, promptLen, newTok, mode, tap)
		prof.pause()
		p, in, l := steadyPeriods(steps.take(), streams)
		srvAll, inLoop, loop = append(srvAll, p...), append(inLoop, in...), append(loop, l...)
	}
	b.StopTimer()
	prof.finish()
	if len(srvAll) == 0 {
		b.Fatal("no two consecutive server steps decoded all streams")
	}
	if ids := s.b.Load().sch.idSteps.Load(); (mode == withUsage) != (ids > 0) {
		b.Fatalf("%v: %d server steps took the ids path", mode, ids)
	}
	eng, srv, in := median(engAll), median(srvAll), median(inLoop)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	b.ReportMetric(us(eng), "engine-us/step")
	b.ReportMetric(us(srv), "server-us/step")
	b.ReportMetric(us(srv-eng), "host-us/step")
	b.ReportMetric(float64(srv)/float64(eng), "server/engine")
	b.ReportMetric(us(in), "in-loop-engine-us/step")
	b.ReportMetric(us(median(loop)), "loop-us/step")
	b.ReportMetric(streams/eng.Seconds(), "engine-tok/s")
	b.ReportMetric(streams/srv.Seconds(), "server-tok/s")
	b.Logf("%v, %d-token prompts, %d new tokens: %d engine steps, %d steady server steps", mode, promptLen, newTok, len(engAll), len(srvAll))
}

// profiles records CPU, mutex and block profiles over the resumed spans
// (the CPU profile is stopped and restarted; the others accumulate from
// the first resume, so they also hold what ran between the spans).
type profiles struct {
	tb     testing.TB
	prefix string
	cpu    []*os.File
}

func startProfiles(tb testing.TB, prefix string) *profiles {
	p := &profiles{tb: tb, prefix: prefix}
	if prefix != "" {
		runtime.SetMutexProfileFraction(1)
		runtime.SetBlockProfileRate(int(10 * time.Microsecond))
	}
	return p
}

func (p *profiles) resume() {
	if p.prefix == "" {
		return
	}
	f, err := os.Create(fmt.Sprintf("%s.cpu.%d", p.prefix, len(p.cpu)))
	if err != nil {
		p.tb.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		p.tb.Fatal(err)
	}
	p.cpu = append(p.cpu, f)
}

func (p *profiles) pause() {
	if p.prefix == "" {
		return
	}
	pprof.StopCPUProfile()
	p.cpu[len(p.cpu)-1].Close()
}

func (p *profiles) finish() {
	if p.prefix == "" {
		return
	}
	for _, name := range []string{"mutex", "block"} {
		f, err := os.Create(p.prefix + "." + name)
		if err != nil {
			p.tb.Fatal(err)
		}
		if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
			p.tb.Fatal(err)
		}
		f.Close()
	}
	runtime.SetMutexProfileFraction(0)
	runtime.SetBlockProfileRate(0)
}

// BenchmarkEmitToken times the scheduler's serial work for one decoded
// row after a step (emitNext: sampler history, detokenization, stop check,
// metrics, queueing the event; the publisher's send is not in it) on the
// fixture's Qwen3 tokenizer; ×64 it is the loop's token share of a
// 64-stream step.
func BenchmarkEmitToken(b *testing.B) {
	e := openFixture(b)
	s := &scheduler{e: e, m: newMetrics()}
	ss, err := e.NewSession(64)
	if err != nil {
		b.Fatal(err)
	}
	defer ss.Close()
	ids, err := e.Encode("The quick brown fox jumps over the lazy dog, again and again, until the night falls.", false)
	if err != nil {
		b.Fatal(err)
	}
	newJob := func() *job {
		j := &job{ctx: context.Background(), prompt: []int{1}, max: b.N + 1, ignoreEOS: true}
		sm, err := sample.New(sample.Params{})
		if err != nil {
			b.Fatal(err)
		}
		j.sm, j.stop, j.dec, j.first = sm, sample.NewStopChecker(nil, nil), tokenizer.NewDecoder(e.Tok), true
		return j
	}
	sl := &slot{s: ss, j: newJob()}
	now := time.Now()
	b.ResetTimer()
	for i := range b.N {
		s.emitNext(sl, sample.Result{Token: int32(ids[i%len(ids)])}, now)
		if len(s.out) >= 64 {
			s.out = s.out[:0] // what flush hands over each step
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)*64/1e3, "us/64-row-step")
}
