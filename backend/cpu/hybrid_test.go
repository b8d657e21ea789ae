package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/hugemem"
	"github.com/cortiq/cortiq/kernels"
	"github.com/cortiq/cortiq/quant"
)

// q8 returns a rows×cols q8_row tensor of pseudo-random weights.
func q8(t *testing.T, d *Device, name string, seed *uint64, rows, cols int) backend.Mat {
	data := make([]byte, rows*cols+2*rows)
	for i := range rows * cols {
		*seed = *seed*6364136223846793005 + 1442695040888963407
		data[i] = byte(*seed >> 56)
	}
	for r := range rows { // scale 0.01 (f16 0x211f)
		data[rows*cols+2*r], data[rows*cols+2*r+1] = 0x1f, 0x21
	}
	m, err := d.LoadMat(name, quant.Q8Row, rows, cols, data)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestMoEExpertsPacked checks that the device runs a MoE block on a
// packed copy of its experts when the kernel allows huge pages (and on
// the weights in place otherwise, or once packing is off), that the copy
// keeps the tensors' names for the observer, and that both give the
// same outputs.
func TestMoEExpertsPacked(t *testing.T) {
	d := New(2)
	defer d.Close()
	const E, k, H, I = 8, 2, 64, 96
	seed := uint64(9)
	w := &backend.MoE{Router: q8(t, d, "router", &seed, E, H), TopK: k, Renorm: true, Experts: make([]backend.Expert, E)}
	for e := range w.Experts {
		p := fmt.Sprintf("experts.%d.", e)
		w.Experts[e] = backend.Expert{Gate: q8(t, d, p+"gate", &seed, I, H), Up: q8(t, d, p+"up", &seed, I, H), Down: q8(t, d, p+"down", &seed, H, I)}
	}
	m, err := d.blocks.moeOf(w)
	if err != nil {
		t.Fatal(err)
	}
	inPlace := m.Experts[3].Up == matOf(w.Experts[3].Up).Mat
	if hugemem.Enabled() && hugemem.Available() > 1<<30 && inPlace {
		t.Fatal("huge pages are on and memory is free, but the experts were not packed")
	}
	if !inPlace && (&m.Experts[3].Up.Data[0] == &matOf(w.Experts[3].Up).Data[0] || d.blocks.packed != m.PackedBytes()) {
		t.Fatalf("packed experts share the original bytes, or the device counted %d packed bytes of %d", d.blocks.packed, m.PackedBytes())
	}
	t.Logf("experts packed: %v (%d bytes)", !inPlace, d.blocks.packed)
	if got := d.blocks.name(m.Experts[3].Up); got != "experts.3.up" {
		t.Fatalf("observer name of a packed expert: %q", got)
	}
	if m2, _ := d.blocks.moeOf(w); m2 != m {
		t.Fatal("a second use rebuilt the block")
	}
	d.blocks.noPack = true
	w2 := *w
	raw, err := d.blocks.moeOf(&w2)
	if err != nil {
		t.Fatal(err)
	}
	if raw.Experts[3].Up != matOf(w.Experts[3].Up).Mat {
		t.Fatal("with packing off the experts were copied")
	}
	x := make([]float32, 3*H)
	for i := range x {
		x[i] = float32(math.Sin(float64(i)))
	}
	for _, T := range []int{1, 3} {
		a, b := make([]float32, T*H), make([]float32, T*H)
		var s kernels.MoEScratch
		kernels.MoEForward(d.pool, m, x, T, a, &s)
		kernels.MoEForward(d.pool, raw, x, T, b, &s)
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("T=%d: output %d is %g with the experts packed, %g in place", T, i, a[i], b[i])
			}
		}
	}
}
