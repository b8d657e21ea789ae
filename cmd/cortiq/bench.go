package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/bench"
	"github.com/cortiq/cortiq/engine"
)

func init() { commands = append(commands, newBench) }

func newBench() *cobra.Command {
	var p, n, r, threads int
	var asJSON, md, noProbe, noVerify, batchLogits bool
	var probeMB int
	var device string
	var path string
	var depths, batches []int
	var plotPath, replot, note string
	models := modelArgs(&path, -1)
	c := &cobra.Command{
		Use:   "bench MODEL [MODEL...]",
		Short: "llama-bench-like speed table (pp, tg tok/s ± sd) with the machine's read bandwidth measured in the same run",
		Args: func(cmd *cobra.Command, args []string) error {
			if replot != "" {
				return nil
			}
			return models(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if replot != "" {
				return replotJSON(replot, plotPath, note, path, args)
			}
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
			for _, d := range depths {
				if d < 0 || d > 1<<20 {
					return fmt.Errorf("bench: --depths %d: want 0 to 1048576", d)
				}
			}
			for _, b := range batches {
				if b < 1 || b > 256 {
					return fmt.Errorf("bench: --batches %d: want 1 to 256", b)
				}
			}
			if (len(depths) > 0 || len(batches) > 0) && n == 0 {
				return fmt.Errorf("bench: --depths and --batches time decoding: -n must be > 0")
			}
			maxDepth, maxBatch := 0, 1
			for _, d := range depths {
				maxDepth = max(maxDepth, d)
			}
			for _, b := range batches {
				maxBatch = max(maxBatch, b)
			}
			rep := &bench.Report{Threads: threads, Machine: machineName(), Date: time.Now().UTC().Format(time.RFC3339),
				Command: commandLine(cmd, args), Note: note}
			// The read probe is the device's own (backend.Prober) where it
			// has one, else the host's, made when the first model that runs
			// on the host threads needs it.
			var prober *bench.Prober
			for _, path := range args {
				dev, err := openDevice(device, threads, deviceSize{seqs: maxBatch + 1, ctx: max(max(p, maxDepth)+n+1, 16), rows: max(p, maxDepth, 64, maxBatch)})
				if err != nil {
					return err
				}
				rep.Device = dev.Name()
				devProbe, onDevice := dev.(backend.Prober)
				if !noProbe && !onDevice && prober == nil {
					prober = bench.NewProber(int64(probeMB)<<20, threads)
					rep.ReadBandwidth = prober.Measure(5)
				}
				e, err := engine.Open(path, engine.Options{Threads: threads, Device: dev, OwnDevice: true, NoVerify: noVerify})
				if err != nil {
					return err
				}
				if err := checkMemory(max(p, maxDepth+n+1, 16), e.Model.SessionBytes, noExtra, "bench: a context"); err != nil {
					e.Close()
					return err
				}
				cfg := bench.Config{Prompt: p, Gen: n, Reps: r, Threads: threads, Depths: depths, Batches: batches, BatchLogits: batchLogits}
				bw := rep.ReadBandwidth
				switch {
				case noProbe:
				case onDevice:
					size := max(int64(1)<<30, bench.DecodeBytes(e))
					if cmd.Flags().Changed("probe-mb") {
						size = int64(probeMB) << 20
					}
					if bw, err = deviceProbe(devProbe, size); err != nil {
						e.Close()
						return fmt.Errorf("bench: %w", err)
					}
					if rep.ReadBandwidthSource == "" {
						rep.ReadBandwidth, rep.ReadBandwidthSource = bw, dev.Name()
					}
					cfg.Probe = func() float64 {
						b, err := deviceProbe(devProbe, size)
						if err != nil {
							fmt.Fprintf(cmd.ErrOrStderr(), "cortiq: bench: %v\n", err)
						}
						return b
					}
				default:
					cfg.Probe = func() float64 { return prober.Measure(2) }
				}
				res, err := bench.Run(cmd.Context(), path, e, cfg, bw)
				if tm, ok := dev.(backend.StepTimer); ok && err == nil && n > 0 {
					// Kernel time vs gaps, apart from the timed tests; a
					// profile that fails costs only its line.
					prof, perr := bench.ProfileSteps(cmd.Context(), path, e, tm, min(n, 32))
					if perr != nil {
						fmt.Fprintf(cmd.ErrOrStderr(), "cortiq: bench: no decode step profile: %v\n", perr)
					} else {
						rep.StepProfiles = append(rep.StepProfiles, *prof)
					}
				}
				e.Close()
				if err != nil {
					return err
				}
				if onDevice {
					for i := range res {
						res[i].Threads = 0 // the device ran it, not the host's threads
					}
				}
				rep.Results = append(rep.Results, res...)
			}
			out := cmd.OutOrStdout()
			if plotPath != "" {
				if err := writePlot(plotPath, rep); err != nil {
					return err
				}
			}
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
	c.Flags().IntVar(&probeMB, "probe-mb", 512, "bandwidth probe buffer size in MiB (a device's own probe, where it has one: max(1 GiB, a decode step's weight bytes) unless given)")
	c.Flags().IntSliceVar(&depths, "depths", nil, "also time tg at these context depths (prefill to each, then decode -n tokens), e.g. 0,512,2048")
	c.Flags().IntSliceVar(&batches, "batches", nil, "also time aggregate tg of this many sequences decoded together, e.g. 1,2,4,8 (greedy ids picked on the device, as a greedy server step)")
	c.Flags().BoolVar(&batchLogits, "batch-logits", false, "with --batches, also time the same steps with every sequence's logits copied to the host (tgNxB+logits: what sampling requests cost)")
	c.Flags().StringVar(&plotPath, "plot", "", "write an SVG figure (tok/s vs depth, vs batch, beside llama.cpp's quoted figures) to this file")
	c.Flags().StringVar(&note, "note", "", "a line for the figure's caption and the JSON (say how loaded the machine was)")
	c.Flags().StringVar(&replot, "replot", "", "measure nothing: draw --plot from the output of an earlier bench --json")
	addDeviceFlag(c, &device)
	addNoVerify(c, &noVerify)
	return c
}

// deviceProbe runs a device's read probe over size bytes: bytes/s.
func deviceProbe(p backend.Prober, size int64) (float64, error) {
	gbps, err := p.ReadProbe(size)
	if err != nil {
		return 0, fmt.Errorf("the device's read probe: %w", err)
	}
	return gbps * 1e9, nil
}

// benchFlags are bench's flags in the order commandLine spells them.
var benchFlags = []string{"model", "p", "n", "r", "threads", "depths", "batches", "batch-logits", "device", "probe-mb", "no-probe", "no-verify", "json", "md", "plot", "note"}

// commandLine spells the command as run: the flags set, in name order
// (slices as the comma lists they were given in), then the arguments.
func commandLine(cmd *cobra.Command, args []string) string {
	parts := []string{"cortiq", cmd.Name()}
	for _, n := range benchFlags {
		f := cmd.Flags().Lookup(n)
		if f == nil || !f.Changed {
			continue
		}
		v := f.Value.String()
		if strings.HasSuffix(f.Value.Type(), "Slice") {
			v = strings.Trim(v, "[]")
		}
		dash := "--"
		if len(n) == 1 {
			dash = "-"
		}
		if f.Value.Type() == "bool" && v == "true" {
			parts = append(parts, dash+n)
			continue
		}
		parts = append(parts, dash+n+" "+v)
	}
	return strings.Join(append(parts, args...), " ")
}

// replotJSON draws the report of an earlier --json run to plotPath.
func replotJSON(from, plotPath, note, model string, args []string) error {
	if plotPath == "" {
		return fmt.Errorf("bench --replot: give the figure's file with --plot")
	}
	if model != "" || len(args) > 0 {
		return fmt.Errorf("bench --replot measures nothing: give no model")
	}
	data, err := os.ReadFile(from)
	if err != nil {
		return fmt.Errorf("bench --replot: %w", err)
	}
	var rep bench.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		return fmt.Errorf("bench --replot %s: %w", from, err)
	}
	if note != "" {
		rep.Note = note
	}
	return writePlot(plotPath, &rep)
}

// writePlot draws rep to path (written whole or not at all).
func writePlot(path string, rep *bench.Report) error {
	var b bytes.Buffer
	if err := rep.WriteSVG(&b, bench.Peers); err != nil {
		return fmt.Errorf("bench --plot: %w", err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("bench --plot: %w", err)
	}
	return nil
}

// machineName describes this machine for a plot's caption: the CPU model,
// logical CPUs and memory (Linux), else GOOS/GOARCH.
func machineName() string {
	name := runtime.GOOS + "/" + runtime.GOARCH
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				name = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	name += fmt.Sprintf(", %d logical CPUs", runtime.NumCPU())
	if total, ok := memTotal(); ok {
		name += fmt.Sprintf(", %.0f GiB", float64(total)/(1<<30))
	}
	return name
}

// memTotal returns MemTotal from /proc/meminfo.
func memTotal() (int64, bool) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(l, "MemTotal:"); ok {
			var kb int64
			if _, err := fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), &kb); err == nil {
				return kb << 10, true
			}
		}
	}
	return 0, false
}
