package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/model"
)

// withBandwidth fills the weight-stream figures of a tg test whose steps
// decode batch tokens each: a step reads the weights once, so the bytes
// per second are BytesPerTok × steps per second. The KV cache read at
// depth is not counted (these stay weight GB/s, as in the plain tg row).
func withBandwidth(r Result, e *engine.Engine, bw float64, batch int) Result {
	r.TokPerSec, r.TokPerSecSD = meanSD(r.Samples)
	r.BytesPerTok = DecodeBytes(e)
	r.GBPerSec = float64(r.BytesPerTok) * r.TokPerSec / float64(max(batch, 1)) / 1e9
	if bw > 0 {
		r.ReadBandwidth = bw
		r.BandwidthPct = 100 * r.GBPerSec * 1e9 / bw
	}
	return r
}

// depthTest prefills ids[:depth] once (untimed), then per repetition
// decodes Gen tokens from position depth and rolls the cache back.
func depthTest(ctx context.Context, e *engine.Engine, s *engine.Session, base Result, cfg Config, depth int, ids []int, now func() time.Time) (Result, error) {
	if depth < 0 {
		return Result{}, fmt.Errorf("bench: depth %d < 0", depth)
	}
	r := base
	r.Test, r.Series, r.Depth = fmt.Sprintf("tg%d@d%d", cfg.Gen, depth), "depth", depth
	prefill := func() error {
		s.Reset()
		if depth == 0 {
			return nil
		}
		_, err := e.Model.Forward(s.Cache(), ids[:depth], 0, model.NoLogits)
		return err
	}
	if err := prefill(); err != nil {
		return Result{}, fmt.Errorf("bench: prefill to depth %d: %w", depth, err)
	}
	for i := 0; i <= max(cfg.Reps, 1); i++ { // the first pass warms up
		// Roll back to the depth; a model with recurrent state cannot
		// truncate and prefills again.
		if err := s.Cache().Truncate(depth); err != nil {
			if err := prefill(); err != nil {
				return Result{}, fmt.Errorf("bench: prefill to depth %d: %w", depth, err)
			}
		}
		t0 := now()
		for k := depth; k < depth+cfg.Gen; k++ {
			if err := ctx.Err(); err != nil {
				return Result{}, err
			}
			if _, err := e.Model.Forward(s.Cache(), ids[k:k+1], k, model.LastLogits); err != nil {
				return Result{}, err
			}
		}
		if i > 0 {
			r.Samples = append(r.Samples, float64(cfg.Gen)/now().Sub(t0).Seconds())
		}
	}
	return r, nil
}

// batchTest decodes Gen tokens in each of n sequences together; the
// sample is the aggregate rate, n·Gen tokens over the time of Gen steps.
// Each sequence starts from its own one-token prompt (untimed). By default
// a step runs as a greedy server step does (engine.StepNext with no
// logits: on a GPU only the ids leave the device) and feeds each
// sequence's greedy id back; with logits it runs engine.Step, every
// sequence's logits copied to the host (what a step of sampling requests
// costs before any sampling), on fixed tokens.
func batchTest(ctx context.Context, e *engine.Engine, base Result, cfg Config, n int, ids []int, now func() time.Time, logits bool) (Result, error) {
	if n < 1 {
		return Result{}, fmt.Errorf("bench: batch %d < 1", n)
	}
	r := base
	r.Test, r.Series, r.Batch, r.Returns = fmt.Sprintf("tg%dx%d", cfg.Gen, n), "batch", n, "ids"
	if logits {
		r.Test, r.Series, r.Returns = r.Test+"+logits", "batch-logits", "logits"
	}
	ss := make([]*engine.Session, n)
	for i := range ss {
		s, err := e.NewSession(cfg.Gen + 1)
		if err != nil {
			return Result{}, err
		}
		defer s.Close()
		ss[i] = s
	}
	toks := make([][]int, n)
	next := make([]int, n)
	step := func(k int) error {
		for j := range toks {
			if k == 0 || logits {
				toks[j] = ids[j+k : j+k+1] // a different token per sequence
			} else {
				toks[j] = next[j : j+1]
			}
		}
		var err error
		if logits {
			_, err = e.Step(ss, toks)
		} else {
			_, err = e.StepNext(ss, toks, nil, next)
		}
		return err
	}
	for i := 0; i <= max(cfg.Reps, 1); i++ {
		for _, s := range ss {
			s.Reset()
		}
		if err := step(0); err != nil {
			return Result{}, err
		}
		t0 := now()
		for k := 1; k <= cfg.Gen; k++ {
			if err := ctx.Err(); err != nil {
				return Result{}, err
			}
			if err := step(k); err != nil {
				return Result{}, err
			}
		}
		if i > 0 {
			r.Samples = append(r.Samples, float64(n*cfg.Gen)/now().Sub(t0).Seconds())
		}
	}
	return r, nil
}
