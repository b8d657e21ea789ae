package rope

import (
	"math"
	"testing"
)

// TestRopeFreqFactors: dividing the default inverse frequencies by the
// per-pair factors that llama3 scaling implies reproduces llama3 scaling.
func TestRopeFreqFactors(t *testing.T) {
	base := Config{HeadDim: 64, Theta: 500000, MaxPositions: 131072}
	l3 := base
	l3.Type, l3.Factor, l3.LowFreqFactor, l3.HighFreqFactor, l3.OriginalMaxPos = "llama3", 32, 1, 4, 8192
	def, err := New(base)
	if err != nil {
		t.Fatal(err)
	}
	want, err := New(l3)
	if err != nil {
		t.Fatal(err)
	}
	ff := base
	ff.Type = "freq_factors"
	for i := range def.invFreq {
		ff.FreqFactors = append(ff.FreqFactors, float64(def.invFreq[i])/float64(want.invFreq[i]))
	}
	got, err := New(ff)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got.invFreq {
		if d := math.Abs(float64(got.invFreq[i]-want.invFreq[i])) / float64(want.invFreq[i]); d > 1e-6 {
			t.Fatalf("pair %d: %v, llama3 %v", i, got.invFreq[i], want.invFreq[i])
		}
	}
	bad := ff
	bad.FreqFactors = ff.FreqFactors[:3]
	if _, err := New(bad); err == nil {
		t.Fatal("wrong factor count accepted")
	}
	bad.FreqFactors = append([]float64{0}, ff.FreqFactors[1:]...)
	if _, err := New(bad); err == nil {
		t.Fatal("zero factor accepted")
	}
}
