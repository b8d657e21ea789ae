package svgplot

import (
	"bytes"
	"encoding/xml"
	"image"
	"image/png"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestTicks(t *testing.T) {
	for _, c := range []struct {
		lo, hi float64
		n      int
		want   []float64
	}{
		{0, 47.3, 5, []float64{0, 10, 20, 30, 40, 50}},
		{0, 8192, 5, []float64{0, 2000, 4000, 6000, 8000, 10000}},
		{1, 8, 5, []float64{0, 2, 4, 6, 8}},
		{0, 0.7, 5, []float64{0, 0.2, 0.4, 0.6, 0.8}},
		{0, 100, 5, []float64{0, 20, 40, 60, 80, 100}},
		{512, 8192, 4, []float64{0, 2000, 4000, 6000, 8000, 10000}},
		{3, 3, 5, []float64{3, 3.2, 3.4, 3.6, 3.8, 4}}, // empty range: one unit
	} {
		if got := Ticks(c.lo, c.hi, c.n); !slices.Equal(got, c.want) {
			t.Errorf("Ticks(%v, %v, %d) = %v, want %v", c.lo, c.hi, c.n, got, c.want)
		}
	}
}

func TestScaleAndLabel(t *testing.T) {
	s := Scale{D0: 0, D1: 50, P0: 272, P1: 28} // y: up is smaller
	for v, want := range map[float64]float64{0: 272, 50: 28, 25: 150, 10: 223.2} {
		if got := s.At(v); math.Abs(got-want) > 1e-9 {
			t.Errorf("At(%v) = %v, want %v", v, got, want)
		}
	}
	if got := (Scale{D0: 5, D1: 5, P0: 0, P1: 10}).At(5); got != 5 {
		t.Errorf("degenerate scale: %v, want the middle", got)
	}
	for v, want := range map[float64]string{8192: "8192", 12000: "12k", 0.5: "0.5", 0: "0", 40000: "40k", 2000: "2000"} {
		if got := Label(v); got != want {
			t.Errorf("Label(%v) = %q, want %q", v, got, want)
		}
	}
}

// parsed is what a test reads back from an SVG.
type parsed struct {
	width, height int
	series        map[string][][2]float64 // name → data points (data-x, data-y)
	pixels        map[string][][2]float64 // name → point centres
	bars          []map[string]string     // attributes of each bar group
	legend        []string
	text          []string
}

func parse(t *testing.T, data []byte) parsed {
	t.Helper()
	p := parsed{series: map[string][][2]float64{}, pixels: map[string][][2]float64{}}
	d := xml.NewDecoder(bytes.NewReader(data))
	var cur string
	var inLegend bool
	attr := func(e xml.StartElement) map[string]string {
		m := map[string]string{}
		for _, a := range e.Attr {
			m[a.Name.Local] = a.Value
		}
		return m
	}
	num := func(s string) float64 {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("attribute %q: %v", s, err)
		}
		return v
	}
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, data)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			a := attr(e)
			switch {
			case e.Name.Local == "svg":
				p.width, p.height = int(num(a["width"])), int(num(a["height"]))
			case e.Name.Local == "g" && a["class"] == "series":
				cur = a["data-name"]
			case e.Name.Local == "g" && a["class"] == "legend":
				inLegend = true
			case e.Name.Local == "g" && a["class"] == "bar":
				p.bars = append(p.bars, a)
			case e.Name.Local == "circle" && cur != "":
				p.series[cur] = append(p.series[cur], [2]float64{num(a["data-x"]), num(a["data-y"])})
				p.pixels[cur] = append(p.pixels[cur], [2]float64{num(a["cx"]), num(a["cy"])})
			}
		case xml.EndElement:
			if e.Name.Local == "g" {
				cur, inLegend = "", false
			}
		case xml.CharData:
			s := strings.TrimSpace(string(e))
			if s == "" {
				continue
			}
			if inLegend {
				p.legend = append(p.legend, s)
			}
			p.text = append(p.text, s)
		}
	}
	return p
}

func sample() *Figure {
	return &Figure{
		Title:   "speed <test> & co",
		Caption: []string{"measured here: a machine", "command: cortiq bench x.cmf --depths 0,512"},
		Panels: []Panel{
			{Title: "vs depth", XLabel: "depth", YLabel: "tok/s", Series: []Series{
				{Name: "a (q4tp)", X: []float64{0, 512, 2048}, Y: []float64{40, 35, 25}},
				{Name: "b <q8_row>", X: []float64{0, 512, 2048, 4096}, Y: []float64{30, math.NaN(), 22, 18}},
				{Name: "empty"},
			}},
			{Title: "vs batch", XLabel: "batch", YLabel: "tok/s", Series: []Series{
				{Name: "a (q4tp)", X: []float64{1, 2, 4, 8}, Y: []float64{40, 70, 110, 150}},
			}},
			{Title: "vs peers", YLabel: "tok/s", Bars: []Bar{
				{Group: "tg Q4_0/q4tp", Name: "cortiq", Value: 51.3},
				{Group: "tg Q4_0/q4tp", Name: "llama.cpp", Value: 48.8, Hatched: true},
				{Group: "pp128", Name: "cortiq", Value: math.Inf(1)}, // not a value: left out
			}},
		},
	}
}

func TestWriteSeries(t *testing.T) {
	f := sample()
	var b bytes.Buffer
	if err := f.Write(&b); err != nil {
		t.Fatal(err)
	}
	p := parse(t, b.Bytes())
	if w, h := f.Size(); p.width != w || p.height != h || w != 3*420 {
		t.Errorf("svg %d×%d, Size %d×%d", p.width, p.height, w, h)
	}
	// Every finite point is drawn, nothing else; the series without
	// points is in no legend.
	want := map[string][][2]float64{
		"a (q4tp)":   {{0, 40}, {512, 35}, {2048, 25}, {1, 40}, {2, 70}, {4, 110}, {8, 150}},
		"b <q8_row>": {{0, 30}, {2048, 22}, {4096, 18}},
	}
	if len(p.series) != len(want) {
		t.Errorf("series %v, want %v", p.series, want)
	}
	for n, pts := range want {
		if !slices.Equal(p.series[n], pts) {
			t.Errorf("series %q: points %v, want %v", n, p.series[n], pts)
		}
	}
	if !slices.Equal(p.legend, []string{"a (q4tp)", "b <q8_row>", "a (q4tp)", "cortiq", "llama.cpp"}) {
		t.Errorf("legend %q", p.legend)
	}
	// The pixel positions follow the scales: depth panel x ticks 0..5000
	// over [62, 406], y ticks 0..40 over [266, 52].
	xs, ys := Scale{0, 5000, 62, 406}, Scale{0, 40, 266, 52}
	for k, pt := range p.pixels["b <q8_row>"] {
		d := want["b <q8_row>"][k]
		if math.Abs(pt[0]-xs.At(d[0])) > 0.051 || math.Abs(pt[1]-ys.At(d[1])) > 0.051 {
			t.Errorf("point %v at pixel %v, want (%.1f, %.1f)", d, pt, xs.At(d[0]), ys.At(d[1]))
		}
	}
	if len(p.bars) != 2 || p.bars[0]["data-value"] != "51.3" || p.bars[0]["data-quoted"] != "false" ||
		p.bars[1]["data-value"] != "48.8" || p.bars[1]["data-quoted"] != "true" {
		t.Errorf("bars %v", p.bars)
	}
	for _, s := range []string{"speed <test> & co", "vs depth", "vs batch", "vs peers", "depth", "batch", "tok/s", "8", "5000",
		"measured here: a machine", "command: cortiq bench x.cmf --depths 0,512", "tg Q4_0/q4tp"} {
		if !slices.Contains(p.text, s) {
			t.Errorf("text %q missing from %q", s, p.text)
		}
	}
	if slices.Contains(p.text, "pp128") {
		t.Error("a group with no finite bar was drawn")
	}
}

// TestRender rasterises the SVG with rsvg-convert or headless chromium,
// whichever is installed, and checks the picture: its size, that it is
// not blank, and that the series' colours are there.
func TestRender(t *testing.T) {
	f := sample()
	dir := t.TempDir()
	src, out := filepath.Join(dir, "f.svg"), filepath.Join(dir, "f.png")
	var b bytes.Buffer
	if err := f.Write(&b); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	W, H := f.Size()
	var cmd *exec.Cmd
	if p, err := exec.LookPath("rsvg-convert"); err == nil {
		cmd = exec.Command(p, "-o", out, src)
	} else if p, err := lookChromium(); err == nil {
		cmd = exec.Command(p, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
			"--hide-scrollbars", "--force-device-scale-factor=1", "--window-size="+strconv.Itoa(W)+","+strconv.Itoa(H),
			"--screenshot="+out, "file://"+src)
	} else {
		t.Skip("neither rsvg-convert (Debian librsvg2-bin) nor chromium is installed: the SVG is not rasterised")
	}
	done := make(chan error, 1)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v\n%s", cmd.Path, err, stderr.Bytes())
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("%s did not finish in 60 s", cmd.Path)
	}
	fh, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	img, err := png.Decode(fh)
	if err != nil {
		t.Fatalf("%s wrote no PNG: %v", cmd.Path, err)
	}
	if r := img.Bounds(); r.Dx() != W || r.Dy() != H {
		t.Errorf("PNG %d×%d, want %d×%d", r.Dx(), r.Dy(), W, H)
	}
	inked, colours := countPixels(img)
	if frac := float64(inked) / float64(W*H); frac < 0.01 || frac > 0.6 {
		t.Errorf("%.1f%% of the pixels are not white: blank or flooded", 100*frac)
	}
	for i := range 2 { // both line colours are drawn
		if colours[i] < 50 {
			t.Errorf("series colour %s: %d pixels", Palette[i], colours[i])
		}
	}
}

func lookChromium() (string, error) {
	var err error
	for _, n := range []string{"chromium", "chromium-browser", "google-chrome"} {
		var p string
		if p, err = exec.LookPath(n); err == nil {
			return p, nil
		}
	}
	return "", err
}

// countPixels returns the pixels that are not near white, and per
// palette entry the pixels within a small distance of its colour.
func countPixels(img image.Image) (int, []int) {
	pal := make([][3]int, len(Palette))
	for i, c := range Palette {
		v, _ := strconv.ParseUint(c[1:], 16, 32)
		pal[i] = [3]int{int(v >> 16), int(v >> 8 & 255), int(v & 255)}
	}
	inked, n := 0, make([]int, len(Palette))
	r := img.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			R, G, B, _ := img.At(x, y).RGBA()
			c := [3]int{int(R >> 8), int(G >> 8), int(B >> 8)}
			if c[0] < 240 || c[1] < 240 || c[2] < 240 {
				inked++
			}
			for i, p := range pal {
				if abs(c[0]-p[0])+abs(c[1]-p[1])+abs(c[2]-p[2]) < 24 {
					n[i]++
				}
			}
		}
	}
	return inked, n
}

func abs(x int) int { return max(x, -x) }

// FuzzWrite: whatever the names (model paths, user text) and values, the
// figure is well-formed XML and draws only finite points.
func FuzzWrite(f *testing.F) {
	f.Add("a (q4tp)", "tg64", 1.0, 40.0, 2.0, 35.0)
	f.Add("<&\"\x00\xff\uFFFE", "]]>", math.NaN(), math.Inf(1), -1e308, 1e308)
	f.Fuzz(func(t *testing.T, name, group string, x0, y0, x1, y1 float64) {
		fig := &Figure{Title: name, Caption: []string{group + name}, Panels: []Panel{
			{Title: name, XLabel: group, YLabel: name, Series: []Series{{Name: name, X: []float64{x0, x1}, Y: []float64{y0, y1}}}},
			{Title: group, Bars: []Bar{{Group: group, Name: name, Value: y0}, {Group: name, Name: group, Value: y1, Hatched: true}}},
		}}
		var b bytes.Buffer
		if err := fig.Write(&b); err != nil {
			t.Fatal(err)
		}
		d := xml.NewDecoder(&b)
		circles := 0
		for {
			tok, err := d.Token()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("not well-formed: %v", err)
			}
			if e, ok := tok.(xml.StartElement); ok && e.Name.Local == "circle" {
				circles++
			}
		}
		want := 0
		for _, p := range [][2]float64{{x0, y0}, {x1, y1}} {
			if finite(p[0]) && finite(p[1]) {
				want++
			}
		}
		if circles != want {
			t.Errorf("%d points drawn, want %d", circles, want)
		}
	})
}

func TestCaptionWrap(t *testing.T) {
	long := strings.Repeat("word ", 100)
	f := &Figure{Caption: []string{"short", long}, Panels: []Panel{{}}}
	lines := f.captionLines()
	if len(lines) < 4 || lines[0] != "short" {
		t.Fatalf("lines %q", lines)
	}
	n := 0
	for _, l := range lines[1:] {
		if len([]rune(l)) > (420-20)*10/63 {
			t.Errorf("line of %d characters: %q", len(l), l)
		}
		n += strings.Count(l, "word")
	}
	if n != 100 {
		t.Errorf("%d words after wrapping, want 100", n)
	}
	if _, h := f.Size(); h != 40+320+18*len(lines)+12 {
		t.Errorf("height %d does not count the wrapped lines", h)
	}
}
