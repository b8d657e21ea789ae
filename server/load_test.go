package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cortiq/cortiq/backend/cuda"
	"github.com/cortiq/cortiq/engine"
)

// loadMode is how the load test streams and times tokens.
type loadMode int

const (
	// withLogprobs asks for logprobs (0 alternatives) so that every token
	// is one chunk, timed as it arrives. Log-probabilities need each row's
	// logits on the host: the slow path of a batched step.
	withLogprobs loadMode = iota
	// withUsage asks for no logprobs (the greedy fast path: only ids leave
	// the device) and counts the tokens from the stream's usage
	// (stream_options.include_usage). A token's text may be empty or held
	// back (a synthetic model's ids mostly have no text), so tokens are
	// timed in the server as each goes to its stream (tokenTap); the
	// chunks' arrival times bound them.
	withUsage
)

func (m loadMode) String() string {
	if m == withUsage {
		return "no logprobs, usage"
	}
	return "logprobs"
}

// tokenTap records, per request id, when the scheduler handed each token
// to its stream (Config.onToken).
type tokenTap struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func newTokenTap() *tokenTap { return &tokenTap{at: map[string][]time.Time{}} }

func (p *tokenTap) record(id string, at time.Time) {
	p.mu.Lock()
	p.at[id] = append(p.at[id], at)
	p.mu.Unlock()
}

func (p *tokenTap) times(id string) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.at[id]
}

// streamTimes sends one streaming completion (token ids, greedy) and
// returns the arrival time of each token: in mode withLogprobs the chunks
// carrying one, in mode withUsage the server's times from tap (the request
// is sent with X-Request-Id id), after checking that the usage counts n
// tokens and that no token was handed to the stream after the last chunk
// arrived.
func streamTimes(ctx context.Context, url string, prompt []int, n int, mode loadMode, tap *tokenTap, id string) (start time.Time, toks []time.Time, err error) {
	ids := make([]string, len(prompt))
	for i, id := range prompt {
		ids[i] = fmt.Sprint(id)
	}
	extra := `"logprobs":0`
	if mode == withUsage {
		extra = `"stream_options":{"include_usage":true}`
	}
	body := fmt.Sprintf(`{"prompt":[%s],"max_tokens":%d,"temperature":0,"ignore_eos":true,"stream":true,%s}`, strings.Join(ids, ","), n, extra)
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(body))
	req.Header.Set("X-Request-Id", id)
	start = time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return start, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return start, nil, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var lastChunk time.Time
	used := -1
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		lastChunk = time.Now()
		switch mode {
		case withLogprobs:
			if strings.Contains(line, `"token_logprobs":[`) && !strings.Contains(line, `"token_logprobs":[]`) {
				toks = append(toks, lastChunk)
			}
		case withUsage:
			if strings.Contains(data, `"logprobs":{`) {
				return start, nil, fmt.Errorf("a chunk carries logprobs unasked: %s", data)
			}
			var u struct {
				Usage *usage `json:"usage"`
			}
			if strings.Contains(data, `"usage"`) && json.Unmarshal([]byte(data), &u) == nil && u.Usage != nil {
				used = u.Usage.CompletionTokens
			}
		}
	}
	if err := sc.Err(); err != nil {
		return start, toks, err
	}
	if mode == withUsage {
		if used != n {
			return start, nil, fmt.Errorf("usage counts %d completion tokens, want %d", used, n)
		}
		toks = slices.Clone(tap.times(id))
		if len(toks) > 0 && toks[len(toks)-1].After(lastChunk) {
			return start, nil, fmt.Errorf("a token was handed to the stream after its last chunk arrived")
		}
	}
	if len(toks) != n {
		return start, toks, fmt.Errorf("%d tokens streamed, want %d", len(toks), n)
	}
	return start, toks, nil
}

type loadResult struct {
	mode               loadMode
	conc, requests     int
	wall               time.Duration
	tokPerSec          float64 // generated tokens / wall time
	ttftP50, ttftP99   time.Duration
	steadyDecodeTokSec float64 // aggregate decode while every stream of a wave is decoding
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// runLoad sends requests at concurrency conc (each worker one request at a
// time) and measures throughput, time to first token and the aggregate
// decode rate of the first wave (from the moment all its streams have their
// first token to the moment the first one ends).
func runLoad(t testing.TB, url string, conc, requests, promptLen, newTok int, mode loadMode, tap *tokenTap) loadResult {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	type one struct {
		start time.Time
		toks  []time.Time
	}
	res := make([]one, requests)
	next := make(chan int, requests)
	for i := range requests {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	t0 := time.Now()
	for range conc {
		wg.Go(func() {
			for i := range next {
				prompt := make([]int, promptLen)
				for k := range prompt {
					prompt[k] = 1 + (i*31+k*7)%200
				}
				start, toks, err := streamTimes(ctx, url, prompt, newTok, mode, tap, fmt.Sprintf("load-%d-%d-%d", conc, i, loadRuns.Add(1)))
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				res[i] = one{start, toks}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	wall := time.Since(t0)
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	r := loadResult{mode: mode, conc: conc, requests: requests, wall: wall}
	var ttft []time.Duration
	for _, x := range res {
		ttft = append(ttft, x.toks[0].Sub(x.start))
	}
	r.tokPerSec = float64(requests*newTok) / wall.Seconds()
	r.ttftP50, r.ttftP99 = percentile(ttft, .5), percentile(ttft, .99)
	// Steady state of the first wave.
	wave := res[:conc]
	var from, to time.Time
	for i, x := range wave {
		if i == 0 || x.toks[0].After(from) {
			from = x.toks[0]
		}
		if last := x.toks[len(x.toks)-1]; i == 0 || last.Before(to) {
			to = last
		}
	}
	count := 0
	for _, x := range wave {
		for _, tt := range x.toks {
			if tt.After(from) && !tt.After(to) {
				count++
			}
		}
	}
	if to.After(from) {
		r.steadyDecodeTokSec = float64(count) / to.Sub(from).Seconds()
	}
	return r
}

func (r loadResult) String() string {
	return fmt.Sprintf("%-19s concurrency %3d: %4d requests in %7.2fs, %8.1f tok/s generated, TTFT p50 %8.2fms p99 %8.2fms, steady aggregate decode %8.1f tok/s",
		r.mode.String()+":", r.conc, r.requests, r.wall.Seconds(), r.tokPerSec, float64(r.ttftP50.Microseconds())/1000, float64(r.ttftP99.Microseconds())/1000, r.steadyDecodeTokSec)
}

// loadRuns makes each load request's id unique.
var loadRuns atomic.Int64

// TestLoad is the bounded loopback load test on the fixture model: a fixed
// number of streaming requests at concurrency 1, 8 and 64, every one
// checked complete; it logs throughput and p50/p99 time to first token.
// The logprobs variant runs at every concurrency, the usage variant (the
// greedy fast path) at 8 and 64.
func TestLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load test: skipped with -short")
	}
	tap := newTokenTap()
	s, ts := startServer(t, Config{Parallel: 64, Queue: 64, Ctx: 128, onToken: tap.record})
	sch := s.b.Load().sch
	for _, mode := range []loadMode{withLogprobs, withUsage} {
		for _, conc := range []int{1, 8, 64} {
			if mode == withUsage && conc == 1 {
				continue
			}
			ids0 := sch.idSteps.Load()
			r := runLoad(t, ts.URL, conc, max(16, conc), 24, 24, mode, tap)
			t.Log(r)
			if r.ttftP50 > r.ttftP99 || r.tokPerSec <= 0 {
				t.Fatalf("inconsistent figures: %v", r)
			}
			// Logprobs need the logits on the host; without them every row
			// is greedy and takes the ids path. (A prompt longer than
			// PrefillChunk would put ids steps in the logprobs runs too: its
			// rows before the last chunk want nothing back.)
			if ids := sch.idSteps.Load() - ids0; (mode == withUsage) != (ids > 0) {
				t.Fatalf("%v: %d steps on the ids path", r, ids)
			}
		}
	}
}

// TestLoadDecodeScaling measures, on the model named by CORTIQ_LOAD_MODEL
// (e.g. bin/cortiq synth --shape llama1b --quant q4tp -o /tmp/l1b.cmf), the
// steady aggregate decode of 8 concurrent streams against one stream, and
// with CORTIQ_LOAD_FULL set also 64 streams. Both variants run (the greedy
// fast path without logprobs, counted from usage, first; then logprobs,
// every row's logits on the host) unless CORTIQ_LOAD_MODE names one
// (usage or logprobs); CORTIQ_LOAD_REPEAT=N runs N interleaved rounds of
// them. It is a measurement, run by hand: skipped when the variable is not
// set.
func TestLoadDecodeScaling(t *testing.T) {
	path := os.Getenv("CORTIQ_LOAD_MODEL")
	if path == "" {
		t.Skip("set CORTIQ_LOAD_MODEL to a CMF file to measure batched decode scaling")
	}
	modes := []loadMode{withUsage, withLogprobs}
	switch os.Getenv("CORTIQ_LOAD_MODE") {
	case "":
	case "usage":
		modes = modes[:1]
	case "logprobs":
		modes = modes[1:]
	default:
		t.Fatalf("CORTIQ_LOAD_MODE %q: want usage or logprobs", os.Getenv("CORTIQ_LOAD_MODE"))
	}
	promptLen, newTok := 16, 32
	if v := os.Getenv("CORTIQ_LOAD_TOKENS"); v != "" {
		fmt.Sscan(v, &newTok)
	}
	if v := os.Getenv("CORTIQ_LOAD_PROMPT"); v != "" {
		fmt.Sscan(v, &promptLen)
	}
	ctxLen := promptLen + newTok + 16
	opt := engine.Options{}
	if os.Getenv("CORTIQ_LOAD_DEVICE") == "cuda" {
		// The GPU path: the K/V pool sized for the 64 slots, graphs and PDL
		// as cortiq serve opens it; CORTIQ_CUDA_MMQ=0 selects the bf16 GEMM.
		dev, err := cuda.Open(cuda.Options{Seqs: 64, Ctx: ctxLen, Graphs: true, PDL: true, NoMMQ: os.Getenv("CORTIQ_CUDA_MMQ") == "0", F16Wide: os.Getenv("CORTIQ_CUDA_MMQ") != "int8",
			KVF16: os.Getenv("CORTIQ_CUDA_KV") != "f32"}) // as cortiq serve opens it
		if err != nil {
			t.Fatal(err)
		}
		opt.Device, opt.OwnDevice = dev, true
	}
	e, err := engine.Open(path, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tap := newTokenTap()
	s := New(Config{Parallel: 64, Queue: 64, Ctx: ctxLen, ModelName: "m", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), onToken: tap.record})
	if err := s.Attach(e); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	defer func() { ts.CloseClientConnections(); s.Close(); ts.Close() }()
	// One request first, untimed: the first steps page the weights in and
	// (on a GPU) record the step graphs.
	runLoad(t, ts.URL, 1, 1, promptLen, min(newTok, 4), withUsage, tap)
	if os.Getenv("CORTIQ_LOAD_FULL") != "" {
		// And one wave of 64, untimed, so that the 64-row decode step's
		// graph is recorded before the timed wave (else its eager step and
		// capture fall inside that wave's steady window).
		runLoad(t, ts.URL, 64, 64, promptLen, newTok, withUsage, tap)
	}
	repeat := 1 // CORTIQ_LOAD_REPEAT: rounds of the variants, interleaved
	if v := os.Getenv("CORTIQ_LOAD_REPEAT"); v != "" {
		fmt.Sscan(v, &repeat)
	}
	for range repeat {
		for _, mode := range modes {
			loadScaling(t, ts.URL, promptLen, newTok, mode, tap)
		}
	}
}

// loadScaling logs one variant's figures at concurrency 1 and 8 (and 64
// with CORTIQ_LOAD_FULL) and their ratios.
func loadScaling(t *testing.T, url string, promptLen, newTok int, mode loadMode, tap *tokenTap) {
	one := runLoad(t, url, 1, 1, promptLen, newTok, mode, tap)
	eight := runLoad(t, url, 8, 8, promptLen, newTok, mode, tap)
	t.Log(one)
	t.Log(eight)
	t.Logf("%v: aggregate decode at concurrency 8 / single stream: %.2f×", mode, eight.steadyDecodeTokSec/one.steadyDecodeTokSec)
	if os.Getenv("CORTIQ_LOAD_FULL") != "" {
		full := runLoad(t, url, 64, 64, promptLen, newTok, mode, tap)
		t.Log(full)
		t.Logf("%v: aggregate decode at concurrency 64 / single stream: %.2f×", mode, full.steadyDecodeTokSec/one.steadyDecodeTokSec)
	}
}
