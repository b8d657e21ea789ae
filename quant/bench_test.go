package quant

import (
	"math/rand/v2"
	"testing"
)

// go test ./quant -run '^$' -bench . -benchtime 3x

func BenchmarkEncode(b *testing.B) {
	const rows, cols = 256, 4096
	w := randMatrix(rand.New(rand.NewPCG(11, 11)), rows, cols)
	for _, d := range floatDTypes {
		b.Run(d.String(), func(b *testing.B) {
			c, _ := CodecFor(d)
			nb, _ := ExpectedBytes(d, []int{rows, cols})
			dst := make([]byte, nb)
			var opt *EncodeOptions
			if d == Q82F {
				opt = &EncodeOptions{Col: FitColumns(w, rows, cols, nil)}
			}
			b.SetBytes(int64(4 * rows * cols))
			for b.Loop() {
				if err := c.EncodeRows(dst, w, rows, cols, 0, opt); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("q8_2f-fit", func(b *testing.B) {
		b.SetBytes(int64(4 * rows * cols))
		for b.Loop() {
			FitColumns(w, rows, cols, nil)
		}
	})
}

func BenchmarkDotRow(b *testing.B) {
	const rows, cols = 64, 4096
	r := rand.New(rand.NewPCG(12, 12))
	w := randMatrix(r, rows, cols)
	x := make([]float32, cols)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	for _, d := range floatDTypes {
		b.Run(d.String(), func(b *testing.B) {
			c, _ := CodecFor(d)
			enc := mustEncode(b, d, w, []int{rows, cols}, nil)
			b.SetBytes(int64(len(enc) / rows)) // stored bytes per row
			var sink float32
			i := 0
			for b.Loop() {
				sink += c.DotRow(enc, rows, cols, i%rows, x)
				i++
			}
			b.ReportMetric(float64(cols)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gweights/s")
			_ = sink
		})
	}
}
