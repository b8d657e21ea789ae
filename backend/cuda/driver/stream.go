package driver

import "fmt"

// Stream is a CUstream; 0 is the legacy default stream.
type Stream uintptr

// Event is a CUevent.
type Event uintptr

// Stream and event flags.
const (
	StreamNonBlocking  = 0x1 // CU_STREAM_NON_BLOCKING: no implicit sync with the default stream
	EventDefault       = 0x0
	EventBlockingSync  = 0x1
	EventDisableTiming = 0x2
)

// NewStream creates a stream.
func (c *Ctx) NewStream(flags uint32) (Stream, error) {
	if err := c.call("cuStreamCreate", c.out(0), uintptr(flags)); err != nil {
		return 0, err
	}
	return Stream(c.u64(0)), nil
}

// DestroyStream destroys a stream (queued work still completes).
func (c *Ctx) DestroyStream(s Stream) error {
	if s == 0 {
		return nil
	}
	return c.callAnyway("cuStreamDestroy_v2", uintptr(s))
}

// StreamSync waits for the stream's work.
func (c *Ctx) StreamSync(s Stream) error { return c.call("cuStreamSynchronize", uintptr(s)) }

// StreamDone reports whether all work queued on s has completed, without
// waiting.
func (c *Ctx) StreamDone(s Stream) (bool, error) { return c.query("cuStreamQuery", uintptr(s)) }

// NewEvent creates an event (flags EventDefault, EventDisableTiming, ...).
func (c *Ctx) NewEvent(flags uint32) (Event, error) {
	if err := c.call("cuEventCreate", c.out(0), uintptr(flags)); err != nil {
		return 0, err
	}
	return Event(c.u64(0)), nil
}

// DestroyEvent destroys an event.
func (c *Ctx) DestroyEvent(e Event) error {
	if e == 0 {
		return nil
	}
	return c.callAnyway("cuEventDestroy_v2", uintptr(e))
}

// Record records e on stream s.
func (c *Ctx) Record(e Event, s Stream) error { return c.call("cuEventRecord", uintptr(e), uintptr(s)) }

// WaitEvent makes later work queued on s wait for e's record (a fork or
// join between streams; inside a stream capture, an edge of the graph).
func (c *Ctx) WaitEvent(s Stream, e Event) error {
	return c.call("cuStreamWaitEvent", uintptr(s), uintptr(e), 0)
}

// EventDone reports whether the work before e's record has completed,
// without waiting: a caller polls it instead of sleeping in EventSync
// (a blocking wait can cost a thread wake-up of a millisecond or more).
func (c *Ctx) EventDone(e Event) (bool, error) { return c.query("cuEventQuery", uintptr(e)) }

// EventSync waits for e.
func (c *Ctx) EventSync(e Event) error { return c.call("cuEventSynchronize", uintptr(e)) }

// Elapsed returns the milliseconds between two recorded, completed events.
func (c *Ctx) Elapsed(start, end Event) (float32, error) {
	name := "cuEventElapsedTime_v2"
	if !c.d.lib.has(name) {
		name = "cuEventElapsedTime"
	}
	if err := c.call(name, c.out(0), uintptr(start), uintptr(end)); err != nil {
		return 0, err
	}
	return c.f32(0), nil
}

// query calls a query entry point: Success is true, CUDA_ERROR_NOT_READY
// false, anything else an error.
func (c *Ctx) query(name string, arg uintptr) (bool, error) {
	if !c.active {
		return false, fmt.Errorf("cuda: %s called outside Device.Do", name)
	}
	if c.poison != nil {
		return false, fmt.Errorf("%w (%v): %s refused", ErrPoisoned, c.poison, name)
	}
	r := c.raw(name, arg)
	if r == ErrNotReady {
		return false, nil
	}
	return r == Success, c.result(name, r)
}
