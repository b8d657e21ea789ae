package half

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestF16RoundTripAll checks every finite binary16 value survives f16→f32→f16.
func TestF16RoundTripAll(t *testing.T) {
	for i := 0; i < 65536; i++ {
		h := uint16(i)
		f := F16ToF32(h)
		if math.IsNaN(float64(f)) {
			if g := F16ToF32(F32ToF16(f)); !math.IsNaN(float64(g)) {
				t.Fatalf("NaN %#04x lost", h)
			}
			continue
		}
		if got := F32ToF16(f); got != h {
			t.Fatalf("%#04x -> %v -> %#04x", h, f, got)
		}
	}
}

// TestF16Rounding checks round-to-nearest-even against a brute-force search
// of the two neighbouring f16 values.
func TestF16Rounding(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200000; i++ {
		f := float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(40)-25)))
		h := F32ToF16(f)
		got := float64(F16ToF32(h))
		// The distance to the chosen value must not exceed the distance to its neighbours.
		for _, n := range []uint16{h - 1, h + 1} {
			if n&0x7c00 == 0x7c00 {
				continue
			}
			alt := float64(F16ToF32(n))
			if math.Signbit(alt) != math.Signbit(got) && alt != 0 {
				continue
			}
			d, da := math.Abs(got-float64(f)), math.Abs(alt-float64(f))
			if da < d || (da == d && h&1 == 1) {
				t.Fatalf("f=%g rounded to %g (%#04x), neighbour %g is nearer or even", f, got, h, alt)
			}
		}
	}
	cases := map[float32]uint16{1: 0x3c00, -2: 0xc000, 65504: 0x7bff, 65520: 0x7c00, 1e-8: 0, 5.9604645e-08: 1, float32(math.Inf(-1)): 0xfc00}
	for f, want := range cases {
		if got := F32ToF16(f); got != want {
			t.Errorf("F32ToF16(%g)=%#04x want %#04x", f, got, want)
		}
	}
}

func TestBF16(t *testing.T) {
	cases := map[float32]uint16{1: 0x3f80, -1: 0xbf80, 1.00390625: 0x3f80 /* tie to even */, 1.01171875: 0x3f82 /* tie to even, up */}
	for f, want := range cases {
		if got := F32ToBF16(f); got != want {
			t.Errorf("F32ToBF16(%g)=%#04x want %#04x", f, got, want)
		}
	}
	for i := 0; i < 65536; i++ {
		f := BF16ToF32(uint16(i))
		if math.IsNaN(float64(f)) {
			continue
		}
		if got := F32ToBF16(f); got != uint16(i) {
			t.Fatalf("bf16 %#04x round trip gave %#04x", i, got)
		}
	}
	if !math.IsNaN(float64(BF16ToF32(F32ToBF16(float32(math.NaN()))))) {
		t.Fatal("bf16 NaN lost")
	}
}
