// Package server is cortiq's OpenAI-compatible HTTP API: chat and text
// completions (streamed over SSE or not) on a continuous-batching scheduler
// over engine.StepNext / engine.Step (greedy rows get their ids from the
// device, only sampling rows bring logits back), with constrained JSON output, tool calls, Prometheus
// metrics and an embedded chat page.
package server

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cortiq/cortiq/engine"
)

// Config sets up a Server.
type Config struct {
	ModelName    string // the id clients name in "model" (empty: any name is accepted and this one reported)
	Parallel     int    // sequences decoded together (slots)
	Ctx          int    // context tokens per slot
	Queue        int    // requests waiting for a slot at most (0: 4 × Parallel)
	PrefillChunk int    // prompt tokens per sequence per step (0: 256)
	PrefillSeqs  int    // sequences prefilled per step (0: 1)
	APIKey       string // when set, /v1 requests need "Authorization: Bearer KEY"
	MaxBody      int64  // request body limit in bytes (0: 4 MiB)
	Logger       *slog.Logger

	stepDelay time.Duration // tests: a pause after every step, to make streams long
	forceText string        // tests: every reply is exactly this text (see forcedTokens)
	// tests: called (by the scheduler's publisher, with the time the step
	// that made it ended) as each token goes to its stream,
	// with the request's id (X-Request-Id); the load test times tokens
	// with it where no chunk carries them (no logprobs, empty text).
	onToken func(id string, at time.Time)
	// tests: called by the scheduler after every step (BenchmarkServeStep
	// times the loop's period against the engine step with it).
	onStep func(stepInfo)
	// tests: while every slot is free, admit nothing until this many
	// requests wait (BenchmarkServeStep starts its 64 streams together).
	admitAt int
}

// Server serves the API. It answers /health with 503 until Attach gives it
// a model.
type Server struct {
	cfg  Config
	m    *metrics
	mux  *http.ServeMux
	log  *slog.Logger
	b    atomic.Pointer[backend]
	seq  atomic.Uint64
	stop atomic.Bool

	ctx    context.Context // cancelled by CancelAll: ends every job
	cancel context.CancelFunc
	wg     sync.WaitGroup // in-flight generation handlers
}

type backend struct {
	e            *engine.Engine
	sch          *scheduler
	vocab        *lazyVocab
	think        bool // the template writes <think> blocks
	created      int64
	vocabSize    int
	thinkInStart func(prompt string) bool
}

// New returns a Server with no model yet.
func New(cfg Config) *Server {
	if cfg.Parallel < 1 {
		cfg.Parallel = 1
	}
	if cfg.Ctx < 1 {
		cfg.Ctx = 4096
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 4 * cfg.Parallel
	}
	if cfg.PrefillChunk <= 0 {
		cfg.PrefillChunk = 256
	}
	if cfg.PrefillSeqs <= 0 {
		cfg.PrefillSeqs = 1
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 4 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, m: newMetrics(), mux: http.NewServeMux(), log: cfg.Logger}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.mux.HandleFunc("GET /health", s.health)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("GET /v1/models", s.auth(s.models))
	s.mux.HandleFunc("GET /v1/models/{id}", s.auth(s.models))
	s.mux.HandleFunc("POST /v1/chat/completions", s.auth(s.generation(s.chat)))
	s.mux.HandleFunc("POST /v1/completions", s.auth(s.generation(s.completion)))
	s.mux.HandleFunc("GET /{$}", s.page)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, Message: fmt.Sprintf("no route %s %s", r.Method, r.URL.Path), Type: "invalid_request_error"})
	})
	return s
}

// Attach makes the server ready with a loaded model: it allocates one
// session per slot (the KV budget, --ctx × --parallel, fixed here) and
// starts the scheduler.
func (s *Server) Attach(e *engine.Engine) error {
	ctx := s.cfg.Ctx
	if mp := e.File.Header.Arch.MaxPositionEmbeddings; mp > 0 && ctx > mp {
		ctx = mp
		s.cfg.Ctx = ctx
	}
	sch, err := newScheduler(e, schedConfig{Parallel: s.cfg.Parallel, Ctx: ctx, Queue: s.cfg.Queue, PrefillChunk: s.cfg.PrefillChunk, PrefillSeqs: s.cfg.PrefillSeqs, stepDelay: s.cfg.stepDelay, onToken: s.cfg.onToken, onStep: s.cfg.onStep, admitAt: s.cfg.admitAt}, s.m)
	if err != nil {
		return err
	}
	b := &backend{e: e, sch: sch, vocab: &lazyVocab{e: e}, created: time.Now().Unix(), vocabSize: e.File.Header.Arch.VocabSize}
	if tc := e.File.Header.TokenizerConfig; tc != nil && strings.Contains(tc.ChatTemplate, thinkOpen) {
		b.think = true
	}
	if s.cfg.ModelName == "" {
		s.cfg.ModelName = "cortiq"
	}
	s.b.Store(b)
	s.log.Info("model ready", "model", s.cfg.ModelName, "parallel", s.cfg.Parallel, "ctx", ctx,
		"kv_cache_bytes", int64(s.cfg.Parallel)*e.Model.CacheBytes(ctx))
	return nil
}

// Drain makes new generation requests fail with 503 (shutdown has begun);
// requests already running go on.
func (s *Server) Drain() { s.stop.Store(true) }

// CancelAll ends every running and waiting request (their streams end with
// an error event), for the end of a shutdown grace period.
func (s *Server) CancelAll() { s.cancel() }

// Close stops the scheduler; the engine stays the caller's to close.
func (s *Server) Close() {
	s.Drain()
	s.cancel()
	s.wg.Wait()
	if b := s.b.Load(); b != nil {
		b.sch.close()
	}
}

// Name is the model id the server reports.
func (s *Server) Name() string { return s.cfg.ModelName }

// statusWriter records the status for logs and metrics.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(c int) {
	if w.code == 0 {
		w.code = c
	}
	w.ResponseWriter.WriteHeader(c)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

type ctxKey struct{}

// reqLog is the logger of a request (with its id).
func reqLog(r *http.Request) *slog.Logger {
	if l, ok := r.Context().Value(ctxKey{}).(*slog.Logger); ok {
		return l
	}
	return slog.Default()
}

// ServeHTTP gives every request an id (X-Request-Id, the client's own when
// it sends a sane one), a logger carrying it, and a log line at the end.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("X-Request-Id")
	if len(id) == 0 || len(id) > 64 || strings.ContainsFunc(id, func(c rune) bool { return c < 0x21 || c > 0x7e }) {
		id = fmt.Sprintf("req-%d-%s", s.seq.Add(1), randomHex(8))
	}
	w.Header().Set("X-Request-Id", id)
	l := s.log.With("request_id", id)
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, l))
	sw := &statusWriter{ResponseWriter: w}
	t0 := time.Now()
	s.mux.ServeHTTP(sw, r)
	if sw.code == 0 {
		sw.code = http.StatusOK
	}
	endpoint := r.URL.Path
	if !strings.HasPrefix(endpoint, "/v1/") && endpoint != "/health" && endpoint != "/metrics" && endpoint != "/" {
		endpoint = "other"
	}
	s.m.requests.WithLabelValues(endpoint, fmt.Sprint(sw.code)).Inc()
	if r.URL.Path != "/health" && r.URL.Path != "/metrics" {
		l.Info("request", "method", r.Method, "path", r.URL.Path, "status", sw.code, "duration", time.Since(t0).Round(time.Microsecond))
	}
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case s.stop.Load():
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"status":"shutting down"}` + "\n"))
	case s.b.Load() == nil:
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"status":"loading"}` + "\n"))
	default:
		w.Write([]byte(`{"status":"ok"}` + "\n"))
	}
}

func (s *Server) auth(h http.HandlerFunc) http.HandlerFunc {
	if s.cfg.APIKey == "" {
		return h
	}
	want := []byte("Bearer " + s.cfg.APIKey)
	return func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="cortiq"`)
			writeError(w, &apiError{status: http.StatusUnauthorized, Message: "missing or wrong API key: send Authorization: Bearer <key>", Type: "authentication_error", Code: "invalid_api_key"})
			return
		}
		h(w, r)
	}
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	b := s.b.Load()
	if b == nil {
		writeError(w, &apiError{status: http.StatusServiceUnavailable, Message: "the model is still loading", Type: "server_error"})
		return
	}
	m := map[string]any{"id": s.cfg.ModelName, "object": "model", "created": b.created, "owned_by": "cortiq",
		"meta": map[string]any{"arch": b.e.File.Header.Arch.ArchName, "ctx": s.cfg.Ctx, "parallel": s.cfg.Parallel, "vocab": b.vocabSize}}
	w.Header().Set("Content-Type", "application/json")
	if id := r.PathValue("id"); id != "" {
		if id != s.cfg.ModelName {
			writeError(w, &apiError{status: http.StatusNotFound, Message: fmt.Sprintf("model %q not found (this server serves %q)", id, s.cfg.ModelName), Type: "invalid_request_error", Param: "model", Code: "model_not_found"})
			return
		}
		json.NewEncoder(w).Encode(m)
		return
	}
	json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": []any{m}})
}

// generation wraps the two generating endpoints: readiness, draining, and
// the in-flight count that shutdown waits on.
func (s *Server) generation(h func(http.ResponseWriter, *http.Request, *backend)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.stop.Load() {
			w.Header().Set("Retry-After", "5")
			writeError(w, &apiError{status: http.StatusServiceUnavailable, Message: "the server is shutting down", Type: "server_error"})
			return
		}
		b := s.b.Load()
		if b == nil {
			w.Header().Set("Retry-After", "2")
			writeError(w, &apiError{status: http.StatusServiceUnavailable, Message: "the model is still loading", Type: "server_error"})
			return
		}
		s.wg.Add(1)
		defer s.wg.Done()
		h(w, r, b)
	}
}

func (s *Server) checkModel(name string) *apiError {
	if name == "" || name == s.cfg.ModelName {
		return nil
	}
	return &apiError{status: http.StatusNotFound, Message: fmt.Sprintf("model %q not found (this server serves %q)", name, s.cfg.ModelName), Type: "invalid_request_error", Param: "model", Code: "model_not_found"}
}

// submit queues the jobs of one request, undoing all of them when one
// cannot be queued.
func (s *Server) submit(b *backend, jobs []*job) *apiError {
	for i, j := range jobs {
		if err := b.sch.submit(j); err != nil {
			// jobs[:i] are queued already: the caller cancels their
			// context on return, which frees them.
			_ = i
			if errors.Is(err, errQueueFull) {
				s.m.rejected.WithLabelValues("queue_full").Inc()
				return &apiError{status: http.StatusServiceUnavailable, Message: fmt.Sprintf("all %d slots are busy and the wait queue (%d) is full; retry later", s.cfg.Parallel, s.cfg.Queue), Type: "server_error", Code: "queue_full"}
			}
			return &apiError{status: http.StatusServiceUnavailable, Message: err.Error(), Type: "server_error"}
		}
	}
	return nil
}

// jobContext ends a request's jobs when the client goes, when the handler
// returns, or when the server cancels everything.
func (s *Server) jobContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	stop := context.AfterFunc(s.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}
