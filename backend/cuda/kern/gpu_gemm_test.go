package kern_test

import (
	"math"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/quant"
)

// TestGPUGemmParity: the prefill GEMM, both tiles (gemm_<fmt> of 128
// tokens, gemm_<fmt>_t64 of 64), against a plain reference that applies
// the kernel's documented roundings (activations and non-q8 weights to
// bf16; q8 quants exact, row scale after the sum), so the only differences
// left are the order of float32 accumulation. ldx = cols takes the 16-byte
// activation loads where cols % 32 == 0, ldx = cols+1 the element-wise
// path; 130 rows and T = 100, 200 leave partial blocks in both directions.
func TestGPUGemmParity(t *testing.T) {
	g := newGPU(t)
	r := rng(12)
	for _, dt := range []quant.DType{quant.F32, quant.F16, quant.BF16, quant.Q8Row, quant.Q82F, quant.Q4TP} {
		shapes := [][2]int{{64, 256}, {37, 101}, {130, 1040}}
		if dt == quant.Q4TP {
			shapes = [][2]int{{64, 256}, {37, 96}, {130, 1056}}
		}
		for _, sh := range shapes {
			rows, cols := sh[0], sh[1]
			w := r.vec(rows*cols, 0.05)
			wb, err := quant.Encode(dt, w, []int{rows, cols}, nil)
			if err != nil {
				t.Fatal(err)
			}
			wd, _ := quant.Decode(dt, wb, []int{rows, cols})
			dW := g.upload(wb)
			for _, T := range []int{1, 9, 64, 100, 200} {
				for _, ldx := range []int{cols, cols + 1} {
					ldy := rows + 2
					x := r.vec(T*ldx, 1)
					bias := r.vec(rows, 0.1)
					y0 := r.vec(T*ldy, 1)
					dx := g.f32(x)
					in := dx
					var col []float32
					if dt == quant.Q82F {
						off := quant.Q82FColOffset(rows, cols)
						col = bytesf32(wb[off : off+int64(4*cols)])
						in = g.zeros(T * ldx)
						var a driver.Args
						a.Ptr(dW).I64(off).Int(cols).Ptr(dx).Int(ldx).Ptr(in).Int(ldx)
						g.launch("q82f_prescale", driver.D2((cols+255)/256, T), driver.D1(256), 0, &a)
					}
					want := make([]float64, T*rows)
					mags := make([]float64, T*rows)
					for ti := range T {
						for o := range rows {
							var sum, mag float64
							for i := range cols {
								xv := x[ti*ldx+i]
								var wv float32
								switch dt {
								case quant.Q8Row, quant.Q82F:
									wv = float32(int8(wb[o*cols+i]))
									if dt == quant.Q82F {
										xv *= col[i]
									}
								default:
									wv = half.RoundBF16(wd[o*cols+i])
								}
								p := float64(wv) * float64(half.RoundBF16(xv))
								sum += p
								mag += math.Abs(p)
							}
							if dt == quant.Q8Row || dt == quant.Q82F {
								s := float64(half.F16ToF32(uint16(wb[rows*cols+2*o]) | uint16(wb[rows*cols+2*o+1])<<8))
								sum, mag = sum*s, mag*s
							}
							want[ti*rows+o] = sum + float64(bias[o]) + float64(y0[ti*ldy+o])
							mags[ti*rows+o] = mag + math.Abs(float64(bias[o])) + math.Abs(float64(y0[ti*ldy+o]))
						}
					}
					dBias := g.f32(bias)
					for _, bm := range []int{128, 64} {
						name := "gemm_" + kernName[dt]
						if bm == 64 {
							name += "_t64"
						}
						dy := g.f32(y0)
						var a driver.Args
						a.Ptr(dW).Int(rows).Int(cols).Ptr(in).Int(ldx).Ptr(dy).Int(ldy).Int(T).Ptr(dBias).Int(1)
						g.launch(name, driver.D2((rows+127)/128, (T+bm-1)/bm), driver.D1(256), 0, &a)
						got := g.readF32(dy, T*ldy)
						for ti := range T {
							for o := range rows {
								tol := 1e-5
								if dt == quant.Q4TP {
									tol = 1e-4 // a rung one exp2f ulp off can round to the other bf16
								}
								gv, wv, mag := got[ti*ldy+o], want[ti*rows+o], mags[ti*rows+o]
								if math.Abs(float64(gv)-wv) > tol*mag+1e-7 || math.IsNaN(float64(gv)) {
									t.Fatalf("%s %dx%d T=%d ldx=%d: y[%d][%d] = %g, reference %g (scale %g)", name, rows, cols, T, ldx, ti, o, gv, wv, mag)
								}
							}
							for o := rows; o < ldy; o++ {
								if got[ti*ldy+o] != y0[ti*ldy+o] {
									t.Fatalf("%s %dx%d T=%d: y[%d][%d] past the outputs was written", name, rows, cols, T, ti, o)
								}
							}
						}
					}
				}
			}
		}
	}
}
