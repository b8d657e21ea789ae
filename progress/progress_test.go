package progress

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// clock is a fake time source a test moves by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestSubSecondWorkPrintsNothing(t *testing.T) {
	for _, terminal := range []bool{false, true} {
		var buf bytes.Buffer
		c := &clock{time.Unix(1000, 0)}
		f := newReporter(&buf, "converting", "", terminal, c.now).report
		for i := int64(0); i <= 10; i++ {
			c.t = c.t.Add(90 * time.Millisecond)
			f(i*100, 1000)
		}
		if buf.Len() != 0 {
			t.Fatalf("terminal %v: sub-second work printed %q", terminal, buf.String())
		}
	}
}

func TestPlainLines(t *testing.T) {
	var buf bytes.Buffer
	c := &clock{time.Unix(1000, 0)}
	f := newReporter(&buf, "converting", "", false, c.now).report
	// 60 s of work reported every 100 ms: a line after the first second,
	// then one per Every, and a last one at the end.
	const total = 3_000_000_000
	for i := int64(1); i <= 600; i++ {
		c.t = c.t.Add(100 * time.Millisecond)
		f(total*i/600, total)
	}
	out := buf.String()
	if strings.ContainsRune(out, '\r') {
		t.Fatalf("plain progress wrote a carriage return: %q", out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	// First at 1 s, then at 6, 11, ..., 56 s (12 lines), then the end.
	if len(lines) != 13 {
		t.Fatalf("%d lines:\n%s", len(lines), out)
	}
	if want := "converting: 1% (50.0 MB of 3.00 GB), 1s elapsed, about 59s left"; lines[0] != want {
		t.Errorf("first line %q, want %q", lines[0], want)
	}
	if want := "converting: 100% (3.00 GB of 3.00 GB), 1m0s elapsed, done"; lines[len(lines)-1] != want {
		t.Errorf("last line %q, want %q", lines[len(lines)-1], want)
	}
	// Calls after the end print nothing more.
	f(total, total)
	if buf.String() != out {
		t.Fatal("a call after the end printed")
	}
	// A new pass (done < total again) is a new report: quiet for its
	// first second, then lines again.
	c.t = c.t.Add(100 * time.Millisecond)
	f(0, total)
	c.t = c.t.Add(500 * time.Millisecond)
	f(total/4, total)
	if buf.String() != out {
		t.Fatalf("the first half second of a new pass printed %q", strings.TrimPrefix(buf.String(), out))
	}
	c.t = c.t.Add(time.Second)
	f(total/2, total)
	if got := strings.TrimPrefix(buf.String(), out); got != "converting: 50% (1.50 GB of 3.00 GB), 2s elapsed, about 2s left\n" {
		t.Fatalf("second pass printed %q", got)
	}
}

func TestCountLines(t *testing.T) {
	var buf bytes.Buffer
	c := &clock{time.Unix(1000, 0)}
	f := newReporter(&buf, "perplexity", "chunks", false, c.now).report
	c.t = c.t.Add(2 * time.Second)
	f(3, 12)
	c.t = c.t.Add(6 * time.Second)
	f(12, 12)
	want := "perplexity: 25% (3 of 12 chunks), 2s elapsed, about 6s left\nperplexity: 100% (12 of 12 chunks), 8s elapsed, done\n"
	if buf.String() != want {
		t.Fatalf("got %q, want %q", buf.String(), want)
	}
}

func TestBarOnTerminal(t *testing.T) {
	var buf bytes.Buffer
	c := &clock{time.Unix(1000, 0)}
	f := newReporter(&buf, "writing", "", true, c.now).report
	c.t = c.t.Add(1500 * time.Millisecond)
	f(500_000_000, 1_000_000_000)
	f(1_000_000_000, 1_000_000_000)
	out := buf.String()
	// The bar redraws in place (carriage returns) and ends with a newline.
	if !strings.Contains(out, "writing") || !strings.ContainsRune(out, '\r') || !strings.HasSuffix(out, "\n") || !strings.Contains(out, "100%") {
		t.Fatalf("bar output %q", out)
	}
}

func TestIsTerminal(t *testing.T) {
	if IsTerminal(&bytes.Buffer{}) {
		t.Fatal("a buffer is a terminal")
	}
}
