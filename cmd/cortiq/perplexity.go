package main

import (
	"context"
	"fmt"
	"math"
	"os"

	"github.com/spf13/cobra"

	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/progress"
)

func init() { commands = append(commands, newPerplexity) }

// PerplexityResult is what `cortiq perplexity` measures.
type PerplexityResult struct {
	PPL     float64 // exp(mean negative log-likelihood)
	StdErr  float64 // standard error of PPL (delta method)
	Tokens  int     // tokens scored
	Chunks  int
	NLLMean float64
}

// perplexity scores text the way llama.cpp's perplexity tool does: the
// tokens are cut into chunks of ctx tokens, each chunk is evaluated from
// an empty cache (its first token replaced by BOS when the model adds one),
// and only the second half of each chunk is scored, so every scored token
// sees at least ctx/2 tokens of context.
func perplexity(cx context.Context, e *engine.Engine, tokens []int, ctx, maxChunks int, report progress.Func) (*PerplexityResult, error) {
	if ctx < 4 {
		return nil, fmt.Errorf("perplexity: --ctx %d is too small", ctx)
	}
	n := len(tokens) / ctx
	if maxChunks > 0 {
		n = min(n, maxChunks)
	}
	if n == 0 {
		return nil, fmt.Errorf("perplexity: the text has %d tokens, fewer than one chunk of %d (lower --ctx)", len(tokens), ctx)
	}
	V := e.File.Header.Arch.VocabSize
	s, err := session(e, ctx, func(n int) int64 { return int64(n) * int64(V) * 4 }) // the logits of every position

	if err != nil {
		return nil, err
	}
	// BOS as the tokenizer itself adds it (tokenizer.json post-processor or
	// add_bos_token), which is what Encode put before the text.
	bos := -1
	if e.Tok != nil {
		if b := e.Tok.SpecialIDs().BOS; b >= 0 {
			if ids := e.Tok.Encode("", true, false); len(ids) > 0 && ids[0] == b {
				bos = b
			}
		}
	}
	first := ctx / 2
	var sum, sum2 float64
	count := 0
	chunk := make([]int, ctx)
	for c := 0; c < n; c++ {
		if err := cx.Err(); err != nil {
			return nil, err
		}
		copy(chunk, tokens[c*ctx:(c+1)*ctx])
		if bos >= 0 {
			chunk[0] = bos
		}
		s.Reset()
		logits, err := e.Model.Forward(s.Cache(), chunk, 0, model.AllLogits)
		if err != nil {
			return nil, err
		}
		for j := first; j < ctx-1; j++ {
			row := logits[j*V : (j+1)*V]
			mx := row[0]
			for _, v := range row {
				mx = max(mx, v)
			}
			var z float64
			for _, v := range row {
				z += math.Exp(float64(v - mx))
			}
			nll := math.Log(z) - float64(row[chunk[j+1]]-mx)
			sum += nll
			sum2 += nll * nll
			count++
		}
		if report != nil {
			report(int64(c+1), int64(n))
		}
	}
	mean := sum / float64(count)
	variance := max(sum2/float64(count)-mean*mean, 0)
	ppl := math.Exp(mean)
	return &PerplexityResult{PPL: ppl, StdErr: ppl * math.Sqrt(variance/float64(max(count-1, 1))), Tokens: count, Chunks: n, NLLMean: mean}, nil
}

func newPerplexity() *cobra.Command {
	var mf modelFlags
	var file string
	var chunks int
	c := &cobra.Command{
		Use:   "perplexity MODEL --text FILE",
		Short: "Sliding-window perplexity of a text file (llama.cpp's method: chunks of --ctx, second half scored)",
		Args:  modelArgs(&mf.path, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, _ := splitModel(mf.path, args)
			if file == "" {
				return fmt.Errorf("perplexity: --text FILE is required")
			}
			b, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			e, err := mf.open(cmd, path)
			if err != nil {
				return err
			}
			defer e.Close()
			tokens, err := e.Encode(string(b), false)
			if err != nil {
				return err
			}
			errOut := cmd.ErrOrStderr()
			res, err := perplexity(cmd.Context(), e, tokens, mf.ctx, chunks, progress.Count(errOut, "perplexity", "chunks"))
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "perplexity %.4f ± %.4f over %d tokens (%d chunks of %d, second halves scored)\n",
				res.PPL, res.StdErr, res.Tokens, res.Chunks, mf.ctx)
			return nil
		},
	}
	mf.add(c)
	c.Flags().Lookup("ctx").DefValue = "512"
	_ = c.Flags().Set("ctx", "512")
	c.Flags().StringVar(&file, "text", "", "text file to score")
	c.Flags().IntVar(&chunks, "chunks", 0, "score at most this many chunks (0: all)")
	return c
}
