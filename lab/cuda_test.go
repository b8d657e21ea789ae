package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/kernels"
	"github.com/cortiq/cortiq/quant"
)

// randTensor encodes a rows×cols tensor of normal weights in format d.
func randTensor(t testing.TB, r *rand.Rand, name string, d quant.DType, rows, cols int) Tensor {
	t.Helper()
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(r.NormFloat64() * 0.05)
	}
	b, err := quant.Encode(d, w, []int{rows, cols}, nil)
	if err != nil {
		t.Fatalf("%s %s %d×%d: %v", name, d, rows, cols, err)
	}
	m, err := kernels.NewMat(d, rows, cols, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Prepare(); err != nil {
		t.Fatal(err)
	}
	return Tensor{Name: name, M: m, Bytes: int64(len(b))}
}

// oddWalk is a walk of odd shapes over q4tp and q8_row (and, with others,
// the formats that run production in every variant): a three-tensor
// group of unequal rows (the merged kernel's segments), rows not a
// multiple of any rows-per-block, q8 rows not whole 16-byte chunks.
func oddWalk(t testing.TB, others bool) []Group {
	r := rand.New(rand.NewPCG(7, 10))
	gs := []Group{
		{randTensor(t, r, "q", quant.Q4TP, 37, 96), randTensor(t, r, "k", quant.Q4TP, 5, 96), randTensor(t, r, "v", quant.Q4TP, 19, 96)},
		{randTensor(t, r, "o", quant.Q8Row, 33, 100)},
		{randTensor(t, r, "gate", quant.Q4TP, 1, 32*67), randTensor(t, r, "up", quant.Q4TP, 130, 32*67)},
		{randTensor(t, r, "down", quant.Q8Row, 50, 160)},
	}
	if others {
		gs = append(gs, Group{randTensor(t, r, "bf", quant.BF16, 9, 40), randTensor(t, r, "q82f", quant.Q82F, 11, 48)},
			Group{randTensor(t, r, "f16", quant.F16, 3, 8), randTensor(t, r, "f32", quant.F32, 4, 12)})
	}
	return append(gs, Group{randTensor(t, r, "head", quant.Q4TP, 1001, 64)})
}

// TestCUDAVariantTable: names unique, tolerances the documented ones,
// every launch any variant makes on a walk of every format names a kernel
// of the embedded build with exactly the parameter sizes packed, grids
// cover the rows with the rows-per-warp that lab.cu states, and every
// lab_* kernel of the build is launched by some variant.
func TestCUDAVariantTable(t *testing.T) {
	m, err := kern.ReadManifest()
	if err != nil {
		t.Fatal(err)
	}
	vs := CUDAVariants()
	if vs[0].Name != "prod" || vs[0].q4 != nil || vs[0].q8 != nil || vs[0].Tol != 0 {
		t.Fatalf("arm 0 is %+v, want production", vs[0])
	}
	src, err := os.ReadFile("../backend/cuda/kern/csrc/lab.cu")
	if err != nil {
		t.Fatal(err)
	}
	rpwOf := map[string]int{}
	last := 0
	re := regexp.MustCompile(`RPW (\d+)\.|__launch_bounds__\(128\) (lab_\w+)\(`)
	for _, mm := range re.FindAllStringSubmatch(string(src), -1) {
		if mm[1] != "" {
			last, _ = strconv.Atoi(mm[1])
		} else {
			rpwOf[mm[2]] = last
			last = 0
		}
	}
	seen := map[string]bool{}
	used := map[string]bool{}
	groups := oddWalk(t, true)
	lay := NewLayout(groups)
	b := bufs{W: 1 << 40, X: 2 << 40, XS: 3 << 40, XQ: 4 << 40, XD: 5 << 40, Y: 6 << 40}
	for _, v := range vs {
		if seen[v.Name] || v.Name == "" || strings.Contains(v.Name, "+") {
			t.Errorf("variant name %q repeated, empty or with a '+'", v.Name)
		}
		seen[v.Name] = true
		if v.Doc == "" {
			t.Errorf("%s: no doc", v.Name)
		}
		if !slices.Contains([]float64{0, TolSameOrder, TolReassoc, TolInt8, -1}, v.Tol) {
			t.Errorf("%s: tolerance %g is none of the documented ones", v.Name, v.Tol)
		}
		for _, k := range []*kspec{v.q4, v.q8} {
			if k == nil {
				continue
			}
			if want := rpwOf[k.name]; k.rpw != want {
				t.Errorf("%s: %s with %d rows a warp, lab.cu says %d", v.Name, k.name, k.rpw, want)
			}
			if v.Tol != TolInt8 && v.Tol >= 0 {
				t.Errorf("%s: tolerance %g against an int8-activation production kernel (want TolInt8)", v.Name, v.Tol)
			}
		}
		for gi, g := range groups {
			ls, err := planGroup(v, g, gi, lay, b)
			if err != nil {
				t.Fatalf("%s group %d: %v", v.Name, gi, err)
			}
			if err := checkPlan(m, ls); err != nil {
				t.Errorf("%s group %d: %v", v.Name, gi, err)
			}
			for _, x := range ls {
				used[x.name] = true
				if strings.HasPrefix(x.name, "mv_") {
					// Production kernels launch as the production Matvec does.
					if x.cfg.Block != driver.D1(128) && x.cfg.Block != driver.D1(512) {
						t.Errorf("%s: %s with block %v", v.Name, x.name, x.cfg.Block)
					}
				} else if x.cfg.Block != driver.D1(128) && x.name != "q82f_prescale" {
					t.Errorf("%s: %s with block %v", v.Name, x.name, x.cfg.Block)
				}
				if rpw := rpwOf[x.name]; rpw > 0 && x.name != "lab_q4_hlfm" {
					rows := int(x.args.Bytes()[8]) | int(x.args.Bytes()[9])<<8 // the rows parameter (little-endian, < 65536 here)
					if g := int(x.cfg.Grid.X); g*4*rpw < rows || (g-1)*4*rpw >= rows {
						t.Errorf("%s: %s grid %d for %d rows at %d a warp", v.Name, x.name, g, rows, rpw)
					}
				}
			}
		}
	}
	for _, k := range m.Kernels {
		if strings.HasPrefix(k.Name, "lab_") && !used[k.Name] {
			t.Errorf("kernel %s of the build is launched by no variant", k.Name)
		}
	}
	// The merged kernel: one launch for q|k|v, with the three row counts.
	var hlfm CUDAVariant
	for _, v := range vs {
		if v.merged {
			hlfm = v
		}
	}
	ls, err := planGroup(hlfm, groups[0], 0, lay, b)
	if err != nil || len(ls) != 1 || ls[0].name != "lab_q4_hlfm" || ls[0].cfg.Grid.X != (10+2+5+3)/4 {
		t.Fatalf("merged q|k|v plan: %v %+v", err, ls)
	}
	// dp4a quantizes once per group when the tensors share the order.
	for _, v := range vs {
		if v.Name != "dp4a" {
			continue
		}
		ls, _ := planGroup(v, groups[0], 0, lay, b)
		n := 0
		for _, x := range ls {
			if x.name == "lab_quant_x" {
				n++
			}
		}
		if n != 1 || len(ls) != 4 {
			t.Errorf("dp4a over q|k|v: %d quantizations in %d launches, want 1 in 4", n, len(ls))
		}
	}
}

// TestLayout: every tensor at an aligned offset, in order, not
// overlapping, inside the buffer; MaxCols whole blocks of 32; MaxOut the
// largest group's rows; each group's outputs end to end in planGroup.
func TestLayout(t *testing.T) {
	groups := oddWalk(t, true)
	l := NewLayout(groups)
	end := int64(0)
	maxOut := 0
	for gi, g := range groups {
		if len(l.Offs[gi]) != len(g) {
			t.Fatalf("group %d: %d offsets for %d tensors", gi, len(l.Offs[gi]), len(g))
		}
		out := 0
		for j, ts := range g {
			o := l.Offs[gi][j]
			if o%LayoutAlign != 0 || o < end {
				t.Fatalf("tensor %s at %d (previous ends at %d)", ts.Name, o, end)
			}
			end = o + int64(len(ts.M.Data))
			out += ts.M.Rows
		}
		maxOut = max(maxOut, out)
	}
	if end > l.Bytes || l.Bytes-end >= LayoutAlign {
		t.Fatalf("buffer %d bytes, last tensor ends at %d", l.Bytes, end)
	}
	if l.MaxCols != 32*67 || l.MaxOut != maxOut || maxOut != 1001 {
		t.Fatalf("MaxCols %d MaxOut %d (want %d, %d)", l.MaxCols, l.MaxOut, 32*67, maxOut)
	}
	b := bufs{W: 0x10000, X: 0x20000, Y: 0x30000}
	ls, err := planGroup(CUDAVariants()[0], groups[0], 0, l, b)
	if err != nil {
		t.Fatal(err)
	}
	for j, x := range ls {
		a := x.args.Bytes()
		w := int64(leU64(a[0:]))
		yp := 5
		if strings.HasPrefix(x.name, "mv_q8row") || strings.HasPrefix(x.name, "mv_q4tp") {
			yp = 10 // kern.MQ's parameters
		}
		y := int64(leU64(a[x.args.Offset(yp):]))
		wantY := int64(0x30000)
		for _, ts := range groups[0][:j] {
			wantY += 4 * int64(ts.M.Rows)
		}
		if w != 0x10000+l.Offs[0][j] || y != wantY {
			t.Errorf("tensor %d: W %#x y %#x, want %#x %#x", j, w, y, 0x10000+l.Offs[0][j], wantY)
		}
	}
}

func leU64(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

// TestSelectCUDA: production first, unknown names refused, variants
// without a kernel for the walk's formats dropped (a q8_row walk keeps
// prod, dp4a and loads).
func TestSelectCUDA(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	q8 := []Group{{randTensor(t, r, "a", quant.Q8Row, 8, 64)}}
	vs, err := SelectCUDA(CUDAVariants(), "", q8)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range vs {
		names = append(names, v.Name)
	}
	if !slices.Equal(names, []string{"prod", "dp4a", "loads"}) {
		t.Fatalf("q8_row walk: %v", names)
	}
	if _, err := SelectCUDA(CUDAVariants(), "hlf", q8); err == nil {
		t.Fatal("hlf accepted on a q8_row walk")
	}
	if _, err := SelectCUDA(CUDAVariants(), "nope", q8); err == nil {
		t.Fatal("unknown variant accepted")
	}
	vs, err = SelectCUDA(CUDAVariants(), "lm8,hlf,lm8", oddWalk(t, false))
	if err != nil || len(vs) != 3 || vs[0].Name != "prod" || vs[1].Name != "lm8" || vs[2].Name != "hlf" {
		t.Fatalf("select lm8,hlf: %v %v", err, vs)
	}
}

// TestCUDAReportJSON: the GPU fields (read probe, mode, fraction of the
// probe) are in the JSON and the table; the CPU report has none of them.
func TestCUDAReportJSON(t *testing.T) {
	rep := &Report{Tensors: 2, Groups: 1, WalkBytes: 4e9, Rounds: 3, ReadProbeGBps: 4000, Notes: []string{"x+graph+pdl not run: because"}}
	for i, m := range Modes {
		rep.Results = append(rep.Results, Result{Variant: "prod" + map[bool]string{true: "", false: "+" + m}[i == 0], Mode: m, Doc: "d",
			Times: []float64{1, 2, 1.5}, Check: "bitwise"})
	}
	rep.Results = append(rep.Results, Result{Variant: "loads", Mode: ModeSerial, Tol: -1, Check: "n/a", Times: []float64{1, 1, 1}},
		Result{Variant: "fast", Mode: ModeSerial, Tol: 0, Failed: true, Times: []float64{0.5, 0.5, 0.5}})
	rep.summarize()
	if r := rep.Results[0]; r.MedianMS != 1.5 || math.Abs(r.GBps-4e9/1e6/1.5) > 1e-9 || math.Abs(r.OfProbe-r.GBps/4000) > 1e-12 {
		t.Fatalf("summary %+v", r)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back["read_probe_gb_per_sec"] != 4000.0 || len(back["notes"].([]any)) != 1 {
		t.Fatalf("report JSON %s", b)
	}
	res := back["results"].([]any)
	for i, m := range Modes {
		r := res[i].(map[string]any)
		if r["mode"] != m || r["fraction_of_read_probe"] == nil || r["gb_per_sec"] == nil || r["ratio_q3"] == nil || r["check"] != "bitwise" {
			t.Fatalf("result %d JSON %v", i, r)
		}
	}
	var tbl strings.Builder
	rep.Table(&tbl)
	for _, want := range []string{"read probe: 4000.0 GB/s", "of probe", "prod+graph+pdl", "note: x+graph+pdl not run",
		"best checked variant: prod, 2666.7 GB/s = 66.7% of the read probe", "loads-only ceiling: loads, 4000.0 GB/s = 100.0% of the read probe"} {
		if !strings.Contains(tbl.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, tbl.String())
		}
	}
	cpu := &Report{Results: []Result{{Variant: "prod", Times: []float64{1}}}}
	cpu.summarize()
	b, _ = json.Marshal(cpu)
	for _, k := range []string{`"read_probe`, `"mode"`, `"fraction_of`, `"notes"`} {
		if strings.Contains(string(b), k) {
			t.Fatalf("CPU report JSON has %q: %s", k, b)
		}
	}
}

// TestRunCUDANoGPU: without a usable GPU RunCUDA fails with the driver's
// reason (wrapping driver.ErrNoDevice).
func TestRunCUDANoGPU(t *testing.T) {
	if d, err := driver.Open(0); err == nil {
		d.Close()
		t.Skip("a GPU is present: TestGPULab* cover this machine")
	}
	_, err := RunCUDA(context.Background(), oddWalk(t, false), CUDAOptions{Rounds: 1})
	if !errors.Is(err, driver.ErrNoDevice) || !strings.Contains(err.Error(), "cuda: no usable device") {
		t.Fatalf("RunCUDA without a GPU: %v", err)
	}
	if _, err := RunCUDA(context.Background(), oddWalk(t, false), CUDAOptions{Rounds: 1, Modes: []string{"bogus"}}); err == nil || errors.Is(err, driver.ErrNoDevice) {
		t.Fatalf("bogus mode: %v", err)
	}
}

// int8Dot is the dp4a kernels' arithmetic in float64: x quantized per
// block of 32 (d = absmax/127, q = round(x/d)), then Σ_b d_b·Σ w·q.
func int8Dot(w []float32, x []float32) float64 {
	var y float64
	for b0 := 0; b0 < len(x); b0 += 32 {
		blk := x[b0:min(b0+32, len(x))]
		am := 0.0
		for _, v := range blk {
			am = max(am, math.Abs(float64(float32(v))))
		}
		d := float64(float32(am) / 127)
		if am == 0 {
			continue
		}
		var s float64
		for i, v := range blk {
			q := math.RoundToEven(float64(v / float32(d)))
			s += float64(w[b0+i]) * q
		}
		y += d * s
	}
	return y
}

// TestInt8ToleranceOnCPU: on the lab's input and the odd walk's weights,
// int8 activations stay within half of TolInt8 of the exact product,
// so the dp4a variants' tolerance has margin for the float32 rounding of
// the kernels themselves.
func TestInt8ToleranceOnCPU(t *testing.T) {
	worst := 0.0
	for _, g := range oddWalk(t, false) {
		for _, ts := range g {
			x := input(ts.M.Cols)
			row := make([]float32, ts.M.Cols)
			ref, got := make([]float64, ts.M.Rows), make([]float64, ts.M.Rows)
			var ss float64
			for r := range ts.M.Rows {
				ts.M.Row(r, row)
				for i, v := range row {
					ref[r] += float64(v) * float64(x[i])
				}
				got[r] = int8Dot(row, x)
				ss += ref[r] * ref[r]
			}
			rms := math.Sqrt(ss / float64(ts.M.Rows))
			tw := 0.0
			for r := range ref {
				tw = max(tw, math.Abs(ref[r]-got[r])/rms)
			}
			t.Logf("%s %s %d×%d: worst |Δ|/rms %.3e", ts.Name, ts.M.DType, ts.M.Rows, ts.M.Cols, tw)
			worst = max(worst, tw)
		}
	}
	t.Logf("worst |Δ|/rms of int8 activations: %.3e (tolerance %.0e)", worst, TolInt8)
	if worst == 0 || worst > TolInt8/2 {
		t.Fatalf("int8 activations off by %.3e of RMS, want (0, %.2e]", worst, TolInt8/2)
	}
}

// TestDP4ALayoutModel is a Go model of lab.cu's int8 path on the stored
// q4tp bytes: lab_quant_x's (0,2,4,6,1,3,5,7) order per 8 quants, the
// masked low and shifted high nibbles of each word fed to dp4a, the −8
// folded in as −8·Σq, the rung from the 5-bit code. It must give the
// int8Dot of the decoded rows exactly (up to float64 rounding), which
// checks the byte arrangement the kernel relies on.
func TestDP4ALayoutModel(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	ts := randTensor(t, r, "w", quant.Q4TP, 7, 32*5)
	rows, cols, gpr := ts.M.Rows, ts.M.Cols, ts.M.Cols/32
	W := ts.M.Data
	poff := rows * gpr * 16
	coff := poff + rows*4
	stride := (5*gpr + 7) / 8
	x := input(cols)
	// lab_quant_x with perm = 1.
	xq := make([]int8, cols)
	xd := make([]float64, 2*gpr)
	for b := range gpr {
		am := float32(0)
		for _, v := range x[32*b : 32*b+32] {
			am = max(am, float32(math.Abs(float64(v))))
		}
		d := am / 127
		s := 0
		for lane := range 32 {
			q := int(math.RoundToEven(float64(x[32*b+lane] / d)))
			e := lane & 7
			xq[32*b+(lane&^7)+e>>1+4*(e&1)] = int8(q)
			s += q
		}
		xd[2*b], xd[2*b+1] = float64(d), float64(s)
	}
	dp4a := func(a, b uint32, c int) int {
		for k := range 4 {
			c += int(int8(a>>(8*k))) * int(int8(b>>(8*k)))
		}
		return c
	}
	word := func(p []int8) uint32 {
		return uint32(uint8(p[0])) | uint32(uint8(p[1]))<<8 | uint32(uint8(p[2]))<<16 | uint32(uint8(p[3]))<<24
	}
	row := make([]float32, cols)
	for o := range rows {
		ah := uint16(W[poff+4*o]) | uint16(W[poff+4*o+1])<<8
		bh := uint16(W[poff+4*o+2]) | uint16(W[poff+4*o+3])<<8
		var y float64
		for g := range gpr {
			bit := 5 * g
			v := uint32(W[coff+o*stride+bit>>3])
			if bit&7 > 3 {
				v |= uint32(W[coff+o*stride+bit>>3+1]) << 8
			}
			code := int(v>>(bit&7)) & 31
			rung := math.Exp2(float64(float32(f16(ah)) + float32(code)*float32(f16(bh))))
			s := 0
			for j := range 4 {
				off := (o*gpr+g)*16 + 4*j
				wv := uint32(W[off]) | uint32(W[off+1])<<8 | uint32(W[off+2])<<16 | uint32(W[off+3])<<24
				s = dp4a(wv&0x0F0F0F0F, word(xq[32*g+8*j:]), s)
				s = dp4a(wv>>4&0x0F0F0F0F, word(xq[32*g+8*j+4:]), s)
			}
			y += rung * xd[2*g] * (float64(s) - 8*xd[2*g+1])
		}
		ts.M.Row(o, row)
		want := int8Dot(row, x)
		if math.Abs(y-want) > 1e-5*math.Abs(want)+1e-7 {
			t.Fatalf("row %d: model %.9g, int8Dot of the decoded row %.9g", o, y, want)
		}
	}
}

// f16 converts IEEE half bits to float64 (normal and subnormal numbers).
func f16(h uint16) float64 {
	e, m := int(h>>10&31), float64(h&1023)
	v := 0.0
	switch {
	case e == 0:
		v = m / 1024 * math.Exp2(-14)
	case e == 31:
		v = math.Inf(1)
	default:
		v = (1 + m/1024) * math.Exp2(float64(e-15))
	}
	if h&0x8000 != 0 {
		v = -v
	}
	return v
}

// TestProductionShare: a q4tp-only variant on a walk with a q8_row head
// says it runs production there and for what share of the bytes.
func TestProductionShare(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	a, b := randTensor(t, r, "a", quant.Q4TP, 64, 64), randTensor(t, r, "b", quant.Q8Row, 64, 64)
	groups := []Group{{a}, {b}}
	total := a.Bytes + b.Bytes
	vs := CUDAVariants()
	for _, v := range vs {
		got := productionShare(v, groups, total)
		switch {
		case v.Name == "prod" || v.q8 != nil:
			if got != "" {
				t.Errorf("%s: %q", v.Name, got)
			}
		default:
			want := fmt.Sprintf(" [production kernel for q8_row %.0f%% of the walk's bytes]", 100*float64(b.Bytes)/float64(total))
			if got != want {
				t.Errorf("%s: %q, want %q", v.Name, got, want)
			}
		}
	}
}

// TestLaunchModes: serial always first, each mode once, names trimmed,
// unknown ones refused.
func TestLaunchModes(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want []string
	}{
		{nil, Modes},
		{[]string{"graph+pdl"}, []string{ModeSerial, ModePDL}},
		{[]string{" graph", "serial", "graph"}, []string{ModeSerial, ModeGraph}},
	} {
		got, err := launchModes(c.in)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("launchModes(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	if _, err := launchModes([]string{"pdl"}); err == nil {
		t.Error("mode pdl accepted")
	}
}
