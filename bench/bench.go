package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/units"
)

// Config selects the tests of a run.
type Config struct {
	Prompt  int // pp test length (0: none)
	Gen     int // tg test length (0: none)
	Reps    int
	Threads int
	// Probe, if set, measures the read bandwidth (bytes/s); it runs before
	// every tg repetition, interleaved with decoding, because this
	// machine's bandwidth drifts by up to 2x within minutes: the best
	// probe of the window is the limit the decode is compared with.
	Probe func() float64
	// Now is the clock (nil: time.Now); tests give a fake one.
	Now func() time.Time
	// Depths, if set, add a tg test at each context depth: the context is
	// prefilled to the depth (not timed), then Gen tokens are decoded.
	Depths []int
	// Batches, if set, add an aggregate tg test at each batch size: that
	// many sequences decode Gen tokens together, one batched step
	// per token, each weight read once per step. The steps return greedy
	// ids only (engine.StepNext, as a greedy server step runs).
	Batches []int
	// BatchLogits adds, at each batch size, the same test with every
	// sequence's logits copied to the host (engine.Step: what a step of
	// sampling requests costs), as the series "batch-logits".
	BatchLogits bool
}

// Result is one test of one model.
type Result struct {
	Model        string    `json:"model"`
	Arch         string    `json:"arch"`
	Quant        string    `json:"quant"`
	SizeBytes    int64     `json:"size_bytes"`
	Params       int64     `json:"params"`
	Threads      int       `json:"threads"`
	Shape        string    `json:"shape,omitempty"` // the synth shape the dimensions match (see ShapeName)
	Test         string    `json:"test"`            // pp512, tg128
	TokPerSec    float64   `json:"tok_per_sec"`
	TokPerSecSD  float64   `json:"tok_per_sec_sd"`
	Samples      []float64 `json:"samples"`
	BytesPerTok  int64     `json:"weight_bytes_per_token,omitempty"` // tg only
	GBPerSec     float64   `json:"gb_per_sec,omitempty"`
	BandwidthPct float64   `json:"bandwidth_pct,omitempty"`
	// ReadBandwidth is the best read bandwidth probed during this test
	// (bytes/s), the denominator of BandwidthPct; ProbeSamples are the
	// probes interleaved with its repetitions.
	ReadBandwidth float64   `json:"read_bandwidth,omitempty"`
	ProbeSamples  []float64 `json:"probe_samples,omitempty"`
	// Series is "depth" or "batch" for the tests of Config.Depths and
	// Config.Batches (tg64@d512: 64 tokens decoded after 512 in the
	// context; tg64x4: 4 sequences of 64 tokens, TokPerSec summed over
	// them), empty for the plain pp and tg tests.
	Series string `json:"series,omitempty"`
	Depth  int    `json:"depth,omitempty"`
	Batch  int    `json:"batch,omitempty"`
	// Returns says what a batch test's steps bring back to the host:
	// "ids" (greedy ids picked on the device) or "logits" (every
	// sequence's logits, series "batch-logits").
	Returns string `json:"returns,omitempty"`
}

// Report is a whole run.
type Report struct {
	ReadBandwidth float64 `json:"read_bandwidth_bytes_per_sec"`
	// ReadBandwidthSource names the device whose own read probe
	// (backend.Prober) gave ReadBandwidth and the rows' ReadBandwidth;
	// empty: the host's probe with Threads threads.
	ReadBandwidthSource string   `json:"read_bandwidth_source,omitempty"`
	Threads             int      `json:"threads"`
	Results             []Result `json:"results"`
	// StepProfiles: per model, a decode step's kernel time and gaps, on a
	// device that times its steps (backend.StepTimer).
	StepProfiles []StepProfile `json:"decode_step_profiles,omitempty"`
	// Where and when, for the caption of a plot.
	Machine string `json:"machine,omitempty"`
	Device  string `json:"device,omitempty"` // the device's name: cpu (2 threads, avx512), a GPU's
	Date    string `json:"date,omitempty"`   // RFC 3339, UTC
	Command string `json:"command,omitempty"`
	Note    string `json:"note,omitempty"` // a caption line (how loaded the machine was)
}

// DecodeBytes returns the weight bytes one decode step reads: every
// matrix once, except the embedding, of which one row is read (unless it
// doubles as the output head). MoE layers are counted with the active
// experts only.
func DecodeBytes(e *engine.Engine) int64 {
	a := &e.File.Header.Arch
	var n int64
	for _, t := range e.File.Tensors {
		if t.DType == quant.U8 || t.DType == quant.I32 || strings.HasPrefix(t.Name, "mtp.") {
			continue
		}
		if t.Name == "model.embed_tokens.weight" && !a.TieWordEmbeddings {
			n += t.Size / int64(max(t.Shape[0], 1))
			continue
		}
		if a.MoE != nil && strings.Contains(t.Name, ".mlp.experts.") {
			n += t.Size * int64(a.MoE.NumExpertsPerTok) / int64(a.MoE.NumExperts)
			continue
		}
		n += t.Size
	}
	return n
}

func meanSD(v []float64) (float64, float64) {
	var s, s2 float64
	for _, x := range v {
		s += x
	}
	m := s / float64(len(v))
	for _, x := range v {
		s2 += (x - m) * (x - m)
	}
	if len(v) < 2 {
		return m, 0
	}
	return m, math.Sqrt(s2 / float64(len(v)-1))
}

// Run measures one model. bw is the read bandwidth measured in the same run
// (0: not measured).
func Run(ctx context.Context, path string, e *engine.Engine, cfg Config, bw float64) ([]Result, error) {
	reps := max(cfg.Reps, 1)
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	base := Result{Model: path, Arch: e.File.Header.Arch.ArchName, Quant: e.File.Header.QuantType, Threads: cfg.Threads,
		Shape: ShapeName(&e.File.Header.Arch)}
	for _, t := range e.File.Tensors {
		base.SizeBytes += t.Size
		if t.DType != quant.U8 && t.DType != quant.I32 {
			r, c, _ := quant.Matrix(t.Shape)
			base.Params += int64(r) * int64(c)
		}
	}
	V := e.File.Header.Arch.VocabSize
	tokens := func(n int) []int {
		ids := make([]int, n)
		for i := range ids {
			ids[i] = (i*7919 + 13) % V
		}
		return ids
	}
	ctxLen := max(cfg.Prompt, cfg.Gen+1, 16) // the device is opened with at least 16 positions (cmd/cortiq bench)
	for _, d := range cfg.Depths {
		ctxLen = max(ctxLen, d+cfg.Gen+1)
	}
	s, err := e.NewSession(ctxLen)
	if err != nil {
		return nil, err
	}
	var out []Result
	if cfg.Prompt > 0 {
		r := base
		r.Test = fmt.Sprintf("pp%d", cfg.Prompt)
		p := tokens(cfg.Prompt)
		for i := 0; i <= reps; i++ { // the first pass warms up and is not counted
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			s.Reset()
			t0 := now()
			if _, err := e.Model.Forward(s.Cache(), p, 0, model.NoLogits); err != nil {
				return nil, err
			}
			if i > 0 {
				r.Samples = append(r.Samples, float64(cfg.Prompt)/now().Sub(t0).Seconds())
			}
		}
		r.TokPerSec, r.TokPerSecSD = meanSD(r.Samples)
		out = append(out, r)
	}
	if cfg.Gen > 0 {
		r := base
		r.Test = fmt.Sprintf("tg%d", cfg.Gen)
		ids := tokens(cfg.Gen + 1)
		for i := 0; i <= reps; i++ {
			if cfg.Probe != nil && i > 0 {
				pb := cfg.Probe()
				r.ProbeSamples = append(r.ProbeSamples, pb)
				bw = max(bw, pb)
			}
			s.Reset()
			if _, err := e.Model.Forward(s.Cache(), ids[:1], 0, model.LastLogits); err != nil {
				return nil, err
			}
			t0 := now()
			for k := 1; k <= cfg.Gen; k++ {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				if _, err := e.Model.Forward(s.Cache(), ids[k:k+1], k, model.LastLogits); err != nil {
					return nil, err
				}
			}
			if i > 0 {
				r.Samples = append(r.Samples, float64(cfg.Gen)/now().Sub(t0).Seconds())
			}
		}
		r.TokPerSec, r.TokPerSecSD = meanSD(r.Samples)
		r.BytesPerTok = DecodeBytes(e)
		r.GBPerSec = float64(r.BytesPerTok) * r.TokPerSec / 1e9
		if bw > 0 {
			r.ReadBandwidth = bw
			r.BandwidthPct = 100 * r.GBPerSec * 1e9 / bw
		}
		out = append(out, r)
	}
	if cfg.Gen > 0 {
		for _, d := range cfg.Depths {
			r, err := depthTest(ctx, e, s, base, cfg, d, tokens(d+cfg.Gen+1), now)
			if err != nil {
				return nil, err
			}
			out = append(out, withBandwidth(r, e, bw, 1))
		}
		for _, logits := range []bool{false, true} {
			if logits && !cfg.BatchLogits {
				break
			}
			for _, n := range cfg.Batches {
				r, err := batchTest(ctx, e, base, cfg, n, tokens(cfg.Gen+n), now, logits)
				if err != nil {
					return nil, err
				}
				out = append(out, withBandwidth(r, e, bw, n))
			}
		}
	}
	return out, nil
}

// Markdown writes the report as a llama-bench-like table.
func (r *Report) Markdown(w io.Writer) {
	fmt.Fprintf(w, "| model | arch | quant | size | params | threads | test | t/s | weights GB/s | read bw GB/s | %% of read bw |\n")
	fmt.Fprintf(w, "| --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n")
	for _, x := range r.Results {
		gb, rb, pct := "", "", ""
		if x.ReadBandwidth > 0 {
			rb = fmt.Sprintf("%.1f", x.ReadBandwidth/1e9)
		}
		if x.GBPerSec > 0 {
			gb = fmt.Sprintf("%.1f", x.GBPerSec)
		}
		if x.BandwidthPct > 0 {
			pct = fmt.Sprintf("%.0f%%", x.BandwidthPct)
		}
		threads := "-" // a device that is not the host's threads ran the row
		if x.Threads > 0 {
			threads = fmt.Sprint(x.Threads)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %.2f ± %.2f | %s | %s | %s |\n",
			x.Model, x.Arch, x.Quant, units.Bytes(x.SizeBytes), units.Count(x.Params), threads, x.Test, x.TokPerSec, x.TokPerSecSD, gb, rb, pct)
	}
	if r.ReadBandwidth > 0 && r.ReadBandwidthSource != "" {
		fmt.Fprintf(w, "\nread bandwidth probed on %s: %.0f GB/s; each tg row is compared with the best device probe interleaved with its repetitions (read bw column)\n", r.ReadBandwidthSource, r.ReadBandwidth/1e9)
	} else if r.ReadBandwidth > 0 {
		fmt.Fprintf(w, "\nread bandwidth probed at the start: %.1f GB/s with %d threads; each tg row is compared with the best probe interleaved with its repetitions (read bw column)\n", r.ReadBandwidth/1e9, r.Threads)
	}
	ids, logits := false, false
	for _, x := range r.Results {
		ids, logits = ids || x.Returns == "ids", logits || x.Returns == "logits"
	}
	if ids {
		fmt.Fprintf(w, "\ntgNxB: B sequences decoded together, one batched step per token, as a greedy server step runs it (engine.StepNext): the greedy ids are picked on the device where it can (a GPU: only they come back to the host; the CPU reduces rows already in host memory)\n")
	}
	if logits {
		fmt.Fprintf(w, "tgNxB+logits: the same steps with every sequence's logits copied to the host (engine.Step), what a step of sampling requests costs before the sampling itself\n")
	}
	for i := range r.StepProfiles {
		r.StepProfiles[i].markdown(w)
	}
}
