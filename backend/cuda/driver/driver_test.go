package driver

import (
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hasLibcuda reports whether this machine has a loadable driver library.
func hasLibcuda() bool {
	_, err := load()
	return err == nil
}

// On a machine without libcuda (CI, the development machines) Open fails
// with ErrNoDevice and says why in one line; with a driver, it opens a
// device or fails with ErrNoDevice naming the driver's answer.
func TestOpenWithoutDriver(t *testing.T) {
	d, err := Open(0)
	if err == nil {
		defer d.Close()
		info := d.Info()
		if info.Name == "" || info.SMs <= 0 || info.TotalMem <= 0 || info.Major <= 0 {
			t.Fatalf("opened a device with implausible info %+v", info)
		}
		t.Logf("device: %+v", info)
		return
	}
	if !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Open: %v, want an error wrapping ErrNoDevice", err)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		t.Fatalf("reason spans lines: %q", msg)
	}
	if !hasLibcuda() && !strings.Contains(msg, "libcuda.so.1") {
		t.Fatalf("reason does not name the library: %q", msg)
	}
	t.Logf("Open(0): %v", err)
}

func TestOpenLibMissing(t *testing.T) {
	_, err := openLib([]string{"libcortiq-does-not-exist.so.7"})
	if !errors.Is(err, ErrNoDevice) || !strings.Contains(err.Error(), "libcortiq-does-not-exist.so.7") {
		t.Fatalf("openLib: %v", err)
	}
}

func TestArgsPacking(t *testing.T) {
	var a Args
	a.U32(7).Ptr(0x1122334455667788).F32(1.5).I32(-2).Struct([]byte{1, 2, 3}, 1).U64(9).Struct(make([]byte, 12), 16)
	wantOff := []int{0, 8, 16, 20, 24, 32, 48}
	wantSize := []int{4, 8, 4, 4, 3, 8, 12}
	if a.Len() != len(wantOff) {
		t.Fatalf("%d params", a.Len())
	}
	for i := range wantOff {
		if a.Offset(i) != wantOff[i] || a.ParamSize(i) != wantSize[i] {
			t.Errorf("param %d at %d size %d, want %d size %d", i, a.Offset(i), a.ParamSize(i), wantOff[i], wantSize[i])
		}
	}
	b := a.Bytes()
	if binary.LittleEndian.Uint32(b[0:]) != 7 || binary.LittleEndian.Uint64(b[8:]) != 0x1122334455667788 ||
		binary.LittleEndian.Uint32(b[16:]) != 0x3fc00000 || int32(binary.LittleEndian.Uint32(b[20:])) != -2 ||
		b[24] != 1 || b[26] != 3 || binary.LittleEndian.Uint64(b[32:]) != 9 {
		t.Fatalf("packed bytes % x", b)
	}
	if a.Size() != 60 {
		t.Fatalf("size %d", a.Size())
	}
	if err := a.Check([]Param{{0, 4}, {8, 8}, {16, 4}, {20, 4}, {24, 3}, {32, 8}, {48, 12}}); err != nil {
		t.Fatal(err)
	}
	if err := a.Check([]Param{{0, 4}}); err == nil {
		t.Fatal("count mismatch accepted")
	}
	if err := a.Check([]Param{{0, 8}, {8, 8}, {16, 4}, {20, 4}, {24, 3}, {32, 8}, {48, 12}}); err == nil {
		t.Fatal("size mismatch accepted")
	}
	a.Reset()
	if a.Len() != 0 || a.Size() != 0 {
		t.Fatal("Reset left parameters")
	}
	a.Int(1 << 40)
	if a.Err() == nil || a.Check([]Param{{0, 4}}) == nil {
		t.Fatal("an int beyond a C int was accepted")
	}
	a.Reset().Struct([]byte{1}, 3)
	if a.Err() == nil {
		t.Fatal("alignment 3 accepted")
	}
}

// newTestCtx is a Ctx with scratch memory but no driver, for the parts
// that run on the host.
func newTestCtx(t *testing.T) *Ctx {
	mem, err := unix.Mmap(-1, 0, scratchSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return &Ctx{d: &Device{lib: &lib{fn: map[string]uintptr{}}}, scratch: mem}
}

// marshal builds the kernelParams array the driver reads: pointer i
// points at parameter i's bytes, all outside the Go heap.
func TestMarshal(t *testing.T) {
	c := newTestCtx(t)
	var a Args
	a.U32(0xdeadbeef).Ptr(0x0102030405060708).F32(-3)
	p, err := c.marshal(&a)
	if err != nil {
		t.Fatal(err)
	}
	lo := uintptr(unsafe.Pointer(&c.scratch[0]))
	hi := lo + uintptr(len(c.scratch))
	if p < lo || p >= hi {
		t.Fatal("kernelParams outside scratch memory")
	}
	ptrs := c.scratch[p-lo:]
	for i, want := range []uint64{0xdeadbeef, 0x0102030405060708, 0xc0400000} {
		q := uintptr(binary.LittleEndian.Uint64(ptrs[8*i:]))
		if q < lo || q >= hi || (q-lo)%uintptr(a.ParamSize(i)) != 0 {
			t.Fatalf("param %d pointer %#x outside scratch or misaligned", i, q)
		}
		v := c.scratch[q-lo:]
		var got uint64
		if a.ParamSize(i) == 8 {
			got = binary.LittleEndian.Uint64(v)
		} else {
			got = uint64(binary.LittleEndian.Uint32(v))
		}
		if got != want {
			t.Fatalf("param %d = %#x, want %#x", i, got, want)
		}
	}
	if p, err := c.marshal(nil); p != 0 || err != nil {
		t.Fatal("no arguments should give a nil kernelParams")
	}
	big := &Args{}
	big.Struct(make([]byte, MaxArgBytes+1), 1)
	if _, err := c.marshal(big); err == nil {
		t.Fatal("an oversized argument block was accepted")
	}
}

func TestLaunchConfigLayout(t *testing.T) {
	b := make([]byte, launchConfigSize+launchAttrSize)
	putLaunchConfig(b, Config{Grid: D3(2, 3, 4), Block: D2(128, 2), Shared: 4096, Stream: 0xabc, PDL: true}, 0x5000)
	le := binary.LittleEndian
	for i, w := range []uint32{2, 3, 4, 128, 2, 1, 4096} {
		if le.Uint32(b[4*i:]) != w {
			t.Fatalf("config word %d = %d, want %d", i, le.Uint32(b[4*i:]), w)
		}
	}
	if le.Uint64(b[32:]) != 0xabc || le.Uint64(b[40:]) != 0x5000 || le.Uint32(b[48:]) != 1 {
		t.Fatalf("stream/attrs/numAttrs wrong: % x", b[32:56])
	}
	if le.Uint32(b[56:]) != 6 || le.Uint32(b[64:]) != 1 {
		t.Fatalf("attribute wrong: % x", b[56:])
	}
	// Without PDL (cluster occupancy queries): no attribute.
	clear(b)
	putLaunchConfig(b, Config{Grid: D3(1, 7, 1), Block: D1(256), Shared: 111 << 10}, 0x5000)
	if le.Uint32(b[4:]) != 7 || le.Uint32(b[24:]) != 111<<10 || le.Uint64(b[40:]) != 0 || le.Uint32(b[48:]) != 0 || le.Uint32(b[56:]) != 0 {
		t.Fatalf("config without attributes wrong: % x", b)
	}
}

func TestErrorsAndPoison(t *testing.T) {
	e := &Error{Call: "cuMemAlloc_v2", Code: ErrOutOfMemory, Name: "CUDA_ERROR_OUT_OF_MEMORY", Desc: "out of memory"}
	if got := e.Error(); got != "cuda: cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory" {
		t.Fatalf("Error() = %q", got)
	}
	if e.Sticky() || !Result(700).sticky() || !Result(719).sticky() || Result(600).sticky() {
		t.Fatal("sticky classification")
	}
	if !IsCode(e, ErrOutOfMemory) || IsCode(errors.New("x"), ErrOutOfMemory) {
		t.Fatal("IsCode")
	}
	c := newTestCtx(t)
	if err := c.call("cuInit", 0); err == nil || !strings.Contains(err.Error(), "outside Device.Do") {
		t.Fatalf("call outside Do: %v", err)
	}
	c.active = true
	if err := c.call("cuInit", 0); !IsCode(err, ErrNotFound) {
		t.Fatalf("missing entry point: %v", err)
	}
	// A sticky result poisons the context; later calls are refused.
	if err := c.result("cuStreamSynchronize", 700); err == nil || c.Poisoned() == nil {
		t.Fatal("illegal address did not poison")
	}
	err := c.call("cuMemAlloc_v2", 0, 0)
	if !errors.Is(err, ErrPoisoned) || !strings.Contains(err.Error(), "cuStreamSynchronize") {
		t.Fatalf("call after poison: %v", err)
	}
	if _, err := c.StreamDone(0); !errors.Is(err, ErrPoisoned) {
		t.Fatalf("query after poison: %v", err)
	}
}

func TestHostBufChecks(t *testing.T) {
	h := &HostBuf{n: 16}
	if h.check(0, 16) != nil || h.check(8, 9) == nil || h.check(-1, 1) == nil {
		t.Fatal("bounds")
	}
	h.freed = true
	if h.check(0, 1) == nil || h.Bytes() != nil {
		t.Fatal("freed buffer usable")
	}
}

func TestMain(m *testing.M) { os.Exit(m.Run()) }

// A closure that ends the device thread (t.Fatal inside Do would) makes Do
// fail instead of hanging, and the device refuses later calls.
func TestDoSurvivesGoexit(t *testing.T) {
	d := &Device{lib: &lib{fn: map[string]uintptr{}}, work: make(chan func()), stopped: make(chan struct{})}
	d.ctx.d = d
	ready := make(chan error, 1)
	go d.loop(ready)
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	ran := false
	if err := d.Do(func(c *Ctx) error { ran = c.active; return nil }); err != nil || !ran {
		t.Fatalf("Do: %v, active %v", err, ran)
	}
	err := d.Do(func(*Ctx) error { runtime.Goexit(); return nil })
	if !errors.Is(err, ErrClosed) || d.threadAlive() {
		t.Fatalf("Do after Goexit: %v (thread alive %v)", err, d.threadAlive())
	}
	if err := d.Do(func(*Ctx) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do on a dead device: %v", err)
	}
}

// Do from many goroutines runs one closure at a time, all on one OS thread.
func TestDoSerialises(t *testing.T) {
	d := &Device{lib: &lib{fn: map[string]uintptr{}}, work: make(chan func()), stopped: make(chan struct{})}
	d.ctx.d = d
	ready := make(chan error, 1)
	go d.loop(ready)
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	defer d.stop()
	var inside, maxInside, calls int
	tids := map[int]bool{}
	done := make(chan error)
	for range 8 {
		go func() {
			for range 50 {
				err := d.Do(func(c *Ctx) error {
					inside++
					maxInside = max(maxInside, inside)
					calls++
					tids[unix.Gettid()] = true
					inside--
					return nil
				})
				if err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if calls != 400 || maxInside != 1 || len(tids) != 1 {
		t.Fatalf("calls %d, max concurrent %d, OS threads %d", calls, maxInside, len(tids))
	}
}
