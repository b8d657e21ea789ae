package bench

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/synth"
	"github.com/cortiq/cortiq/units"
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
	// Each figure against a reference: the mean and SD of the samples
	// computed here.
	for _, r := range res {
		var sum, ss float64
		for _, v := range r.Samples {
			sum += v
		}
		mean := sum / float64(len(r.Samples))
		for _, v := range r.Samples {
			ss += (v - mean) * (v - mean)
		}
		sd := math.Sqrt(ss / float64(len(r.Samples)-1))
		if math.Abs(r.TokPerSec-mean) > 1e-9*mean || math.Abs(r.TokPerSecSD-sd) > 1e-9*mean+1e-12 {
			t.Errorf("%s: %v ± %v tok/s, samples %v give %v ± %v", r.Test, r.TokPerSec, r.TokPerSecSD, r.Samples, mean, sd)
		}
	}
	// The rates against a clock that advances exactly 1 ms per reading:
	// 16 prompt tokens and 8 decoded tokens in 1 ms each time.
	clock := time.Unix(0, 0)
	fake := func() time.Time { clock = clock.Add(time.Millisecond); return clock }
	fr, err := Run(context.Background(), p, e, Config{Prompt: 16, Gen: 8, Reps: 3, Threads: 2, Now: fake}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []float64{16000, 8000} {
		if !slices.Equal(fr[i].Samples, []float64{want, want, want}) || fr[i].TokPerSec != want || fr[i].TokPerSecSD != 0 {
			t.Errorf("%s with a 1 ms clock: samples %v, %v ± %v tok/s, want %v", fr[i].Test, fr[i].Samples, fr[i].TokPerSec, fr[i].TokPerSecSD, want)
		}
	}
	if tg := res[1]; math.Abs(tg.GBPerSec-float64(tg.BytesPerTok)*tg.TokPerSec/1e9) > 1e-9*tg.GBPerSec ||
		math.Abs(tg.BandwidthPct-100*tg.GBPerSec*1e9/bw) > 1e-9*tg.BandwidthPct || tg.ReadBandwidth != bw {
		t.Errorf("tg: %v GB/s, %v%% of %v B/s for %d bytes at %v tok/s", tg.GBPerSec, tg.BandwidthPct, tg.ReadBandwidth, tg.BytesPerTok, tg.TokPerSec)
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
	// Sizes in units that show a tiny model (not "0.00 GB | 0.00 B").
	if !strings.Contains(sb.String(), "| tg8 |") || !strings.Contains(sb.String(), "read bandwidth") ||
		!strings.Contains(sb.String(), " | "+units.Count(res[0].Params)+" | ") || !strings.Contains(sb.String(), " | "+units.Bytes(res[0].SizeBytes)+" | ") {
		t.Fatalf("table:\n%s", sb.String())
	}
}

func TestSumWideMatchesScalar(t *testing.T) {
	b := make([]uint64, 1000+37)
	for i := range b {
		b[i] = uint64(i)*0x9e3779b97f4a7c15 + 7
	}
	s, ok := sumWide(b)
	if !ok {
		t.Skip("no wide (AVX2) sum on this CPU: nothing to compare with the scalar sum")
	}
	if s != sumWords(b) {
		t.Fatalf("wide sum %d, scalar %d", s, sumWords(b))
	}
	// Lengths around the 32-word blocks, and short ones (scalar only).
	for _, n := range []int{31, 32, 33, 63, 64, 65} {
		if s, ok := sumWide(b[:n]); ok != (n >= 32) || ok && s != sumWords(b[:n]) {
			t.Fatalf("%d words: wide sum %d (%v), scalar %d", n, s, ok, sumWords(b[:n]))
		}
	}
}
