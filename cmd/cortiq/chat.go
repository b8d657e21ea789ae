package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cortiq/cortiq/chat"
	"github.com/cortiq/cortiq/engine"
)

func init() { commands = append(commands, newChat) }

func newChat() *cobra.Command {
	var mf modelFlags
	var sf sampleFlags
	var system string
	var noThink bool
	c := &cobra.Command{
		Use:   "chat MODEL",
		Short: "Interactive multi-turn chat (keeps the KV cache between turns)",
		Long: `Chat with a model: one line of input is one user turn. Commands: /reset clears the conversation,
/system TEXT sets the system prompt, /exit quits. The conversation is re-rendered with the model's
chat template every turn; the KV cache keeps the longest common prefix, so only new tokens are processed.`,
		Args: modelArgs(&mf.path, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, _ := splitModel(mf.path, args)
			e, err := mf.open(cmd, path)
			if err != nil {
				return err
			}
			defer e.Close()
			if !e.HasTemplate() {
				return fmt.Errorf("chat: %s has no chat template; use cortiq run --raw", path)
			}
			ctx := mf.ctxLen(e)
			if cmd.Flags().Changed("max-tokens") && sf.n >= ctx {
				return fmt.Errorf("chat: -n %d does not fit: a reply must leave room for the prompt in the %d-token context (raise --ctx or lower -n)", sf.n, ctx)
			}
			s, err := session(e, ctx, noExtra)
			if err != nil {
				return err
			}
			p := sf.params()
			out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
			fmt.Fprintf(errOut, "cortiq chat: %s (%s), context %d tokens, KV cache %.1f MiB. /exit to quit.\n",
				path, e.File.Header.Arch.ArchName, s.Cache().Cap(), float64(s.Cache().Bytes())/(1<<20))
			var msgs []chat.Message
			reset := func() {
				msgs = msgs[:0]
				if system != "" {
					msgs = append(msgs, chat.Message{Role: "system", Content: system})
				}
			}
			reset()
			in := bufio.NewScanner(cmd.InOrStdin())
			in.Buffer(make([]byte, 1<<20), 1<<24)
			for {
				fmt.Fprint(errOut, "> ")
				if !in.Scan() {
					fmt.Fprintln(errOut)
					return in.Err()
				}
				line := strings.TrimSpace(in.Text())
				switch {
				case line == "":
					continue
				case line == "/exit" || line == "/quit":
					return nil
				case line == "/reset":
					reset()
					s.Reset()
					continue
				case strings.HasPrefix(line, "/system "):
					system = strings.TrimSpace(strings.TrimPrefix(line, "/system "))
					reset()
					continue
				}
				msgs = append(msgs, chat.Message{Role: "user", Content: line})
				opt := chat.Options{AddGenerationPrompt: true}
				if noThink {
					f := false
					opt.EnableThinking = &f
				}
				prompt, err := fitPrompt(e, &msgs, opt, s.Cache().Cap()-min(sf.n, s.Cache().Cap()/4), errOut)
				if err != nil {
					fmt.Fprintln(errOut, "cortiq:", err)
					msgs = msgs[:len(msgs)-1]
					continue
				}
				if e.Model.HasState() {
					markHistory(e, s, msgs, opt, prompt)
				}
				// Ctrl-C while the reply streams stops the reply, not the chat.
				turn, stopTurn := context.WithCancel(cmd.Context())
				hook := func() bool { stopTurn(); return true }
				interruptHook.Store(&hook)
				p.Seed++ // each turn its own draws, all from the one seed
				res, err := s.Generate(turn, prompt, engine.GenOptions{MaxTokens: sf.n, Sample: p, Stop: sf.stops,
					OnText: func(t string) error { _, err := fmt.Fprint(out, t); return err }})
				interruptHook.Store(nil)
				interrupted := turn.Err() != nil && cmd.Context().Err() == nil
				stopTurn()
				if interrupted {
					fmt.Fprintln(errOut, "\n[interrupted]")
					if res != nil && res.Text != "" {
						msgs = append(msgs, chat.Message{Role: "assistant", Content: res.Text})
					} else {
						msgs = msgs[:len(msgs)-1]
					}
					continue
				}
				if err != nil {
					return err
				}
				fmt.Fprintln(out)
				snaps := ""
				if e.Model.HasState() {
					n, b := e.SnapshotStats()
					snaps = fmt.Sprintf("; %d state snapshots, %.1f MiB", n, float64(b)/(1<<20))
				}
				fmt.Fprintf(errOut, "[%d prompt tokens, %d reused from cache; prefill %.1f tok/s, decode %.2f tok/s; %s%s]\n",
					res.PromptTokens, res.CachedTokens, res.PrefillRate(), res.DecodeRate(), res.Reason, snaps)
				msgs = append(msgs, chat.Message{Role: "assistant", Content: res.Text})
			}
		},
	}
	mf.add(c)
	sf.add(c)
	c.Flags().StringVar(&system, "system", "", "system prompt")
	c.Flags().BoolVar(&noThink, "no-think", false, "enable_thinking=false for templates that support it (Qwen3)")
	return c
}

// fitPrompt renders the conversation and, while it does not leave room for
// the reply in the context, drops the oldest exchange (the system prompt
// stays), saying so. It fails only when the last message alone is too long.
func fitPrompt(e *engine.Engine, msgs *[]chat.Message, opt chat.Options, budget int, errOut io.Writer) ([]int, error) {
	for {
		text, err := e.RenderChat(*msgs, opt)
		if err != nil {
			return nil, err
		}
		prompt, err := e.Encode(text, true)
		if err != nil {
			return nil, err
		}
		if len(prompt) <= budget {
			return prompt, nil
		}
		first := 0
		if len(*msgs) > 0 && (*msgs)[0].Role == "system" {
			first = 1
		}
		if len(*msgs)-first <= 1 {
			return nil, fmt.Errorf("this message needs %d tokens; the context leaves room for %d (raise --ctx)", len(prompt), budget)
		}
		// Drop the oldest turn and the replies that followed it.
		end := first + 1
		for end < len(*msgs)-1 && (*msgs)[end].Role != "user" {
			end++
		}
		fmt.Fprintf(errOut, "[context full: dropping the oldest exchange (%d messages) from the conversation]\n", end-first)
		*msgs = append((*msgs)[:first], (*msgs)[end:]...)
	}
}

// markHistory asks a hybrid session to snapshot its state where the
// conversation's messages end (the prompt without the generation prompt):
// the next turn's prompt shares that prefix even when the template
// rewrites the assistant turn after it (Qwen3 drops past think blocks), so
// the next turn resumes there instead of prefilling everything.
func markHistory(e *engine.Engine, s *engine.Session, msgs []chat.Message, opt chat.Options, prompt []int) {
	opt.AddGenerationPrompt = false
	text, err := e.RenderChat(msgs, opt)
	if err != nil {
		return
	}
	ids, err := e.Encode(text, true)
	if err != nil || len(ids) >= len(prompt) || !slices.Equal(ids, prompt[:len(ids)]) {
		return
	}
	s.SnapshotAt(len(ids))
}
