package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cortiq/cortiq/progress"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/synth"
	"github.com/cortiq/cortiq/units"
)

func init() { commands = append(commands, newSynth) }

func newSynth() *cobra.Command {
	var arch, shape, qs, out, shard string
	var seed uint64
	c := &cobra.Command{
		Use:   "synth --shape SHAPE --quant Q -o FILE.cmf",
		Short: "Write a model of a real published shape with random weights (for benchmarks)",
		Long:  fmt.Sprintf("Write a model of a real published shape with random weights straight into CMF.\nShapes: %v", synth.ShapeNames()),
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("synth: -o FILE.cmf is required")
			}
			a, err := synth.Arch(shape, arch)
			if err != nil {
				return err
			}
			d, err := quant.ParseDType(qs)
			if err != nil || d == quant.U8 || d == quant.I32 {
				return fmt.Errorf("synth: --quant %q: want one of f32, f16, bf16, q8_row, q8_2f, q4tp", qs)
			}
			opt := synth.Options{Seed: seed, Progress: progress.Bytes(cmd.ErrOrStderr(), "writing")}
			if shard != "" {
				if opt.ShardBytes, err = parseBytes(shard); err != nil {
					return fmt.Errorf("synth: --shard-size: %w", err)
				}
			}
			res, err := synth.Write(cmd.Context(), out, a, d, opt)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %s %s, %s params, %s in %s (%s/s)\n", strings.Join(res.Files, ", "), shape, d,
				units.Count(res.Params), units.Bytes(res.Bytes), res.Elapsed.Round(time.Millisecond),
				units.Bytes(int64(float64(res.Bytes)/max(res.Elapsed.Seconds(), 1e-9))))
			return nil
		},
	}
	c.Flags().StringVar(&arch, "arch", "", "architecture the shape must have (optional check)")
	c.Flags().StringVar(&shape, "shape", "llama1b", "model shape")
	c.Flags().StringVar(&qs, "quant", "q4tp", "default weight format")
	c.Flags().StringVarP(&out, "output", "o", "", "output CMF file")
	c.Flags().StringVar(&shard, "shard-size", "", "split into files of at most this size")
	c.Flags().Uint64Var(&seed, "seed", 1, "random seed")
	return c
}
