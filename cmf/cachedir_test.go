package cmf

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestMain points the user cache directory (where opening a CMF file
// records verified weights) at a temporary directory, so that tests never
// touch the real cache.
func TestMain(m *testing.M) {
	// Created on first use only, so that killed fuzz workers leave nothing.
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("cortiq-test-cache-%d-%d", os.Getpid(), time.Now().UnixNano()))
	os.Setenv("XDG_CACHE_HOME", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
