package tokenizer

import (
	"compress/gzip"
	"io"
	"os"
	"sync"
	"testing"
)

var (
	qwen3Once sync.Once
	qwen3Tok  *Tokenizer
	qwen3Err  error
)

// loadQwen3 loads the real Qwen3 tokenizer from testdata/qwen3.
func loadQwen3(t testing.TB) *Tokenizer {
	t.Helper()
	qwen3Once.Do(func() {
		f, err := os.Open("testdata/qwen3/tokenizer.json.gz")
		if err != nil {
			qwen3Err = err
			return
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			qwen3Err = err
			return
		}
		js, err := io.ReadAll(zr)
		if err != nil {
			qwen3Err = err
			return
		}
		cj, err := os.ReadFile("testdata/qwen3/tokenizer_config.json")
		if err != nil {
			qwen3Err = err
			return
		}
		cfg, err := ParseHFConfig(cj)
		if err != nil {
			qwen3Err = err
			return
		}
		qwen3Tok, qwen3Err = FromHFJSON(js, cfg)
	})
	if qwen3Err != nil {
		t.Fatal(qwen3Err)
	}
	return qwen3Tok
}
