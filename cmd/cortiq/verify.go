package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/progress"
)

func init() { commands = append(commands, newVerify) }

func newVerify() *cobra.Command {
	var path string
	c := &cobra.Command{
		Use:   "verify FILE",
		Short: "Recompute every section hash of a CMF file (exit 2 and name the section on a mismatch)",
		Args:  modelArgs(&path, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, args := splitModel(path, args)
			args = append([]string{p}, args...)
			m, err := cmf.OpenWith(p, cmf.OpenOptions{NoVerify: true}) // Verify below hashes everything
			if errors.Is(err, cmf.ErrCorrupt) {
				return &exitError{2, err} // a damaged file: the same status as a hash mismatch
			}
			if err != nil {
				return err
			}
			defer m.Close()
			probs, err := m.Verify(cmd.Context(), progress.Bytes(cmd.ErrOrStderr(), "verifying"))
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(probs) > 0 {
				for _, p := range probs {
					fmt.Fprintln(out, "FAIL", p)
				}
				return &exitError{2, fmt.Errorf("%s: %d section(s) do not match their hashes; first: %s", args[0], len(probs), probs[0].Section)}
			}
			var bytes int64
			for _, s := range m.Sections() {
				bytes += s.Size
			}
			fmt.Fprintf(out, "OK %s: preamble, header, directory, %d data section(s) and %d tensors match (%d bytes)\n", args[0], m.Shards(), len(m.Tensors), bytes)
			return nil
		},
	}
	addModelFlag(c, &path)
	return c
}
