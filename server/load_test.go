package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cortiq/cortiq/backend/cuda"
	"github.com/cortiq/cortiq/engine"
)

// streamTimes sends one streaming completion (token ids, logprobs so that
// every token is a chunk) and returns the arrival time of each token.
func streamTimes(ctx context.Context, url string, prompt []int, n int) (start time.Time, toks []time.Time, err error) {
	ids := make([]string, len(prompt))
	for i, id := range prompt {
		ids[i] = fmt.Sprint(id)
	}
	body := fmt.Sprintf(`{"prompt":[%s],"max_tokens":%d,"temperature":0,"ignore_eos":true,"stream":true,"logprobs":0}`, strings.Join(ids, ","), n)
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(body))
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
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, `"token_logprobs":[`) && !strings.Contains(line, `"token_logprobs":[]`) {
			toks = append(toks, time.Now())
		}
	}
	if len(toks) != n {
		return start, toks, fmt.Errorf("%d tokens streamed, want %d", len(toks), n)
	}
	return start, toks, sc.Err()
}

type loadResult struct {
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
func runLoad(t testing.TB, url string, conc, requests, promptLen, newTok int) loadResult {
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
				start, toks, err := streamTimes(ctx, url, prompt, newTok)
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
	r := loadResult{conc: conc, requests: requests, wall: wall}
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
	return fmt.Sprintf("concurrency %3d: %4d requests in %7.2fs, %8.1f tok/s generated, TTFT p50 %8.2fms p99 %8.2fms, steady aggregate decode %8.1f tok/s",
		r.conc, r.requests, r.wall.Seconds(), r.tokPerSec, float64(r.ttftP50.Microseconds())/1000, float64(r.ttftP99.Microseconds())/1000, r.steadyDecodeTokSec)
}

// TestLoad is the bounded loopback load test on the fixture model: a fixed
// number of streaming requests at concurrency 1, 8 and 64, every one
// checked complete; it logs throughput and p50/p99 time to first token.
func TestLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load test: skipped with -short")
	}
	_, ts := startServer(t, Config{Parallel: 64, Queue: 64, Ctx: 128})
	for _, conc := range []int{1, 8, 64} {
		r := runLoad(t, ts.URL, conc, max(16, conc), 24, 24)
		t.Log(r)
		if r.ttftP50 > r.ttftP99 || r.tokPerSec <= 0 {
			t.Fatalf("inconsistent figures: %v", r)
		}
	}
}

// TestLoadDecodeScaling measures, on the model named by CORTIQ_LOAD_MODEL
// (e.g. bin/cortiq synth --shape llama1b --quant q4tp -o /tmp/l1b.cmf), the
// steady aggregate decode of 8 concurrent streams against one stream, and
// the load figures at concurrency 1, 8 and 64. It is a measurement, run by
// hand: skipped when the variable is not set.
func TestLoadDecodeScaling(t *testing.T) {
	path := os.Getenv("CORTIQ_LOAD_MODEL")
	if path == "" {
		t.Skip("set CORTIQ_LOAD_MODEL to a CMF file to measure batched decode scaling")
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
		dev, err := cuda.Open(cuda.Options{Seqs: 64, Ctx: ctxLen, Graphs: true, PDL: true, NoMMQ: os.Getenv("CORTIQ_CUDA_MMQ") == "0"})
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
	s := New(Config{Parallel: 64, Queue: 64, Ctx: ctxLen, ModelName: "m", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := s.Attach(e); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	defer func() { ts.CloseClientConnections(); s.Close(); ts.Close() }()
	one := runLoad(t, ts.URL, 1, 1, promptLen, newTok)
	eight := runLoad(t, ts.URL, 8, 8, promptLen, newTok)
	t.Log(one)
	t.Log(eight)
	t.Logf("aggregate decode at concurrency 8 / single stream: %.2f×", eight.steadyDecodeTokSec/one.steadyDecodeTokSec)
	if os.Getenv("CORTIQ_LOAD_FULL") != "" {
		full := runLoad(t, ts.URL, 64, 64, promptLen, newTok)
		t.Log(full)
		t.Logf("aggregate decode at concurrency 64 / single stream: %.2f×", full.steadyDecodeTokSec/one.steadyDecodeTokSec)
	}
}
