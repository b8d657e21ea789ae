// Command cortiq runs, converts, inspects and serves LLMs stored as CMF files.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set by the linker for releases.
var version = "0.1.0-dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// The first Ctrl-C cancels the work (partial files are removed);
		// once it has, a second one kills the process the default way.
		<-ctx.Done()
		stop()
	}()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cortiq:", err)
		os.Exit(exitCode(err))
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
			slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
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
