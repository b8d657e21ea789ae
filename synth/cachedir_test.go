package synth

import (
	"fmt"
	"os"
	"testing"
)

// TestMain points the user cache directory (where opening a CMF file
// records verified weights) at a temporary directory, so that tests never
// touch the real cache.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cortiq-test-cache-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("XDG_CACHE_HOME", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
