package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/cortiq/cortiq/chat"
	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/sample"
)

func init() { commands = append(commands, newRun, newLogits, newTokenize) }

// modelFlags are shared by the commands that load a model.
type modelFlags struct {
	path                string // -m/--model
	threads, ctx, batch int
	device              string
	noVerify            bool
}

func (f *modelFlags) add(c *cobra.Command) {
	addModelFlag(c, &f.path)
	c.Flags().IntVarP(&f.threads, "threads", "t", 0, "CPU threads (0: all cores; more than the machine's CPUs: clamped, with a warning)")
	c.Flags().IntVar(&f.ctx, "ctx", 4096, "context length in tokens (KV cache size; capped at the model's trained context; refused when it does not fit in memory)")
	c.Flags().IntVar(&f.batch, "batch", 0, "prefill positions per step (0: default)")
	addDeviceFlag(c, &f.device)
	addNoVerify(c, &f.noVerify)
}

// open checks the flags and opens the model; nothing large is allocated
// yet (the weights are mapped, the KV cache comes with session).
func (f *modelFlags) open(cmd *cobra.Command, path string) (*engine.Engine, error) {
	if f.ctx < 1 || f.threads < 0 || f.batch < 0 {
		return nil, fmt.Errorf("--ctx must be ≥ 1 and --threads, --batch ≥ 0")
	}
	threads := clampThreads("--threads", f.threads, cmd.ErrOrStderr())
	rows := f.batch
	if rows <= 0 {
		rows = 512 // a GPU's prefill chunk (the CPU takes its own 64)
	}
	dev, err := openDevice(f.device, threads, deviceSize{seqs: 1, ctx: f.ctx, rows: rows})
	if err != nil {
		return nil, err
	}
	return engine.Open(path, engine.Options{Threads: threads, Batch: f.batch, Device: dev, OwnDevice: true, NoVerify: f.noVerify})
}

func (f *modelFlags) ctxLen(e *engine.Engine) int {
	n := f.ctx
	if mp := e.File.Header.Arch.MaxPositionEmbeddings; mp > 0 && n > mp {
		n = mp
	}
	return n
}

// session checks that a context of ctx tokens (its KV cache, run state
// and extra bytes) fits in memory, then allocates it.
func session(e *engine.Engine, ctx int, extra func(int) int64) (*engine.Session, error) {
	if err := checkMemory(ctx, e.Model.SessionBytes, extra, "a context"); err != nil {
		return nil, err
	}
	return e.NewSession(ctx)
}

// sampleFlags are the sampling options of run and chat; their defaults
// are sample.Defaults.
type sampleFlags struct {
	p     sample.Params
	seed  int64
	n     int
	stops []string
}

func (f *sampleFlags) add(c *cobra.Command) {
	d := sample.Defaults()
	c.Flags().Float32Var(&f.p.Temperature, "temperature", d.Temperature, "sampling temperature (0: greedy)")
	c.Flags().IntVar(&f.p.TopK, "top-k", d.TopK, "keep the K most likely tokens (0: off)")
	c.Flags().Float32Var(&f.p.TopP, "top-p", d.TopP, "nucleus sampling mass (1: off)")
	c.Flags().Float32Var(&f.p.MinP, "min-p", d.MinP, "drop tokens below this fraction of the best (0: off)")
	c.Flags().Float32Var(&f.p.RepeatPenalty, "repeat-penalty", d.RepeatPenalty, "repetition penalty (1: off)")
	c.Flags().Float32Var(&f.p.PresencePenalty, "presence-penalty", d.PresencePenalty, "OpenAI presence penalty")
	c.Flags().Float32Var(&f.p.FrequencyPenalty, "frequency-penalty", d.FrequencyPenalty, "OpenAI frequency penalty")
	c.Flags().IntVar(&f.p.RepeatLastN, "repeat-last-n", d.RepeatLastN, "penalty window in tokens")
	c.Flags().Int64Var(&f.seed, "seed", sample.RandomSeed, "random seed (-1: a new one each run, printed with --verbose)")
	c.Flags().IntVarP(&f.n, "max-tokens", "n", 256, "tokens to generate at most (0: until stop or context end; more than the context leaves: an error)")
	c.Flags().StringArrayVar(&f.stops, "stop", nil, "stop string (repeatable)")
}

// params returns the sampling parameters with the seed drawn when none
// was given.
func (f *sampleFlags) params() sample.Params {
	p := f.p
	if f.seed < 0 {
		p.Seed = uint64(rand.Uint32()) // llama.cpp's range: short to type back as --seed
	} else {
		p.Seed = uint64(f.seed)
	}
	f32 := func(x float32) string { return strconv.FormatFloat(float64(x), 'g', -1, 32) }
	slog.Debug("sampling", "seed", p.Seed, "temperature", f32(p.Temperature), "top_k", p.TopK, "top_p", f32(p.TopP), "min_p", f32(p.MinP))
	return p
}

// checkMaxTokens refuses an explicit -n that the context cannot hold
// after a prompt of n tokens (the last sampled token needs no slot). The
// default -n stops at the context's end instead.
func (f *sampleFlags) checkMaxTokens(cmd *cobra.Command, prompt, ctx int) error {
	if !cmd.Flags().Changed("max-tokens") || f.n == 0 || prompt > ctx {
		return nil
	}
	if room := ctx - prompt + 1; f.n > room {
		return fmt.Errorf("%s: -n %d does not fit: the %d-token context leaves room for %d tokens after the %d-token prompt (raise --ctx or lower -n)",
			cmd.Name(), f.n, ctx, room, prompt)
	}
	return nil
}

// readPrompt returns the prompt: the argument, or standard input when the
// argument is "-" or absent and standard input is not a terminal (one
// trailing line break dropped). ok=false: no prompt at all.
func readPrompt(cmd *cobra.Command, rest []string) (string, bool, error) {
	if len(rest) == 1 && rest[0] != "-" {
		return rest[0], true, nil
	}
	in := cmd.InOrStdin()
	if len(rest) == 0 {
		if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			return "", false, nil
		}
	}
	b, err := readAll(in)
	if err != nil {
		return "", false, fmt.Errorf("reading the prompt from standard input: %w", err)
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		if len(rest) == 0 {
			return "", false, nil
		}
		return "", false, fmt.Errorf("the prompt on standard input is empty")
	}
	return s, true, nil
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
		Use:   "run MODEL [PROMPT | -]",
		Short: "Generate text from a prompt (streams; prints prefill and decode tok/s)",
		Long: `Generate text. The prompt is the argument, or standard input when it is "-" or when no prompt
is given and standard input is not a terminal (echo hi | cortiq run m.cmf). It is wrapped in the
model's chat template unless --raw; with --ids the given token ids are the whole prompt.
--json prints {"ids":[generated ids],"text":"...","finish_reason":"...","seed":N,"prompt_tokens":N,
"reused_tokens":N} (reused: prompt tokens found in the cache or resumed from a state snapshot).
The seed is random unless --seed N is given (--verbose prints it); the same seed, prompt and
flags give the same text.`,
		Args: modelArgs(&mf.path, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, rest := splitModel(mf.path, args)
			if sf.n < 0 {
				return fmt.Errorf("run: --max-tokens %d: want ≥ 0", sf.n)
			}
			var text string
			hasText := false
			if idsFlag == "" {
				var err error
				if text, hasText, err = readPrompt(cmd, rest); err != nil {
					return fmt.Errorf("run: %w", err)
				}
				if !hasText {
					return fmt.Errorf("run: give a PROMPT, - (standard input) or --ids")
				}
			} else if len(rest) > 0 {
				return fmt.Errorf("run: give a PROMPT or --ids, not both")
			}
			e, err := mf.open(cmd, path)
			if err != nil {
				return err
			}
			defer e.Close()
			var prompt []int
			if idsFlag != "" {
				if prompt, err = parseIDs(idsFlag); err != nil {
					return err
				}
				if err := checkIDs(e, prompt); err != nil {
					return err
				}
			} else {
				if !raw && e.HasTemplate() {
					var msgs []chat.Message
					if system != "" {
						msgs = append(msgs, chat.Message{Role: "system", Content: system})
					}
					msgs = append(msgs, chat.Message{Role: "user", Content: text})
					opt := chat.Options{AddGenerationPrompt: true, Limits: chat.Limits{MaxBytes: chat.BytesPerToken * mf.ctxLen(e)}}
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
			}
			ctx := mf.ctxLen(e)
			if err := sf.checkMaxTokens(cmd, len(prompt), ctx); err != nil {
				return err
			}
			s, err := session(e, ctx, noExtra)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			p := sf.params()
			opt := engine.GenOptions{MaxTokens: sf.n, Sample: p, Stop: sf.stops, IgnoreEOS: ignoreEOS}
			if !asJSON {
				opt.OnText = func(t string) error { _, err := fmt.Fprint(out, t); return err }
			}
			res, err := s.Generate(cmd.Context(), prompt, opt)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(out).Encode(map[string]any{"ids": res.IDs, "text": res.Text, "finish_reason": res.Reason, "seed": p.Seed,
					"prompt_tokens": res.PromptTokens, "reused_tokens": res.CachedTokens})
			}
			fmt.Fprintln(out)
			fmt.Fprintf(cmd.ErrOrStderr(), "\nprefill: %d tokens, %.1f tok/s | decode: %d tokens, %.2f tok/s | stop: %s | KV cache %.1f MiB for %d tokens\n",
				res.PromptTokens, res.PrefillRate(), res.Decoded, res.DecodeRate(), res.Reason,
				float64(s.Cache().Bytes())/(1<<20), s.Cache().Cap())
			if e.Model.HasState() {
				n, b := e.SnapshotStats()
				fmt.Fprintf(cmd.ErrOrStderr(), "linear-attention state: %.2f MiB per sequence and per snapshot; %d snapshots held (%.1f MiB)\n",
					float64(e.Model.SnapshotBytes())/(1<<20), n, float64(b)/(1<<20))
			}
			return nil
		},
	}
	mf.add(c)
	sf.add(c)
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
	var top int
	c := &cobra.Command{
		Use:   "logits MODEL --ids 1,2,3 [--json]",
		Short: "Print the logits of every prompt position: the top tokens per position, or all of them with --json",
		Args:  modelArgs(&mf.path, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, _ := splitModel(mf.path, args)
			if top < 1 {
				return fmt.Errorf("logits: --top %d: want ≥ 1", top)
			}
			ids, err := parseIDs(idsFlag)
			if err != nil {
				return err
			}
			e, err := mf.open(cmd, path)
			if err != nil {
				return err
			}
			defer e.Close()
			if err := checkIDs(e, ids); err != nil {
				return err
			}
			v := e.File.Header.Arch.VocabSize
			s, err := session(e, len(ids), func(n int) int64 { return int64(n) * int64(v) * 4 })
			if err != nil {
				return err
			}
			all, err := e.Model.Forward(s.Cache(), ids, 0, model.AllLogits)
			if err != nil {
				return err
			}
			rows := make([][]float32, len(ids))
			for i := range rows {
				rows[i] = all[i*v : (i+1)*v]
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"logits": rows})
			}
			printTopLogits(cmd.OutOrStdout(), e, ids, rows, top)
			return nil
		},
	}
	mf.add(c)
	c.Flags().StringVar(&idsFlag, "ids", "", "token ids, comma-separated")
	c.Flags().BoolVar(&asJSON, "json", false, `every logit of every position: {"logits":[[...],...]}`)
	c.Flags().IntVar(&top, "top", 5, "tokens shown per position without --json")
	return c
}

// printTopLogits writes, per position, the input token and the k most
// likely next tokens with their logits and probabilities.
func printTopLogits(w io.Writer, e *engine.Engine, ids []int, rows [][]float32, k int) {
	name := func(id int) string {
		if e.Tok != nil && id < e.Tok.VocabSize() {
			return strconv.Quote(e.Tok.Decode([]int{id}))
		}
		return "?"
	}
	fmt.Fprintf(w, "%4s  %-20s  top %d next tokens: id token (logit, probability)\n", "pos", "token", k)
	for p, row := range rows {
		idx := make([]int, len(row))
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(a, b int) bool { return row[idx[a]] > row[idx[b]] })
		idx = idx[:min(k, len(idx))]
		probs := softmaxAt(row, idx)
		parts := make([]string, len(idx))
		for i, id := range idx {
			parts[i] = fmt.Sprintf("%d %s (%.3f, %.3f)", id, name(id), row[id], probs[i])
		}
		fmt.Fprintf(w, "%4d  %-20s  %s\n", p, fmt.Sprintf("%d %s", ids[p], name(ids[p])), strings.Join(parts, " | "))
	}
}

// softmaxAt returns the softmax probabilities of row at the given indices.
func softmaxAt(row []float32, at []int) []float64 {
	mx := row[0]
	for _, v := range row {
		mx = max(mx, v)
	}
	var z float64
	for _, v := range row {
		z += math.Exp(float64(v - mx))
	}
	out := make([]float64, len(at))
	for i, j := range at {
		out[i] = math.Exp(float64(row[j]-mx)) / z
	}
	return out
}

func newTokenize() *cobra.Command {
	var asJSON, special, noVerify bool
	var path string
	c := &cobra.Command{
		Use:   "tokenize MODEL --json < text",
		Short: `Tokenize standard input: {"ids":[...]} (no BOS, no special-token parsing unless --special)`,
		Args:  modelArgs(&path, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, _ := splitModel(path, args)
			f, err := openCMF(p, noVerify)
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
	addModelFlag(c, &path)
	c.Flags().BoolVar(&asJSON, "json", false, "JSON output")
	c.Flags().BoolVar(&special, "special", false, "add BOS/EOS as the tokenizer does and parse special tokens in the text")
	addNoVerify(c, &noVerify)
	return c
}
