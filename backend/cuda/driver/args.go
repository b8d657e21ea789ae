package driver

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Args packs kernel arguments: each value at its natural alignment in one
// byte block, as the launcher hands them to the driver (a pointer per
// parameter into the block). An Args is plain Go data; Launch copies it
// into the device thread's memory outside the Go heap. Reset and reuse one
// to avoid allocating per launch.
type Args struct {
	buf   []byte
	offs  []int
	sizes []int
	err   error // the first packing mistake, reported by Launch
}

// Reset empties a for reuse.
func (a *Args) Reset() *Args {
	a.buf, a.offs, a.sizes, a.err = a.buf[:0], a.offs[:0], a.sizes[:0], nil
	return a
}

// Len returns the number of parameters.
func (a *Args) Len() int { return len(a.offs) }

// Size returns the packed size in bytes.
func (a *Args) Size() int { return len(a.buf) }

// Offset and ParamSize describe parameter i in the block.
func (a *Args) Offset(i int) int    { return a.offs[i] }
func (a *Args) ParamSize(i int) int { return a.sizes[i] }

// Bytes returns the packed block (shared; valid until the next change).
func (a *Args) Bytes() []byte { return a.buf }

// slot appends a parameter of n bytes aligned to align and returns it.
func (a *Args) slot(n, align int) []byte {
	off := (len(a.buf) + align - 1) &^ (align - 1)
	old, end := len(a.buf), off+n
	if end <= cap(a.buf) {
		a.buf = a.buf[:end]
		clear(a.buf[old:end]) // the padding and the slot
	} else {
		a.buf = append(a.buf, make([]byte, end-old)...)
	}
	a.offs = append(a.offs, off)
	a.sizes = append(a.sizes, n)
	return a.buf[off : off+n]
}

// Ptr appends a device pointer (8 bytes).
func (a *Args) Ptr(p DevicePtr) *Args {
	binary.LittleEndian.PutUint64(a.slot(8, 8), uint64(p))
	return a
}

// U64 appends a 64-bit unsigned integer.
func (a *Args) U64(v uint64) *Args { binary.LittleEndian.PutUint64(a.slot(8, 8), v); return a }

// I64 appends a 64-bit signed integer.
func (a *Args) I64(v int64) *Args { return a.U64(uint64(v)) }

// U32 appends a 32-bit unsigned integer.
func (a *Args) U32(v uint32) *Args { binary.LittleEndian.PutUint32(a.slot(4, 4), v); return a }

// I32 appends a 32-bit signed integer (C int).
func (a *Args) I32(v int32) *Args { return a.U32(uint32(v)) }

// Int appends a Go int as a C int, which it must fit.
func (a *Args) Int(v int) *Args {
	if v < math.MinInt32 || v > math.MaxInt32 {
		a.fail(fmt.Errorf("cuda: argument %d: %d does not fit a C int", len(a.offs), v))
	}
	return a.I32(int32(v))
}

// F32 appends a float.
func (a *Args) F32(v float32) *Args {
	binary.LittleEndian.PutUint32(a.slot(4, 4), math.Float32bits(v))
	return a
}

// Struct appends a by-value struct of the given C layout bytes and
// alignment (a power of two, at most 16).
func (a *Args) Struct(b []byte, align int) *Args {
	if align <= 0 || align > 16 || align&(align-1) != 0 {
		a.fail(fmt.Errorf("cuda: argument %d: struct alignment %d is not a power of two up to 16", len(a.offs), align))
		align = 16
	}
	copy(a.slot(len(b), align), b)
	return a
}

func (a *Args) fail(err error) {
	if a.err == nil {
		a.err = err
	}
}

// Err returns the first packing mistake (a value that does not fit its C
// type), which Launch also reports.
func (a *Args) Err() error { return a.err }

// Check compares the packed parameters with a kernel's list from Params:
// the count and every size must match.
func (a *Args) Check(ps []Param) error {
	if a.err != nil {
		return a.err
	}
	if len(ps) != len(a.sizes) {
		return fmt.Errorf("cuda: kernel takes %d parameters, %d packed", len(ps), len(a.sizes))
	}
	for i, p := range ps {
		if p.Size != a.sizes[i] {
			return fmt.Errorf("cuda: kernel parameter %d is %d bytes, %d packed", i, p.Size, a.sizes[i])
		}
	}
	return nil
}
