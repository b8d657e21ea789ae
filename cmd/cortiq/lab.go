package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/cortiq/cortiq/kernels"
	"github.com/cortiq/cortiq/lab"
	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newLab) }

func newLab() *cobra.Command {
	var rounds, threads int
	var variants, device, modes string
	var asJSON bool
	c := &cobra.Command{
		Use:   "lab MODEL",
		Short: "time kernel variants over one decode token's weight walk, checked against the production kernel",
		Long: `lab runs exactly the weight dispatches of one decode token (per layer q, k, v, o, gate, up, down;
then the head) on the model's real tensors, for every variant in turn (round-robin, so drift of the
machine hits all alike), and prints per variant the median and minimum time, GB/s, the per-round
ratio to arm 0 (the production kernel: median, q1, q3), and how its output on the first layer and the
head compares with production ("bitwise" or the worst |Δ|/rms; over its tolerance it is FAILED).
With --device cuda[:N] the walk is uploaded once and every CUDA variant runs in three launch modes
(serial launches, one captured graph, a graph with PDL), GPU-timed with events; the table adds the
device's read-probe bandwidth and each arm's fraction of it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if rounds < 1 || rounds > 100000 {
				return fmt.Errorf("lab: --rounds %d: want 1 to 100000", rounds)
			}
			d, err := parseDevice(device)
			if err != nil {
				return err
			}
			if d.kind == "cpu" && modes != "" {
				return fmt.Errorf("lab: --modes %s: launch modes are for --device cuda", modes)
			}
			if d.kind != "cpu" {
				// Without a usable GPU this fails with the driver's reason.
				dev, err := openCUDA(d.index, deviceSize{seqs: 1, ctx: 1})
				if err != nil {
					return fmt.Errorf("lab: --device %s: %w", device, err)
				}
				if err := dev.Close(); err != nil {
					return fmt.Errorf("lab: --device %s: %w", device, err)
				}
			}
			f, err := openCMF(args[0], false)
			if err != nil {
				return err
			}
			defer f.Close()
			groups, err := lab.Walk(f)
			if err != nil {
				return err
			}
			var rep *lab.Report
			if d.kind != "cpu" {
				var modeList []string
				if modes != "" {
					modeList = strings.Split(modes, ",")
				}
				rep, err = lab.RunCUDA(cmd.Context(), groups, lab.CUDAOptions{Ordinal: d.index, Rounds: rounds, Variants: variants, Modes: modeList})
				if err != nil {
					return err
				}
			} else {
				pool := kernels.NewPool(threads)
				defer pool.Close()
				var single *kernels.Pool
				if pool.Workers() > 1 {
					single = kernels.NewPool(1)
					defer single.Close()
				}
				vs, err := lab.Select(lab.CPUVariants(pool, single), variants)
				if err != nil {
					return err
				}
				if rep, err = lab.Run(cmd.Context(), groups, vs, rounds); err != nil {
					return err
				}
				rep.Device = fmt.Sprintf("cpu (%d threads, %s)", pool.Workers(), kernels.ISA())
			}
			rep.Model = args[0]
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				rep.Table(out)
			}
			for _, r := range rep.Results {
				if r.Failed {
					return &exitError{code: 2, err: fmt.Errorf("lab: variant %s is off the production kernel by %.2e of RMS (tolerance %.0e)", r.Variant, r.Worst, r.Tol)}
				}
			}
			return nil
		},
	}
	c.Flags().IntVar(&rounds, "rounds", 9, "rounds of the walk per variant")
	c.Flags().StringVar(&variants, "variants", "", "comma-separated variants to run besides production (default: all)")
	c.Flags().StringVar(&device, "device", "cpu", "cpu, or cuda[:N] (the CUDA variants of csrc/lab.cu, timed with events)")
	c.Flags().StringVar(&modes, "modes", "", "CUDA launch modes, comma-separated: serial, graph, graph+pdl (default: all; serial always runs as arm 0)")
	c.Flags().IntVarP(&threads, "threads", "t", 0, "CPU threads (0: all cores)")
	c.Flags().BoolVar(&asJSON, "json", false, "JSON output")
	return c
}
