package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// tempCache points the user cache directory (where opening a CMF file
// records verified weights) at a temporary directory, so that tests never
// touch the real cache; TestMain calls it and the returned cleanup.
func tempCache() (cleanup func()) {
	// Created on first use only, so that killed fuzz workers leave nothing.
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("cortiq-test-cache-%d-%d", os.Getpid(), time.Now().UnixNano()))
	os.Setenv("XDG_CACHE_HOME", dir)
	return func() { os.RemoveAll(dir) }
}
