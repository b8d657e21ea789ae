// Package progress reports the progress of long work (conversion, model
// synthesis, calibration, perplexity, verification) as a func(done, total
// int64): a bar on a terminal (github.com/schollz/progressbar/v3), plain
// lines now and then otherwise (logs never get a carriage return), and
// nothing at all for work that ends within the first second.
package progress

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/cortiq/cortiq/units"
)

// Func receives the work done so far and the total, in bytes or items.
// Calls come from one goroutine at a time; done == total ends the report,
// and a later call with done < total starts a new one (the next pass of
// work that runs in passes, such as calibration).
type Func func(done, total int64)

// Delay is how long work runs before anything is shown.
const Delay = time.Second

// Every is the interval between plain lines when the output is not a
// terminal.
const Every = 5 * time.Second

// Bytes reports work measured in bytes to w (normally standard error).
func Bytes(w io.Writer, what string) Func {
	return newReporter(w, what, "", IsTerminal(w), time.Now).report
}

// Count reports work measured in items (chunks, tokens, sequences) to w;
// noun names them ("chunks").
func Count(w io.Writer, what, noun string) Func {
	return newReporter(w, what, noun, IsTerminal(w), time.Now).report
}

// IsTerminal says whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

type reporter struct {
	mu       sync.Mutex
	w        io.Writer
	what     string
	noun     string // "" for bytes
	terminal bool
	now      func() time.Time
	start    time.Time
	last     time.Time // last plain line; zero before the first
	bar      *progressbar.ProgressBar
	finished bool
}

func newReporter(w io.Writer, what, noun string, terminal bool, now func() time.Time) *reporter {
	return &reporter{w: w, what: what, noun: noun, terminal: terminal, now: now, start: now()}
}

func (r *reporter) report(done, total int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if total <= 0 {
		return
	}
	done = min(max(done, 0), total)
	t := r.now()
	if r.finished {
		if done == total {
			return
		}
		// A new pass: a new report.
		r.start, r.last, r.bar, r.finished = t, time.Time{}, nil, false
	}
	end := done == total
	if end {
		r.finished = true
	}
	if r.bar == nil && r.last.IsZero() && t.Sub(r.start) < Delay {
		return // nothing for sub-second work
	}
	if r.terminal {
		r.showBar(done, total)
		return
	}
	if end || r.last.IsZero() || t.Sub(r.last) >= Every {
		r.last = t
		fmt.Fprintln(r.w, r.line(done, total, t.Sub(r.start), end))
	}
}

func (r *reporter) showBar(done, total int64) {
	if r.bar == nil {
		opts := []progressbar.Option{
			progressbar.OptionSetWriter(r.w),
			progressbar.OptionSetDescription(r.what),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(100 * time.Millisecond),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(r.w) }),
		}
		if r.noun == "" {
			opts = append(opts, progressbar.OptionShowBytes(true), progressbar.OptionShowTotalBytes(true))
		} else {
			opts = append(opts, progressbar.OptionSetItsString(r.noun), progressbar.OptionShowIts())
		}
		r.bar = progressbar.NewOptions64(total, opts...)
	}
	if r.bar.GetMax64() != total {
		r.bar.ChangeMax64(total)
	}
	_ = r.bar.Set64(done)
}

// line is a plain progress line: "converting: 40% (1.20 GB of 3.00 GB),
// 8s elapsed, about 12s left".
func (r *reporter) line(done, total int64, el time.Duration, end bool) string {
	amount := func(n int64) string {
		if r.noun == "" {
			return units.Bytes(n)
		}
		return fmt.Sprint(n)
	}
	of := fmt.Sprintf("%s of %s", amount(done), amount(total))
	if r.noun != "" {
		of += " " + r.noun
	}
	s := fmt.Sprintf("%s: %d%% (%s), %s elapsed", r.what, done*100/total, of, el.Round(time.Second))
	if end {
		return s + ", done"
	}
	if done > 0 {
		left := time.Duration(float64(el) * float64(total-done) / float64(done))
		s += fmt.Sprintf(", about %s left", left.Round(time.Second))
	}
	return s
}
