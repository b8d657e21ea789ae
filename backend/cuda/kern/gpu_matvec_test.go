package kern_test

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/quant"
)

// kernName is the matvec kernel family of a format (q8_2f runs as
// q82f_prescale + mv_q8row).
var kernName = map[quant.DType]string{
	quant.F32: "f32", quant.F16: "f16", quant.BF16: "bf16", quant.Q8Row: "q8row", quant.Q82F: "q8row", quant.Q4TP: "q4tp",
}

var embedName = map[quant.DType]string{
	quant.F32: "f32", quant.F16: "f16", quant.BF16: "bf16", quant.Q8Row: "q8row", quant.Q82F: "q82f", quant.Q4TP: "q4tp",
}

type mvShape struct{ rows, cols, ldxPad int }

func mvShapes(d quant.DType) []mvShape {
	if d == quant.Q4TP {
		// gpr 3 (one partial lane round), 33 (two rounds), 128; odd row counts; an ldx
		// that is not a multiple of 4 takes the element-wise activation loads.
		return []mvShape{{37, 96, 0}, {130, 1056, 0}, {5, 4096, 0}, {64, 256, 1}}
	}
	// 101 columns: rows that are not whole 16-byte chunks (element-wise path);
	// 1040: 65 chunks for q8, so lanes wrap; ldxPad 1: activations misaligned.
	return []mvShape{{64, 256, 0}, {37, 101, 0}, {130, 1040, 0}, {3, 4160, 0}, {64, 256, 1}}
}

// TestGPUMatvecParity: every format × shape × R = 1..9 activation rows
// (9: the float formats' one mm_*, the quantized ones' launches of 8 and
// of 1) × epilogue, against float64 sums of
// quant's decoded weights times the activations the kernel uses: float32
// for f32/f16/bf16, kern.ActQuant's int8 blocks for q8_row, q8_2f and q4tp.
func TestGPUMatvecParity(t *testing.T) {
	g := newGPU(t)
	r := rng(1)
	for _, dt := range []quant.DType{quant.F32, quant.F16, quant.BF16, quant.Q8Row, quant.Q82F, quant.Q4TP} {
		for _, sh := range mvShapes(dt) {
			rows, cols := sh.rows, sh.cols
			w := r.vec(rows*cols, 0.05)
			wb, err := quant.Encode(dt, w, []int{rows, cols}, nil)
			if err != nil {
				t.Fatal(err)
			}
			wd, _ := quant.Decode(dt, wb, []int{rows, cols})
			if dt == quant.Q82F {
				// The kernel: q8_row's quants and row scales on x ⊙ col.
				wd, _ = quant.Decode(quant.Q8Row, wb[:rows*cols+2*rows], []int{rows, cols})
			}
			dW := g.upload(wb)
			ldx := (cols+3)/4*4 + sh.ldxPad
			ldy := rows + 3
			const maxR = 9
			x := r.vec(maxR*ldx, 1)
			dx := g.f32(x)
			bias := r.vec(rows, 0.1)
			dbias := g.f32(bias)
			dxs := g.zeros(maxR * ldx)
			for R := 1; R <= maxR; R++ {
				for _, epi := range []string{"store", "bias+accumulate"} {
					y0 := r.vec(maxR*ldy, 1)
					dy := g.f32(y0)
					in := dx
					var bp driver.DevicePtr
					if epi != "store" {
						bp = dbias
					}
					g.run(func(l *kern.Launcher) error {
						if dt == quant.Q82F {
							if err := l.Q82FPrescale(dW, rows, cols, dx, ldx, dxs, ldx, R); err != nil {
								return err
							}
							in = dxs
						}
						return l.Matvec(dt, dW, rows, cols, in, ldx, dy, ldy, R, bp, epi != "store")
					})
					got := g.readF32(dy, maxR*ldy)
					for ri := range maxR {
						xr := x[ri*ldx : ri*ldx+cols]
						// q8_row, q8_2f and q4tp run on int8 activations
						// (kern.ActQuant; q8_2f's of x ⊙ col).
						xe := make([]float64, cols)
						for i, v := range xr {
							xe[i] = float64(v)
						}
						switch dt {
						case quant.Q8Row, quant.Q4TP:
							xe = kern.ActQuant(xr)
						case quant.Q82F:
							col := make([]float32, cols)
							off := quant.Q82FColOffset(rows, cols)
							for i := range col {
								col[i] = xr[i] * math.Float32frombits(binary.LittleEndian.Uint32(wb[off+int64(4*i):]))
							}
							xe = kern.ActQuant(col)
						}
						for o := range rows {
							gv := got[ri*ldy+o]
							if ri >= R {
								if gv != y0[ri*ldy+o] {
									t.Fatalf("%s %dx%d R=%d: row %d beyond R written", dt, rows, cols, R, ri)
								}
								continue
							}
							var want, mag float64
							for i, v := range xe {
								p := float64(wd[o*cols+i]) * v
								want += p
								mag += math.Abs(p)
							}
							if epi != "store" {
								want += float64(bias[o]) + float64(y0[ri*ldy+o])
								mag += math.Abs(float64(bias[o])) + math.Abs(float64(y0[ri*ldy+o]))
							}
							if d := math.Abs(float64(gv) - want); d > 1e-5*mag+1e-7 || math.IsNaN(float64(gv)) {
								t.Fatalf("%s %dx%d ldx %d R=%d %s: y[%d][%d] = %g, reference %g (|diff| %g, scale %g)",
									dt, rows, cols, ldx, R, epi, ri, o, gv, want, d, mag)
							}
						}
					}
				}
			}
		}
	}
}

// TestGPUFloatMatmul: mm_* and mm_*_t16 (float weights over more than 8 rows: prefill
// chunks through a float32 router or shared-expert gate) against float64
// sums of the decoded weights times the float32 activations, to 1e-5 of
// the products' magnitude, for T up to a 512-row chunk, a router's and a
// gate's shapes, rows of partial 16-byte chunks and misaligned activations
// (the element-wise path); padding columns of y and rows past T untouched.
func TestGPUFloatMatmul(t *testing.T) {
	g := newGPU(t)
	r := rng(71)
	type shape struct{ rows, cols, ldxPad, T int }
	// mm_*_t16 (fewer 32-token blocks than multiprocessors) for most;
	// mm_* for the last two (at least 132 blocks), one on element loads.
	shapes := []shape{{128, 2048, 0, 512}, {1, 2048, 0, 100}, {130, 1040, 0, 33}, {37, 101, 0, 9}, {64, 256, 1, 40}, {512, 96, 0, 64},
		{512, 96, 0, 512}, {600, 100, 0, 300}}
	for _, dt := range []quant.DType{quant.F32, quant.F16, quant.BF16} {
		for _, sh := range shapes {
			rows, cols, T := sh.rows, sh.cols, sh.T
			wb, err := quant.Encode(dt, r.vec(rows*cols, 0.05), []int{rows, cols}, nil)
			if err != nil {
				t.Fatal(err)
			}
			wd, _ := quant.Decode(dt, wb, []int{rows, cols})
			ldx, ldy := cols+sh.ldxPad, rows+3
			x, bias := r.vec((T+1)*ldx, 1), r.vec(rows, 0.1)
			dW, dx, dbias := g.upload(wb), g.f32(x), g.f32(bias)
			for _, acc := range []bool{false, true} {
				y0 := r.vec((T+1)*ldy, 1)
				dy := g.f32(y0)
				var bp driver.DevicePtr
				if acc {
					bp = dbias
				}
				g.run(func(l *kern.Launcher) error { return l.Matvec(dt, dW, rows, cols, dx, ldx, dy, ldy, T, bp, acc) })
				got := g.readF32(dy, (T+1)*ldy)
				for ti := range T + 1 {
					for o := range ldy {
						gv := got[ti*ldy+o]
						if ti == T || o >= rows {
							if gv != y0[ti*ldy+o] {
								t.Fatalf("%s %dx%d T=%d: y[%d][%d] outside the product written", dt, rows, cols, T, ti, o)
							}
							continue
						}
						var want, mag float64
						for i := range cols {
							p := float64(wd[o*cols+i]) * float64(x[ti*ldx+i])
							want += p
							mag += math.Abs(p)
						}
						if acc {
							want += float64(bias[o]) + float64(y0[ti*ldy+o])
							mag += math.Abs(float64(bias[o])) + math.Abs(float64(y0[ti*ldy+o]))
						}
						if d := math.Abs(float64(gv) - want); d > 1e-5*mag+1e-7 || math.IsNaN(float64(gv)) {
							t.Fatalf("%s %dx%d ldx %d T=%d acc %v: y[%d][%d] = %g, reference %g (|diff| %g, scale %g)",
								dt, rows, cols, ldx, T, acc, ti, o, gv, want, d, mag)
						}
					}
				}
			}
		}
	}
}

// TestGPUEmbedParity: the gather decodes rows exactly as quant.Decode (q4tp
// within exp2f's ulps); ids outside the table give zeros.
func TestGPUEmbedParity(t *testing.T) {
	g := newGPU(t)
	r := rng(2)
	for _, dt := range []quant.DType{quant.F32, quant.F16, quant.BF16, quant.Q8Row, quant.Q82F, quant.Q4TP} {
		rows, cols := 50, 96
		if dt != quant.Q4TP {
			cols = 99
		}
		w := r.vec(rows*cols, 0.3)
		wb, err := quant.Encode(dt, w, []int{rows, cols}, nil)
		if err != nil {
			t.Fatal(err)
		}
		wd, _ := quant.Decode(dt, wb, []int{rows, cols})
		ids := []int32{0, 49, 7, -1, 50, 7, 23, 1, 2}
		ldo := cols + 5
		dout := g.zeros(len(ids) * ldo)
		var a driver.Args
		a.Ptr(g.upload(wb)).Int(rows).Int(cols).Ptr(g.i32(ids)).Ptr(dout).Int(ldo)
		g.launch("embed_"+embedName[dt], driver.D1(len(ids)), driver.D1(256), 0, &a)
		got := g.readF32(dout, len(ids)*ldo)
		for k, id := range ids {
			for i := range cols {
				gv := got[k*ldo+i]
				var want float32
				if id >= 0 && int(id) < rows {
					want = wd[int(id)*cols+i]
				}
				tol := 0.0
				if dt == quant.Q4TP {
					tol = 4e-7 * math.Abs(float64(want))
				}
				if math.Abs(float64(gv-want)) > tol {
					t.Fatalf("%s: embed id %d col %d = %g, want %g", dt, id, i, gv, want)
				}
			}
		}
	}
}
