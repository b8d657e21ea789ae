package gguf

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// BenchmarkDequantize measures dequantization throughput per type over
// 1 Mi elements; bytes/s counts the packed input.
func BenchmarkDequantize(b *testing.B) {
	const n = 1 << 20
	r := rand.New(rand.NewPCG(1, 1))
	x := randFloats(r, n)
	types := make([]Type, 0, len(dequantizers))
	for t := range dequantizers {
		types = append(types, t)
	}
	slices.Sort(types)
	dst := make([]float32, n)
	for _, t := range types {
		src, err := Quantize(t, x)
		if err != nil {
			src = randomBlocks(r, t, n/t.BlockSize())
		}
		b.Run(t.String(), func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				if err := Dequantize(t, src, dst); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e6, "Melem/s")
		})
	}
}

// BenchmarkQuantize measures the fixture quantizers (not a hot path).
func BenchmarkQuantize(b *testing.B) {
	const n = 1 << 16
	x := randFloats(rand.New(rand.NewPCG(2, 2)), n)
	for _, t := range []Type{TypeQ8_0, TypeQ4_0, TypeQ4_K, TypeQ6_K} {
		b.Run(t.String(), func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				if _, err := Quantize(t, x); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkParseVocab measures parsing a header with a 150k-token vocab.
func BenchmarkParseVocab(b *testing.B) {
	const n = 150000
	toks := make([]string, n)
	scores := make([]float32, n)
	for i := range toks {
		toks[i] = fmt.Sprintf("tok%d", i)
		scores[i] = float32(-i)
	}
	w := NewWriter()
	_ = w.AddKV("tokenizer.ggml.tokens", Strings(toks))
	_ = w.AddKV("tokenizer.ggml.scores", Float32s(scores))
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(buf.Len()))
	for b.Loop() {
		if _, err := Parse(buf.Bytes()); err != nil {
			b.Fatal(err)
		}
	}
}
