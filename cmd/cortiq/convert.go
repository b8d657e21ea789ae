package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cortiq/cortiq/convert"
	"github.com/cortiq/cortiq/progress"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/units"
)

func init() { commands = append(commands, newConvert) }

func newConvert() *cobra.Command {
	var out, qs, shard, calib, calibMethod, calibMem string
	var keep []string
	var threads, calibTokens, calibCtx int
	c := &cobra.Command{
		Use:   "convert SRC -o OUT.cmf",
		Short: "Convert a Hugging Face model directory or a GGUF file to CMF",
		Long: `Convert a Hugging Face directory (config.json, *.safetensors, tokenizer files) or a .gguf
file to a CMF file, choosing a storage format per tensor role (see docs/convert.md).
Tensors stream one at a time: memory stays near the largest tensor.

--calibrate TEXT runs the model (llama, qwen2, qwen3) on tokens of TEXT first and
encodes q4tp weights by GPTQ (or, with --calib-method rms, with their error weighted by
each input's RMS) and fits q8_2f column fields to the activations, so that each layer's
outputs rather than its weights are kept close; the statistics are stored in the file.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("convert: -o OUT.cmf is required")
			}
			d, err := quant.ParseDType(qs)
			if err != nil || d == quant.U8 || d == quant.I32 {
				return fmt.Errorf("convert: --quant %q: want one of f32, f16, bf16, q8_row, q8_2f, q4tp", qs)
			}
			opt := convert.Options{Quant: d, Threads: threads}
			for _, k := range keep {
				r, err := convert.ParseKeep(k)
				if err != nil {
					return err
				}
				opt.Keep = append(opt.Keep, r)
			}
			if calib != "" {
				uses := d == quant.Q4TP || d == quant.Q82F
				for _, r := range opt.Keep {
					uses = uses || r.DType == quant.Q4TP || r.DType == quant.Q82F
				}
				if !uses {
					return fmt.Errorf("convert: --calibrate only changes q4tp and q8_2f weights; --quant is %s", d)
				}
				if calibTokens < 0 || calibCtx < 0 {
					return fmt.Errorf("convert: --calib-tokens and --calib-ctx must not be negative")
				}
				if calibMethod != convert.CalibGPTQ && calibMethod != convert.CalibRMS {
					return fmt.Errorf("convert: --calib-method %q: want %s or %s", calibMethod, convert.CalibGPTQ, convert.CalibRMS)
				}
				opt.Calibrate = &convert.Calibrate{Text: calib, Tokens: calibTokens, Ctx: calibCtx, Method: calibMethod}
				if calibMem != "" {
					if opt.Calibrate.Memory, err = parseBytes(calibMem); err != nil {
						return fmt.Errorf("convert: --calib-memory: %w", err)
					}
				}
			} else {
				for _, f := range []string{"calib-tokens", "calib-ctx", "calib-method", "calib-memory"} {
					if cmd.Flags().Changed(f) {
						return fmt.Errorf("convert: --%s needs --calibrate", f)
					}
				}
			}
			if shard != "" {
				if opt.ShardBytes, err = parseBytes(shard); err != nil {
					return fmt.Errorf("convert: --shard-size: %w", err)
				}
			}
			opt.Threads = clampThreads("--threads", threads, cmd.ErrOrStderr())
			opt.Progress = progress.Bytes(cmd.ErrOrStderr(), "converting")
			if opt.Calibrate != nil {
				opt.Calibrate.Progress = progress.Count(cmd.ErrOrStderr(), "calibration", "tokens")
			}
			res, err := convert.Run(cmd.Context(), args[0], out, opt)
			if err != nil {
				return err
			}
			warnFallbacks(cmd.ErrOrStderr(), res.Fallbacks)
			printConvertSummary(cmd.OutOrStdout(), res)
			return nil
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "output CMF file")
	c.Flags().StringVar(&qs, "quant", "q8_row", "default weight format: f32, f16, bf16, q8_row, q8_2f, q4tp")
	c.Flags().StringArrayVar(&keep, "keep", nil, "override the format of tensors matching a regexp: NAME_REGEX=dtype (repeatable)")
	c.Flags().StringVar(&shard, "shard-size", "", "split the output into files of at most this size (e.g. 4GB)")
	c.Flags().IntVar(&threads, "threads", 0, "encoder threads (0: all cores)")
	c.Flags().StringVar(&calib, "calibrate", "", "calibration text file (UTF-8, may be gzipped): encode q4tp/q8_2f weights for the activations it produces")
	c.Flags().IntVar(&calibTokens, "calib-tokens", 0, fmt.Sprintf("tokens of calibration text to run (0: %d)", convert.DefaultCalibTokens))
	c.Flags().IntVar(&calibCtx, "calib-ctx", 0, fmt.Sprintf("tokens per calibration sequence (0: %d, at most the model's context)", convert.DefaultCalibCtx))
	c.Flags().StringVar(&calibMethod, "calib-method", convert.CalibGPTQ, "how calibration encodes q4tp: gptq (error feedback through the inputs' Gram matrices) or rms (error weighted by each input's RMS)")
	c.Flags().StringVar(&calibMem, "calib-memory", "", "memory for GPTQ's Gram matrices at once, e.g. 8GiB (default 4GiB; less means more passes over the text)")
	return c
}

// parseBytes reads sizes like 4GB, 512MiB, 1000000.
func parseBytes(s string) (int64, error) {
	mult := map[string]int64{"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}
	u := strings.ToUpper(strings.TrimSpace(s))
	i := strings.IndexFunc(u, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := u, ""
	if i >= 0 {
		num, unit = u[:i], strings.TrimSpace(u[i:])
	}
	m, ok := mult[unit]
	var f float64
	if _, err := fmt.Sscanf(num, "%g", &f); err != nil || !ok || f <= 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	v := f * float64(m)
	if v < 1<<20 || v > 1<<60 {
		return 0, fmt.Errorf("size %q is out of range (1 MiB to 1 EiB)", s)
	}
	return int64(v), nil
}

// warnFallbacks prints one warning line per (asked, stored, reason) group
// of tensors stored in another format than asked.
func warnFallbacks(w io.Writer, fbs []convert.Fallback) {
	type key struct {
		asked, stored quant.DType
		reason        string
	}
	var order []key
	groups := map[key][]convert.Fallback{}
	for _, f := range fbs {
		k := key{f.Asked, f.Stored, f.Reason}
		if groups[k] == nil {
			order = append(order, k)
		}
		groups[k] = append(groups[k], f)
	}
	for _, k := range order {
		g := groups[k]
		ex := fmt.Sprintf("%s %v", g[0].Tensor, g[0].Shape)
		if len(g) > 1 {
			ex += fmt.Sprintf(" and %d more", len(g)-1)
		}
		noun := "tensors"
		if len(g) == 1 {
			noun = "tensor"
		}
		warnf(w, "%d %s stored as %s instead of %s: %s (%s)", len(g), noun, k.stored, k.asked, k.reason, ex)
	}
}

// printConvertSummary prints what was written and a table of the stored
// formats.
func printConvertSummary(w io.Writer, res *convert.Result) {
	fmt.Fprintf(w, "wrote %s: %d tensors, %s from %s in %s (%s/s)\n",
		strings.Join(res.Files, ", "), res.Tensors, units.Bytes(res.OutBytes), units.Bytes(res.InBytes),
		res.Elapsed.Round(time.Millisecond), units.Bytes(int64(float64(res.InBytes)/max(res.Elapsed.Seconds(), 1e-9))))
	names := make([]string, 0, len(res.DTypeCount))
	for d := range res.DTypeCount {
		names = append(names, d)
	}
	sort.Slice(names, func(i, j int) bool {
		if bi, bj := res.DTypeBytes[names[i]], res.DTypeBytes[names[j]]; bi != bj {
			return bi > bj
		}
		return names[i] < names[j]
	})
	fmt.Fprintf(w, "  %-8s %8s %12s\n", "format", "tensors", "bytes")
	for _, d := range names {
		fmt.Fprintf(w, "  %-8s %8d %12s\n", d, res.DTypeCount[d], units.Bytes(res.DTypeBytes[d]))
	}
}
