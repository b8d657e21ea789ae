package kern

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/cortiq/cortiq/quant"
)

// TestGemmHWeightsNearDecode: the half tiles' weights are quant.Decode's
// within two f16 roundings (the scaled rung, then the product: ≤ 2^-10
// relative, plus f16's subnormal step scaled by 2^E), also for rows whose
// weights span very different magnitudes; a row's E bounds its scaled
// rungs by 1; a tensor of the wrong size is an error.
func TestGemmHWeightsNearDecode(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 9))
	const rows, cols = 24, 256
	w := make([]float32, rows*cols)
	for o := range rows {
		scale := math.Ldexp(1, -20+2*o) // rows from 2^-20 to 2^26
		for k := range cols {
			w[o*cols+k] = float32(r.NormFloat64() * scale * (1 + float64(k/32))) // groups of growing size
		}
	}
	b, err := quant.Encode(quant.Q4TP, w, []int{rows, cols}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := quant.Decode(quant.Q4TP, b, []int{rows, cols})
	if err != nil {
		t.Fatal(err)
	}
	got, err := GemmHWeights(b, rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	lad := rows * cols / 32 * 16
	for o := range rows {
		e := GemmHRowExp(uint16(b[lad+4*o])|uint16(b[lad+4*o+1])<<8, uint16(b[lad+4*o+2])|uint16(b[lad+4*o+3])<<8)
		var amax float64
		for k := range cols {
			amax = max(amax, math.Abs(float64(dec[o*cols+k])))
		}
		if amax > 8*math.Ldexp(1, e) {
			t.Fatalf("row %d: |w| up to %g beyond 8·2^E = %g", o, amax, 8*math.Ldexp(1, e))
		}
		for k := range cols {
			want, g := float64(dec[o*cols+k]), float64(got[o*cols+k])
			if d := math.Abs(g - want); d > math.Ldexp(1, -10)*math.Abs(want)+math.Ldexp(1, e-24) {
				t.Fatalf("row %d col %d: %g, Decode %g (E %d)", o, k, g, want, e)
			}
		}
	}
	if _, err := GemmHWeights(b[:len(b)-1], rows, cols); err == nil {
		t.Fatal("a truncated tensor gave no error")
	}
}

// TestGemmHActivation: f16 rounding to nearest even, saturation at ±65504,
// NaN kept.
func TestGemmHActivation(t *testing.T) {
	for _, c := range []struct{ x, want float32 }{
		{1, 1}, {1 + 1.0/4096, 1}, {1 + 3.0/4096, 1 + 1.0/1024}, {65504, 65504}, {1e6, 65504}, {-7e4, -65504},
		{float32(math.Inf(1)), 65504}, {float32(math.Inf(-1)), -65504}, {-0.5, -0.5},
	} {
		if got := GemmHActivation(c.x); got != c.want {
			t.Errorf("GemmHActivation(%g) = %g, want %g", c.x, got, c.want)
		}
	}
	if v := GemmHActivation(float32(math.NaN())); v == v {
		t.Errorf("GemmHActivation(NaN) = %g", v)
	}
}

// TestGemmHTilesMatchSource: gemmq.cu's GEMMH_WIDE_KS lines are kern's
// table (BM, FT = BM/16, NS, WT, CG, WK, CA; suffix t for WT 2, c4 for CG 4,
// r for WK 2, ca for CA 1), and each tile fits two blocks an SM (228 KB, 1 KB
// reserved each).
func TestGemmHTilesMatchSource(t *testing.T) {
	src, err := os.ReadFile("csrc/gemmq.cu")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^GEMMH_WIDE_KS\((\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\w*)\)`)
	var got [][6]int
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		bm, _ := strconv.Atoi(m[1])
		ft, _ := strconv.Atoi(m[2])
		ns, _ := strconv.Atoi(m[3])
		wt, _ := strconv.Atoi(m[4])
		cg, _ := strconv.Atoi(m[5])
		wk, _ := strconv.Atoi(m[6])
		ca, _ := strconv.Atoi(m[7])
		sfx := map[[3]int]string{{1, 8, 1}: "", {2, 8, 1}: "t", {1, 4, 1}: "c4", {1, 8, 2}: "r"}[[3]int{wt, cg, wk}]
		if ca == 1 {
			sfx += "ca"
		}
		if ft*16 != bm || sfx != m[8] {
			t.Errorf("%s: BM %d, FT %d, WT %d, CG %d, WK %d, CA %d, suffix %q", m[0], bm, ft, wt, cg, wk, ca, m[8])
		}
		got = append(got, [6]int{bm, ns, wt, cg, wk, ca})
	}
	if fmt.Sprint(got) != fmt.Sprint(gemmhWide) {
		t.Fatalf("gemmq.cu's GEMMH_WIDE_KS lines %v, kern's table %v", got, gemmhWide)
	}
	for _, tl := range GemmHTiles() {
		if sh := tl.Shared("q4tp"); 2*(sh+1024) > 228*1024 {
			t.Errorf("%s: %d bytes of shared memory, over half an SM's", tl.Suffix, sh)
		}
	}
}
