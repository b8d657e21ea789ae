package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/cortiq/cortiq/convert"
	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/quant"
)

var (
	fixtureDir  string
	fixtureOnce sync.Once
	fixturePath string
	fixtureErr  error
)

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "cortiq-server-test")
	if err != nil {
		panic(err)
	}
	fixtureDir = d
	if os.Getenv("CORTIQ_SERVER_TEST_LOG") == "" {
		slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

// fixtureModel converts the tiny Qwen3 fixture (random weights, the real
// Qwen3 chat template, a small BPE vocabulary) once per test run.
func fixtureModel(t testing.TB) string {
	t.Helper()
	fixtureOnce.Do(func() {
		fixturePath = filepath.Join(fixtureDir, "qwen3.cmf")
		_, fixtureErr = convert.FromHF(context.Background(), "../testdata/models/qwen3_f32", fixturePath, convert.Options{Quant: quant.F32})
	})
	if fixtureErr != nil {
		t.Fatal(fixtureErr)
	}
	return fixturePath
}

func openFixture(t testing.TB) *engine.Engine {
	t.Helper()
	e, err := engine.Open(fixtureModel(t), engine.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// startServer runs a Server with the fixture on an httptest listener.
func startServer(t testing.TB, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	if cfg.Ctx == 0 {
		cfg.Ctx = 512
	}
	if cfg.ModelName == "" {
		cfg.ModelName = "qwen3-tiny"
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s := New(cfg)
	if err := s.Attach(openFixture(t)); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(func() {
		ts.CloseClientConnections()
		s.Close()
		ts.Close()
	})
	return s, ts
}

func client(ts *httptest.Server, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL(ts.URL + "/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0)}, opts...)...)
}

// post sends a raw JSON body and returns the status, headers and body.
func post(t testing.TB, url, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// sseEvents splits an SSE body into its data payloads.
func sseEvents(t testing.TB, body []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			out = append(out, d)
		} else if line != "" {
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	return out
}

func errorMessage(t testing.TB, body []byte) (msg, param string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Param   any    `json:"param"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error body: %v %s", err, body)
	}
	p, _ := e.Error.Param.(string)
	return e.Error.Message, p
}
