package kern

import (
	"math"
	"testing"
)

// TestActQuant: the reference's scale, rounding and zero blocks.
func TestActQuant(t *testing.T) {
	x := make([]float32, 70)
	for i := range x {
		x[i] = float32(i%32) - 10.5
	}
	x[40] = 127 // block 1's amax: d = 1, so every value rounds to an integer
	x[65] = float32(math.NaN())
	got := ActQuant(x)
	d0 := float64(float32(20.5) / 127)
	for i := range 32 {
		want := math.RoundToEven(float64(x[i]*(127/float32(20.5)))) * d0
		if got[i] != want {
			t.Fatalf("block 0 element %d: %g, want %g", i, got[i], want)
		}
	}
	if got[41] != math.RoundToEven(float64(x[41])) || got[40] != 127 {
		t.Fatalf("block 1: %g %g", got[40], got[41])
	}
	for i := 64; i < 70; i++ {
		if got[i] != 0 {
			t.Fatalf("a block holding NaN must be zeros: element %d = %g", i, got[i])
		}
	}
	tiny := []float32{0x1p-121, -0x1p-122}
	if g := ActQuant(tiny); g[0] != 0 || g[1] != 0 {
		t.Fatalf("a block below 2^-120 must be zeros: %v", g)
	}
}
