package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/cpu"
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

// probingDevice is a device with its own read probe (backend.Prober), as
// the CUDA device has: the CPU computes, the probe answers a fixed figure
// and records the sizes it was asked for.
type probingDevice struct {
	backend.Device
	gbps   float64
	sizes  []int64
	timing []bool // TimeSteps calls
}

func (p *probingDevice) Name() string { return "cuda:0 (Fake H200, 132 SMs)" }

func (p *probingDevice) ReadProbe(n int64) (float64, error) {
	p.sizes = append(p.sizes, n)
	return p.gbps, nil
}

// It also times its steps (backend.StepTimer) with fixed figures: 4 steps
// of 1500 µs replayed from graphs, 100 kernels of 12 µs.
func (p *probingDevice) TimeSteps(on bool) { p.timing = append(p.timing, on) }

func (p *probingDevice) StepTimes() backend.StepTimes {
	return backend.StepTimes{Steps: 4, Graphs: 4, StepTime: 6 * time.Millisecond, Kernels: 100, KernelTime: 1200 * time.Microsecond}
}

// TestBenchDeviceProbe: on a device with its own read probe, bench takes
// the bandwidth from it, not from the host's threads: the table's threads
// column is "-", the probe line names the device and its figure, the %
// column and the JSON's bandwidth_pct are against that figure, and the
// JSON names the probe's source. The host's probe never runs.
func TestBenchDeviceProbe(t *testing.T) {
	p := filepath.Join(t.TempDir(), "m.cmf")
	a, _ := synth.Arch("tiny_llama", "")
	if _, err := synth.Write(context.Background(), p, a, quant.Q8Row, synth.Options{Seed: 3}); err != nil {
		t.Fatal(err)
	}
	saved := openCUDA
	defer func() { openCUDA = saved }()
	var devs []*probingDevice
	openCUDA = func(int, deviceSize) (backend.Device, error) {
		d := &probingDevice{Device: cpu.New(1), gbps: 4513}
		devs = append(devs, d)
		return d, nil
	}
	out, _, err := cliIO(t, nil, "bench", p, "-p", "8", "-n", "4", "-r", "2", "--threads", "1", "--device", "cuda")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bench on a device with its own probe:\n%s", out)
	if !strings.Contains(out, "\nread bandwidth probed on cuda:0 (Fake H200, 132 SMs): 4513 GB/s;") || strings.Contains(out, "threads;") ||
		strings.Contains(out, "with 1 threads") {
		t.Errorf("probe line:\n%s", out)
	}
	if !strings.Contains(out, "\ndecode step of "+p+" on the device: 1500 µs (mean of 4, replayed from a graph); kernels 1200 µs (80%: 100 kernels, each timed by events in one eager step), gaps between kernels 300 µs (20%)\n") {
		t.Errorf("no decode step profile line:\n%s", out)
	}
	rows := 0
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "| "+p+" |") {
			continue
		}
		rows++
		cells := strings.Split(l, " | ")
		if len(cells) != 11 || cells[5] != "-" {
			t.Errorf("threads column of %q is not -", l)
		}
		if strings.Contains(l, "| tg4 |") && (cells[9] != "4513.0" || !strings.HasSuffix(cells[10], "% |")) {
			t.Errorf("tg row %q: read bw %q, %% %q", l, cells[9], cells[10])
		}
	}
	if rows != 2 {
		t.Errorf("%d rows, want pp8 and tg4:\n%s", rows, out)
	}
	// One probe at the start and one before each of the 2 repetitions,
	// over at least 1 GiB (the model is smaller).
	if len(devs) != 1 || len(devs[0].sizes) != 3 || devs[0].sizes[0] != 1<<30 {
		t.Errorf("device probes: %d devices, sizes %v", len(devs), devs[0].sizes)
	}
	if tm := devs[0].timing; len(tm) != 2 || !tm[0] || tm[1] {
		t.Errorf("TimeSteps calls %v, want on then off (after the timed tests)", tm)
	}

	out, _, err = cliIO(t, nil, "bench", p, "-p", "0", "-n", "4", "-r", "1", "--threads", "1", "--device", "cuda", "--probe-mb", "64", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		ReadBandwidth float64 `json:"read_bandwidth_bytes_per_sec"`
		Source        string  `json:"read_bandwidth_source"`
		Device        string  `json:"device"`
		Profiles      []struct {
			Steps   int     `json:"steps"`
			StepUS  float64 `json:"step_us"`
			Kernels int     `json:"kernels"`
			GapUS   float64 `json:"gap_us"`
		} `json:"decode_step_profiles"`
		Results []struct {
			Test          string    `json:"test"`
			Threads       int       `json:"threads"`
			GBPerSec      float64   `json:"gb_per_sec"`
			BandwidthPct  float64   `json:"bandwidth_pct"`
			ReadBandwidth float64   `json:"read_bandwidth"`
			ProbeSamples  []float64 `json:"probe_samples"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if rep.ReadBandwidth != 4513e9 || rep.Source != "cuda:0 (Fake H200, 132 SMs)" || rep.Device != rep.Source || len(rep.Results) != 1 {
		t.Fatalf("report: %+v", rep)
	}
	if pr := rep.Profiles; len(pr) != 1 || pr[0].Steps != 4 || pr[0].StepUS != 1500 || pr[0].Kernels != 100 || math.Abs(pr[0].GapUS-300) > 1e-9 {
		t.Errorf("decode_step_profiles: %+v", pr)
	}
	x := rep.Results[0]
	want := 100 * x.GBPerSec * 1e9 / 4513e9
	if x.Test != "tg4" || x.Threads != 0 || x.ReadBandwidth != 4513e9 || len(x.ProbeSamples) != 1 || x.ProbeSamples[0] != 4513e9 ||
		!(x.GBPerSec > 0) || math.Abs(x.BandwidthPct-want) > 1e-9*want {
		t.Errorf("tg row: %+v (bandwidth_pct want %g)", x, want)
	}
	if s := devs[1].sizes; len(s) != 2 || s[0] != 64<<20 || s[1] != 64<<20 {
		t.Errorf("--probe-mb 64: device probe sizes %v", s)
	}
}
