package server

import (
	"context"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestChatPageServed: / is the embedded page, self-contained (no external
// scripts, styles or fonts).
func TestChatPageServed(t *testing.T) {
	_, ts := startServer(t, Config{Parallel: 1})
	resp, err := http.Get(ts.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	page := string(b)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(page, "/v1/chat/completions") {
		t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if m := regexp.MustCompile(`(src|href)=["']?(https?:)?//`).FindString(page); m != "" {
		t.Fatalf("the page loads an external resource: %s", m)
	}
}

// TestChatPageInBrowser loads the page in headless Chromium, has it send a
// message (/#max_tokens=12&send=...), and checks the streamed reply and its speed line
// in the DOM.
func TestChatPageInBrowser(t *testing.T) {
	var bin string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		t.Skip("no headless Chromium installed (Debian: apt-get install chromium)")
	}
	_, ts := startServer(t, Config{Parallel: 1})
	// Virtual time can run out before a slow (loaded) machine streams the
	// reply; try a few times before calling it a failure.
	var dom string
	for attempt := 0; attempt < 3; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
			"--user-data-dir="+t.TempDir(), "--virtual-time-budget=60000", "--dump-dom", ts.URL+"/#max_tokens=12&temperature=0&send=Hello%20there")
		out, err := cmd.Output()
		cancel()
		if err != nil {
			t.Fatalf("chromium: %v", err)
		}
		dom = string(out)
		if strings.Contains(dom, `data-done="1"`) {
			break
		}
	}
	if !strings.Contains(dom, `<div class="msg user"><div class="reasoning"></div><div class="content">Hello there</div>`) {
		t.Fatalf("no user message in the DOM:\n%s", dom)
	}
	m := regexp.MustCompile(`(?s)<div class="msg assistant" data-done="1">.*?<div class="stats">(\d+) tokens · ([0-9.]+) tok/s`).FindStringSubmatch(dom)
	if m == nil || m[1] == "0" {
		t.Fatalf("no finished reply with its speed in the DOM:\n%s", dom)
	}
}
