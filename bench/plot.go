package bench

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"

	"github.com/cortiq/cortiq/svgplot"
)

// ErrNothingToPlot is returned by Figure when the report holds no depth
// or batch test and no result comparable with a peer figure.
var ErrNothingToPlot = errors.New("bench: nothing to plot (measure with --depths or --batches, or a shape and format that targets.md quotes)")

func label(r *Result) string {
	return fmt.Sprintf("%s (%s)", filepath.Base(r.Model), r.Quant)
}

// Figure draws the report: decode tok/s against context depth, aggregate
// decode tok/s against batch size (one line per model), and cortiq's
// results beside the peers' figures for the same shape and machine kind
// (quoted figures hatched). A panel with nothing measured is left out;
// only measured values and quoted peer figures are drawn.
func (r *Report) Figure(peers []Peer) (*svgplot.Figure, error) {
	depth := svgplot.Panel{Title: "decode tok/s vs context depth", XLabel: "context depth (tokens already in the cache)", YLabel: "decode tok/s (one sequence)"}
	batch := svgplot.Panel{Title: "aggregate decode tok/s vs batch size", XLabel: "sequences decoded together (batch)", YLabel: "aggregate decode tok/s"}
	vs := svgplot.Panel{Title: "cortiq (measured here) vs llama.cpp (quoted)", XLabel: "test and format: llama.cpp | cortiq", YLabel: "tok/s"}
	series := func(p *svgplot.Panel, name string) *svgplot.Series {
		for i := range p.Series {
			if p.Series[i].Name == name {
				return &p.Series[i]
			}
		}
		p.Series = append(p.Series, svgplot.Series{Name: name})
		return &p.Series[len(p.Series)-1]
	}
	var sources []string
	for i := range r.Results {
		x := &r.Results[i]
		if x.TokPerSec <= 0 {
			continue // not measured (or failed): never drawn
		}
		switch x.Series {
		case "depth":
			s := series(&depth, label(x))
			s.X, s.Y = append(s.X, float64(x.Depth)), append(s.Y, x.TokPerSec)
		case "batch":
			s := series(&batch, label(x))
			s.X, s.Y = append(s.X, float64(x.Batch)), append(s.Y, x.TokPerSec)
		case "batch-logits":
			s := series(&batch, label(x)+", logits to the host")
			s.X, s.Y = append(s.X, float64(x.Batch)), append(s.Y, x.TokPerSec)
		}
		for _, p := range peers {
			if !p.Matches(x, r.Device, x.Threads) {
				continue
			}
			g := fmt.Sprintf("%s\n%s | %s", p.Test, p.Quant, x.Quant)
			if x.Test != p.Test {
				g = fmt.Sprintf("%s | %s\n%s | %s", p.Test, x.Test, p.Quant, x.Quant)
			}
			vs.Bars = append(vs.Bars,
				svgplot.Bar{Group: g, Name: "cortiq, measured here", Value: x.TokPerSec},
				svgplot.Bar{Group: g, Name: p.Engine + ", quoted", Value: p.TokPerSec, Hatched: true})
			if !slices.Contains(sources, p.Source) {
				sources = append(sources, p.Source)
			}
		}
	}
	for _, p := range []*svgplot.Panel{&depth, &batch} {
		for i := range p.Series {
			s := &p.Series[i]
			idx := make([]int, len(s.X))
			for k := range idx {
				idx[k] = k
			}
			slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(s.X[a], s.X[b]) })
			x, y := make([]float64, len(idx)), make([]float64, len(idx))
			for k, j := range idx {
				x[k], y[k] = s.X[j], s.Y[j]
			}
			s.X, s.Y = x, y
		}
	}
	f := &svgplot.Figure{Title: "cortiq decode speed"}
	for _, p := range []svgplot.Panel{depth, batch} {
		if len(p.Series) > 0 {
			f.Panels = append(f.Panels, p)
		}
	}
	if len(vs.Bars) > 0 {
		f.Panels = append(f.Panels, vs)
	}
	if len(f.Panels) == 0 {
		return nil, ErrNothingToPlot
	}
	threads := r.Threads
	f.Caption = append(f.Caption, fmt.Sprintf("measured here: %s, device %s, %d threads, %s", orUnknown(r.Machine), orUnknown(r.Device), threads, orUnknown(r.Date)))
	if r.Command != "" {
		f.Caption = append(f.Caption, "command: "+r.Command)
	}
	if r.Note != "" {
		f.Caption = append(f.Caption, "note: "+r.Note)
	}
	if r.ReadBandwidth > 0 && r.ReadBandwidthSource != "" {
		f.Caption = append(f.Caption, fmt.Sprintf("read bandwidth probed on %s at the start of the run: %.0f GB/s; tok/s are means over the repetitions", r.ReadBandwidthSource, r.ReadBandwidth/1e9))
	} else if r.ReadBandwidth > 0 {
		f.Caption = append(f.Caption, fmt.Sprintf("read bandwidth probed at the start of the run: %.1f GB/s; tok/s are means over the repetitions", r.ReadBandwidth/1e9))
	}
	for _, s := range sources {
		f.Caption = append(f.Caption, "quoted, not rerun here: "+s)
	}
	return f, nil
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// WriteSVG draws the report's Figure to w.
func (r *Report) WriteSVG(w io.Writer, peers []Peer) error {
	f, err := r.Figure(peers)
	if err != nil {
		return err
	}
	return f.Write(w)
}
