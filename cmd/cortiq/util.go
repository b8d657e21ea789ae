package main

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/cortiq/cortiq/cmf"
)

// openCMF opens a model file, verifying its weights once per file identity
// unless noVerify.
func openCMF(path string, noVerify bool) (*cmf.Model, error) {
	return cmf.OpenWith(path, cmf.OpenOptions{NoVerify: noVerify})
}

// addNoVerify adds --no-verify to a command that opens a model.
func addNoVerify(c *cobra.Command, v *bool) {
	c.Flags().BoolVar(v, "no-verify", false, "do not hash the weights at open (by default they are verified once per file, remembered in the user cache)")
}

// maxInput bounds text read from standard input or a file (1 GiB).
const maxInput = 1 << 30

func readAll(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxInput+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxInput {
		return nil, errTooLarge
	}
	return b, nil
}

var errTooLarge = errorString("input larger than 1 GiB")

type errorString string

func (e errorString) Error() string { return string(e) }
