package sample

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

type piece struct {
	tok  int32
	text string
}

func run(c *StopChecker, pieces []piece) (string, StopReason) {
	var out strings.Builder
	for _, p := range pieces {
		emit, reason := c.Push(p.tok, p.text)
		out.WriteString(emit)
		if reason != NotStopped {
			return out.String(), reason
		}
	}
	out.WriteString(c.Flush())
	return out.String(), NotStopped
}

func pieces(texts ...string) []piece {
	out := make([]piece, len(texts))
	for i, t := range texts {
		out[i] = piece{tok: int32(10 + i), text: t}
	}
	return out
}

func TestStopStringAcrossTokens(t *testing.T) {
	c := NewStopChecker(nil, []string{"World"})
	var emitted []string
	for _, p := range pieces("Hel", "lo W", "or", "ld! more") {
		e, r := c.Push(p.tok, p.text)
		emitted = append(emitted, e)
		if r == StoppedString {
			break
		}
	}
	want := []string{"Hel", "lo ", "", ""}
	if strings.Join(emitted, "|") != strings.Join(want, "|") {
		t.Fatalf("emitted %q want %q", emitted, want)
	}
	if c.Reason() != StoppedString || c.Matched() != "World" {
		t.Fatalf("reason %v matched %q", c.Reason(), c.Matched())
	}
	if e, r := c.Push(99, "x"); e != "" || r != StoppedString {
		t.Fatalf("Push after stop = %q, %v", e, r)
	}
	if c.Flush() != "" {
		t.Fatal("Flush after stop must be empty")
	}
}

func TestStopHeldTextReleased(t *testing.T) {
	c := NewStopChecker(nil, []string{"World"})
	if e, _ := c.Push(1, "Wo"); e != "" {
		t.Fatalf("possible stop prefix emitted: %q", e)
	}
	if e, _ := c.Push(2, "rd"); e != "Word" {
		t.Fatalf("held text not released: %q", e)
	}
	c.Push(3, "Wor")
	if got := c.Flush(); got != "Wor" {
		t.Fatalf("Flush = %q", got)
	}
}

func TestStopEarliestAndFirstToken(t *testing.T) {
	out, r := run(NewStopChecker(nil, []string{"cd", "b", "abc"}), pieces("xab", "cde"))
	if out != "xa" || r != StoppedString {
		t.Fatalf("got %q %v, want \"xa\" (stop \"b\" occurs first)", out, r)
	}
	out, r = run(NewStopChecker(nil, []string{"STOP"}), pieces("STOP", "after"))
	if out != "" || r != StoppedString {
		t.Fatalf("stop at start: %q %v", out, r)
	}
	// Overlapping prefixes: "aab" inside "aaab".
	out, _ = run(NewStopChecker(nil, []string{"aab"}), pieces("a", "a", "a", "b", "c"))
	if out != "a" {
		t.Fatalf("overlap: %q want \"a\"", out)
	}
}

func TestStopEOS(t *testing.T) {
	c := NewStopChecker([]int32{2, 7}, []string{"</s>"})
	if e, r := c.Push(5, "done </"); e != "done " || r != NotStopped {
		t.Fatalf("got %q %v", e, r)
	}
	// EOS releases the held "</" (it never became a stop string) and drops
	// the EOS token's own text.
	if e, r := c.Push(7, "<|im_end|>"); e != "</" || r != StoppedEOS {
		t.Fatalf("eos: %q %v", e, r)
	}
	if c.Matched() != "" || c.Reason().String() != "eos" {
		t.Fatalf("matched %q reason %v", c.Matched(), c.Reason())
	}
}

func TestStopHoldsPartialUTF8(t *testing.T) {
	c := NewStopChecker(nil, nil)
	euro := "€" // e2 82 ac
	if e, _ := c.Push(1, "a"+euro[:1]); e != "a" {
		t.Fatalf("partial rune emitted: %q", e)
	}
	if e, _ := c.Push(2, euro[1:2]); e != "" {
		t.Fatalf("partial rune emitted: %q", e)
	}
	if e, _ := c.Push(3, euro[2:]+"b"); e != euro+"b" {
		t.Fatalf("completed rune: %q", e)
	}
	// Invalid bytes are not held forever.
	if e, _ := c.Push(4, "\x80\x80"); e != "\x80\x80" {
		t.Fatalf("invalid bytes held: %q", e)
	}
}

// TestStopMatchesReference splits random texts into random pieces and checks
// that the concatenated output equals the text cut at the first stop string,
// and that no emitted prefix ever contains a stop string.
func TestStopMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	alpha := "abc é"
	randStr := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteByte(alpha[rng.IntN(len(alpha))])
		}
		return b.String()
	}
	for range 3000 {
		text := randStr(rng.IntN(40))
		stops := []string{randStr(1 + rng.IntN(4))}
		if rng.IntN(2) == 0 {
			stops = append(stops, randStr(1+rng.IntN(3)))
		}
		want := text
		cut := -1
		for _, s := range stops {
			if i := strings.Index(text, s); i >= 0 && (cut < 0 || i < cut) {
				cut = i
			}
		}
		if cut >= 0 {
			want = text[:cut]
		}
		var ps []piece
		for rest := text; rest != ""; {
			n := 1 + rng.IntN(min(5, len(rest)))
			ps = append(ps, piece{tok: 1, text: rest[:n]})
			rest = rest[n:]
		}
		c := NewStopChecker(nil, stops)
		var out strings.Builder
		reason := NotStopped
		for _, p := range ps {
			e, r := c.Push(p.tok, p.text)
			out.WriteString(e)
			for _, s := range stops {
				if strings.Contains(out.String(), s) {
					t.Fatalf("emitted stop string %q: text %q stops %q", s, text, stops)
				}
			}
			if r != NotStopped {
				reason = r
				break
			}
		}
		out.WriteString(c.Flush())
		if out.String() != want {
			t.Fatalf("text %q stops %q pieces %q: got %q want %q", text, stops, ps, out.String(), want)
		}
		if (cut >= 0) != (reason == StoppedString) {
			t.Fatalf("text %q stops %q: reason %v", text, stops, reason)
		}
	}
}

func FuzzStopChecker(f *testing.F) {
	f.Add("Hello World", "World", uint8(3))
	f.Add("a€b", "€", uint8(1))
	f.Add("", "", uint8(0))
	f.Fuzz(func(t *testing.T, text, stop string, step uint8) {
		c := NewStopChecker([]int32{0}, []string{stop})
		n := int(step%7) + 1
		var out strings.Builder
		for i := 0; i < len(text); i += n {
			e, r := c.Push(1, text[i:min(i+n, len(text))])
			out.WriteString(e)
			if r != NotStopped {
				break
			}
		}
		out.WriteString(c.Flush())
		want := text
		if stop != "" {
			if i := strings.Index(text, stop); i >= 0 {
				want = text[:i]
			}
		}
		if out.String() != want {
			t.Fatalf("got %q want %q", out.String(), want)
		}
		if utf8.ValidString(text) && utf8.ValidString(stop) && !utf8.ValidString(out.String()) {
			t.Fatalf("valid input produced invalid output %q", out.String())
		}
	})
}
