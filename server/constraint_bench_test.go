package server

import (
	"compress/gzip"
	"io"
	"os"
	"testing"

	"github.com/cortiq/cortiq/tokenizer"
)

// qwen3Vocab is the real 151k-token Qwen3 vocabulary from the tokenizer's
// test data.
func qwen3Vocab(b testing.TB) *vocab {
	f, err := os.Open("../tokenizer/testdata/qwen3/tokenizer.json.gz")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		b.Fatal(err)
	}
	blob, err := io.ReadAll(zr)
	if err != nil {
		b.Fatal(err)
	}
	tok, err := tokenizer.FromHFJSON(blob, tokenizer.Config{})
	if err != nil {
		b.Fatal(err)
	}
	return vocabOf(tok, tok.VocabSize(), []int32{151645})
}

// BenchmarkMask: one constrained-decoding mask over the Qwen3 vocabulary,
// inside a free string (the widest walk: almost every token continues it)
// and where a key is due (most tokens pruned at their first byte).
func BenchmarkMask(b *testing.B) {
	v := qwen3Vocab(b)
	logits := make([]float32, v.size)
	for _, c := range []struct{ name, prefix string }{{"in-string", `{"a":"x`}, {"key-due", `{"a":1,`}} {
		b.Run(c.name, func(b *testing.B) {
			g := newGrammarConstraint(v, anyObjectNode)
			for _, x := range []byte(c.prefix) {
				if !g.st.feed(x) {
					b.Fatal("prefix rejected")
				}
			}
			allowed := 0
			b.SetBytes(int64(v.size) * 4)
			for b.Loop() {
				g.mask(logits)
			}
			for _, ok := range g.allowed {
				if ok {
					allowed++
				}
			}
			b.ReportMetric(float64(allowed), "allowed")
		})
	}
}
