// Package lab is the kernel lab: it times variants of the decode matvecs
// over exactly the weight walk of one decode token of a real model file
// (per layer q, k, v, o, gate, up, down; then the head), serialised the way
// a token runs them. Variants alternate round-robin inside one process, so
// drift of a shared machine hits every arm alike; each variant's output on
// the first layer's tensors and the head is checked against the production
// kernel. It is the seed's mv_lab as a product feature (`cortiq lab`).
package lab

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/kernels"
)

// Tensor is one weight dispatch of the walk.
type Tensor struct {
	Name  string
	M     *kernels.Mat
	Bytes int64
}

// Group is a run of dispatches that share their input (q|k|v, gate|up).
type Group []Tensor

// Walk returns one decode token's weight dispatches of a dense model
// (llama, qwen2, qwen3) in the order the token runs them.
func Walk(f *cmf.Model) ([]Group, error) {
	a := f.Header.Arch
	mat := func(name string) (Tensor, error) {
		t, data, err := f.TensorData(name)
		if err != nil {
			return Tensor{}, fmt.Errorf("lab: %w", err)
		}
		if len(t.Shape) != 2 {
			return Tensor{}, fmt.Errorf("lab: tensor %q has shape %v, want a matrix", name, t.Shape)
		}
		m, err := kernels.NewMat(t.DType, t.Shape[0], t.Shape[1], data)
		if err != nil {
			return Tensor{}, fmt.Errorf("lab: tensor %q: %w", name, err)
		}
		if err := m.Prepare(); err != nil {
			return Tensor{}, fmt.Errorf("lab: tensor %q: %w", name, err)
		}
		return Tensor{Name: name, M: m, Bytes: int64(len(data))}, nil
	}
	var groups []Group
	add := func(names ...string) error {
		var g Group
		for _, n := range names {
			t, err := mat(n)
			if err != nil {
				return err
			}
			g = append(g, t)
		}
		groups = append(groups, g)
		return nil
	}
	if a.MoE != nil || len(a.LayerTypes) > 0 && slices.ContainsFunc(a.LayerTypes, func(s string) bool { return s != "full_attention" }) {
		return nil, fmt.Errorf("lab: %s: the walk covers dense models (llama, qwen2, qwen3) so far", a.ArchName)
	}
	for l := range a.NumLayers {
		p := fmt.Sprintf("model.layers.%d.", l)
		for _, g := range [][]string{
			{p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"},
			{p + "self_attn.o_proj.weight"},
			{p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"},
			{p + "mlp.down_proj.weight"},
		} {
			if err := add(g...); err != nil {
				return nil, err
			}
		}
	}
	head := "lm_head.weight"
	if a.TieWordEmbeddings {
		head = "model.embed_tokens.weight"
	}
	if err := add(head); err != nil {
		return nil, err
	}
	return groups, nil
}

// Variant is one way of running the walk.
type Variant struct {
	Name string
	Doc  string
	// Tol is the largest |Δ|/rms from the production kernel this variant
	// may show (0: it must be bitwise equal); negative: no output to check
	// (the loads-only ceiling).
	Tol float64
	// run computes ys[i] = g[i]·x for every tensor of g.
	run func(g Group, x []float32, ys [][]float32)
	// enter and leave bracket the variant's rounds (a kernel set switch).
	enter, leave func() error
}

// CPUVariants returns the CPU variants for a pool; the first is the
// production path (arm 0). single is a one-worker pool for the
// single-thread arm (nil: none).
func CPUVariants(pool, single *kernels.Pool) []Variant {
	// Production decode runs the tensors that share an input (q|k|v,
	// gate|up) as one pool operation (Pool.MatVecs, backend/cpu).
	prod := func(p *kernels.Pool) func(Group, []float32, [][]float32) {
		return func(g Group, x []float32, ys [][]float32) {
			jobs := make([]kernels.MatVecJob, len(g))
			for i, t := range g {
				jobs[i] = kernels.MatVecJob{M: t.M, X: x, Y: ys[i]}
			}
			p.MatVecs(jobs)
		}
	}
	vs := []Variant{
		{Name: "prod", Doc: "production: tensors sharing an input in one pool dispatch (Pool.MatVecs), kernel set " + kernels.ISA(), run: prod(pool)},
		{Name: "split", Doc: "one pool dispatch per tensor (production before the grouped dispatch)", run: func(g Group, x []float32, ys [][]float32) {
			for i, t := range g {
				pool.MatVec(t.M, x, ys[i])
			}
		}},
	}
	for _, isa := range slices.Backward(kernels.ISAs()) {
		if isa == kernels.ISA() {
			continue
		}
		var prev string
		tol := 1e-5 // the same int8 activations with another instruction set
		if isa == "generic" {
			tol = 5e-2 // float32 activations: differs by the int8 activation quantization (per row at most Σ_blocks absmax/254·Σ|w|)
		}
		vs = append(vs, Variant{
			Name: isa, Doc: "kernel set " + isa + " in the same dispatch", Tol: tol, run: prod(pool),
			enter: func() (err error) { prev, err = kernels.SetISA(isa); return err },
			leave: func() error { _, err := kernels.SetISA(prev); return err },
		})
	}
	if single != nil {
		vs = append(vs, Variant{Name: "1thread", Doc: "production kernels on one worker", run: prod(single)})
	}
	vs = append(vs, Variant{Name: "loads", Doc: "loads-only ceiling: every weight byte read in the same shares, no arithmetic", Tol: -1,
		run: func(g Group, _ []float32, _ [][]float32) {
			for _, t := range g {
				pool.Stream(t.M)
			}
		}})
	return vs
}

// Select keeps the variants named in a comma-separated list (empty: all),
// production first.
func Select(vs []Variant, list string) ([]Variant, error) {
	if strings.TrimSpace(list) == "" {
		return vs, nil
	}
	out := []Variant{vs[0]}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		i := slices.IndexFunc(vs, func(v Variant) bool { return v.Name == n })
		if i < 0 {
			var have []string
			for _, v := range vs {
				have = append(have, v.Name)
			}
			return nil, fmt.Errorf("lab: no variant %q (have %s)", n, strings.Join(have, ", "))
		}
		if i > 0 && !slices.ContainsFunc(out, func(v Variant) bool { return v.Name == n }) {
			out = append(out, vs[i])
		}
	}
	return out, nil
}

// Result is one variant's measurements.
type Result struct {
	Variant  string    `json:"variant"`
	Doc      string    `json:"doc"`
	MedianMS float64   `json:"median_ms"`
	MinMS    float64   `json:"min_ms"`
	GBps     float64   `json:"gb_per_sec"`      // walk bytes / median time
	Ratio    float64   `json:"ratio_to_arm0"`   // median of per-round time ratios to arm 0
	RatioQ1  float64   `json:"ratio_q1"`        // their first quartile
	RatioQ3  float64   `json:"ratio_q3"`        // their third quartile
	Check    string    `json:"check"`           // "bitwise", "|Δ|/rms …", "n/a"
	Worst    float64   `json:"worst_rel_error"` // worst |Δ|/rms against arm 0
	Tol      float64   `json:"tolerance"`
	Failed   bool      `json:"failed"`
	Times    []float64 `json:"times_ms"`
	// GPU lab only: the launch mode ("serial", "graph", "graph+pdl") and
	// GBps as a fraction of the device's read probe.
	Mode    string  `json:"mode,omitempty"`
	OfProbe float64 `json:"fraction_of_read_probe,omitempty"`
}

// Report is a lab run.
type Report struct {
	Date      string   `json:"date"`
	Model     string   `json:"model"`
	Device    string   `json:"device"`
	Tensors   int      `json:"tensors"`
	Groups    int      `json:"groups"`
	WalkBytes int64    `json:"walk_bytes"`
	Rounds    int      `json:"rounds"`
	Results   []Result `json:"results"`
	// GPU lab only: the streaming read bandwidth of the device measured
	// over a buffer the walk's size (kern's probe_read, best of several),
	// and notes on arms that could not run.
	ReadProbeGBps float64  `json:"read_probe_gb_per_sec,omitempty"`
	Notes         []string `json:"notes,omitempty"`
}

func nowUTC() string { return time.Now().UTC().Format(time.RFC3339) }

// input is the walk's activation vector (the seed's pattern).
func input(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32((i*37+11)%101)/101 - 0.5
	}
	return x
}

// Run times every variant over the walk for rounds rounds, round-robin,
// after checking each against arm 0 on the first layer's groups and the
// head.
func Run(ctx context.Context, groups []Group, vs []Variant, rounds int) (*Report, error) {
	if len(groups) == 0 || len(vs) == 0 || rounds < 1 {
		return nil, fmt.Errorf("lab: nothing to run (%d groups, %d variants, %d rounds)", len(groups), len(vs), rounds)
	}
	rep := &Report{Rounds: rounds, Groups: len(groups), Date: nowUTC()}
	maxCols, maxRows := 0, 0
	for _, g := range groups {
		for _, t := range g {
			maxCols, maxRows = max(maxCols, t.M.Cols), max(maxRows, t.M.Rows)
			rep.WalkBytes += t.Bytes
			rep.Tensors++
		}
	}
	x := input(maxCols)
	outs := func() [][]float32 {
		ys := make([][]float32, 3)
		for i := range ys {
			ys[i] = make([]float32, maxRows)
		}
		return ys
	}
	ys := outs()
	// Correctness: the first layer's groups and the head.
	probe := append(slices.Clone(groups[:min(4, len(groups)-1)]), groups[len(groups)-1])
	ref := make([][][]float32, len(probe))
	for gi, g := range probe {
		ref[gi] = outs()
		vs[0].run(g, x, ref[gi])
	}
	rep.Results = make([]Result, len(vs))
	for vi, v := range vs {
		r := &rep.Results[vi]
		r.Variant, r.Doc, r.Tol = v.Name, v.Doc, v.Tol
		if v.Tol < 0 {
			r.Check = "n/a"
			continue
		}
		if err := bracket(v, func() {
			exact := true
			for gi, g := range probe {
				got := outs()
				v.run(g, x, got)
				for i, t := range g {
					e, w := compare(ref[gi][i][:t.M.Rows], got[i][:t.M.Rows])
					exact = exact && e
					r.Worst = max(r.Worst, w)
				}
			}
			r.setCheck(exact)
		}); err != nil {
			return nil, err
		}
	}
	// Timing, round-robin.
	for range rounds {
		for vi, v := range vs {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			var d time.Duration
			if err := bracket(v, func() {
				t0 := time.Now()
				for _, g := range groups {
					v.run(g, x, ys)
				}
				d = time.Since(t0)
			}); err != nil {
				return nil, err
			}
			rep.Results[vi].Times = append(rep.Results[vi].Times, float64(d.Nanoseconds())/1e6)
		}
	}
	rep.summarize()
	return rep, nil
}

// compare returns whether got equals ref bitwise and the worst |Δ|/rms of
// ref (a NaN difference counts as infinite).
func compare(ref, got []float32) (exact bool, worst float64) {
	var ss float64
	for _, y := range ref {
		ss += float64(y) * float64(y)
	}
	rms := math.Sqrt(ss / float64(max(len(ref), 1)))
	exact = true
	for j := range ref {
		if math.Float32bits(ref[j]) != math.Float32bits(got[j]) {
			exact = false
			d := math.Abs(float64(ref[j]) - float64(got[j]))
			if rms > 0 {
				d /= rms
			}
			if math.IsNaN(d) {
				d = math.Inf(1)
			}
			worst = max(worst, d)
		}
	}
	return exact, worst
}

// setCheck fills the correctness column from Worst and Tol.
func (r *Result) setCheck(exact bool) {
	if exact {
		r.Check = "bitwise"
	} else {
		r.Check = fmt.Sprintf("|Δ|/rms %.2e", r.Worst)
	}
	r.Failed = r.Worst > r.Tol
}

// summarize computes every result's statistics from its Times: median,
// minimum, GB/s, and the per-round ratio to arm 0 (median, q1, q3), and
// the fraction of the read probe where one was measured.
func (rep *Report) summarize() {
	arm0 := rep.Results[0].Times
	for vi := range rep.Results {
		r := &rep.Results[vi]
		t := slices.Clone(r.Times)
		slices.Sort(t)
		r.MedianMS, r.MinMS = t[len(t)/2], t[0]
		r.GBps = float64(rep.WalkBytes) / 1e6 / r.MedianMS
		if rep.ReadProbeGBps > 0 {
			r.OfProbe = r.GBps / rep.ReadProbeGBps
		}
		ratios := make([]float64, len(r.Times))
		for i := range ratios {
			ratios[i] = r.Times[i] / arm0[i]
		}
		slices.Sort(ratios)
		r.Ratio, r.RatioQ1, r.RatioQ3 = ratios[len(ratios)/2], ratios[len(ratios)/4], ratios[3*len(ratios)/4]
	}
}

// bracket runs f between the variant's enter and leave.
func bracket(v Variant, f func()) error {
	if v.enter != nil {
		if err := v.enter(); err != nil {
			return fmt.Errorf("lab: variant %s: %w", v.Name, err)
		}
	}
	f()
	if v.leave != nil {
		if err := v.leave(); err != nil {
			return fmt.Errorf("lab: variant %s: %w", v.Name, err)
		}
	}
	return nil
}

// Table writes the report as a text table.
func (r *Report) Table(w interface{ Write([]byte) (int, error) }) {
	fmt.Fprintf(w, "lab: %s on %s, %s\n", r.Model, r.Device, r.Date)
	fmt.Fprintf(w, "walk: %d tensors in %d groups, %.3f GB; %d rounds round-robin\n", r.Tensors, r.Groups, float64(r.WalkBytes)/1e9, r.Rounds)
	probe := r.ReadProbeGBps > 0
	if probe {
		fmt.Fprintf(w, "read probe: %.1f GB/s over a buffer of the walk's size (the machine's limit; \"of probe\" below)\n", r.ReadProbeGBps)
	}
	fmt.Fprintln(w)
	name := 10
	for _, x := range r.Results {
		name = max(name, len(x.Variant))
	}
	extra, extraHead := "", ""
	if probe {
		extraHead = fmt.Sprintf(" %8s", "of probe")
	}
	fmt.Fprintf(w, "%-*s %10s %10s %9s%s %8s %8s %8s  %-22s %s\n", name, "variant", "median ms", "min ms", "GB/s", extraHead, "vs arm0", "q1", "q3", "check", "")
	for _, x := range r.Results {
		status := ""
		if x.Failed {
			status = fmt.Sprintf("FAILED (tolerance %.0e)", x.Tol)
		}
		if probe {
			extra = fmt.Sprintf(" %7.1f%%", 100*x.OfProbe)
		}
		fmt.Fprintf(w, "%-*s %10.3f %10.3f %9.2f%s %8.3f %8.3f %8.3f  %-22s %s\n", name, x.Variant, x.MedianMS, x.MinMS, x.GBps, extra, x.Ratio, x.RatioQ1, x.RatioQ3, x.Check, status)
	}
	if probe {
		best, ceil := -1, -1
		for i, x := range r.Results {
			switch {
			case x.Tol < 0 && (ceil < 0 || x.GBps > r.Results[ceil].GBps):
				ceil = i
			case x.Tol >= 0 && !x.Failed && (best < 0 || x.GBps > r.Results[best].GBps):
				best = i
			}
		}
		for _, p := range []struct {
			what string
			i    int
		}{{"best checked variant", best}, {"loads-only ceiling", ceil}} {
			if p.i >= 0 {
				x := r.Results[p.i]
				fmt.Fprintf(w, "%s: %s, %.1f GB/s = %.1f%% of the read probe\n", p.what, x.Variant, x.GBps, 100*x.OfProbe)
			}
		}
	}
	fmt.Fprintln(w)
	seen := map[string]bool{}
	for _, x := range r.Results {
		v, _, _ := strings.Cut(x.Variant, "+")
		if !seen[v] {
			seen[v] = true
			fmt.Fprintf(w, "  %-*s %s\n", name, v, x.Doc)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

// Broken returns v with every output scaled by 1+eps and a zero
// tolerance: a variant the correctness check must reject (tests).
func Broken(v Variant, eps float64) Variant {
	run := v.run
	v.Name, v.Doc, v.Tol = v.Name+"-broken", "deliberately off by "+fmt.Sprint(eps), 0
	v.run = func(g Group, x []float32, ys [][]float32) {
		run(g, x, ys)
		for i, t := range g {
			for j := range ys[i][:t.M.Rows] {
				ys[i][j] *= float32(1 + eps)
			}
		}
	}
	return v
}
