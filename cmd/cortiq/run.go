package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cortiq/cortiq/chat"
	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/sample"
)

func init() { commands = append(commands, newRun, newLogits, newTokenize) }

// modelFlags are shared by the commands that load a model.
type modelFlags struct {
	threads, ctx, batch int
	device              string
}

func (f *modelFlags) add(c *cobra.Command) {
	c.Flags().IntVarP(&f.threads, "threads", "t", 0, "CPU threads (0: all cores)")
	c.Flags().IntVar(&f.ctx, "ctx", 4096, "context length in tokens (KV cache size; capped at the model's trained context)")
	c.Flags().IntVar(&f.batch, "batch", 0, "prefill positions per step (0: default)")
	addDeviceFlag(c, &f.device)
}

func (f *modelFlags) open(path string) (*engine.Engine, error) {
	if f.ctx < 1 || f.threads < 0 || f.batch < 0 {
		return nil, fmt.Errorf("--ctx must be ≥ 1 and --threads, --batch ≥ 0")
	}
	dev, err := openDevice(f.device, f.threads, deviceSize{seqs: 1, ctx: f.ctx, rows: max(f.batch, 64)})
	if err != nil {
		return nil, err
	}
	e, err := engine.Open(path, engine.Options{Threads: f.threads, Batch: f.batch, Device: dev, OwnDevice: true})
	if err != nil {
		return nil, err
	}
	return e, nil
}

func (f *modelFlags) ctxLen(e *engine.Engine) int {
	n := f.ctx
	if mp := e.File.Header.Arch.MaxPositionEmbeddings; mp > 0 && n > mp {
		n = mp
	}
	return n
}

// sampleFlags are the sampling options of run and chat.
type sampleFlags struct {
	p     sample.Params
	n     int
	stops []string
}

func (f *sampleFlags) add(c *cobra.Command, defTemp float32) {
	c.Flags().Float32Var(&f.p.Temperature, "temperature", defTemp, "sampling temperature (0: greedy)")
	c.Flags().IntVar(&f.p.TopK, "top-k", 40, "keep the K most likely tokens (0: off)")
	c.Flags().Float32Var(&f.p.TopP, "top-p", 0.95, "nucleus sampling mass (1: off)")
	c.Flags().Float32Var(&f.p.MinP, "min-p", 0.05, "drop tokens below this fraction of the best (0: off)")
	c.Flags().Float32Var(&f.p.RepeatPenalty, "repeat-penalty", 1, "repetition penalty (1: off)")
	c.Flags().Float32Var(&f.p.PresencePenalty, "presence-penalty", 0, "OpenAI presence penalty")
	c.Flags().Float32Var(&f.p.FrequencyPenalty, "frequency-penalty", 0, "OpenAI frequency penalty")
	c.Flags().IntVar(&f.p.RepeatLastN, "repeat-last-n", 64, "penalty window in tokens")
	c.Flags().Uint64Var(&f.p.Seed, "seed", 0, "random seed")
	c.Flags().IntVarP(&f.n, "max-tokens", "n", 256, "tokens to generate at most (0: until stop or context end)")
	c.Flags().StringArrayVar(&f.stops, "stop", nil, "stop string (repeatable)")
}

func parseIDs(s string) ([]int, error) {
	var ids []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("--ids: %q is not a token id", f)
		}
		ids = append(ids, v)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("--ids: no token ids")
	}
	return ids, nil
}

func checkIDs(e *engine.Engine, ids []int) error {
	for _, id := range ids {
		if id >= e.File.Header.Arch.VocabSize {
			return fmt.Errorf("token id %d is outside the %d-token vocabulary", id, e.File.Header.Arch.VocabSize)
		}
	}
	return nil
}

func newRun() *cobra.Command {
	var mf modelFlags
	var sf sampleFlags
	var idsFlag, system string
	var asJSON, raw, noThink, ignoreEOS bool
	c := &cobra.Command{
		Use:   "run MODEL [PROMPT]",
		Short: "Generate text from a prompt (streams; prints prefill and decode tok/s)",
		Long: `Generate text. The prompt is wrapped in the model's chat template unless --raw; with --ids the
given token ids are the whole prompt. --json prints {"ids":[generated ids],"text":"..."}.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if sf.n < 0 {
				return fmt.Errorf("run: --max-tokens %d: want ≥ 0", sf.n)
			}
			e, err := mf.open(args[0])
			if err != nil {
				return err
			}
			defer e.Close()
			var prompt []int
			switch {
			case idsFlag != "":
				if prompt, err = parseIDs(idsFlag); err != nil {
					return err
				}
				if err := checkIDs(e, prompt); err != nil {
					return err
				}
			case len(args) == 2:
				text := args[1]
				if !raw && e.HasTemplate() {
					var msgs []chat.Message
					if system != "" {
						msgs = append(msgs, chat.Message{Role: "system", Content: system})
					}
					msgs = append(msgs, chat.Message{Role: "user", Content: text})
					opt := chat.Options{AddGenerationPrompt: true}
					if noThink {
						f := false
						opt.EnableThinking = &f
					}
					if text, err = e.RenderChat(msgs, opt); err != nil {
						return err
					}
				}
				if prompt, err = e.Encode(text, !raw); err != nil {
					return err
				}
			default:
				return fmt.Errorf("run: give a PROMPT or --ids")
			}
			s, err := e.NewSession(mf.ctxLen(e))
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			opt := engine.GenOptions{MaxTokens: sf.n, Sample: sf.p, Stop: sf.stops, IgnoreEOS: ignoreEOS}
			if !asJSON {
				opt.OnText = func(t string) error { _, err := fmt.Fprint(out, t); return err }
			}
			res, err := s.Generate(cmd.Context(), prompt, opt)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(out).Encode(map[string]any{"ids": res.IDs, "text": res.Text, "finish_reason": res.Reason})
			}
			fmt.Fprintln(out)
			fmt.Fprintf(cmd.ErrOrStderr(), "\nprefill: %d tokens, %.1f tok/s | decode: %d tokens, %.2f tok/s | stop: %s | KV cache %.1f MiB for %d tokens\n",
				res.PromptTokens, res.PrefillRate(), res.Decoded, res.DecodeRate(), res.Reason,
				float64(s.Cache().Bytes())/(1<<20), s.Cache().Cap())
			return nil
		},
	}
	mf.add(c)
	sf.add(c, 0.8)
	c.Flags().StringVar(&idsFlag, "ids", "", "prompt as comma-separated token ids")
	c.Flags().BoolVar(&asJSON, "json", false, `print {"ids":[...],"text":"..."} instead of streaming`)
	c.Flags().BoolVar(&raw, "raw", false, "do not apply the chat template")
	c.Flags().StringVar(&system, "system", "", "system prompt")
	c.Flags().BoolVar(&noThink, "no-think", false, "enable_thinking=false for templates that support it (Qwen3)")
	c.Flags().BoolVar(&ignoreEOS, "ignore-eos", false, "keep generating past end-of-sequence tokens")
	return c
}

func newLogits() *cobra.Command {
	var mf modelFlags
	var idsFlag string
	var asJSON bool
	c := &cobra.Command{
		Use:   "logits MODEL --ids 1,2,3 --json",
		Short: "Print the logits of every prompt position (for reference tests)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !asJSON {
				return fmt.Errorf("logits: only --json output is supported")
			}
			ids, err := parseIDs(idsFlag)
			if err != nil {
				return err
			}
			e, err := mf.open(args[0])
			if err != nil {
				return err
			}
			defer e.Close()
			if err := checkIDs(e, ids); err != nil {
				return err
			}
			s, err := e.NewSession(len(ids))
			if err != nil {
				return err
			}
			all, err := e.Model.Forward(s.Cache(), ids, 0, model.AllLogits)
			if err != nil {
				return err
			}
			v := e.File.Header.Arch.VocabSize
			rows := make([][]float32, len(ids))
			for i := range rows {
				rows[i] = all[i*v : (i+1)*v]
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"logits": rows})
		},
	}
	mf.add(c)
	c.Flags().StringVar(&idsFlag, "ids", "", "token ids, comma-separated")
	c.Flags().BoolVar(&asJSON, "json", false, "JSON output")
	return c
}

func newTokenize() *cobra.Command {
	var asJSON, special bool
	c := &cobra.Command{
		Use:   "tokenize MODEL --json < text",
		Short: `Tokenize standard input: {"ids":[...]} (no BOS, no special-token parsing unless --special)`,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := openCMF(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			tok, err := engine.LoadTokenizer(f)
			if err != nil {
				return err
			}
			in, err := readAll(cmd.InOrStdin())
			if err != nil {
				return err
			}
			ids, err := tok.EncodeChecked(string(in), special, special)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"ids": ids})
			}
			for _, id := range ids {
				s, _ := tok.TokenString(id)
				fmt.Fprintf(cmd.OutOrStdout(), "%6d %q\n", id, s)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "JSON output")
	c.Flags().BoolVar(&special, "special", false, "add BOS/EOS as the tokenizer does and parse special tokens in the text")
	return c
}
