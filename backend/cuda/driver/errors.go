package driver

import (
	"errors"
	"fmt"
)

// Result is a CUresult, the status every driver call returns.
type Result int32

// Results the binding treats specially (values from cuda.h).
const (
	Success           Result = 0
	ErrInvalidValue   Result = 1
	ErrOutOfMemory    Result = 2
	ErrNotInitialized Result = 3
	ErrDeinitialized  Result = 4
	ErrNoDeviceCode   Result = 100 // CUDA_ERROR_NO_DEVICE
	ErrInvalidDevice  Result = 101
	ErrNotFound       Result = 500
	ErrNotReady       Result = 600
	ErrNotSupported   Result = 801
)

// sticky reports whether a result leaves the context unusable: after one of
// these every later call in the context fails, so the binding refuses to
// hand out numbers from it (the list is cuda.h's "the process must be
// terminated" class).
func (r Result) sticky() bool {
	switch r {
	case 214, // CUDA_ERROR_ECC_UNCORRECTABLE
		700, // CUDA_ERROR_ILLEGAL_ADDRESS
		702, // CUDA_ERROR_LAUNCH_TIMEOUT
		710, // CUDA_ERROR_ASSERT
		714, // CUDA_ERROR_HARDWARE_STACK_ERROR
		715, // CUDA_ERROR_ILLEGAL_INSTRUCTION
		716, // CUDA_ERROR_MISALIGNED_ADDRESS
		717, // CUDA_ERROR_INVALID_ADDRESS_SPACE
		718, // CUDA_ERROR_INVALID_PC
		719: // CUDA_ERROR_LAUNCH_FAILED
		return true
	}
	return false
}

// Error is a failed driver call: the call, the CUresult and its name as
// cuGetErrorName gives it.
type Error struct {
	Call string // e.g. "cuMemAlloc_v2"
	Code Result
	Name string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Desc string // cuGetErrorString, may be empty
}

func (e *Error) Error() string {
	s := fmt.Sprintf("cuda: %s: %s (%d)", e.Call, e.Name, int32(e.Code))
	if e.Desc != "" {
		s += ": " + e.Desc
	}
	return s
}

// Sticky reports whether the error poisoned its context.
func (e *Error) Sticky() bool { return e.Code.sticky() }

// ErrNoDevice is returned (wrapped, with the reason on one line) when the
// CUDA driver library cannot be loaded, lacks a needed entry point, or
// reports no usable device.
var ErrNoDevice = errors.New("cuda: no usable device")

// ErrPoisoned is wrapped by every call made after a sticky error: the
// context is dead and its results must not be trusted.
var ErrPoisoned = errors.New("cuda: context poisoned by an earlier error")

// ErrClosed is returned by calls on a closed device.
var ErrClosed = errors.New("cuda: device closed")

// noDevice wraps ErrNoDevice with a one-line reason.
func noDevice(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrNoDevice, fmt.Sprintf(format, a...))
}

// IsCode reports whether err is a driver error with the given result.
func IsCode(err error, r Result) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == r
}
