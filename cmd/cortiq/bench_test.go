package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/synth"
)

// TestBenchPlot: bench --depths --batches --plot measures the sweeps,
// reports them in the JSON, draws them, and --replot draws the same
// figure from that JSON.
func TestBenchPlot(t *testing.T) {
	dir := t.TempDir()
	p, svg, svg2, js := filepath.Join(dir, "m.cmf"), filepath.Join(dir, "a.svg"), filepath.Join(dir, "b.svg"), filepath.Join(dir, "r.json")
	a, _ := synth.Arch("tiny_llama", "")
	if _, err := synth.Write(context.Background(), p, a, quant.Q8Row, synth.Options{Seed: 3}); err != nil {
		t.Fatal(err)
	}
	out, _, err := cliIO(t, nil, "bench", p, "-p", "8", "-n", "4", "-r", "1", "--no-probe", "--threads", "1", "--device", "cpu",
		"--depths", "0,16", "--batches", "1,2", "--plot", svg, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Machine, Date, Command string
		Results                []struct {
			Test      string  `json:"test"`
			TokPerSec float64 `json:"tok_per_sec"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var tests []string
	for _, r := range rep.Results {
		tests = append(tests, r.Test)
		if !(r.TokPerSec > 0) {
			t.Errorf("%s: %v tok/s", r.Test, r.TokPerSec)
		}
	}
	if strings.Join(tests, " ") != "pp8 tg4 tg4@d0 tg4@d16 tg4x1 tg4x2" || rep.Machine == "" || rep.Date == "" ||
		rep.Command != "cortiq bench -p 8 -n 4 -r 1 --threads 1 --depths 0,16 --batches 1,2 --device cpu --no-probe --json --plot "+svg+" "+p {
		t.Errorf("tests %v, machine %q, date %q, command %q", tests, rep.Machine, rep.Date, rep.Command)
	}
	data, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	points := 0
	d := xml.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("--plot wrote bad XML: %v", err)
		}
		if e, ok := tok.(xml.StartElement); ok && e.Name.Local == "circle" {
			points++
		}
	}
	if points != 4 || !bytes.Contains(data, []byte(`data-name="m.cmf (q8_row)"`)) {
		t.Errorf("%d points drawn, want 4 (2 depths, 2 batches)\n%s", points, data)
	}
	if err := os.WriteFile(js, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cliIO(t, nil, "bench", "--replot", js, "--plot", svg2); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(svg2); !bytes.Equal(again, data) {
		t.Error("--replot of the JSON draws another figure")
	}
	for _, args := range [][]string{
		{"bench", "--replot", js},
		{"bench", "--replot", js, "--plot", svg2, p},
		{"bench", p, "-n", "0", "--depths", "8", "--no-probe"},
		{"bench", p, "--batches", "0", "--no-probe"},
		{"bench", p, "--depths", "-1", "--no-probe"},
	} {
		if _, _, err := cliIO(t, nil, args...); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}
