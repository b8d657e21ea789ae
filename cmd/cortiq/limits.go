package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/cortiq/cortiq/units"
)

// warnf prints one warning line to w.
func warnf(w io.Writer, format string, args ...any) {
	fmt.Fprintf(w, "cortiq: warning: "+format+"\n", args...)
}

// numCPU is the machine's CPU count (a variable for tests).
var numCPU = runtime.NumCPU

// clampThreads bounds a --threads value by the machine's CPUs, warning
// once when it had to; 0 (all cores) passes through.
func clampThreads(flag string, n int, errOut io.Writer) int {
	if c := numCPU(); n > c {
		warnf(errOut, "%s %d is more than this machine's %d CPUs; using %d", flag, n, c, c)
		return c
	}
	return n
}

// memAvailable returns the memory that can be allocated without swapping
// (MemAvailable of /proc/meminfo), ok=false where that is unknown. A
// variable for tests.
var memAvailable = func() (int64, bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	return parseMemAvailable(b)
}

// parseMemAvailable reads "MemAvailable:  12345 kB" from /proc/meminfo.
func parseMemAvailable(b []byte) (int64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == "MemAvailable:" {
			v, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil || v < 0 {
				return 0, false
			}
			mult := int64(1)
			if len(f) >= 3 && string(f[2]) == "kB" {
				mult = 1024
			}
			return v * mult, true
		}
	}
	return 0, false
}

// checkMemory refuses, before anything is allocated, a context whose
// session (KV cache and run state, from need) plus extra bytes does not
// fit the memory available, naming the largest context that does.
func checkMemory(ctx int, need func(ctx int) int64, extra func(ctx int) int64, what string) error {
	avail, ok := memAvailable()
	if !ok {
		return nil
	}
	total := func(n int) int64 { return need(n) + extra(n) }
	if total(ctx) <= avail {
		return nil
	}
	lo, hi := 0, ctx // total(lo) fits (or lo = 0), total(hi) does not
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if total(mid) <= avail {
			lo = mid
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return fmt.Errorf("%s of %d tokens needs %s; only %s of memory is available (MemAvailable), not enough for even one token",
			what, ctx, units.Bytes(total(ctx)), units.Bytes(avail))
	}
	return fmt.Errorf("%s of %d tokens needs %s (KV cache and buffers); %s of memory is available (MemAvailable): at most %d tokens fit; lower --ctx (or --batch)",
		what, ctx, units.Bytes(total(ctx)), units.Bytes(avail), lo)
}

func noExtra(int) int64 { return 0 }

// modelArgs is the Args check of a command that takes a model as its
// first argument or as -m/--model (*flag), followed by at most rest more
// arguments (rest < 0: any number).
func modelArgs(flag *string, rest int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		n := len(args)
		if *flag == "" {
			if n == 0 {
				return fmt.Errorf("%s: give the model as the first argument or with -m/--model", cmd.Name())
			}
			n--
		}
		if rest >= 0 && n > rest {
			return fmt.Errorf("%s: %d arguments too many (usage: %s)", cmd.Name(), n-rest, cmd.UseLine())
		}
		return nil
	}
}

// splitModel returns the model path (the flag, or else the first
// argument) and the remaining arguments.
func splitModel(flag string, args []string) (string, []string) {
	if flag != "" {
		return flag, args
	}
	return args[0], args[1:]
}

// addModelFlag adds -m/--model to c.
func addModelFlag(c *cobra.Command, p *string) {
	c.Flags().StringVarP(p, "model", "m", "", "model file (instead of the MODEL argument)")
}
