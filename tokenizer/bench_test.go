package tokenizer

import (
	"compress/gzip"
	"io"
	"os"
	"testing"
)

// benchText is ~100 KB of the Go language specification (HTML: English
// prose with code examples), testdata/bench_go_spec.txt.gz.
func benchText(b *testing.B) string {
	b.Helper()
	f, err := os.Open("testdata/bench_go_spec.txt.gz")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		b.Fatal(err)
	}
	t, err := io.ReadAll(zr)
	if err != nil {
		b.Fatal(err)
	}
	return string(t)
}

// BenchmarkEncodeQwen3 measures Encode throughput with the word cache warm
// (the steady state of a server).
func BenchmarkEncodeQwen3(b *testing.B) {
	tok := loadQwen3(b)
	text := benchText(b)
	tok.Encode(text, false, true)
	b.SetBytes(int64(len(text)))
	var n int
	for b.Loop() {
		n = len(tok.Encode(text, false, true))
	}
	b.ReportMetric(float64(len(text))/float64(n), "bytes/token")
}

// BenchmarkEncodeQwen3Cold empties the word cache before every run, so
// every distinct word goes through BPE merging once.
func BenchmarkEncodeQwen3Cold(b *testing.B) {
	tok := loadQwen3(b)
	text := benchText(b)
	m := tok.model.(*bpeModel)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		m.cache.reset()
		tok.Encode(text, false, true)
	}
}

// BenchmarkPreTokenize compares the hand-written matcher with regexp2 on
// the Qwen2 pattern.
func BenchmarkPreTokenize(b *testing.B) {
	text := benchText(b)
	re, err := compileRegex(patQwen2)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		m    matcher
	}{{"fast", fastMatcherFor(patQwen2)}, {"regexp2", re}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			var buf [][2]int
			for b.Loop() {
				buf, _ = c.m.findAll(text, buf[:0])
			}
		})
	}
}

func BenchmarkDecodeQwen3(b *testing.B) {
	tok := loadQwen3(b)
	text := benchText(b)
	ids := tok.Encode(text, false, true)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Decode(ids)
	}
}

func BenchmarkStreamDecodeQwen3(b *testing.B) {
	tok := loadQwen3(b)
	text := benchText(b)
	ids := tok.Encode(text, false, true)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		d := NewDecoder(tok)
		for _, id := range ids {
			d.Push(id)
		}
		d.Flush()
	}
}
