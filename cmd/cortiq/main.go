// Command cortiq runs, converts, inspects and serves LLMs stored as CMF files.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set by the linker for releases.
var version = "0.1.0-dev"

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go handleSignals(sigs, cancel, func() { signal.Stop(sigs) })
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cortiq:", err)
		os.Exit(exitCode(err))
	}
}

// interruptHook, when set, gets Ctrl-C first: a command that can stop a
// part of its work (chat stops the reply being generated) returns true and
// the process goes on.
var interruptHook atomic.Pointer[func() bool]

// handleSignals cancels the root context on SIGTERM or on a Ctrl-C that no
// hook took, then stops catching signals, so a second Ctrl-C kills the
// process the default way while the first one's cleanup (removing partial
// files) runs.
func handleSignals(sigs <-chan os.Signal, cancel func(), stopCatching func()) {
	for s := range sigs {
		if s == os.Interrupt {
			if h := interruptHook.Load(); h != nil && (*h)() {
				continue
			}
		}
		cancel()
		stopCatching()
		return
	}
}

// exitError carries a specific exit status (e.g. verify's "hash mismatch").
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func exitCode(err error) int {
	if e, ok := err.(*exitError); ok {
		return e.code
	}
	return 1
}

func newRoot() *cobra.Command {
	var verbose bool
	root := &cobra.Command{
		Use:           "cortiq",
		Short:         "cortiq: a fast, trustworthy LLM inference engine",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRun: func(cmd *cobra.Command, args []string) {
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level})))
		},
	}
	root.PersistentFlags().BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	for _, c := range commands {
		root.AddCommand(c())
	}
	return root
}

// commands lists the subcommand constructors; each file registers its own.
var commands []func() *cobra.Command
