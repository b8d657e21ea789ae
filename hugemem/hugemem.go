// Package hugemem provides large byte buffers outside the Go heap that the
// kernel backs, where it can, with 2 MB transparent huge pages: weights
// read at random places (the experts of a MoE layer) then cost one TLB
// entry per 2 MB instead of one per 4 KB page.
package hugemem

import (
	"fmt"
	"runtime"
)

// PageSize is the size of a huge page, the alignment of a Buf.
const PageSize = 2 << 20

// Buf is n bytes of zeroed memory, PageSize-aligned. It is released when
// the Buf becomes unreachable: whoever keeps slices of Bytes must keep
// the Buf too.
type Buf struct {
	b    []byte
	huge bool
}

// Bytes returns the buffer.
func (b *Buf) Bytes() []byte { return b.b }

// Advised reports whether the kernel accepted the huge-page advice for
// the buffer (it may still back parts of it with small pages).
func (b *Buf) Advised() bool { return b.huge }

// Alloc returns a buffer of n > 0 bytes advised for huge pages before
// first touch.
func Alloc(n int) (*Buf, error) {
	if n <= 0 {
		return nil, fmt.Errorf("hugemem: allocation of %d bytes", n)
	}
	mem, huge, err := alloc(n)
	if err != nil {
		return nil, fmt.Errorf("hugemem: %d bytes: %w", n, err)
	}
	b := &Buf{b: mem[:n:n], huge: huge}
	runtime.AddCleanup(b, free, mem)
	return b, nil
}
