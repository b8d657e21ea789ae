package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/cortiq/cortiq/backend"
)

// stepProfile: the mean step, the kernel sum and the gap as their
// difference (negative where the kernels timed one by one took longer
// than a replayed step: reported as measured), the wording for partly
// replayed steps, and an error when nothing was timed.
func TestStepProfile(t *testing.T) {
	p, err := stepProfile("m.cmf", backend.StepTimes{Steps: 3, Graphs: 2, StepTime: 3 * time.Millisecond, Kernels: 10, KernelTime: 1100 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	if p.StepUS != 1000 || p.KernelUS != 1100 || p.GapUS != -100 || p.Kernels != 10 || p.Graphs != 2 {
		t.Fatalf("%+v", p)
	}
	var b bytes.Buffer
	p.markdown(&b)
	if want := "decode step of m.cmf on the device: 1000 µs (mean of 3, 2 of them replayed from a graph); kernels 1100 µs (110%: 10 kernels, each timed by events in one eager step), gaps between kernels -100 µs (-10%)\n"; b.String() != want {
		t.Fatalf("line %q\nwant %q", b.String(), want)
	}
	for _, st := range []backend.StepTimes{{}, {Steps: 2, StepTime: time.Millisecond}, {Kernels: 3, KernelTime: time.Millisecond}} {
		if _, err := stepProfile("m.cmf", st); err == nil || !strings.Contains(err.Error(), "timed") {
			t.Errorf("%+v: %v", st, err)
		}
	}
}
