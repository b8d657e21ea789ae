package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestServeCommand runs cortiq serve in-process with flags from CORTIQ_*
// variables, answers a request, and exits 0 when its context ends (what
// SIGTERM does through main's signal handler).
func TestServeCommand(t *testing.T) {
	p := convertFixture(t, "qwen3_f32", "f32")
	addr := freeAddr(t)
	t.Setenv("CORTIQ_ADDR", addr)
	t.Setenv("CORTIQ_PARALLEL", "3")
	t.Setenv("CORTIQ_MODEL", p)
	ctx, cancel := context.WithCancel(context.Background())
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"serve", "--ctx", "256", "--name", "tiny", "--grace", "2s"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	url := "http://" + addr
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case err := <-done:
			t.Fatalf("serve exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("serve never became healthy")
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct {
			ID   string `json:"id"`
			Meta struct {
				Parallel int `json:"parallel"`
				Ctx      int `json:"ctx"`
			} `json:"meta"`
		} `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if len(models.Data) != 1 || models.Data[0].ID != "tiny" || models.Data[0].Meta.Parallel != 3 || models.Data[0].Meta.Ctx != 256 {
		t.Fatalf("models %+v", models)
	}
	resp, err = http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"temperature":0}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"chat.completion"`) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v after shutdown", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not shut down")
	}
}

func TestServeDeviceAndModel(t *testing.T) {
	p := convertFixture(t, "qwen3_f32", "f32")
	// No GPU in CI: cuda fails with the reason instead of falling back.
	if _, err := cli(t, "serve", p, "--device", "cuda", "--addr", freeAddr(t)); err == nil || !strings.Contains(err.Error(), "--device cuda") {
		t.Fatalf("--device cuda: %v", err)
	}
	if _, err := cli(t, "serve", p, "--device", "tpu"); err == nil {
		t.Fatal("--device tpu accepted")
	}
	t.Setenv("CORTIQ_MODEL", "")
	if _, err := cli(t, "serve"); err == nil || !strings.Contains(err.Error(), "CORTIQ_MODEL") {
		t.Fatalf("no model: %v", err)
	}
	t.Setenv("CORTIQ_PARALLEL", "many")
	if _, err := cli(t, "serve", p); err == nil || !strings.Contains(err.Error(), "CORTIQ_PARALLEL") {
		t.Fatalf("bad env value: %v", err)
	}
}

// TestServeSIGTERMChild is the child process of TestServeSIGTERM: it runs
// cortiq's main with the arguments in CORTIQ_SERVE_CHILD.
func TestServeSIGTERMChild(t *testing.T) {
	args := os.Getenv("CORTIQ_SERVE_CHILD")
	if args == "" {
		t.Skip("child process of TestServeSIGTERM")
	}
	os.Args = append([]string{"cortiq"}, strings.Split(args, "\x1f")...)
	main() // exits non-zero on error; returns on a clean shutdown
}

// TestServeSIGTERM sends a real SIGTERM to a serving process with a stream
// in flight: the stream runs to its end within the grace period, new
// connections are refused, and the process exits 0.
func TestServeSIGTERM(t *testing.T) {
	p := convertFixture(t, "qwen3_f32", "f32")
	addr := freeAddr(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeSIGTERMChild$")
	cmd.Env = append(os.Environ(), "CORTIQ_SERVE_CHILD="+strings.Join([]string{"serve", p, "--addr", addr, "--parallel", "1", "--ctx", "512", "--grace", "20s"}, "\x1f"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	url := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("never healthy:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := http.Post(url+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"Hello","max_tokens":400,"ignore_eos":true,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 64)
	if _, err := io.ReadAtLeast(resp.Body, first, 16); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(rest), `"finish_reason":"length"`) || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("the stream did not finish: %q", string(rest)[max(0, len(rest)-300):])
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, stderr.String())
	}
	// The stream was in flight when shutdown began: its request line is
	// logged after the shutdown notice.
	log := stderr.String()
	down, req := strings.Index(log, "shutting down"), strings.Index(log, "path=/v1/completions")
	if down < 0 || req < down || !strings.Contains(log, "msg=\"shut down\"") {
		t.Fatalf("shutdown notice at %d, request line at %d:\n%s", down, req, log)
	}
}
