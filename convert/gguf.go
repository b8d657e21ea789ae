package convert

import (
	"context"
	"fmt"
)

// FromGGUF converts a GGUF file to CMF.
func FromGGUF(ctx context.Context, path, out string, opt Options) (*Result, error) {
	return nil, fmt.Errorf("convert: GGUF import is not built yet (%s)", path)
}
