package main

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/cpu"
)

// TestDeviceSelection: auto falls back to the CPU with exactly one line
// saying why, cuda fails with the reason, a GPU that is present but broken
// is an error under auto too, and bad values are refused.
func TestDeviceSelection(t *testing.T) {
	var logs bytes.Buffer
	old := fallbackOut
	fallbackOut = &logs
	defer func() { fallbackOut = old }()
	saved := openCUDA
	defer func() { openCUDA = saved }()

	openCUDA = func(int, deviceSize) (backend.Device, error) {
		return nil, fmt.Errorf("%w: libcuda.so.1 not found", backend.ErrNoDevice)
	}
	d, err := openDevice("auto", 1, deviceSize{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d.(*cpu.Device); !ok {
		t.Fatalf("auto without a GPU gave %T", d)
	}
	d.Close()
	if got := logs.String(); got != "cortiq: running on the CPU: libcuda.so.1 not found\n" {
		t.Fatalf("auto fallback printed %q, want one line with the reason", got)
	}
	logs.Reset()
	if _, err := openDevice("cuda", 1, deviceSize{}); err == nil || !strings.Contains(err.Error(), "libcuda.so.1 not found") {
		t.Fatalf("--device cuda without a GPU: %v", err)
	}
	if _, err := openDevice("cuda:3", 1, deviceSize{}); err == nil || !strings.Contains(err.Error(), "cuda:3") {
		t.Fatalf("--device cuda:3 without a GPU: %v", err)
	}
	d, err = openDevice("cpu", 1, deviceSize{})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if logs.Len() != 0 {
		t.Fatalf("--device cpu logged %q", logs.String())
	}
	openCUDA = func(int, deviceSize) (backend.Device, error) { return nil, errors.New("CUDA_ERROR_ECC_UNCORRECTABLE") }
	if _, err := openDevice("auto", 1, deviceSize{}); err == nil || !strings.Contains(err.Error(), "ECC") {
		t.Fatalf("auto with a broken GPU must fail, got %v", err)
	}
	for _, bad := range []string{"gpu", "cuda:-1", "cuda:x", ""} {
		if _, err := openDevice(bad, 1, deviceSize{}); err == nil {
			t.Fatalf("--device %q accepted", bad)
		}
	}
}

// TestDeviceFlagEnv: CORTIQ_DEVICE sets the default of --device, and the
// real (no-GPU here) CUDA path makes `run --device cuda` fail with a reason.
func TestDeviceFlagEnv(t *testing.T) {
	t.Setenv("CORTIQ_DEVICE", "cuda")
	path := convertFixture(t, "llama_f32", "f32")
	_, err := cli(t, "run", path, "--ids", "1,2", "-n", "2")
	if err == nil || !strings.Contains(err.Error(), "--device cuda") {
		t.Fatalf("CORTIQ_DEVICE=cuda: %v", err)
	}
	if _, err := cli(t, "run", path, "--ids", "1,2", "-n", "2", "--device", "cpu"); err != nil {
		t.Fatalf("--device cpu overrides CORTIQ_DEVICE: %v", err)
	}
}

// The int8 GEMM is on unless CORTIQ_CUDA_MMQ=0.
func TestMMQFromEnv(t *testing.T) {
	for v, want := range map[string]bool{"": true, "0": false, "1": true, "yes": true} {
		t.Setenv("CORTIQ_CUDA_MMQ", v)
		if got := mmqFromEnv(); got != want {
			t.Errorf("CORTIQ_CUDA_MMQ=%q: MMQ %v, want %v", v, got, want)
		}
	}
}
