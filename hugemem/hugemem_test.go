package hugemem

import (
	"runtime"
	"testing"
	"unsafe"
)

func TestAlloc(t *testing.T) {
	for _, n := range []int{1, 4096, PageSize - 1, PageSize, 3*PageSize + 5} {
		b, err := Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		m := b.Bytes()
		if len(m) != n || cap(m) != n {
			t.Fatalf("Alloc(%d): len %d cap %d", n, len(m), cap(m))
		}
		if p := uintptr(unsafe.Pointer(&m[0])); p%PageSize != 0 {
			t.Fatalf("Alloc(%d) at %#x: not %d-aligned", n, p, PageSize)
		}
		for i, v := range m {
			if v != 0 {
				t.Fatalf("Alloc(%d): byte %d = %d, want zero memory", n, i, v)
			}
		}
		for i := range m {
			m[i] = byte(i * 7)
		}
		for i, v := range m {
			if v != byte(i*7) {
				t.Fatalf("Alloc(%d): byte %d reads %d after writing %d", n, i, v, byte(i*7))
			}
		}
		runtime.KeepAlive(b)
	}
	if _, err := Alloc(0); err == nil {
		t.Fatal("Alloc(0) gave no error")
	}
	if _, err := Alloc(-3); err == nil {
		t.Fatal("Alloc(-3) gave no error")
	}
	t.Logf("THP enabled for advised memory: %v, MemAvailable %d MB", Enabled(), Available()>>20)
}
