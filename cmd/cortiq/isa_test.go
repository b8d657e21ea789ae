package main

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/cortiq/cortiq/kernels"
)

var isaFlag = flag.String("isa", "", "run the tests with this kernel set (generic, avx2, avx512) instead of the CPU's best")

func TestMain(m *testing.M) {
	flag.Parse()
	if *isaFlag != "" {
		if _, err := kernels.SetISA(*isaFlag); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	// The suite runs on the CPU unless a test names a device: with --device
	// auto every command would add its one fallback line to the output the
	// tests parse (device_test.go and gpu_test.go choose devices explicitly).
	if os.Getenv("CORTIQ_DEVICE") == "" {
		os.Setenv("CORTIQ_DEVICE", "cpu")
	}
	cleanup := tempCache()
	code := m.Run()
	cleanup()
	os.Exit(code)
}
