package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ardanlabs/jinja"
)

// Limits bound one rendering, so that a hostile or broken chat template
// fails fast instead of running for minutes and filling memory. The zero
// value of a field means its default.
//
// The engine has no hook into its evaluation loop, so the bounds are kept
// at the points a template cannot avoid: every piece of output (literal
// text and {{ }} expressions, rewritten by Compile into calls of a counting
// function), every range() (checked before the list is allocated), and the
// template's other calls into this package. Between those points a template
// can still do work no limit sees (string repetition with "*", or doubling a
// string in {% set %} a few dozen times); Timeout then returns the error,
// although the abandoned evaluation runs on until its next checkpoint.
type Limits struct {
	// MaxBytes bounds what the template adds to the conversation (default
	// DefaultMaxBytes): the rendered prompt may hold MaxBytes plus the
	// bytes of the conversation itself (message texts, tool calls and tool
	// definitions), so a long conversation is the context's business (the
	// caller's "does not fit" error) and only a template that produces far
	// more than it was given trips this. A caller that knows the context
	// length passes BytesPerToken × tokens.
	MaxBytes int
	// MaxIterations bounds the items all range() calls of one rendering
	// may produce together (default DefaultMaxIterations).
	MaxIterations int
	// Timeout bounds the wall time of one rendering (default
	// DefaultTimeout).
	Timeout time.Duration
}

const (
	// BytesPerToken is the rendered bytes allowed per context token when
	// Limits.MaxBytes is derived from a context length (real prompts
	// average about 4 bytes a token).
	BytesPerToken = 16
	// DefaultMaxBytes is 16 bytes × 256k tokens.
	DefaultMaxBytes = BytesPerToken << 18
	// DefaultMaxIterations is far beyond what any template does for a
	// conversation (loops over messages are bounded by the conversation,
	// not counted here).
	DefaultMaxIterations = 1 << 16
	// DefaultTimeout is far beyond any real template (well under a
	// millisecond for a long conversation).
	DefaultTimeout = 2 * time.Second
)

// LimitError reports a rendering stopped by one of its Limits: the chat
// template, not the conversation, is the cause.
type LimitError struct {
	What  string // "output", "range() items" or "time"
	Limit string
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("the chat template exceeded its %s limit (%s); the template is broken or hostile, use --raw or fix the model's chat_template", e.What, e.Limit)
}

// ErrLimit matches every *LimitError with errors.Is.
var ErrLimit = errors.New("chat template limit exceeded")

// Is makes errors.Is(err, ErrLimit) hold.
func (e *LimitError) Is(target error) bool { return target == ErrLimit }

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxIterations <= 0 {
		l.MaxIterations = DefaultMaxIterations
	}
	if l.Timeout <= 0 {
		l.Timeout = DefaultTimeout
	}
	return l
}

// emitName and rangeName are the variables the renderer binds to the
// counting output function and the bounded range.
const (
	emitName  = "__cortiq_out"
	rangeName = "range"
)

// budget is the state of one rendering's limits. The checkpoints run on
// the rendering goroutine; stopped is also set by the timer.
type budget struct {
	lim      Limits
	deadline time.Time
	input    int // bytes of the conversation, allowed on top of MaxBytes
	bytes    int
	items    int
	calls    int
	stopped  atomic.Bool
}

func newBudget(l Limits) *budget {
	l = l.withDefaults()
	return &budget{lim: l, deadline: time.Now().Add(l.Timeout)}
}

func (b *budget) timeErr() error {
	return &LimitError{What: "time", Limit: b.lim.Timeout.String()}
}

// check is the common checkpoint: the deadline, tested every 64 calls.
func (b *budget) check() error {
	if b.stopped.Load() {
		return b.timeErr()
	}
	b.calls++
	if b.calls%64 == 0 && time.Now().After(b.deadline) {
		b.stopped.Store(true)
		return b.timeErr()
	}
	return nil
}

// emit counts one piece of output and passes it through unchanged.
func (b *budget) emit(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 {
		return jinja.Undefined(), fmt.Errorf("chat: internal output function called with %d arguments", len(args))
	}
	if err := b.check(); err != nil {
		return jinja.Undefined(), err
	}
	v := args[0]
	switch {
	case v.IsString():
		b.bytes += len(v.AsString())
	case v.IsList() || v.IsDict():
		b.bytes += len(v.String())
	default:
		b.bytes += 8
	}
	if b.bytes > b.lim.MaxBytes+b.input {
		return jinja.Undefined(), &LimitError{What: "output", Limit: fmt.Sprintf("%d bytes: the conversation's %d and %d more", b.lim.MaxBytes+b.input, b.input, b.lim.MaxBytes)}
	}
	return v, nil
}

// rangeFn is Python's range with the iteration budget checked before the
// list is made.
func (b *budget) rangeFn(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if err := b.check(); err != nil {
		return jinja.Undefined(), err
	}
	var start, stop, step int64 = 0, 0, 1
	ints := make([]int64, len(args))
	for i, a := range args {
		switch {
		case a.IsInt():
			ints[i] = a.AsInt()
		case a.IsBool():
			if a.AsBool() {
				ints[i] = 1
			}
		default:
			return jinja.Undefined(), fmt.Errorf("range: argument %d is %s, not an integer", i+1, a.String())
		}
	}
	switch len(ints) {
	case 1:
		stop = ints[0]
	case 2:
		start, stop = ints[0], ints[1]
	case 3:
		start, stop, step = ints[0], ints[1], ints[2]
	default:
		return jinja.Undefined(), fmt.Errorf("range: expected 1-3 arguments, got %d", len(args))
	}
	if step == 0 {
		return jinja.Undefined(), errors.New("range: step must not be zero")
	}
	// The item count in uint64: the int64 difference may overflow, its
	// true value never exceeds 2^64.
	var n uint64
	if step > 0 && stop > start {
		n = (uint64(stop)-uint64(start)-1)/uint64(step) + 1
	} else if step < 0 && start > stop {
		n = (uint64(start)-uint64(stop)-1)/(uint64(-(step+1))+1) + 1
	}
	if n > uint64(b.lim.MaxIterations-b.items) {
		return jinja.Undefined(), &LimitError{What: "range() items", Limit: fmt.Sprintf("%d items in all", b.lim.MaxIterations)}
	}
	items := make([]jinja.Value, n)
	for k := range items {
		items[k] = jinja.NewInt(start + int64(k)*step)
	}
	b.items += len(items)
	return jinja.NewList(items), nil
}

// inputBytes is the size of what the caller gives the template: message
// texts, tool calls and tool definitions (as JSON).
func inputBytes(messages []Message, tools []any) int {
	n := 0
	for _, m := range messages {
		n += len(m.Role) + len(m.Content) + len(m.ReasoningContent) + len(m.Name) + len(m.ToolCallID)
		for _, c := range m.ToolCalls {
			n += len(c.ID) + len(c.Type) + len(c.Function.Name) + len(c.Function.Arguments)
		}
	}
	for _, t := range tools {
		if b, err := json.Marshal(t); err == nil {
			n += len(b)
		}
	}
	return n
}
