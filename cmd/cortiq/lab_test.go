package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestLabCommand: `cortiq lab` on a tiny synthesized model prints the
// table, --json gives the same variants with the correctness column, and
// --device cuda fails with the reason on a machine without a GPU backend.
func TestLabCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tiny.cmf")
	if _, err := cli(t, "synth", "--shape", "tiny_qwen3", "--quant", "q4tp", "-o", path); err != nil {
		t.Fatal(err)
	}
	out, err := cli(t, "lab", path, "--rounds", "2", "-t", "2")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"walk: 15 tensors in 9 groups", "prod", "split", "loads", "bitwise"} {
		if !strings.Contains(out, want) {
			t.Fatalf("lab table lacks %q:\n%s", want, out)
		}
	}
	out, err = cli(t, "lab", path, "--rounds", "2", "--variants", "split", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Tensors int `json:"tensors"`
		Results []struct {
			Variant string  `json:"variant"`
			Check   string  `json:"check"`
			Failed  bool    `json:"failed"`
			Ratio   float64 `json:"ratio_to_arm0"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rep.Results) != 2 || rep.Results[0].Variant != "prod" || rep.Results[1].Check != "bitwise" || rep.Results[1].Failed {
		t.Fatalf("lab --json: %+v", rep)
	}
	if _, err := cli(t, "lab", path, "--device", "cuda"); err == nil || !strings.Contains(err.Error(), "CUDA") {
		t.Fatalf("lab --device cuda without a GPU backend: %v", err)
	}
	if _, err := cli(t, "lab", path, "--modes", "graph"); err == nil || !strings.Contains(err.Error(), "--device cuda") {
		t.Fatalf("lab --modes on the CPU: %v", err)
	}
	if _, err := cli(t, "lab", path, "--variants", "nope"); err == nil {
		t.Fatal("unknown variant accepted")
	}
}
