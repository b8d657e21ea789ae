package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/quant"
)

// cli runs the command line in-process and returns stdout and the error.
func cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func writeTiny(t *testing.T, path string) {
	t.Helper()
	hdr := &cmf.Header{Arch: cmf.Arch{ArchName: "llama", HiddenSize: 64, NumLayers: 1, VocabSize: 8, NumAttentionHeads: 4, NumKVHeads: 4, HeadDim: 16, NormStyle: "standard", PartialRotaryFactor: 1}, QuantType: "q8_row"}
	w := make([]float32, 8*64)
	for i := range w {
		w[i] = float32(i%17) - 8
	}
	q, err := quant.Encode(quant.Q8Row, w, []int{8, 64}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f32 := make([]byte, 64*4)
	specs := []cmf.TensorSpec{{Name: "model.embed_tokens.weight", DType: quant.Q8Row, Shape: []int{8, 64}}, {Name: "model.norm.weight", DType: quant.F32, Shape: []int{64}}}
	wr, err := cmf.Create(path, hdr, specs, cmf.WriteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := wr.WriteTensor(specs[0].Name, q); err != nil {
		t.Fatal(err)
	}
	if err := wr.WriteTensor(specs[1].Name, f32); err != nil {
		t.Fatal(err)
	}
	if err := wr.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestInspectAndVerify(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tiny.cmf")
	writeTiny(t, p)
	out, err := cli(t, "inspect", p)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"llama", "model.embed_tokens.weight", "q8_row", "[8, 64]", "8.250 bpw", "directory"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	out, err = cli(t, "inspect", "--json", p)
	if err != nil {
		t.Fatal(err)
	}
	var r report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Tensors) != 2 || r.Tensors[0].Bytes != 8*64+16 || r.Header.Arch.HiddenSize != 64 {
		t.Fatalf("json report: %+v", r)
	}
	if out, err = cli(t, "verify", p); err != nil || !strings.HasPrefix(out, "OK") {
		t.Fatalf("verify good file: %v %s", err, out)
	}
	// A flipped byte in each section makes verify fail with exit 2, naming it.
	m, err := cmf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	secs := m.Sections()
	tt, _ := m.Tensor("model.embed_tokens.weight")
	abs, _ := m.AbsOffset(tt)
	m.Close()
	good, _ := os.ReadFile(p)
	for _, c := range []struct {
		off  int64
		want string
	}{{100, "preamble"}, {secs[0].Offset + 3, "header"}, {secs[1].Offset + 3, "directory"}, {abs + 10, "tensor model.embed_tokens.weight"}, {secs[2].Offset + secs[2].Size - 1, "data"}} {
		b := append([]byte(nil), good...)
		b[c.off] ^= 1
		os.WriteFile(p, b, 0o644)
		out, err := cli(t, "verify", p)
		if err == nil || exitCode(err) != 2 {
			t.Fatalf("flip at %d: verify returned %v", c.off, err)
		}
		if !strings.Contains(out+err.Error(), c.want) {
			t.Errorf("flip at %d: %q / %v does not name %q", c.off, out, err, c.want)
		}
	}
	if _, err := cli(t, "inspect", filepath.Join(t.TempDir(), "missing.cmf")); err == nil {
		t.Fatal("inspect of a missing file succeeded")
	}
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestHandleSignals(t *testing.T) {
	// A Ctrl-C taken by the hook does not cancel; SIGTERM does, and then
	// signals stop being caught.
	sigs := make(chan os.Signal, 3)
	cancelled, stopped, hooked := false, false, 0
	h := func() bool { hooked++; return true }
	interruptHook.Store(&h)
	defer interruptHook.Store(nil)
	sigs <- os.Interrupt
	sigs <- syscall.SIGTERM
	close(sigs)
	handleSignals(sigs, func() { cancelled = true }, func() { stopped = true })
	if hooked != 1 || !cancelled || !stopped {
		t.Fatalf("hooked %d, cancelled %v, stopped %v", hooked, cancelled, stopped)
	}
	// Without a hook, Ctrl-C cancels.
	interruptHook.Store(nil)
	sigs = make(chan os.Signal, 1)
	sigs <- os.Interrupt
	cancelled = false
	handleSignals(sigs, func() { cancelled = true }, func() {})
	if !cancelled {
		t.Fatal("Ctrl-C without a hook did not cancel")
	}
}
