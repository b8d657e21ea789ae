package bench

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/synth"
)

func TestBenchTinyModel(t *testing.T) {
	a, _ := synth.Arch("tiny_llama", "")
	p := filepath.Join(t.TempDir(), "m.cmf")
	if _, err := synth.Write(context.Background(), p, a, quant.Q8Row, synth.Options{Seed: 1}); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Open(p, engine.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	bw := ReadBandwidth(64<<20, 2, 2)
	if bw < 1e8 || bw > 1e13 {
		t.Fatalf("read bandwidth %.3g B/s is implausible", bw)
	}
	res, err := Run(context.Background(), p, e, Config{Prompt: 16, Gen: 8, Reps: 2, Threads: 2, Probe: func() float64 { return bw }}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || res[0].Test != "pp16" || res[1].Test != "tg8" || len(res[1].Samples) != 2 {
		t.Fatalf("results %+v", res)
	}
	for _, r := range res {
		if !(r.TokPerSec > 0) {
			t.Fatalf("%s: %v tok/s", r.Test, r.TokPerSec)
		}
	}
	// Decode reads every matrix but the untied embedding, of which one row.
	var want int64
	for _, tt := range e.File.Tensors {
		switch {
		case tt.DType == quant.U8:
		case tt.Name == "model.embed_tokens.weight":
			want += tt.Size / int64(tt.Shape[0])
		default:
			want += tt.Size
		}
	}
	if res[1].BytesPerTok != want || res[1].BandwidthPct <= 0 {
		t.Fatalf("bytes per token %d, want %d (pct %v)", res[1].BytesPerTok, want, res[1].BandwidthPct)
	}
	var sb strings.Builder
	(&Report{ReadBandwidth: bw, Threads: 2, Results: res}).Markdown(&sb)
	if !strings.Contains(sb.String(), "| tg8 |") || !strings.Contains(sb.String(), "read bandwidth") {
		t.Fatalf("table:\n%s", sb.String())
	}
}

func TestSumWideMatchesScalar(t *testing.T) {
	b := make([]uint64, 1000+37)
	for i := range b {
		b[i] = uint64(i)*0x9e3779b97f4a7c15 + 7
	}
	if s, ok := sumWide(b); ok && s != sumWords(b) {
		t.Fatalf("wide sum %d, scalar %d", s, sumWords(b))
	}
}
