package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/synth"
)

func TestShapeName(t *testing.T) {
	for _, n := range []string{"llama1b", "llama8b", "tiny_llama", "qwen3_30b_a3b"} {
		a, err := synth.Arch(n, "")
		if err != nil {
			t.Fatal(err)
		}
		if got := ShapeName(&a); got != n {
			t.Errorf("ShapeName(%s) = %q", n, got)
		}
		a.NumLayers++
		if got := ShapeName(&a); got != "" {
			t.Errorf("%s with one more layer: %q, want no shape", n, got)
		}
	}
}

// TestDepthsBatches runs the depth and batch tests on a tiny model: the
// names, fields and rates (against a clock that advances 1 ms a reading),
// and that the JSON keeps the fields scripts parse.
func TestDepthsBatches(t *testing.T) {
	a, _ := synth.Arch("tiny_llama", "")
	p := filepath.Join(t.TempDir(), "m.cmf")
	if _, err := synth.Write(context.Background(), p, a, quant.Q4TP, synth.Options{Seed: 2}); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Open(p, engine.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	clock := time.Unix(0, 0)
	fake := func() time.Time { clock = clock.Add(time.Millisecond); return clock }
	res, err := Run(context.Background(), p, e, Config{Gen: 4, Reps: 2, Threads: 2, Now: fake, Depths: []int{0, 40}, Batches: []int{1, 3}, BatchLogits: true}, 1e10)
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		test, series, returns string
		depth, batch          int
		rate                  float64
	}
	wants := []want{{"tg4", "", "", 0, 0, 4000}, {"tg4@d0", "depth", "", 0, 0, 4000}, {"tg4@d40", "depth", "", 40, 0, 4000},
		{"tg4x1", "batch", "ids", 0, 1, 4000}, {"tg4x3", "batch", "ids", 0, 3, 12000},
		{"tg4x1+logits", "batch-logits", "logits", 0, 1, 4000}, {"tg4x3+logits", "batch-logits", "logits", 0, 3, 12000}}
	if len(res) != len(wants) {
		t.Fatalf("%d results, want %d: %+v", len(res), len(wants), res)
	}
	for i, w := range wants {
		r := res[i]
		if r.Test != w.test || r.Series != w.series || r.Returns != w.returns || r.Depth != w.depth || r.Batch != w.batch || r.Shape != "tiny_llama" {
			t.Errorf("result %d: %s %q %q d%d x%d shape %q, want %+v", i, r.Test, r.Series, r.Returns, r.Depth, r.Batch, r.Shape, w)
		}
		if !slices.Equal(r.Samples, []float64{w.rate, w.rate}) || r.TokPerSec != w.rate {
			t.Errorf("%s: samples %v, %v tok/s, want %v", r.Test, r.Samples, r.TokPerSec, w.rate)
		}
		// A step of a batch reads the weights once for all its tokens.
		steps := w.rate / float64(max(w.batch, 1))
		if gb := float64(r.BytesPerTok) * steps / 1e9; math.Abs(r.GBPerSec-gb) > 1e-12*gb || math.Abs(r.BandwidthPct-100*gb*1e9/1e10) > 1e-9 {
			t.Errorf("%s: %v GB/s (%v%%), want %v GB/s", r.Test, r.GBPerSec, r.BandwidthPct, gb)
		}
	}
	// The table says what the batch rows bring back to the host.
	var md strings.Builder
	(&Report{Results: res}).Markdown(&md)
	for _, l := range []string{"| tg4x3 |", "| tg4x3+logits |", "as a greedy server step runs it (engine.StepNext)", "every sequence's logits copied to the host (engine.Step)"} {
		if !strings.Contains(md.String(), l) {
			t.Errorf("the table lacks %q:\n%s", l, md.String())
		}
	}
	// The figure draws both batch series.
	f, err := (&Report{Results: res}).Figure(nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, pn := range f.Panels {
		for _, se := range pn.Series {
			names = append(names, se.Name)
		}
	}
	if !slices.Contains(names, "m.cmf (q4tp)") || !slices.Contains(names, "m.cmf (q4tp), logits to the host") {
		t.Errorf("figure series %q", names)
	}
	// Real clock: every rate is positive and finite.
	res, err = Run(context.Background(), p, e, Config{Gen: 3, Reps: 1, Threads: 2, Depths: []int{16}, Batches: []int{2}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if !(r.TokPerSec > 0) || math.IsInf(r.TokPerSec, 0) {
			t.Errorf("%s: %v tok/s", r.Test, r.TokPerSec)
		}
	}
	// The JSON keeps the old fields and adds the new ones.
	js, _ := json.Marshal(Report{Results: res})
	var back struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"test", "tok_per_sec", "series", "shape"} {
		if _, ok := back.Results[1][k]; !ok {
			t.Errorf("JSON result lacks %q: %s", k, js)
		}
	}
	if back.Results[1]["depth"] != 16.0 || back.Results[2]["batch"] != 2.0 {
		t.Errorf("JSON depth/batch: %v %v", back.Results[1], back.Results[2])
	}
	if _, err := Run(context.Background(), p, e, Config{Gen: 2, Reps: 1, Batches: []int{0}}, 0); err == nil {
		t.Error("batch 0 accepted")
	}
}

type svgBar struct{ group, name, value, quoted string }

// readSVG returns the series names, their data points and the bars.
func readSVG(t *testing.T, data []byte) (map[string][]string, []svgBar, []string) {
	t.Helper()
	pts, text := map[string][]string{}, []string(nil)
	var bars []svgBar
	d := xml.NewDecoder(bytes.NewReader(data))
	cur := ""
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed: %v\n%s", err, data)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			a := map[string]string{}
			for _, x := range e.Attr {
				a[x.Name.Local] = x.Value
			}
			switch {
			case e.Name.Local == "g" && a["class"] == "series":
				cur = a["data-name"]
			case e.Name.Local == "g" && a["class"] == "bar":
				bars = append(bars, svgBar{a["data-group"], a["data-name"], a["data-value"], a["data-quoted"]})
			case e.Name.Local == "circle" && cur != "":
				pts[cur] = append(pts[cur], a["data-x"]+":"+a["data-y"])
			}
		case xml.EndElement:
			if e.Name.Local == "g" {
				cur = ""
			}
		case xml.CharData:
			if s := strings.TrimSpace(string(e)); s != "" {
				text = append(text, s)
			}
		}
	}
	return pts, bars, text
}

func TestFigure(t *testing.T) {
	r := func(model, quant, shape, test, series string, d, b, threads int, v float64) Result {
		return Result{Model: model, Quant: quant, Shape: shape, Test: test, Series: series, Depth: d, Batch: b, Threads: threads, TokPerSec: v}
	}
	rep := &Report{Threads: 2, Device: "cpu (2 threads, avx512)", Machine: "test box", Date: "2026-12-01T20:00:00Z", Command: "cortiq bench a b", Note: "the machine was loaded", ReadBandwidth: 45e9,
		Results: []Result{
			r("/m/q4.cmf", "q4tp", "llama1b", "pp128", "", 0, 0, 2, 330),
			r("/m/q4.cmf", "q4tp", "llama1b", "tg32", "", 0, 0, 2, 50),
			r("/m/q4.cmf", "q4tp", "llama1b", "tg32@d2048", "depth", 2048, 0, 2, 40),
			r("/m/q4.cmf", "q4tp", "llama1b", "tg32@d0", "depth", 0, 0, 2, 50),
			r("/m/q4.cmf", "q4tp", "llama1b", "tg32x4", "batch", 0, 4, 2, 120),
			r("/m/q4.cmf", "q4tp", "llama1b", "tg32x8", "batch", 0, 8, 2, 0), // not measured: not drawn
			r("/m/q8.cmf", "q8_row", "llama1b", "tg32@d0", "depth", 0, 0, 2, 31),
			r("/m/q8.cmf", "q8_row", "llama1b", "tg32", "", 0, 0, 1, 20), // 1 thread: no peer figure
			r("/m/x.cmf", "q8_row", "", "tg32", "", 0, 0, 2, 99),         // unknown shape: no peer
		}}
	var b bytes.Buffer
	if err := rep.WriteSVG(&b, Peers); err != nil {
		t.Fatal(err)
	}
	pts, bars, text := readSVG(t, b.Bytes())
	// Depths sorted, then the batch points; only depth and batch rows
	// make lines, and the unmeasured batch 8 is not drawn.
	wantPts := map[string][]string{
		"q4.cmf (q4tp)":   {"0:50", "2048:40", "4:120"},
		"q8.cmf (q8_row)": {"0:31"},
	}
	for n, w := range wantPts {
		if !slices.Equal(pts[n], w) {
			t.Errorf("series %q: %v, want %v", n, pts[n], w)
		}
	}
	if len(pts) != len(wantPts) {
		t.Errorf("series %v", pts)
	}
	wantBars := []svgBar{
		{"pp128\nQ4_0 | q4tp", "cortiq, measured here", "330", "false"}, {"pp128\nQ4_0 | q4tp", "llama.cpp, quoted", "259", "true"},
		{"tg64 | tg32\nQ4_0 | q4tp", "cortiq, measured here", "50", "false"}, {"tg64 | tg32\nQ4_0 | q4tp", "llama.cpp, quoted", "48.8", "true"},
	}
	if !slices.Equal(bars, wantBars) {
		t.Errorf("bars\n%v\nwant\n%v", bars, wantBars)
	}
	for _, s := range []string{"measured here: test box, device cpu (2 threads, avx512), 2 threads, 2026-12-01T20:00:00Z", "command: cortiq bench a b", "note: the machine was loaded",
		"quoted, not rerun here: " + srcCPU} {
		if !slices.Contains(text, s) {
			t.Errorf("caption %q missing: %q", s, text)
		}
	}
	// The same results on an H200 stand beside the H200 figures, on
	// another GPU beside none.
	rep.Device = "cuda 0: NVIDIA H200 (141 GB)"
	b.Reset()
	if err := rep.WriteSVG(&b, Peers); err != nil {
		t.Fatal(err)
	}
	if _, bars, _ := readSVG(t, b.Bytes()); len(bars) != 4 || bars[1].value != "958" || bars[3].value != "816" {
		t.Errorf("H200 results: %v", bars)
	}
	rep.Device = "cuda 0: NVIDIA GeForce RTX 4090"
	b.Reset()
	if err := rep.WriteSVG(&b, Peers); err != nil {
		t.Fatal(err)
	}
	if _, bars, _ := readSVG(t, b.Bytes()); len(bars) != 0 {
		t.Errorf("RTX 4090 results beside H200 peers: %v", bars)
	}
	if err := (&Report{Results: []Result{r("x", "q4tp", "", "tg8", "", 0, 0, 2, 5)}}).WriteSVG(&b, Peers); !errors.Is(err, ErrNothingToPlot) {
		t.Errorf("nothing to plot: %v", err)
	}
}

// TestPeersTable pins the quoted figures to targets.md's numbers.
func TestPeersTable(t *testing.T) {
	got := map[string]float64{}
	for _, p := range Peers {
		got[p.Device+" "+p.Shape+" "+p.Quant+" "+p.Test] = p.TokPerSec
		if p.Source == "" || p.Engine == "" || (p.Like != "q4tp" && p.Like != "q8_row") {
			t.Errorf("peer %+v", p)
		}
	}
	for k, v := range map[string]float64{"cpu llama1b Q4_0 tg64": 48.8, "cpu llama1b Q8_0 tg64": 32.5, "cpu llama1b Q4_0 pp128": 259,
		"cpu llama1b Q8_0 pp128": 139, "cuda llama8b Q4_0 tg128": 330, "cuda llama8b Q4_0 tg128x64": 5122, "cuda llama8b Q4_0 tg128@d32768": 216} {
		if got[k] != v {
			t.Errorf("%s: %v, want %v", k, got[k], v)
		}
	}
}
