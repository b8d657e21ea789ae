package main

import (
	"io"

	"github.com/cortiq/cortiq/cmf"
)

func openCMF(path string) (*cmf.Model, error) { return cmf.Open(path) }

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
