package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cortiq/cortiq/convert"
	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/sample"
)

type completionOut struct {
	Choices []struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage usage `json:"usage"`
}

// TestBatchingMatchesOneByOne: 64 concurrent greedy requests (16 slots,
// the rest queued, prompts of different lengths so prefill chunks and
// decode rows mix in one step) give exactly what engine.Generate gives for
// each request alone. Streamed and whole requests alternate; every stream
// is checked to be complete and to belong to its own request. Every third
// request asks for log-probabilities, so its rows need logits on the host
// while the others' take the ids-only path in the same steps.
func TestBatchingMatchesOneByOne(t *testing.T) {
	s, ts := startServer(t, Config{Parallel: 16, Queue: 64, PrefillChunk: 7})
	ref := openFixture(t)
	const n = 64
	prompts := make([]string, n)
	want := make([]*engine.GenResult, n)
	sess, err := ref.NewSession(512)
	if err != nil {
		t.Fatal(err)
	}
	for i := range prompts {
		prompts[i] = fmt.Sprintf("Request %d: %s", i, strings.Repeat("tell me more ", i%9))
		ids, err := ref.Encode(prompts[i], true)
		if err != nil {
			t.Fatal(err)
		}
		sess.Reset()
		if want[i], err = sess.Generate(context.Background(), ids, engine.GenOptions{MaxTokens: 6 + i%5, Sample: sample.Params{}}); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]string, n)
	reasons := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			lp := ""
			if i%3 == 2 {
				lp = `,"logprobs":1`
			}
			body := fmt.Sprintf(`{"prompt":%q,"max_tokens":%d,"temperature":0,"stream":%v%s}`, prompts[i], 6+i%5, i%2 == 1, lp)
			req, _ := http.NewRequest("POST", ts.URL+"/v1/completions", strings.NewReader(body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 {
				errs <- fmt.Errorf("request %d: %d %s", i, resp.StatusCode, b)
				return
			}
			if i%2 == 0 {
				var r completionOut
				if err := json.Unmarshal(b, &r); err != nil {
					errs <- err
					return
				}
				got[i], reasons[i] = r.Choices[0].Text, r.Choices[0].FinishReason
				return
			}
			ev := sseEvents(t, b)
			if len(ev) < 2 || ev[len(ev)-1] != "[DONE]" {
				errs <- fmt.Errorf("request %d: stream does not end with [DONE]: %q", i, ev)
				return
			}
			for _, e := range ev[:len(ev)-1] {
				var r completionOut
				if err := json.Unmarshal([]byte(e), &r); err != nil || len(r.Choices) != 1 {
					errs <- fmt.Errorf("request %d: chunk %q: %v", i, e, err)
					return
				}
				got[i] += r.Choices[0].Text
				if r.Choices[0].FinishReason != "" {
					reasons[i] = r.Choices[0].FinishReason
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range n {
		wr := "stop"
		if want[i].Reason == "length" {
			wr = "length"
		}
		if got[i] != want[i].Text || reasons[i] != wr {
			t.Errorf("request %d: batched %q (%s), alone %q (%s)", i, got[i], reasons[i], want[i].Text, wr)
		}
	}
	if rows := value(s.m.steps); rows == 0 {
		t.Fatal("no steps counted")
	}
	// Batching happened: some step ran more than one sequence.
	if n := histogramMax(t, s); n < 2 {
		t.Fatalf("at most %v sequences per step", n)
	}
	// The greedy rows took the ids path, also in steps with logits rows.
	sch := s.b.Load().sch
	if ids, mixed := sch.idSteps.Load(), sch.mixedSteps.Load(); ids == 0 || mixed == 0 || mixed == ids {
		t.Fatalf("%d steps on the ids path, %d of them mixed with logits rows", ids, mixed)
	}
}

// histogramMax is the smallest bucket bound that holds every observation of
// the batch size histogram.
func histogramMax(t *testing.T, s *Server) float64 {
	t.Helper()
	mfs, err := s.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "cortiq_batch_step_sequences" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		for _, b := range h.GetBucket() {
			if b.GetCumulativeCount() == h.GetSampleCount() {
				return b.GetUpperBound()
			}
		}
	}
	return 0
}

// streamUntil starts a streaming request and returns once its first chunk
// with text has arrived; cancel ends it.
func streamUntil(t *testing.T, url, body string) (cancel func(), rest chan string) {
	t.Helper()
	ctx, cancelFn := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	br := bufio.NewReader(resp.Body)
	for chunks := 0; chunks < 3; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") {
			chunks++
		}
	}
	rest = make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(br)
		resp.Body.Close()
		rest <- string(b)
	}()
	return cancelFn, rest
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

const longStream = `{"prompt":"Once upon a time","max_tokens":480,"temperature":0.9,"seed":1,"ignore_eos":true,"stream":true}`

// TestCancelFreesSlot: with one slot, a client that leaves mid-stream frees
// it at once for the next request, and generation for it stops.
func TestCancelFreesSlot(t *testing.T) {
	s, ts := startServer(t, Config{Parallel: 1, stepDelay: 2 * time.Millisecond})
	cancel, rest := streamUntil(t, ts.URL+"/v1/completions", longStream)
	cancel()
	<-rest
	waitFor(t, "the slot to be freed", func() bool { return value(s.m.running) == 0 })
	gen := value(s.m.completionTokens)
	if gen >= 480 {
		t.Fatalf("generated %v tokens: the cancelled stream ran to its end", gen)
	}
	code, _, b := post(t, ts.URL+"/v1/completions", `{"prompt":"Hello","max_tokens":3,"temperature":0}`)
	if code != 200 {
		t.Fatalf("after cancel: %d %s", code, b)
	}
	if after := value(s.m.completionTokens); after-gen > 3 {
		t.Fatalf("%v tokens generated after the cancel; want only the new request's 3", after-gen)
	}
}

// TestQueueFull: one slot busy, one request waiting, the next gets 503 with
// Retry-After and an error body; the waiting one then runs.
func TestQueueFull(t *testing.T) {
	s, ts := startServer(t, Config{Parallel: 1, Queue: 1, stepDelay: 2 * time.Millisecond})
	cancel, rest := streamUntil(t, ts.URL+"/v1/completions", longStream)
	waiting := make(chan int, 1)
	go func() {
		code, _, _ := post(t, ts.URL+"/v1/completions", `{"prompt":"Hi","max_tokens":2,"temperature":0}`)
		waiting <- code
	}()
	waitFor(t, "a queued request", func() bool { return value(s.m.waiting) == 1 })
	code, hdr, b := post(t, ts.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":2}`)
	if code != 503 || hdr.Get("Retry-After") == "" {
		t.Fatalf("full queue: %d, Retry-After %q", code, hdr.Get("Retry-After"))
	}
	if msg, _ := errorMessage(t, b); !strings.Contains(msg, "queue") {
		t.Fatalf("message %q", msg)
	}
	cancel()
	<-rest
	if c := <-waiting; c != 200 {
		t.Fatalf("queued request: %d", c)
	}
}

// TestBadInput: each kind of bad request gets its status and an OpenAI
// error body naming the problem.
func TestBadInput(t *testing.T) {
	_, ts := startServer(t, Config{Parallel: 1, MaxBody: 2048})
	chat, comp := ts.URL+"/v1/chat/completions", ts.URL+"/v1/completions"
	long := strings.Repeat("word ", 600)
	cases := []struct {
		name, url, body string
		code            int
		msg, param      string
	}{
		{"malformed", chat, `{"messages": [`, 400, "malformed JSON", ""},
		{"syntax", chat, `{"messages": x}`, 400, "malformed JSON", ""},
		{"empty", chat, ``, 400, "empty", ""},
		{"not an object", chat, `[1,2]`, 400, "JSON object", ""},
		{"wrong type", chat, `{"messages":[{"role":"user","content":"hi"}],"temperature":"hot"}`, 400, `"temperature"`, "temperature"},
		{"wrong type nested", chat, `{"messages":[{"role":7,"content":"hi"}]}`, 400, "messages.role", "messages.role"},
		{"content parts", chat, `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, "image_url", "messages"},
		{"stop type", comp, `{"prompt":"a","stop":5}`, 400, "stop", "stop"},
		{"unknown model", chat, `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}`, 404, `"gpt-9" not found`, "model"},
		{"no messages", chat, `{"messages":[]}`, 400, "at least one", "messages"},
		{"bad role", chat, `{"messages":[{"role":"wizard","content":"hi"}]}`, 400, "wizard", "messages[0].role"},
		{"prompt too long", comp, fmt.Sprintf(`{"prompt":%q}`, long[:1900]), 400, "does not fit", "prompt"},
		{"max_tokens beyond", comp, `{"prompt":"hello","max_tokens":100000}`, 400, "beyond the context", "max_tokens"},
		{"max_tokens zero", comp, `{"prompt":"hello","max_tokens":0}`, 400, "at least 1", "max_tokens"},
		{"temperature range", comp, `{"prompt":"hello","temperature":5}`, 400, "temperature", "temperature"},
		{"top_logprobs alone", chat, `{"messages":[{"role":"user","content":"hi"}],"top_logprobs":2}`, 400, "logprobs", "top_logprobs"},
		{"token out of vocab", comp, `{"prompt":[1,99999]}`, 400, "outside", "prompt"},
		{"body too big", comp, fmt.Sprintf(`{"prompt":%q}`, long), 413, "limit", ""},
		{"schema keyword", chat, `{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","pattern":"a+"}}}}`, 400, `"pattern"`, "response_format.json_schema.schema"},
		{"format type", chat, `{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"yaml"}}`, 400, "yaml", "response_format.type"},
		{"tool_choice without tools", chat, `{"messages":[{"role":"user","content":"hi"}],"tool_choice":"required"}`, 400, "needs tools", "tool_choice"},
		{"unknown tool", chat, `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"a"}}],"tool_choice":{"type":"function","function":{"name":"b"}}}`, 400, `"b"`, "tool_choice"},
		{"n range", comp, `{"prompt":"a","n":99}`, 400, "n 99", "n"},
	}
	for _, c := range cases {
		code, _, b := post(t, c.url, c.body)
		if code != c.code {
			t.Errorf("%s: status %d, want %d: %s", c.name, code, c.code, b)
			continue
		}
		msg, param := errorMessage(t, b)
		if !strings.Contains(msg, c.msg) || param != c.param {
			t.Errorf("%s: message %q param %q; want %q, %q", c.name, msg, param, c.msg, c.param)
		}
	}
	// Unknown routes are 404s with an error body too.
	resp, err := http.Get(ts.URL + "/v1/embeddings")
	if err != nil || resp.StatusCode != 404 {
		t.Fatalf("unknown route: %v %v", err, resp.StatusCode)
	}
	resp.Body.Close()
}

// TestAPIKey: with a key, /v1 needs it; /health does not.
func TestAPIKey(t *testing.T) {
	_, ts := startServer(t, Config{Parallel: 1, APIKey: "s3cret"})
	body := `{"prompt":"hi","max_tokens":2}`
	if code, _, b := post(t, ts.URL+"/v1/completions", body); code != 401 {
		t.Fatalf("no key: %d %s", code, b)
	} else if msg, _ := errorMessage(t, b); !strings.Contains(msg, "API key") {
		t.Fatal(msg)
	}
	if code, _, _ := post(t, ts.URL+"/v1/completions", body, "Authorization", "Bearer wrong"); code != 401 {
		t.Fatalf("wrong key: %d", code)
	}
	if code, _, b := post(t, ts.URL+"/v1/completions", body, "Authorization", "Bearer s3cret"); code != 200 {
		t.Fatalf("right key: %d %s", code, b)
	}
	resp, _ := http.Get(ts.URL + "/v1/models")
	if resp.StatusCode != 401 {
		t.Fatalf("models without key: %d", resp.StatusCode)
	}
	resp.Body.Close()
	resp, _ = http.Get(ts.URL + "/health")
	if resp.StatusCode != 200 {
		t.Fatalf("health: %d", resp.StatusCode)
	}
	resp.Body.Close()
}

// TestHealthModelsMetrics: /health is 503 until the model is attached;
// /v1/models lists it; /metrics exposes the series the issue asks for.
func TestHealthModelsMetrics(t *testing.T) {
	s := New(Config{Parallel: 2, Ctx: 512, ModelName: "tiny"})
	ts := httptest.NewServer(s)
	defer ts.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/health"); code != 503 || !strings.Contains(body, "loading") {
		t.Fatalf("before load: %d %s", code, body)
	}
	if code, _, _ := post(t, ts.URL+"/v1/completions", `{"prompt":"a"}`); code != 503 {
		t.Fatalf("completion before load: %d", code)
	}
	if err := s.Attach(openFixture(t)); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if code, _ := get("/health"); code != 200 {
		t.Fatalf("after load: %d", code)
	}
	code, body := get("/v1/models")
	var list struct {
		Data []struct{ ID string } `json:"data"`
	}
	if json.Unmarshal([]byte(body), &list); code != 200 || len(list.Data) != 1 || list.Data[0].ID != "tiny" {
		t.Fatalf("models: %d %s", code, body)
	}
	if code, _ := get("/v1/models/other"); code != 404 {
		t.Fatalf("unknown model: %d", code)
	}
	for range 2 {
		if code, _, b := post(t, ts.URL+"/v1/completions", `{"prompt":"Shared prefix of two requests","max_tokens":3}`); code != 200 {
			t.Fatalf("%d %s", code, b)
		}
	}
	_, m := get("/metrics")
	for _, name := range []string{"cortiq_requests_running", "cortiq_requests_waiting", "cortiq_prompt_tokens_total",
		"cortiq_generation_tokens_total", "cortiq_prefill_tokens_per_second", "cortiq_decode_tokens_per_second",
		"cortiq_time_to_first_token_seconds_bucket", "cortiq_inter_token_latency_seconds_bucket", "cortiq_kv_cache_tokens",
		"cortiq_kv_cache_capacity_tokens 1024", "cortiq_prefix_cache_hits_total 1", `cortiq_http_requests_total{code="200",endpoint="/v1/completions"} 2`} {
		if !strings.Contains(m, name) {
			t.Errorf("metrics lack %q", name)
		}
	}
}

// TestRequestID: a sane client id is echoed, otherwise one is made.
func TestRequestID(t *testing.T) {
	_, ts := startServer(t, Config{Parallel: 1})
	_, hdr, _ := post(t, ts.URL+"/v1/completions", `{"prompt":"a","max_tokens":1}`, "X-Request-Id", "abc-123")
	if hdr.Get("X-Request-Id") != "abc-123" {
		t.Fatalf("echo: %q", hdr.Get("X-Request-Id"))
	}
	_, hdr, _ = post(t, ts.URL+"/v1/completions", `{"prompt":"a","max_tokens":1}`)
	if !strings.HasPrefix(hdr.Get("X-Request-Id"), "req-") {
		t.Fatalf("made: %q", hdr.Get("X-Request-Id"))
	}
}

// serveOn runs Serve on a loopback listener until the returned stop is
// called; stop's result is Serve's.
func serveOn(t *testing.T, cfg Config, grace time.Duration) (*Server, string, func() error) {
	t.Helper()
	cfg.Ctx = 512
	s := New(cfg)
	if err := s.Attach(openFixture(t)); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, s, grace) }()
	return s, "http://" + ln.Addr().String(), func() error { cancel(); return <-done }
}

// TestShutdownGraceCancels: a stream still running when the grace period
// ends is ended cleanly (an error event, then [DONE]) and Serve returns nil;
// the listener is closed.
func TestShutdownGraceCancels(t *testing.T) {
	_, url, stop := serveOn(t, Config{Parallel: 1, stepDelay: 2 * time.Millisecond}, 100*time.Millisecond)
	_, rest := streamUntil(t, url+"/v1/completions", longStream)
	t0 := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("shutdown took %v", d)
	}
	tail := <-rest
	if !strings.Contains(tail, "shutting down") || !strings.HasSuffix(tail, "data: [DONE]\n\n") {
		t.Fatalf("stream tail %q", tail[max(0, len(tail)-300):])
	}
	if _, err := http.Get(url + "/health"); err == nil {
		t.Fatal("the listener still accepts")
	}
}

// TestShutdownLetsStreamsFinish: within the grace period an in-flight
// stream runs to its end.
func TestShutdownLetsStreamsFinish(t *testing.T) {
	_, url, stop := serveOn(t, Config{Parallel: 1}, 30*time.Second)
	_, rest := streamUntil(t, url+"/v1/completions", `{"prompt":"Hello","max_tokens":60,"ignore_eos":true,"stream":true}`)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	tail := <-rest
	if !strings.Contains(tail, `"finish_reason":"length"`) || !strings.HasSuffix(tail, "data: [DONE]\n\n") || strings.Contains(tail, "error") {
		t.Fatalf("stream tail %q", tail)
	}
}

// value reads a gauge or counter.
func value(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var d dto.Metric
	(<-ch).Write(&d)
	if d.Gauge != nil {
		return d.Gauge.GetValue()
	}
	return d.Counter.GetValue()
}

// TestHybridBatching: a hybrid model (Qwen3-Next: Gated DeltaNet layers
// with recurrent state) batched in the scheduler gives what Generate gives
// alone, also for a second round of the same prompts, which resumes from
// the state snapshots the first round left every 8 tokens of its prefill
// (prefix reuse without cutting the state back).
func TestHybridBatching(t *testing.T) {
	p := filepath.Join(t.TempDir(), "next.cmf")
	if _, err := convert.FromHF(context.Background(), "../testdata/models/qwen3_next_f32", p, convert.Options{Quant: quant.F32}); err != nil {
		t.Fatal(err)
	}
	open := func() *engine.Engine {
		e, err := engine.Open(p, engine.Options{Threads: 2, SnapshotInterval: 8})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		return e
	}
	s := New(Config{Parallel: 4, Ctx: 256, Queue: 16, PrefillChunk: 5, ModelName: "next", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := s.Attach(open()); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	defer func() { ts.CloseClientConnections(); s.Close(); ts.Close() }()
	ref := open()
	const n = 8
	want := make([]string, n)
	minGap := make([]float64, n)
	prompts := make([]string, n)
	for i := range n {
		prompts[i] = fmt.Sprintf("Shared opening words, then request %d %s", i%4, strings.Repeat("more ", i))
		ids, err := ref.Encode(prompts[i], true)
		if err != nil {
			t.Fatal(err)
		}
		sess, _ := ref.NewSession(256)
		// The smallest top-1 − top-2 log-probability gap of the greedy steps:
		// resuming from a state snapshot equals a fresh prefill to rounding
		// (the chunked delta rule over other chunk boundaries), which can flip
		// a near-tie on these random weights.
		minGap[i] = math.Inf(1)
		opt := engine.GenOptions{MaxTokens: 6, IgnoreEOS: true, Sample: sample.Params{LogProbs: true, TopLogProbs: 2},
			OnToken: func(r sample.Result) error {
				if len(r.TopLogProbs) == 2 {
					minGap[i] = min(minGap[i], float64(r.TopLogProbs[0].LogProb-r.TopLogProbs[1].LogProb))
				}
				return nil
			}}
		r, err := sess.Generate(context.Background(), ids, opt)
		sess.Close()
		if err != nil {
			t.Fatal(err)
		}
		want[i] = r.Text
	}
	for round := range 2 {
		got := make([]string, n)
		cached := make([]int, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				code, _, b := post(t, ts.URL+"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":6,"temperature":0,"ignore_eos":true}`, prompts[i]))
				var r completionOut
				if code != 200 || json.Unmarshal(b, &r) != nil {
					t.Errorf("request %d: %d %s", i, code, b)
					return
				}
				got[i], cached[i] = r.Choices[0].Text, r.Usage.PromptTokensDetails.CachedTokens
			})
		}
		wg.Wait()
		for i := range n {
			switch {
			case got[i] == want[i]:
			case minGap[i] < 1e-4:
				t.Logf("round %d request %d: batched %q, alone %q after a near-tie (log-prob gap %.1e): not compared", round, i, got[i], want[i], minGap[i])
			default:
				t.Errorf("round %d request %d: batched %q, alone %q (smallest log-prob gap %.1e)", round, i, got[i], want[i], minGap[i])
			}
		}
		if round == 1 && slices.Max(cached) == 0 {
			t.Errorf("second round reused no prefix: %v", cached)
		}
	}
}
