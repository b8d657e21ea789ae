package kern_test

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/quant"
)

// TestGPUGemmQParity: the int8 tensor-core GEMM (gemmq_actq, then every
// tile of gemmq_<fmt> (kern.GemmQTiles): the one GemmQKernel picks, then
// each forced (the small-batch _s* tiles up to T = 100: several token
// blocks where T > BM))
// for q8_row and q4tp, rows 37/130/4096 × cols 96/1056/4096 (96: fewer
// groups than a stage; 1056: 33 groups, a partial last stage), T = 1, 9,
// 16, 33, 64, 100, 512, store and bias+accumulate, against float64 sums of
// quant.Decode's weights × kern.ActQuant's activations, tolerance 1e-5 of
// the sum of |terms| (TestGPUMatvecParity's). The quants and scales
// gemmq_actq writes are checked against kern.ActQuant exactly (q4tp's in
// their documented order), and Y's padding columns and the rows past T
// must be left as they were. For 4096 × 4096 every 7th weight row (and
// the last) is checked, to keep the float64 reference short.
// CORTIQ_GEMMQ_SMALL=1 keeps the shapes of fewer than 4096 columns and
// rows (scripts/gpu-check's run under compute-sanitizer).
func TestGPUGemmQParity(t *testing.T) {
	g := newGPU(t)
	r := rng(21)
	shapes := [][2]int{{37, 96}, {130, 1056}, {4096, 4096}, {130, 4096}, {4096, 96}}
	if os.Getenv("CORTIQ_GEMMQ_SMALL") == "1" {
		shapes = shapes[:2]
	}
	for _, dt := range []quant.DType{quant.Q8Row, quant.Q4TP} {
		fam := kernName[dt]
		for _, sh := range shapes {
			rows, cols := sh[0], sh[1]
			w := r.vec(rows*cols, 0.05)
			wb, err := quant.Encode(dt, w, []int{rows, cols}, nil)
			if err != nil {
				t.Fatal(err)
			}
			wd, _ := quant.Decode(dt, wb, []int{rows, cols})
			dW := g.upload(wb)
			const maxT = 512
			ldx, ldy := cols+4, rows+3
			x := r.vec(maxT*ldx, 1)
			dx := g.f32(x)
			bias := r.vec(rows, 0.1)
			dbias := g.f32(bias)
			nq, ns := kern.GemmQScratch(cols, maxT)
			dq, dd := g.upload(make([]byte, nq)), g.upload(make([]byte, ns))
			xe := make([][]float64, maxT)
			for ti := range maxT {
				xe[ti] = kern.ActQuant(x[ti*ldx : ti*ldx+cols])
			}
			check := func(o int) bool { return rows < 4096 || o%7 == 0 || o == rows-1 }
			// The products of every token (they do not depend on T).
			ref, refMag := make([]float64, maxT*rows), make([]float64, maxT*rows)
			for ti := range maxT {
				for o := range rows {
					if !check(o) {
						continue
					}
					var sum, mag float64
					for i, v := range xe[ti] {
						p := float64(wd[o*cols+i]) * v
						sum += p
						mag += math.Abs(p)
					}
					ref[ti*rows+o], refMag[ti*rows+o] = sum, mag
				}
			}
			for _, T := range []int{1, 9, 16, 33, 64, 100, 512} {
				for _, epi := range []string{"store", "bias+accumulate"} {
					var bp driver.DevicePtr
					if epi != "store" {
						bp = dbias
					}
					gq := kern.GemmQ{W: dW, Rows: rows, Cols: cols, X: dx, Ldx: ldx, Quants: dq, Scales: dd, Bias: bp, Accumulate: epi != "store", Ldy: ldy}
					picked, _, _ := kern.GemmQKernel(fam, rows, cols, T)
					for ti, tile := range append([]kern.GemmQTile{{Suffix: "picked"}}, kern.GemmQTiles(fam)...) {
						name := picked
						if ti > 0 {
							name = "gemmq_" + fam + tile.Suffix
							if (tile.Small() || tile.Wide()) && tile.BM < T && T > 100 {
								continue // the small and wide tiles over several token blocks: up to T = 100 here
							}
						}
						y0 := r.vec((maxT+1)*ldy, 1)
						dy := g.f32(y0)
						gq.Y = dy
						gq.ForceTile, gq.Tile = ti > 0, tile.Suffix
						g.run(func(l *kern.Launcher) error { return l.GemmQ(dt, gq, T) })
						if epi == "store" && (ti == 0 || tile.Wide() && tile.KS == 1) {
							perm := kern.GemmQPerm(fam, strings.TrimPrefix(picked, "gemmq_"+fam))
							if ti > 0 {
								perm = kern.GemmQPerm(fam, tile.Suffix)
							}
							checkActQuant(t, g, dq, dd, xe[:T], cols, perm)
						}
						got := g.readF32(dy, (maxT+1)*ldy)
						for ti := range maxT + 1 {
							for o := range ldy {
								gv, y := got[ti*ldy+o], y0[ti*ldy+o]
								if ti >= T || o >= rows {
									if gv != y {
										t.Fatalf("%s %dx%d T=%d %s: y[%d][%d] outside the product written", name, rows, cols, T, epi, ti, o)
									}
									continue
								}
								if !check(o) {
									continue
								}
								want, mag := ref[ti*rows+o], refMag[ti*rows+o]
								if epi != "store" {
									want += float64(bias[o]) + float64(y)
									mag += math.Abs(float64(bias[o])) + math.Abs(float64(y))
								}
								if d := math.Abs(float64(gv) - want); d > 1e-5*mag+1e-7 || math.IsNaN(float64(gv)) {
									t.Fatalf("%s %dx%d T=%d %s: y[%d][%d] = %g, reference %g (|diff| %g, scale %g)",
										name, rows, cols, T, epi, ti, o, gv, want, d, mag)
								}
							}
						}
					}
				}
			}
		}
	}
}

// checkActQuant compares gemmq_actq's quants·scales with kern.ActQuant's
// values exactly, in quant order perm (kern.QuantPos).
func checkActQuant(t *testing.T, g *gpu, dq, dd driver.DevicePtr, xe [][]float64, cols int, perm int) {
	t.Helper()
	T, nb := len(xe), cols/32
	q := g.readBytes(dq, T*cols)
	d := g.readF32(dd, T*nb)
	for ti, row := range xe {
		for k, want := range row {
			p := k&^31 + kern.QuantPos(k&31, perm)
			if got := float64(int8(q[ti*cols+p])) * float64(d[ti*nb+k/32]); got != want {
				t.Fatalf("gemmq_actq (perm %d) row %d element %d: q·d = %g, ActQuant %g", perm, ti, k, got, want)
			}
		}
	}
}

// BenchmarkGPUGemmQ times the int8 GEMM (gemmq_actq + the tile
// GemmQKernel picks, as the forward pass queues them) on the 8B model's
// MLP and attention shapes (14336×4096, 4096×4096) at T = 16, 64 (batched
// decode) and 512 (prefill), q4tp and q8_row, with CUDA events over 10
// calls a sample; "base" is the bf16 GEMM at the same shape (T > 8:
// kern.GemmKernel's tile, the path with Options.NoMMQ) for a direct
// comparison, and tile<suffix> forces each int8 tile of kern.GemmQTiles
// (tile128 the 128 × 128 one; the small-batch _s* tiles where T fits
// them, the 64-token ones also at T = 512), all in the same run so that their ratios set GemmQKernel's
// choice ("mmq" is the one it picks). TFLOP/s counts 2·rows·cols·T a
// call. The bars: 64 streams of the 8B q4tp model at ≥ 7,700
// tok/s aggregate (T = 64) and pp512 near llama.cpp's 10,650 tok/s.
func BenchmarkGPUGemmQ(b *testing.B) {
	d, m := benchGPU(b)
	const launches = 10
	for _, dt := range []quant.DType{quant.Q4TP, quant.Q8Row} {
		for _, sh := range [][2]int{{14336, 4096}, {4096, 4096}} {
			rows, cols := sh[0], sh[1]
			nb, _ := quant.ExpectedBytes(dt, []int{rows, cols})
			for _, T := range []int{16, 64, 512} {
				paths := []string{"mmq", "base"}
				if dt == quant.Q4TP && T <= 64 {
					paths = append(paths, "f16") // the half wide tile (GemmQ.F16, Options.F16Wide)
				}
				for _, tl := range kern.GemmQTiles(kernName[dt]) {
					if tl.Small() && tl.BM < T && tl.BM < 64 {
						continue // the 64-token small tiles also at T = 512
					}
					if tl.Wide() && (T > 64 || tl.BM < T || tl.BM >= 2*T && tl.BM > 16) {
						continue // the wide tiles of the picked token count, every cluster size
					}
					paths = append(paths, "tile"+map[bool]string{true: "128", false: tl.Suffix}[tl.Suffix == ""])
				}
				for _, path := range paths {
					pick, _, _ := kern.GemmQKernel(kernName[dt], rows, cols, T)
					if path == "base" {
						pick, _, _ = kern.GemmKernel(kernName[dt], rows, T)
					}
					b.Run(fmt.Sprintf("%s/%dx%d/T%d/%s", dt, rows, cols, T, path), func(b *testing.B) {
						var w, x, y, q, s driver.DevicePtr
						nq, ns := kern.GemmQScratch(cols, T)
						queue := func(c *driver.Ctx) error {
							l := m.On(c, 0, false)
							g := kern.GemmQ{W: w, Rows: rows, Cols: cols, X: x, Ldx: cols, Quants: q, Scales: s, Y: y, Ldy: rows}
							switch path {
							case "base":
								return l.Gemm(dt, w, rows, cols, x, cols, y, rows, T, 0, false)
							case "mmq":
							case "f16":
								g.F16 = true
							case "tile128":
								g.ForceTile = true
							default: // one tile forced: for the thresholds
								g.ForceTile, g.Tile = true, strings.TrimPrefix(path, "tile")
							}
							return l.GemmQ(dt, g, T)
						}
						err := d.Do(func(c *driver.Ctx) error {
							var err error
							if w, err = c.Alloc(nb); err != nil {
								return err
							}
							c.MemsetD8(w, 0x11, nb) // finite weights in every format
							x, y, q, s = gemmBenchBufs(c, T, rows, cols, nq, ns)
							return queue(c) // warm-up
						})
						defer d.Do(func(c *driver.Ctx) error {
							for _, p := range []driver.DevicePtr{w, x, y, q} {
								c.Free(p)
							}
							return c.Free(s)
						})
						if err != nil {
							b.Fatal(err)
						}
						ms := timeLaunches(b, d, launches, func(c *driver.Ctx) error { return queue(c) })
						flops := 2 * float64(rows) * float64(cols) * float64(T)
						sec := float64(ms) / 1e3
						b.SetBytes(nb * launches)
						b.ReportMetric(flops*launches*float64(b.N)/sec/1e12, "TFLOP/s")
						b.ReportMetric(sec/float64(b.N*launches)*1e6, "µs/call")
						b.Logf("%s (the default path's kernel, or the int8 tile GemmQKernel picks: %s)", path, pick)
					})
				}
			}
		}
	}
}

// TestGPUGemmQStacked: one wide launch over two or three tensors of one
// width (q|k|v, gate|up: kern.GemmQ.More), rows 130, 37 and 256 (not
// multiples of the 128-row tiles), T = 9, 33, 64 and, on the stacked
// 64-token tile (kern.GemmQStacked), 100 and 200, store and
// bias+accumulate, each tensor's outputs in its own columns of Y against
// float64 sums (TestGPUGemmQParity's tolerance), Y's padding untouched.
func TestGPUGemmQStacked(t *testing.T) {
	g := newGPU(t)
	r := rng(23)
	const cols = 1056
	parts := []int{130, 37, 256}
	for _, dt := range []quant.DType{quant.Q8Row, quant.Q4TP} {
		for _, np := range []int{2, 3} {
			total := 0
			var wds [][]float32
			var dws, dbs []driver.DevicePtr
			var biases [][]float32
			for _, rows := range parts[:np] {
				wb, err := quant.Encode(dt, r.vec(rows*cols, 0.05), []int{rows, cols}, nil)
				if err != nil {
					t.Fatal(err)
				}
				wd, _ := quant.Decode(dt, wb, []int{rows, cols})
				wds, dws = append(wds, wd), append(dws, g.upload(wb))
				b := r.vec(rows, 0.1)
				biases, dbs = append(biases, b), append(dbs, g.f32(b))
				total += rows
			}
			const maxT = 200
			ldx, ldy := cols+4, total+3
			x := r.vec(maxT*ldx, 1)
			dx := g.f32(x)
			nq, ns := kern.GemmQScratch(cols, maxT)
			dq, dd := g.upload(make([]byte, nq)), g.upload(make([]byte, ns))
			for _, T := range []int{9, 33, 64, 100, 200} {
				for _, epi := range []string{"store", "bias+accumulate"} {
					acc := epi != "store"
					gq := kern.GemmQ{W: dws[0], Rows: parts[0], Cols: cols, X: dx, Ldx: ldx, Quants: dq, Scales: dd, Ldy: ldy, Accumulate: acc}
					if acc {
						gq.Bias = dbs[0]
					}
					for j := 1; j < np; j++ {
						p := kern.GemmQPart{W: dws[j], Rows: parts[j]}
						if acc {
							p.Bias = dbs[j]
						}
						gq.More = append(gq.More, p)
					}
					if s := gq.Suffix(kern.MoEExpertFamily(dt), T); (T > 64) != (s == kern.GemmQStacked) {
						t.Fatalf("%s %d parts T=%d: tile %q", dt, np, T, s)
					}
					y0 := r.vec((maxT+1)*ldy, 1)
					gq.Y = g.f32(y0)
					g.run(func(l *kern.Launcher) error { return l.GemmQ(dt, gq, T) })
					got := g.readF32(gq.Y, (maxT+1)*ldy)
					for ti := range maxT + 1 {
						var xe []float64
						if ti < T {
							xe = kern.ActQuant(x[ti*ldx : ti*ldx+cols])
						}
						col := 0
						for j, rows := range append(parts[:np:np], ldy-total) {
							for o := range rows {
								gv, y := got[ti*ldy+col+o], y0[ti*ldy+col+o]
								if ti >= T || j == np {
									if gv != y {
										t.Fatalf("%s %d parts T=%d %s: y[%d][%d] outside the product written", dt, np, T, epi, ti, col+o)
									}
									continue
								}
								var want, mag float64
								for k, v := range xe {
									p := float64(wds[j][o*cols+k]) * v
									want += p
									mag += math.Abs(p)
								}
								if acc {
									want += float64(biases[j][o]) + float64(y)
									mag += math.Abs(float64(biases[j][o])) + math.Abs(float64(y))
								}
								if d := math.Abs(float64(gv) - want); d > 1e-5*mag+1e-7 || math.IsNaN(float64(gv)) {
									t.Fatalf("%s %d parts T=%d %s: part %d y[%d][%d] = %g, reference %g", dt, np, T, epi, j, ti, o, gv, want)
								}
							}
							col += rows
						}
					}
				}
			}
		}
	}
}

// TestGPUGemmHParity: the half wide tiles (kern.GemmQ.F16: gemmh_acth,
// then gemmh_q4tp_w*, the one GemmQSuffix picks and every tile forced)
// over q4tp, rows 37/130/4096 × cols 96/1056/4096 and a stack of three
// tensors (130, 37, 256 rows), T = 1, 9, 16, 33, 64, store and
// bias+accumulate, against float64 sums of kern.GemmHWeights × the
// activations rounded by kern.GemmHActivation, tolerance 1e-5 of Σ|terms|
// plus one f16 ulp on two groups' terms (the GPU's exp2f may round a scaled
// rung the other way);
// gemmh_acth's output is checked bit for bit (f16 of each x in the
// documented order, with values past f16's range saturated), Y's padding
// and rows past T untouched.
func TestGPUGemmHParity(t *testing.T) {
	g := newGPU(t)
	r := rng(29)
	bf := func(x float32) float64 { return float64(kern.GemmHActivation(x)) }
	for _, sh := range [][]int{{37, 96}, {130, 1056}, {4096, 4096}, {130, 1056, 37, 256}} {
		cols := sh[1]
		parts := append([]int{sh[0]}, sh[2:]...)
		total := 0
		var wds [][]float32
		var dws []driver.DevicePtr
		for _, rows := range parts {
			wb, err := quant.Encode(quant.Q4TP, r.vec(rows*cols, 0.05), []int{rows, cols}, nil)
			if err != nil {
				t.Fatal(err)
			}
			wd, err := kern.GemmHWeights(wb, rows, cols)
			if err != nil {
				t.Fatal(err)
			}
			wds, dws = append(wds, wd), append(dws, g.upload(wb))
			total += rows
		}
		const maxT = 64
		ldx, ldy := cols+4, total+3
		x := r.vec(maxT*ldx, 1)
		x[3], x[ldx+9] = 1e6, -7e4 // past f16's range: saturated
		dx := g.f32(x)
		bias := r.vec(total, 0.1)
		dq := g.upload(make([]byte, kern.GemmHScratch(cols, maxT)))
		check := func(o int) bool { return total < 4096 || o%7 == 0 || o == total-1 }
		// refGrp: the largest Σ|terms| of one group, for a scaled rung that
		// the GPU's exp2f rounds to the next f16 (one ulp, 2^-11, on a group).
		ref, refMag, refGrp := make([]float64, maxT*total), make([]float64, maxT*total), make([]float64, maxT*total)
		for ti := range maxT {
			col := 0
			for j, rows := range parts {
				for o := range rows {
					if !check(col + o) {
						continue
					}
					var sum, mag, gmax float64
					for g0 := 0; g0 < cols; g0 += 32 {
						var gm float64
						for k := g0; k < g0+32; k++ {
							p := float64(wds[j][o*cols+k]) * bf(x[ti*ldx+k])
							sum += p
							gm += math.Abs(p)
						}
						mag, gmax = mag+gm, max(gmax, gm)
					}
					ref[ti*total+col+o], refMag[ti*total+col+o], refGrp[ti*total+col+o] = sum, mag, gmax
				}
				col += rows
			}
		}
		dbs := make([]driver.DevicePtr, len(parts))
		col := 0
		for j, rows := range parts {
			dbs[j] = g.f32(bias[col : col+rows])
			col += rows
		}
		for _, T := range []int{1, 9, 16, 33, 64} {
			for _, epi := range []string{"store", "bias+accumulate"} {
				acc := epi != "store"
				gq := kern.GemmQ{W: dws[0], Rows: parts[0], Cols: cols, X: dx, Ldx: ldx, Quants: dq, Ldy: ldy, Accumulate: acc, F16: true}
				if acc {
					gq.Bias = dbs[0]
				}
				for j := 1; j < len(parts); j++ {
					p := kern.GemmQPart{W: dws[j], Rows: parts[j]}
					if acc {
						p.Bias = dbs[j]
					}
					gq.More = append(gq.More, p)
				}
				for ti, tile := range append([]kern.GemmQTile{{Suffix: "picked"}}, kern.GemmHTiles()...) {
					if ti > 0 && (tile.BM < T || total >= 4096 && tile.KS != 8) {
						continue
					}
					y0 := r.vec((maxT+1)*ldy, 1)
					gq.Y = g.f32(y0)
					gq.ForceTile, gq.Tile = ti > 0, tile.Suffix
					g.run(func(l *kern.Launcher) error { return l.GemmQ(quant.Q4TP, gq, T) })
					if ti == 0 && epi == "store" {
						xb := g.readBytes(dq, 2*T*cols)
						for tt := range T {
							for k := range cols {
								m, q := k&7, (k&31)>>3
								h := uint16(xb[2*(tt*cols+k&^31+2*q+m>>2+8*(m&3))]) | uint16(xb[2*(tt*cols+k&^31+2*q+m>>2+8*(m&3))+1])<<8
								if got := float64(half.F16ToF32(h)); got != bf(x[tt*ldx+k]) {
									t.Fatalf("gemmh_acth row %d element %d: %g, want f16 %g", tt, k, got, bf(x[tt*ldx+k]))
								}
							}
						}
					}
					got := g.readF32(gq.Y, (maxT+1)*ldy)
					for ti2 := range maxT + 1 {
						for o := range ldy {
							gv, y := got[ti2*ldy+o], y0[ti2*ldy+o]
							if ti2 >= T || o >= total {
								if gv != y {
									t.Fatalf("%v T=%d %s %s: y[%d][%d] outside the product written", sh, T, epi, tile.Suffix, ti2, o)
								}
								continue
							}
							if !check(o) {
								continue
							}
							want, mag := ref[ti2*total+o], refMag[ti2*total+o]
							if acc {
								want += float64(bias[o]) + float64(y)
								mag += math.Abs(float64(bias[o])) + math.Abs(float64(y))
							}
							// f32 sums, and up to two groups' rungs one f16 ulp off.
							if d := math.Abs(float64(gv) - want); d > 1e-5*mag+2*0x1p-11*refGrp[ti2*total+o]+1e-7 || math.IsNaN(float64(gv)) {
								t.Fatalf("%v T=%d %s %s: y[%d][%d] = %g, reference %g (|diff| %g, scale %g)", sh, T, epi, tile.Suffix, ti2, o, gv, want, d, mag)
							}
						}
					}
				}
			}
		}
	}
}

// gemmBenchBufs allocates the GEMM benchmarks' activations x (T×cols, all
// 1/128), output y (T×rows), quant scratch q (int8 or f16, whichever is
// larger) and scales s.
func gemmBenchBufs(c *driver.Ctx, T, rows, cols int, nq, ns int64) (x, y, q, s driver.DevicePtr) {
	x, _ = c.Alloc(4 * int64(T*cols))
	y, _ = c.Alloc(4 * int64(T*rows))
	q, _ = c.Alloc(max(nq, kern.GemmHScratch(cols, T)))
	s, _ = c.Alloc(ns)
	c.MemsetD32(x, 0x3c000000, int64(T*cols))
	return x, y, q, s
}

// BenchmarkGPUGemmQCold times the int8 GEMM at the 8B model's four
// projection shapes (q|k|v stacked 6144×4096, o 4096×4096, gate|up stacked
// 28672×4096, down 4096×14336) with the weights read from device memory,
// not L2: each launch takes the next of enough copies of the weights to
// pass 256 MB, as a decode step streams every layer's weights once.
// T = 16 and 64, the wide tiles at every cluster size and the default
// pick (gemmq_actq included, as in BenchmarkGPUGemmQ). GB/s counts the
// weight bytes.
func BenchmarkGPUGemmQCold(b *testing.B) {
	d, m := benchGPU(b)
	const launches = 16
	dt := quant.Q4TP
	for _, sh := range []struct {
		name       string
		rows, cols int
	}{{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gateup", 28672, 4096}, {"down", 4096, 14336}} {
		rows, cols := sh.rows, sh.cols
		nb, _ := quant.ExpectedBytes(dt, []int{rows, cols})
		copies := int(max(2, (256<<20)/nb+1))
		for _, T := range []int{16, 64} {
			paths := []string{"mmq", "f16"}
			for _, tl := range kern.GemmQTiles(kernName[dt]) {
				if tl.Wide() && tl.BM >= T && (tl.BM < 2*T || tl.BM <= 16) {
					paths = append(paths, "tile"+tl.Suffix)
				}
			}
			for _, tl := range kern.GemmHTiles() {
				if tl.BM >= T && (tl.BM < 2*T || tl.BM <= 16) {
					paths = append(paths, "f16tile"+tl.Suffix)
				}
			}
			for _, path := range paths {
				pick, _, _ := kern.GemmQKernel(kernName[dt], rows, cols, T)
				b.Run(fmt.Sprintf("%s/%dx%d/T%d/%s", sh.name, rows, cols, T, path), func(b *testing.B) {
					ws := make([]driver.DevicePtr, copies)
					var x, y, q, s driver.DevicePtr
					nq, ns := kern.GemmQScratch(cols, T)
					next := 0
					queue := func(c *driver.Ctx) error {
						l := m.On(c, 0, false)
						g := kern.GemmQ{W: ws[next%copies], Rows: rows, Cols: cols, X: x, Ldx: cols, Quants: q, Scales: s, Y: y, Ldy: rows}
						next++
						switch {
						case path == "f16":
							g.F16 = true
						case strings.HasPrefix(path, "f16tile"):
							g.F16, g.ForceTile, g.Tile = true, true, strings.TrimPrefix(path, "f16tile")
						case path != "mmq":
							g.ForceTile, g.Tile = true, strings.TrimPrefix(path, "tile")
						}
						return l.GemmQ(dt, g, T)
					}
					err := d.Do(func(c *driver.Ctx) error {
						for i := range ws {
							var err error
							if ws[i], err = c.Alloc(nb); err != nil {
								return err
							}
							c.MemsetD8(ws[i], 0x11, nb)
						}
						x, y, q, s = gemmBenchBufs(c, T, rows, cols, nq, ns)
						return queue(c) // warm-up
					})
					defer d.Do(func(c *driver.Ctx) error {
						for _, p := range append(ws, x, y, q) {
							c.Free(p)
						}
						return c.Free(s)
					})
					if err != nil {
						b.Fatal(err)
					}
					ms := timeLaunches(b, d, launches, queue)
					sec := float64(ms) / 1e3
					b.SetBytes(nb * launches)
					b.ReportMetric(float64(nb)*launches*float64(b.N)/sec/1e9, "GB/s")
					b.ReportMetric(sec/float64(b.N*launches)*1e6, "µs/call")
					b.Logf("%s (the default pick: %s)", path, pick)
				})
			}
		}
	}
}

// TestGPUActQuantPro: the int8 GEMM with the RMSNorm (plain and
// zero-centred) or SwiGLU in its quantizer (GemmQ.Pro: gemmq_actq_pro)
// gives the same bits as rmsnorm or silu_mul into a buffer and then the
// plain GEMM, q8_row and q4tp, T = 9, 33 and 64, on the wide tiles the
// decode steps use; so do the half wide tiles (GemmQ.F16: gemmh_acth's
// prologues) for q4tp at T = 33 and 64; widths 1024 and 9216.
func TestGPUActQuantPro(t *testing.T) {
	g := newGPU(t)
	r := rng(31)
	const rows, maxT = 256, 64
	for _, cols := range []int{1024, 9216} {
		x := r.vec(maxT*2*cols, 1) // two halves a row: gate | up for SwiGLU
		nw := r.vec(cols, 0.5)
		dx, dnw := g.f32(x), g.f32(nw)
		dtmp := g.zeros(maxT * cols)
		nq, ns := kern.GemmQScratch(cols, maxT)
		dq, dd := g.upload(make([]byte, max(nq, kern.GemmHScratch(cols, maxT)))), g.upload(make([]byte, ns))
		dy0, dy1 := g.zeros(maxT*rows), g.zeros(maxT*rows)
		for _, dt := range []quant.DType{quant.Q8Row, quant.Q4TP} {
			wb, err := quant.Encode(dt, r.vec(rows*cols, 0.05), []int{rows, cols}, nil)
			if err != nil {
				t.Fatal(err)
			}
			dw := g.upload(wb)
			for _, half := range []bool{false, true} {
				if half && dt != quant.Q4TP {
					continue
				}
				for _, T := range []int{9, 33, 64} {
					if half && T < 33 {
						continue
					}
					for _, pro := range []int{kern.ProNorm, kern.ProNorm1, kern.ProSilu} {
						fused := kern.GemmQ{W: dw, Rows: rows, Cols: cols, X: dx, Ldx: 2 * cols, Quants: dq, Scales: dd, Y: dy1, Ldy: rows,
							Pro: pro, ProU: dx.Add(4 * int64(cols)), ProW: dnw, ProEps: 1e-5, F16: half}
						plain := kern.GemmQ{W: dw, Rows: rows, Cols: cols, X: dtmp, Ldx: cols, Quants: dq, Scales: dd, Y: dy0, Ldy: rows, F16: half}
						g.run(func(l *kern.Launcher) error {
							var err error
							if pro == kern.ProSilu {
								err = l.SiluMul(dx, dx.Add(4*int64(cols)), 2*cols, dtmp, cols, cols, T)
							} else {
								err = l.RMSNorm(dx, 2*cols, dnw, dtmp, cols, cols, T, 1e-5, pro == kern.ProNorm1)
							}
							if err != nil {
								return err
							}
							if err := l.GemmQ(dt, plain, T); err != nil {
								return err
							}
							return l.GemmQ(dt, fused, T)
						})
						want, got := g.readF32(dy0, T*rows), g.readF32(dy1, T*rows)
						nonzero := false
						for i := range want {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("%s cols %d half %v T%d prologue %d: y[%d] = %g fused, %g after the separate kernel", dt, cols, half, T, pro, i, got[i], want[i])
							}
							nonzero = nonzero || want[i] != 0
						}
						if !nonzero {
							t.Fatalf("%s cols %d T%d prologue %d: all outputs zero", dt, cols, T, pro)
						}
					}
				}
			}
		}
	}
}

// TestGPUGemmHSwiGLU: gate|up on the half wide tiles with SwiGLU in the
// epilogue (GemmQ.SwiGLU) writes the same f16 bits as gate|up into Y and
// then gemmh_acth's SwiGLU prologue (the down projection's input), for
// T = 33 and 64, rows 512 and 1088 (a partial 64-row block), every
// 64-token tile forced (each cluster size, the token-split and 4-group
// ones), with biases and the RMSNorm prologue on the input.
func TestGPUGemmHSwiGLU(t *testing.T) {
	g := newGPU(t)
	r := rng(41)
	const cols, maxT = 1024, 64
	x := r.vec(maxT*cols, 1)
	nw := r.vec(cols, 0.5)
	dx, dnw := g.f32(x), g.f32(nw)
	dq := g.upload(make([]byte, kern.GemmHScratch(cols, maxT)))
	for _, I := range []int{512, 1088} {
		var dws [2]driver.DevicePtr
		var dbs [2]driver.DevicePtr
		for j := range dws {
			wb, err := quant.Encode(quant.Q4TP, r.vec(I*cols, 0.05), []int{I, cols}, nil)
			if err != nil {
				t.Fatal(err)
			}
			dws[j], dbs[j] = g.upload(wb), g.f32(r.vec(I, 0.1))
		}
		wd, err := quant.Encode(quant.Q4TP, r.vec(64*I, 0.05), []int{64, I}, nil)
		if err != nil {
			t.Fatal(err)
		}
		dwd := g.upload(wd)
		dy := g.zeros(maxT * 2 * I)
		dh0 := g.upload(make([]byte, kern.GemmHScratch(I, maxT)))
		dh1 := g.upload(make([]byte, kern.GemmHScratch(I, maxT)))
		for _, T := range []int{33, 64} {
			tiles := []string{""}
			for _, tl := range kern.GemmHTiles() {
				if tl.BM == 64 {
					tiles = append(tiles, tl.Suffix)
				}
			}
			for _, tile := range tiles {
				gu := kern.GemmQ{W: dws[0], Rows: I, Cols: cols, X: dx, Ldx: cols, Quants: dq, Y: dy, Ldy: 2 * I, Bias: dbs[0],
					More: []kern.GemmQPart{{W: dws[1], Rows: I, Bias: dbs[1]}}, F16: true, Pro: kern.ProNorm, ProW: dnw, ProEps: 1e-5,
					ForceTile: tile != "", Tile: tile}
				fused := gu
				fused.SwiGLU, fused.Ldh = dh1, I
				// down's input the unfused way: gemmh_acth's SwiGLU prologue over Y (into dh0).
				down := kern.GemmQ{W: dwd, Rows: 64, Cols: I, X: dy, Ldx: 2 * I, Quants: dh0, Y: g.zeros(maxT * 64), Ldy: 64, F16: true,
					Pro: kern.ProSilu, ProU: dy.Add(4 * int64(I))}
				g.run(func(l *kern.Launcher) error {
					if err := l.GemmQ(quant.Q4TP, gu, T); err != nil {
						return err
					}
					if err := l.GemmQ(quant.Q4TP, down, T); err != nil { // (its product is not checked)
						return err
					}
					return l.GemmQ(quant.Q4TP, fused, T)
				})
				want, got := g.readBytes(dh0, 2*T*I), g.readBytes(dh1, 2*T*I)
				nonzero := false
				for i := 0; i < len(want); i += 2 {
					if want[i] != got[i] || want[i+1] != got[i+1] {
						t.Fatalf("I %d T%d tile %q: h element %d is %#04x fused, %#04x through Y and gemmh_acth", I, T, tile, i/2,
							uint16(got[i])|uint16(got[i+1])<<8, uint16(want[i])|uint16(want[i+1])<<8)
					}
					nonzero = nonzero || want[i] != 0 || want[i+1] != 0
				}
				if !nonzero {
					t.Fatalf("I %d T%d tile %q: h all zero", I, T, tile)
				}
			}
		}
	}
}

// TestGPUClusterCaps: the driver answers how many clusters of each
// compiled size the wide tiles run at once (Load's query, which
// GemmQWideKS picks with), each within the device's block slots and no
// more for a larger cluster; on an H200 (132 SMs) the answers are
// H200ClusterCaps, the CPU-side default.
func TestGPUClusterCaps(t *testing.T) {
	g := newGPU(t)
	if g.m.ClusterCapsErr != nil {
		t.Fatalf("cluster occupancy query: %v", g.m.ClusterCapsErr)
	}
	caps, sms := g.m.ClusterCaps, g.d.Info().SMs
	t.Logf("%s, %d SMs: clusters at once by size %v", g.d.Info().Name, sms, caps[1:])
	prev := 1 << 30
	for _, ks := range []int{1, 2, 4, 7, 8} {
		if caps[ks] <= 0 || caps[ks]*ks > 2*sms || caps[ks] > prev {
			t.Errorf("%d clusters of %d on %d SMs (after %d of the next smaller size)", caps[ks], ks, sms, prev)
		}
		prev = caps[ks]
		if sms == 132 && caps[ks] != kern.H200ClusterCaps[ks] {
			t.Errorf("132 SMs: %d clusters of %d, H200ClusterCaps says %d", caps[ks], ks, kern.H200ClusterCaps[ks])
		}
	}
	if kern.CurrentClusterCaps() != caps {
		t.Errorf("Load left the process's caps %v, the device's %v", kern.CurrentClusterCaps(), caps)
	}
}
