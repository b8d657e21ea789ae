package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// TestOpsMatchReference compares the Dot, AXPY and SiLUMul kernels of
// every ISA level with the plain Go ones (and SiLUMul with float64) on
// odd lengths, unaligned slices and extreme values.
func TestOpsMatchReference(t *testing.T) {
	skipMissingISAs(t)
	r := rand.New(rand.NewPCG(23, 24))
	for _, l := range isaLevels() {
		withISA(t, l, func() {
			for _, n := range []int{1, 3, 15, 16, 17, 31, 33, 64, 65, 100, 1000} {
				a := randVec(r, n+1)[1:]
				b := randVec(r, n+3)[3:]
				// Dot: any summation order is within 1e-6 of Σ|a·b|.
				var mag float64
				for i := range a {
					mag += math.Abs(float64(a[i]) * float64(b[i]))
				}
				if got, want := Dot(a, b), dotGo(a, b); math.Abs(float64(got-want)) > 1e-6*mag {
					t.Fatalf("%s Dot n=%d: %g, plain %g", l, n, got, want)
				}
				// AXPY: one rounding per element (FMA) or two.
				y1 := append([]float32(nil), b...)
				y2 := append([]float32(nil), b...)
				AXPY(y1, 0.37, a)
				axpyGo(y2, 0.37, a)
				for i := range y1 {
					if d := math.Abs(float64(y1[i] - y2[i])); d > 2.5e-7*(math.Abs(float64(b[i]))+math.Abs(0.37*float64(a[i]))) {
						t.Fatalf("%s AXPY n=%d [%d]: %g, plain %g", l, n, i, y1[i], y2[i])
					}
				}
				// Softmax's exponentials and their float64 sum.
				e1 := append([]float32(nil), b...)
				e2 := append([]float32(nil), b...)
				sum1, sum2 := expSumVec(e1, 1.5), expSumGo(e2, 1.5)
				if math.Abs(sum1-sum2) > 1e-6*sum2 {
					t.Fatalf("%s expSum n=%d: %g, plain %g", l, n, sum1, sum2)
				}
				for i := range e1 {
					if d := math.Abs(float64(e1[i] - e2[i])); d > 4e-7*float64(e2[i]) {
						t.Fatalf("%s expSum n=%d [%d]: %g, plain %g", l, n, i, e1[i], e2[i])
					}
				}
				// SiLUMul, including large and tiny gates.
				g := append([]float32(nil), a...)
				for i := range g {
					switch i % 7 {
					case 1:
						g[i] *= 40
					case 2:
						g[i] = -100 - float32(i)
					case 3:
						g[i] = 90 + float32(i)
					}
				}
				s1 := append([]float32(nil), g...)
				SiLUMul(s1, b)
				for i, v := range g {
					x := float64(v)
					want := x / (1 + math.Exp(-x)) * float64(b[i])
					if d := math.Abs(float64(s1[i]) - want); !(d <= 5e-7*math.Abs(want)+1e-36) {
						t.Fatalf("%s SiLUMul n=%d [%d] gate %g: %g, want %g", l, n, i, v, s1[i], want)
					}
				}
			}
		})
	}
}

func BenchmarkOps(b *testing.B) {
	r := rand.New(rand.NewPCG(25, 26))
	x, y := randVec(r, 8192), randVec(r, 8192)
	b.Run(ISA()+"/Dot/64", func(b *testing.B) {
		for b.Loop() {
			sinkF += Dot(x[:64], y[:64])
		}
	})
	b.Run(ISA()+"/AXPY/64", func(b *testing.B) {
		for b.Loop() {
			AXPY(y[:64], 1e-9, x[:64])
		}
	})
	b.Run(ISA()+"/SiLUMul/8192", func(b *testing.B) {
		b.SetBytes(8 * 8192)
		z := append([]float32(nil), x...)
		for b.Loop() {
			copy(z, x)
			SiLUMul(z, y)
		}
	})
}

var sinkF float32

func TestStreamRead(t *testing.T) {
	skipMissingISAs(t)
	for _, l := range isaLevels() {
		withISA(t, l, func() {
			for _, n := range []int{0, 1, 255, 256, 257, 4096 + 17} {
				b := make([]byte, n)
				for i := range b {
					b[i] = byte(i*7 + 1)
				}
				// XOR of the 8-byte words, then the tail bytes.
				var want uint64
				m := n &^ 255
				for i := 0; i+8 <= m; i += 8 {
					want ^= binary.LittleEndian.Uint64(b[i:])
				}
				for _, v := range b[m:] {
					want ^= uint64(v)
				}
				if got := streamRead(b); got != want {
					t.Fatalf("%s n=%d: %x, want %x", l, n, got, want)
				}
			}
		})
	}
}
