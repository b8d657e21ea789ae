// Package svgplot draws small line and bar charts as hand-written SVG
// (no dependency): a figure is a row of panels with a title, axes with
// ticks and labels, a legend and a caption. Only the points given are
// drawn; a series with no points is left out of the panel and its legend.
package svgplot

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Palette is the colour of the i-th series (cycled).
var Palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"}

// Series is one line of a line panel.
type Series struct {
	Name string
	X, Y []float64
}

// Bar is one bar of a bar panel: Group is its label on the x axis,
// Name its legend entry (one colour per name). Hatched bars are drawn
// with a stripe pattern (used for figures quoted from elsewhere).
type Bar struct {
	Group, Name string
	Value       float64
	Hatched     bool
}

// Panel is one chart of a figure: Series for a line chart, else Bars.
type Panel struct {
	Title, XLabel, YLabel string
	Series                []Series
	Bars                  []Bar
}

// Figure is a row of panels above a caption.
type Figure struct {
	Title   string
	Caption []string // one line each
	Panels  []Panel
	PanelW  int // panel size in pixels (0: 420 × 320)
	PanelH  int
}

// Size returns the figure's width and height in pixels.
func (f *Figure) Size() (int, int) {
	pw, ph := f.panelSize()
	return max(len(f.Panels), 1) * pw, 40 + ph + 18*len(f.captionLines()) + 12
}

// captionLines wraps the caption at spaces to the figure's width (about
// 6.3 px a character at 11 px).
func (f *Figure) captionLines() []string {
	pw, _ := f.panelSize()
	width := max((max(len(f.Panels), 1)*pw-20)*10/63, 20)
	var out []string
	for _, c := range f.Caption {
		for len([]rune(c)) > width {
			r := []rune(c)
			cut := strings.LastIndex(string(r[:width]), " ")
			if cut <= 0 {
				cut = len(string(r[:width]))
			}
			out = append(out, c[:cut])
			c = "    " + strings.TrimLeft(c[cut:], " ")
		}
		out = append(out, c)
	}
	return out
}

func (f *Figure) panelSize() (int, int) {
	pw, ph := f.PanelW, f.PanelH
	if pw <= 0 {
		pw = 420
	}
	if ph <= 0 {
		ph = 320
	}
	return pw, ph
}

// Ticks returns about n evenly spaced round values (steps of 1, 2 or 5 ×
// 10^k) covering [lo, hi]: the first is ≤ lo, the last ≥ hi.
func Ticks(lo, hi float64, n int) []float64 {
	if !(hi > lo) || math.IsInf(hi-lo, 0) {
		hi = lo + 1
	}
	n = max(n, 1)
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw*(1-1e-9) {
			step = m * mag
			break
		}
	}
	k0 := math.Floor(lo/step + 1e-9)
	var t []float64
	for k := k0; ; k++ {
		// Twelve digits drop the float noise (3 × 0.2 = 0.6000000000000001).
		v, _ := strconv.ParseFloat(strconv.FormatFloat(k*step, 'g', 12, 64), 64)
		t = append(t, v)
		if v >= hi-1e-9*step || len(t) > 100 {
			break
		}
	}
	return t
}

// Scale maps the data interval [D0, D1] linearly onto pixels [P0, P1].
type Scale struct{ D0, D1, P0, P1 float64 }

// At returns the pixel of v.
func (s Scale) At(v float64) float64 {
	if s.D1 == s.D0 {
		return (s.P0 + s.P1) / 2
	}
	return s.P0 + (v-s.D0)*(s.P1-s.P0)/(s.D1-s.D0)
}

// Label formats a tick value compactly: 8192 → "8192", 12000 → "12k",
// 0.5 → "0.5".
func Label(v float64) string {
	if a := math.Abs(v); a >= 10000 && math.Mod(a, 1000) == 0 {
		return strconv.FormatFloat(v/1000, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

func esc(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '&':
			b.WriteString("&amp;")
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '"':
			b.WriteString("&quot;")
		case '\n', '\r', '\t': // kept as they are inside attributes
			fmt.Fprintf(&b, "&#%d;", r)
		default:
			if !xmlChar(r) {
				continue // not allowed in XML 1.0
			}
			b.WriteRune(r)
		}
	}
	return b.String()
}

// xmlChar reports whether r may appear in XML 1.0 text (invalid UTF-8
// has already become U+FFFD, which may).
func xmlChar(r rune) bool {
	return r == '\t' || r == '\n' || r == '\r' || r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// Write renders the figure as a standalone SVG document.
func (f *Figure) Write(w io.Writer) error {
	W, H := f.Size()
	pw, ph := f.panelSize()
	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">`+"\n", W, H, W, H)
	b.WriteString(`<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="white" stroke-width="2.5"/></pattern></defs>` + "\n")
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(&b, `<text x="%d" y="24" text-anchor="middle" font-size="16" font-weight="bold">%s</text>`+"\n", W/2, esc(f.Title))
	for i, p := range f.Panels {
		fmt.Fprintf(&b, `<g class="panel" transform="translate(%d,40)">`+"\n", i*pw)
		if len(p.Bars) > 0 {
			p.bars(&b, pw, ph)
		} else {
			p.lines(&b, pw, ph)
		}
		b.WriteString("</g>\n")
	}
	for i, c := range f.captionLines() {
		fmt.Fprintf(&b, `<text class="caption" x="10" y="%d" font-size="11" fill="#333">%s</text>`+"\n", 40+ph+18*(i+1), esc(c))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// Plot area inside a panel.
const (
	left, right, top, bottom = 62, 14, 52, 54
)

func (p *Panel) frame(b *strings.Builder, pw, ph int, ys Scale, yt []float64) {
	fmt.Fprintf(b, `<text x="%d" y="14" text-anchor="middle" font-size="13" font-weight="bold">%s</text>`+"\n", pw/2, esc(p.Title))
	for _, v := range yt {
		y := ys.At(v)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`, left, y, pw-right, y)
		fmt.Fprintf(b, `<text class="ytick" x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", left-5, y, Label(v))
	}
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`, left, top, left, ph-bottom)
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, ph-bottom, pw-right, ph-bottom)
	fmt.Fprintf(b, `<text class="xlabel" x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", (left+pw-right)/2, ph-8, esc(p.XLabel))
	fmt.Fprintf(b, `<text class="ylabel" transform="translate(14,%d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", (top+ph-bottom)/2, esc(p.YLabel))
}

// legend lists the names in rows between the panel's title and its plot
// area (never over the data); a hatched name's swatch is hatched.
func (p *Panel) legend(b *strings.Builder, pw int, names []string, hatched map[string]bool) {
	x, y := left, 22
	for i, n := range names {
		w := 26 + 7*len([]rune(n))
		if x+w > pw-right && x > left {
			x, y = left, y+14
		}
		c := Palette[i%len(Palette)]
		fmt.Fprintf(b, `<g class="legend"><rect x="%d" y="%d" width="14" height="10" fill="%s"/>`, x, y, c)
		if hatched[n] {
			fmt.Fprintf(b, `<rect x="%d" y="%d" width="14" height="10" fill="url(#hatch)"/>`, x, y)
		}
		fmt.Fprintf(b, `<text x="%d" y="%d" font-size="11">%s</text></g>`+"\n", x+18, y+9, esc(n))
		x += w
	}
}

// yScale returns ticks from 0 to above the largest value and the scale.
func yScale(maxV float64, ph int) ([]float64, Scale) {
	yt := Ticks(0, max(maxV, 1e-9), 5)
	return yt, Scale{0, yt[len(yt)-1], float64(ph - bottom), top}
}

func (p *Panel) lines(b *strings.Builder, pw, ph int) {
	var ss []Series
	xlo, xhi, ymax := math.Inf(1), math.Inf(-1), 0.0
	for _, s := range p.Series {
		var t Series
		t.Name = s.Name
		for i := range min(len(s.X), len(s.Y)) {
			if finite(s.X[i]) && finite(s.Y[i]) {
				t.X, t.Y = append(t.X, s.X[i]), append(t.Y, s.Y[i])
				xlo, xhi, ymax = min(xlo, s.X[i]), max(xhi, s.X[i]), max(ymax, s.Y[i])
			}
		}
		if len(t.X) > 0 {
			ss = append(ss, t)
		}
	}
	if len(ss) == 0 {
		xlo, xhi = 0, 1
	}
	yt, ys := yScale(ymax, ph)
	xt := Ticks(xlo, xhi, 5)
	xs := Scale{xt[0], xt[len(xt)-1], left, float64(pw - right)}
	p.frame(b, pw, ph, ys, yt)
	for _, v := range xt {
		x := xs.At(v)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/><text class="xtick" x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, ph-bottom, x, ph-bottom+5, x, ph-bottom+18, Label(v))
	}
	var names []string
	for i, s := range ss {
		c := Palette[i%len(Palette)]
		var pts []string
		for k := range s.X {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xs.At(s.X[k]), ys.At(s.Y[k])))
		}
		fmt.Fprintf(b, `<g class="series" data-name="%s">`, esc(s.Name))
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2.5" points="%s"/>`, c, strings.Join(pts, " "))
		for k := range s.X {
			fmt.Fprintf(b, `<circle class="point" cx="%.1f" cy="%.1f" r="3.5" fill="%s" data-x="%g" data-y="%g"/>`, xs.At(s.X[k]), ys.At(s.Y[k]), c, s.X[k], s.Y[k])
		}
		b.WriteString("</g>\n")
		names = append(names, s.Name)
	}
	p.legend(b, pw, names, nil)
}

func (p *Panel) bars(b *strings.Builder, pw, ph int) {
	var groups, names []string
	gi, ni := map[string]int{}, map[string]int{}
	ymax, hatched := 0.0, map[string]bool{}
	var bs []Bar
	for _, r := range p.Bars {
		if !finite(r.Value) {
			continue
		}
		bs = append(bs, r)
		if _, ok := gi[r.Group]; !ok {
			gi[r.Group] = len(groups)
			groups = append(groups, r.Group)
		}
		if _, ok := ni[r.Name]; !ok {
			ni[r.Name] = len(names)
			names = append(names, r.Name)
		}
		ymax = max(ymax, r.Value)
		hatched[r.Name] = hatched[r.Name] || r.Hatched
	}
	yt, ys := yScale(ymax*1.08, ph) // room for the value labels
	p.frame(b, pw, ph, ys, yt)
	gw := float64(pw-left-right) / float64(max(len(groups), 1))
	// Each group holds its own bars side by side, in legend order.
	for g, name := range groups {
		var in []Bar
		for _, r := range bs {
			if r.Group == name {
				in = append(in, r)
			}
		}
		bw := gw * 0.8 / float64(len(in))
		x0 := float64(left) + gw*float64(g) + gw*0.1
		for k, r := range in {
			x, y := x0+bw*float64(k), ys.At(r.Value)
			c := Palette[ni[r.Name]%len(Palette)]
			fmt.Fprintf(b, `<g class="bar" data-group="%s" data-name="%s" data-value="%g" data-quoted="%t">`, esc(r.Group), esc(r.Name), r.Value, r.Hatched)
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, x, y, bw-2, ys.At(0)-y, c)
			if r.Hatched {
				fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="url(#hatch)"/>`, x, y, bw-2, ys.At(0)-y)
			}
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10">%s</text></g>`+"\n", x+(bw-2)/2, y-3, strconv.FormatFloat(r.Value, 'f', 1, 64))
		}
		// A group label may hold several lines (split at "\n").
		cx := float64(left) + gw*(float64(g)+0.5)
		fmt.Fprintf(b, `<text class="xtick" x="%.1f" y="%d" text-anchor="middle" font-size="11">`, cx, ph-bottom+15)
		for k, l := range strings.Split(name, "\n") {
			fmt.Fprintf(b, `<tspan x="%.1f" dy="%d">%s</tspan>`, cx, min(k, 1)*13, esc(l))
		}
		b.WriteString("</text>\n")
	}
	p.legend(b, pw, names, hatched)
}
