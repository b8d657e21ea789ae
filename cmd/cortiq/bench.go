package main

import (
	"encoding/json"
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/cortiq/cortiq/bench"
	"github.com/cortiq/cortiq/engine"
)

func init() { commands = append(commands, newBench) }

func newBench() *cobra.Command {
	var p, n, r, threads int
	var asJSON, md, noProbe, noVerify bool
	var probeMB int
	var device string
	var path string
	c := &cobra.Command{
		Use:   "bench MODEL [MODEL...]",
		Short: "llama-bench-like speed table (pp, tg tok/s ± sd) with the machine's read bandwidth measured in the same run",
		Args:  modelArgs(&path, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if path != "" {
				args = append([]string{path}, args...)
			}
			if probeMB < 16 || probeMB > 1<<20 {
				return fmt.Errorf("bench: --probe-mb %d: want 16 to 1048576", probeMB)
			}
			if p < 0 || n < 0 || r < 1 {
				return fmt.Errorf("bench: -p and -n must be ≥ 0 and -r ≥ 1")
			}
			if threads <= 0 {
				threads = runtime.GOMAXPROCS(0)
			}
			threads = clampThreads("--threads", threads, cmd.ErrOrStderr())
			rep := &bench.Report{Threads: threads}
			var prober *bench.Prober
			if !noProbe {
				prober = bench.NewProber(int64(probeMB)<<20, threads)
				rep.ReadBandwidth = prober.Measure(5)
			}
			for _, path := range args {
				dev, err := openDevice(device, threads, deviceSize{seqs: 1, ctx: p + n + 1, rows: max(p, 64)})
				if err != nil {
					return err
				}
				e, err := engine.Open(path, engine.Options{Threads: threads, Device: dev, OwnDevice: true, NoVerify: noVerify})
				if err != nil {
					return err
				}
				if err := checkMemory(max(p, n+1, 16), e.Model.SessionBytes, noExtra, "bench: a context"); err != nil {
					e.Close()
					return err
				}
				cfg := bench.Config{Prompt: p, Gen: n, Reps: r, Threads: threads}
				if !noProbe {
					cfg.Probe = func() float64 { return prober.Measure(2) }
				}
				res, err := bench.Run(cmd.Context(), path, e, cfg, rep.ReadBandwidth)
				e.Close()
				if err != nil {
					return err
				}
				rep.Results = append(rep.Results, res...)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			rep.Markdown(out) // --md is the default text format
			_ = md
			return nil
		},
	}
	addModelFlag(c, &path)
	c.Flags().IntVarP(&p, "p", "p", 512, "prompt tokens of the pp test (0: skip)")
	c.Flags().IntVarP(&n, "n", "n", 128, "generated tokens of the tg test (0: skip)")
	c.Flags().IntVarP(&r, "r", "r", 3, "repetitions")
	c.Flags().IntVarP(&threads, "threads", "t", 0, "threads (0: all cores)")
	c.Flags().BoolVar(&asJSON, "json", false, "JSON output")
	c.Flags().BoolVar(&md, "md", true, "Markdown table output (default)")
	c.Flags().BoolVar(&noProbe, "no-probe", false, "skip the memory bandwidth probe")
	c.Flags().IntVar(&probeMB, "probe-mb", 512, "bandwidth probe buffer size in MiB")
	addDeviceFlag(c, &device)
	addNoVerify(c, &noVerify)
	return c
}
