package main

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/server"
)

func init() { commands = append(commands, newServe) }

// serveFlags are the options of cortiq serve; each is also read from the
// environment as CORTIQ_<FLAG> (e.g. CORTIQ_ADDR, CORTIQ_API_KEY) when not
// given on the command line.
type serveFlags struct {
	addr, device, apiKey, name string
	parallel, ctx, threads     int
	queue, chunk               int
	grace                      time.Duration
	maxBody                    int64
}

func newServe() *cobra.Command {
	var f serveFlags
	c := &cobra.Command{
		Use:   "serve [MODEL]",
		Short: "Serve a model over an OpenAI-compatible HTTP API with continuous batching",
		Long: `Serve MODEL (a CMF file; or $CORTIQ_MODEL) at --addr: POST /v1/chat/completions and /v1/completions
(streaming or not), GET /v1/models, /health, /metrics (Prometheus) and a chat page at /.

--parallel sequences are decoded together, each with a --ctx-token KV cache (memory fixed at start);
up to --queue more requests wait, and the next gets 503. Every flag can be set as CORTIQ_<FLAG>,
e.g. CORTIQ_ADDR=0.0.0.0:8080 CORTIQ_API_KEY=secret. SIGTERM or Ctrl-C stops accepting requests,
lets those in flight finish for --grace, then cancels them and exits 0. --device auto uses the GPU when one can be used, else the CPU
(saying why); cuda fails instead of falling back.`,
		Args: cobra.MaximumNArgs(1),
		PreRunE: func(cmd *cobra.Command, args []string) error {
			return flagsFromEnv(cmd.Flags())
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			path := os.Getenv("CORTIQ_MODEL")
			if len(args) == 1 {
				path = args[0]
			}
			if path == "" {
				return errors.New("serve: no model: give MODEL (a .cmf file) or set CORTIQ_MODEL")
			}
			return runServe(cmd, path, f)
		},
	}
	fl := c.Flags()
	fl.StringVar(&f.addr, "addr", "127.0.0.1:8080", "listen address")
	fl.IntVar(&f.parallel, "parallel", 4, "sequences decoded together (slots)")
	fl.IntVar(&f.ctx, "ctx", 4096, "context tokens per slot (capped at the model's trained context)")
	addDeviceFlag(c, &f.device)
	fl.StringVar(&f.apiKey, "api-key", "", "require Authorization: Bearer KEY on /v1")
	fl.StringVar(&f.name, "name", "", "model id reported and accepted in \"model\" (default: the file name)")
	fl.IntVarP(&f.threads, "threads", "t", 0, "CPU threads (0: all cores)")
	fl.IntVar(&f.queue, "queue", 0, "requests that may wait for a slot (0: 4 × --parallel)")
	fl.IntVar(&f.chunk, "prefill-chunk", 256, "prompt tokens per sequence per step (long prompts are prefilled in chunks between decode steps)")
	fl.DurationVar(&f.grace, "grace", 30*time.Second, "on SIGTERM, how long requests in flight may run before they are cancelled")
	fl.Int64Var(&f.maxBody, "max-body", 4<<20, "request body limit in bytes")
	return c
}

// envName is the variable that sets a flag: CORTIQ_ and the flag's name in
// upper case with - as _.
func envName(flag string) string {
	return "CORTIQ_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// flagsFromEnv sets every flag not given on the command line from its
// CORTIQ_* variable.
func flagsFromEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(fl *pflag.Flag) {
		if err != nil || fl.Changed || fl.Name == "help" {
			return
		}
		if v, ok := os.LookupEnv(envName(fl.Name)); ok {
			if e := fs.Set(fl.Name, v); e != nil {
				err = fmt.Errorf("serve: %s=%q: %w", envName(fl.Name), v, e)
			}
		}
	})
	return err
}

func runServe(cmd *cobra.Command, path string, f serveFlags) error {
	if _, err := parseDevice(f.device); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if f.parallel < 1 || f.ctx < 1 || f.threads < 0 || f.queue < 0 || f.chunk < 1 {
		return errors.New("serve: --parallel, --ctx and --prefill-chunk must be ≥ 1, --threads and --queue ≥ 0")
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	name := f.name
	if name == "" {
		name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	srv := server.New(server.Config{ModelName: name, Parallel: f.parallel, Ctx: f.ctx, Queue: f.queue,
		PrefillChunk: f.chunk, APIKey: f.apiKey, MaxBody: f.maxBody, Logger: slog.Default()})
	ctx := cmd.Context()
	done := make(chan error, 1)
	go func() { done <- server.Serve(ctx, ln, srv, f.grace) }()
	slog.Info("listening; loading the model", "addr", "http://"+ln.Addr().String(), "model", path, "device", f.device)

	t0 := time.Now()
	// A step holds a token per slot plus one prompt chunk.
	dev, err := openDevice(f.device, f.threads, deviceSize{seqs: f.parallel, ctx: f.ctx, rows: f.parallel + f.chunk})
	var e *engine.Engine
	if err == nil {
		e, err = engine.Open(path, engine.Options{Threads: f.threads, Device: dev, OwnDevice: true})
	}
	if err == nil {
		ctxLen := f.ctx
		if mp := e.File.Header.Arch.MaxPositionEmbeddings; mp > 0 && ctxLen > mp {
			ctxLen = mp
		}
		err = checkKVMemory(int64(f.parallel) * e.Model.CacheBytes(ctxLen))
		if err == nil {
			err = srv.Attach(e)
		}
		if err != nil {
			e.Close()
		}
	}
	if err != nil {
		srv.Close()
		ln.Close()
		<-done
		return fmt.Errorf("serve: %w", err)
	}
	defer e.Close()
	slog.Info("ready", "model", name, "load", time.Since(t0).Round(time.Millisecond))
	return <-done
}

// checkKVMemory refuses a KV budget (--ctx × --parallel) larger than the
// memory the system reports available (Linux; elsewhere no check).
func checkKVMemory(need int64) error {
	fh, err := os.Open("/proc/meminfo")
	if err != nil {
		return nil
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err == nil && need > kb<<10 {
				return fmt.Errorf("the KV caches need %.1f GiB (--ctx × --parallel) but %.1f GiB is available; lower --ctx or --parallel",
					float64(need)/(1<<30), float64(kb<<10)/(1<<30))
			}
			return nil
		}
	}
	return nil
}
