package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/cpu"
	"github.com/cortiq/cortiq/backend/cuda"
	"github.com/cortiq/cortiq/progress"
	"github.com/spf13/cobra"
)

// deviceFlagHelp documents --device (and CORTIQ_DEVICE).
const deviceFlagHelp = "device to run on: auto (the GPU when one can be used, else the CPU with one line saying why), cpu, cuda or cuda:N (fail instead of falling back); default $CORTIQ_DEVICE or auto"

// addDeviceFlag registers --device on c.
func addDeviceFlag(c *cobra.Command, dst *string) {
	def := os.Getenv("CORTIQ_DEVICE")
	if def == "" {
		def = "auto"
	}
	c.Flags().StringVar(dst, "device", def, deviceFlagHelp)
}

// deviceSpec is a parsed --device value.
type deviceSpec struct {
	kind  string // auto, cpu, cuda
	index int    // cuda:N
}

func parseDevice(s string) (deviceSpec, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	switch s {
	case "auto", "cpu", "cuda":
		return deviceSpec{kind: s}, nil
	}
	if n, ok := strings.CutPrefix(s, "cuda:"); ok {
		i, err := strconv.Atoi(n)
		if err == nil && i >= 0 {
			return deviceSpec{kind: "cuda", index: i}, nil
		}
	}
	return deviceSpec{}, fmt.Errorf("--device %q: want auto, cpu, cuda or cuda:N", s)
}

// deviceSize sizes a GPU's K/V pool and step scratch at open.
type deviceSize struct {
	seqs, ctx, rows int
}

// openCUDA opens CUDA device index. It returns an error wrapping
// backend.ErrNoDevice with the reason when no usable GPU is there.
var openCUDA = func(index int, sz deviceSize) (backend.Device, error) {
	opt := cuda.Options{Ordinal: index, Seqs: max(sz.seqs, 1), Ctx: max(sz.ctx, 1), MaxRows: sz.rows, Graphs: true, PDL: os.Getenv("CORTIQ_CUDA_PDL") != "0",
		NoMMQ: !mmqFromEnv(), F16Wide: os.Getenv("CORTIQ_CUDA_MMQ") != "int8", KVF16: os.Getenv("CORTIQ_CUDA_KV") != "f32",
		NoFusion: os.Getenv("CORTIQ_CUDA_FUSION") == "0", CheckEveryStep: os.Getenv("CORTIQ_CUDA_CHECK") == "every",
		MoEFF: os.Getenv("CORTIQ_CUDA_MOEFF") == "1", Progress: progress.Bytes(os.Stderr, "uploading weights")}
	if os.Getenv("CORTIQ_CUDA_PROFILE") != "" {
		// Per-kernel times of every step (eager, no graphs), printed at close.
		opt.Profile = os.Stderr
		// CORTIQ_CUDA_PROFILE_ROWS=N: only the steps of N rows.
		opt.ProfileRows, _ = strconv.Atoi(os.Getenv("CORTIQ_CUDA_PROFILE_ROWS"))
	}
	return cuda.Open(opt)
}

// mmqFromEnv reads CORTIQ_CUDA_MMQ: steps of more than 8 rows over q8_row,
// q8_2f and q4tp weights run on the int8 tensor-core GEMM unless it is 0
// (cuda.Options.NoMMQ: the bf16 GEMM); q4tp's steps of 33-64 rows take the
// half wide tiles (cuda.Options.F16Wide, f16 activations) unless it is
// "int8" (the int8 wide tiles, whose results equal the CPU's to float32
// rounding).
func mmqFromEnv() bool { return os.Getenv("CORTIQ_CUDA_MMQ") != "0" }

// openDevice opens the device spec names. auto falls back to the CPU and
// logs one line saying why; cuda fails instead.
func openDevice(spec string, threads int, sz deviceSize) (backend.Device, error) {
	d, err := parseDevice(spec)
	if err != nil {
		return nil, err
	}
	switch d.kind {
	case "cpu":
		return cpu.New(threads), nil
	case "cuda":
		dev, err := openCUDA(d.index, sz)
		if err != nil {
			return nil, fmt.Errorf("--device %s: %w", spec, err)
		}
		return dev, nil
	}
	dev, err := openCUDA(0, sz)
	if err == nil {
		return dev, nil
	}
	if !errors.Is(err, backend.ErrNoDevice) {
		// A GPU is there but failed: never silently hide that.
		return nil, fmt.Errorf("--device auto: the GPU could not be used (pass --device cpu to run on the CPU): %w", err)
	}
	fmt.Fprintf(fallbackOut, "cortiq: running on the CPU: %s\n", strings.TrimPrefix(err.Error(), backend.ErrNoDevice.Error()+": "))
	return cpu.New(threads), nil
}

// fallbackOut receives the one line --device auto prints when it falls
// back to the CPU (standard error; tests replace it).
var fallbackOut io.Writer = os.Stderr
