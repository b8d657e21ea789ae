package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/model"
)

// StepProfile says how a decode step's device time divides into the time
// its kernels take and the gaps between them (launch latency,
// dependencies, copies), from a device's own timing (backend.StepTimer).
type StepProfile struct {
	Model    string  `json:"model"`
	Steps    int     `json:"steps"`         // decode steps timed whole
	Graphs   int     `json:"graph_replays"` // how many of them were replayed graphs
	StepUS   float64 `json:"step_us"`       // mean device time of a step, µs
	Kernels  int     `json:"kernels"`       // kernels of the step timed one by one
	KernelUS float64 `json:"kernel_us"`     // the sum of their times, µs
	GapUS    float64 `json:"gap_us"`        // StepUS − KernelUS
	// Host wall time a step, µs: the whole Forward call (WallUS), the
	// device's Run inside it (RunUS), of which packing the step to check
	// it against its graph (CheckUS) and the time after its launches
	// (WaitUS: the device finishing, the logits copy, the syncs).
	WallUS  float64 `json:"wall_us"`
	RunUS   float64 `json:"run_us"`
	CheckUS float64 `json:"check_us"`
	WaitUS  float64 `json:"wait_us"`
}

// ProfileSteps decodes steps tokens after a one-token prompt with t's
// timing on (the prompt token is a decode-shaped step: the one the device
// times kernel by kernel) and returns the figures. It runs apart from the
// timed tests so that their tok/s carry no timing events.
func ProfileSteps(ctx context.Context, path string, e *engine.Engine, t backend.StepTimer, steps int) (*StepProfile, error) {
	if steps < 1 {
		return nil, fmt.Errorf("bench: a step profile needs at least one step, not %d", steps)
	}
	s, err := e.NewSession(steps + 1)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	V := e.File.Header.Arch.VocabSize
	t.TimeSteps(true)
	defer t.TimeSteps(false)
	var wall time.Duration
	for k := 0; k <= steps; k++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		t0 := time.Now()
		if _, err := e.Model.Forward(s.Cache(), []int{(k*7919 + 13) % V}, k, model.LastLogits); err != nil {
			return nil, err
		}
		if k > 0 { // step 0 is the one timed kernel by kernel
			wall += time.Since(t0)
		}
	}
	p, err := stepProfile(path, t.StepTimes())
	if err != nil {
		return nil, err
	}
	p.WallUS = float64(wall) / float64(time.Microsecond) / float64(steps)
	return p, nil
}

// stepProfile turns a StepTimer's figures into a StepProfile.
func stepProfile(path string, st backend.StepTimes) (*StepProfile, error) {
	if st.Steps == 0 || st.Kernels == 0 {
		return nil, fmt.Errorf("bench: the device timed %d decode steps and %d kernels", st.Steps, st.Kernels)
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	p := &StepProfile{Model: path, Steps: st.Steps, Graphs: st.Graphs, StepUS: us(st.StepTime) / float64(st.Steps),
		Kernels: st.Kernels, KernelUS: us(st.KernelTime)}
	p.GapUS = p.StepUS - p.KernelUS
	n := float64(st.Steps)
	p.RunUS, p.CheckUS, p.WaitUS = us(st.HostRun)/n, us(st.HostCheck)/n, us(st.HostWait)/n
	return p, nil
}

// markdown writes the profile's line under the table.
func (p *StepProfile) markdown(w io.Writer) {
	how := "launched eagerly"
	if p.Graphs == p.Steps {
		how = "replayed from a graph"
	} else if p.Graphs > 0 {
		how = fmt.Sprintf("%d of them replayed from a graph", p.Graphs)
	}
	pct := func(x float64) float64 { return 100 * x / p.StepUS }
	fmt.Fprintf(w, "decode step of %s on the device: %.0f µs (mean of %d, %s); kernels %.0f µs (%.0f%%: %d kernels, each timed by events in one eager step), gaps between kernels %.0f µs (%.0f%%)\n",
		p.Model, p.StepUS, p.Steps, how, p.KernelUS, pct(p.KernelUS), p.Kernels, p.GapUS, pct(p.GapUS))
	if p.WallUS > 0 {
		fmt.Fprintf(w, "host wall time a decode step: %.0f µs (%.0f µs over the device's step); in the device's Run %.0f µs: packing the step to check it against its graph %.0f µs, after the launches (the device finishing, the logits copy, the syncs) %.0f µs\n",
			p.WallUS, p.WallUS-p.StepUS, p.RunUS, p.CheckUS, p.WaitUS)
	}
}
