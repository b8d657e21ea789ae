package chat

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// renderLimit renders src and returns its error, which must be a limit
// error naming the chat template, and the time it took.
func renderLimit(t *testing.T, src string, msgs []Message, lim Limits) (*LimitError, time.Duration) {
	t.Helper()
	t0 := time.Now()
	_, err := Render(src, msgs, Options{Limits: lim})
	d := time.Since(t0)
	if err == nil {
		t.Fatalf("%q rendered within %+v", src, lim)
	}
	var le *LimitError
	if !errors.As(err, &le) || !errors.Is(err, ErrLimit) {
		t.Fatalf("%q: error %v is not a limit error", src, err)
	}
	if !strings.Contains(err.Error(), "chat template") {
		t.Fatalf("error %q does not name the chat template", err)
	}
	return le, d
}

// TestRenderHugeRange: the template of issue 8, which made run spend 70 s
// and 11 GB, is refused at the range() call, before its list is made.
func TestRenderHugeRange(t *testing.T) {
	le, d := renderLimit(t, "{% for i in range(100000000) %}x{% endfor %}", nil, Limits{})
	if le.What != "range() items" {
		t.Fatalf("stopped by the %s limit", le.What)
	}
	if d > time.Second {
		t.Fatalf("took %v", d)
	}
}

// TestRenderNestedRanges: the range budget is shared by every range() of a
// rendering, so nested small ranges cannot multiply past it.
func TestRenderNestedRanges(t *testing.T) {
	src := "{% for i in range(2000) %}{% for j in range(2000) %}{% endfor %}{% endfor %}"
	if le, _ := renderLimit(t, src, nil, Limits{}); le.What != "range() items" {
		t.Fatalf("stopped by the %s limit", le.What)
	}
	// Within the budget the same shape renders.
	if out := render(t, "{% for i in range(3) %}{% for j in range(2) %}{{ i }}{{ j }},{% endfor %}{% endfor %}", nil, Options{}); out != "00,01,10,11,20,21," {
		t.Fatalf("got %q", out)
	}
}

// TestRenderOutputLimit: output beyond the conversation's bytes plus
// MaxBytes (text or expressions) stops the rendering; output within it
// renders unchanged; a long conversation alone never trips it.
func TestRenderOutputLimit(t *testing.T) {
	msgs := []Message{{Role: "user", Content: strings.Repeat("a", 100)}} // 104 bytes with the role
	src := "{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ m.content }}{{ m.content }}{% endfor %}"
	le, _ := renderLimit(t, src, msgs, Limits{MaxBytes: 201})
	if le.What != "output" || le.Limit != "305 bytes: the conversation's 104 and 201 more" {
		t.Fatalf("stopped by the %s limit (%s)", le.What, le.Limit)
	}
	out, err := Render(src, msgs, Options{Limits: Limits{MaxBytes: 202}})
	if err != nil || out != "<user>"+strings.Repeat(msgs[0].Content, 3) {
		t.Fatalf("within the limit: %q, %v", out, err)
	}
	long := []Message{{Role: "user", Content: strings.Repeat("b", 5000)}}
	if out, err := Render("{% for m in messages %}[{{ m.content }}]{% endfor %}", long, Options{Limits: Limits{MaxBytes: 10}}); err != nil || len(out) != 5002 {
		t.Fatalf("a long conversation with a plain template: %d bytes, %v", len(out), err)
	}
	// Literal text counts too.
	if le, _ := renderLimit(t, "{% for i in range(1000) %}xxxxxxxxxx{% endfor %}", nil, Limits{MaxBytes: 5000}); le.What != "output" {
		t.Fatalf("stopped by the %s limit", le.What)
	}
	// The default bounds a long loop of output.
	if le, _ := renderLimit(t, "{% for i in range(60000) %}"+strings.Repeat("x", 100)+"{% endfor %}", nil, Limits{}); le.What != "output" {
		t.Fatalf("stopped by the %s limit", le.What)
	}
}

// TestRenderTimeLimit: a rendering past Timeout stops at an output
// checkpoint with a time limit error.
func TestRenderTimeLimit(t *testing.T) {
	src := "{% for i in range(5000000) %}{{ '' }}{% endfor %}"
	le, d := renderLimit(t, src, nil, Limits{Timeout: 30 * time.Millisecond, MaxIterations: 1 << 23})
	if le.What != "time" {
		t.Fatalf("stopped by the %s limit", le.What)
	}
	if d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
}

// TestRenderRange: the bounded range() is Python's range.
func TestRenderRange(t *testing.T) {
	for _, c := range []struct{ args, want string }{
		{"5", "0,1,2,3,4,"},
		{"0", ""},
		{"-3", ""},
		{"2, 8, 3", "2,5,"},
		{"5, 0, -2", "5,3,1,"},
		{"-3, 3", "-3,-2,-1,0,1,2,"},
		{"3, 3", ""},
		{"1, 10, 100", "1,"},
		{strconv.FormatInt(math.MaxInt64-2, 10) + ", " + strconv.FormatInt(math.MaxInt64, 10), strconv.FormatInt(math.MaxInt64-2, 10) + "," + strconv.FormatInt(math.MaxInt64-1, 10) + ","},
		{strconv.FormatInt(math.MaxInt64-1, 10) + ", " + strconv.FormatInt(math.MaxInt64, 10) + ", " + strconv.FormatInt(math.MaxInt64, 10), strconv.FormatInt(math.MaxInt64-1, 10) + ","},
	} {
		got := render(t, "{% for i in range("+c.args+") %}{{ i }},{% endfor %}", nil, Options{})
		if got != c.want {
			t.Errorf("range(%s): %q, want %q", c.args, got, c.want)
		}
	}
	for _, args := range []string{"1, 2, 0", "'a'", "1, 2, 3, 4"} {
		if _, err := Render("{{ range("+args+") }}", nil, Options{}); err == nil || errors.Is(err, ErrLimit) {
			t.Errorf("range(%s): error %v", args, err)
		}
	}
	// A range of MinInt64..MaxInt64 is refused by the budget, not
	// allocated or overflowed.
	src := "{{ range(" + strconv.FormatInt(math.MinInt64, 10) + ", " + strconv.FormatInt(math.MaxInt64, 10) + ") }}"
	if le, _ := renderLimit(t, src, nil, Limits{}); le.What != "range() items" {
		t.Fatalf("stopped by the %s limit", le.What)
	}
}
