package kern_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/quant"
)

// TestGPUMatvecFused: the quantized-activation matvecs over three stacked
// tensors (q|k|v-like rows 40, 8, 8 side by side in y, each with its bias)
// and every prologue (plain, RMSNorm, zero-centred RMSNorm, SwiGLU), for
// q8_row (whole 16-byte rows and 100-column rows) and q4tp, R = 1..9,
// against float64 sums of the decoded weights times kern.ActQuant of the
// prologue computed on the CPU with the kernels' float32 arithmetic.
func TestGPUMatvecFused(t *testing.T) {
	g := newGPU(t)
	r := rng(21)
	rows := [3]int{40, 8, 8}
	N := rows[0] + rows[1] + rows[2]
	for _, tc := range []struct {
		dt   quant.DType
		cols int
	}{{quant.Q4TP, 256}, {quant.Q4TP, 96}, {quant.Q8Row, 256}, {quant.Q8Row, 100}} {
		cols := tc.cols
		var W [3]driver.DevicePtr
		var B [3]driver.DevicePtr
		wd := make([][]float32, 3)
		bias := make([][]float32, 3)
		for j := range 3 {
			wb, err := quant.Encode(tc.dt, r.vec(rows[j]*cols, 0.05), []int{rows[j], cols}, nil)
			if err != nil {
				t.Fatal(err)
			}
			wd[j], _ = quant.Decode(tc.dt, wb, []int{rows[j], cols})
			W[j] = g.upload(wb)
			bias[j] = r.vec(rows[j], 0.1)
			B[j] = g.f32(bias[j])
		}
		const maxR = 9
		ldx := 2*cols + 4 // room for the SwiGLU up half at xoff = cols + 4
		xoff := cols + 4
		x := r.vec(maxR*ldx, 1)
		nw := r.vec(cols, 0.3)
		dx, dnw := g.f32(x), g.f32(nw)
		ldy := N + 2
		for _, pro := range []int{kern.ProPlain, kern.ProNorm, kern.ProNorm1, kern.ProSilu} {
			for _, R := range []int{1, 2, 5, 8, 9} {
				name := fmt.Sprintf("%s %d cols pro %d R=%d", tc.dt, cols, pro, R)
				y0 := r.vec(maxR*ldy, 1)
				dy := g.f32(y0)
				acc := pro != kern.ProPlain
				m := kern.MQ{W: W, Rows: rows, Bias: B, Cols: cols, X: dx, Ldx: ldx, XOff: xoff, Y: dy, Ldy: ldy,
					Accumulate: acc, Norm: dnw, Eps: 1e-5, Pro: pro}
				g.run(func(l *kern.Launcher) error { return l.MatvecQ(tc.dt, m, R) })
				got := g.readF32(dy, maxR*ldy)
				for ri := range maxR {
					if ri >= R {
						for o := range N {
							if got[ri*ldy+o] != y0[ri*ldy+o] {
								t.Fatalf("%s: row %d beyond R written", name, ri)
							}
						}
						continue
					}
					xr := x[ri*ldx : ri*ldx+cols]
					xp := make([]float32, cols)
					switch pro {
					case kern.ProPlain:
						copy(xp, xr)
					case kern.ProNorm, kern.ProNorm1:
						refRMSNorm(xp, xr, nw, 1e-5, pro == kern.ProNorm1)
					case kern.ProSilu:
						for i, v := range xr {
							xp[i] = float32(float64(v)/(1+math.Exp(-float64(v)))) * x[ri*ldx+xoff+i]
						}
					}
					xe := kern.ActQuant(xp)
					// SwiGLU's expf and Go's exp may round a quant across a boundary.
					tol := 1e-5
					if pro == kern.ProSilu {
						tol = 3e-3
					}
					for o := range N {
						j, ol := 0, o
						for ol >= rows[j] {
							ol -= rows[j]
							j++
						}
						var want, mag float64
						for i, v := range xe {
							p := float64(wd[j][ol*cols+i]) * v
							want += p
							mag += math.Abs(p)
						}
						want += float64(bias[j][ol])
						mag += math.Abs(float64(bias[j][ol]))
						if acc {
							want += float64(y0[ri*ldy+o])
							mag += math.Abs(float64(y0[ri*ldy+o]))
						}
						gv := got[ri*ldy+o]
						if d := math.Abs(float64(gv) - want); d > tol*mag+1e-7 || math.IsNaN(float64(gv)) {
							t.Fatalf("%s: y[%d][%d] = %g, reference %g (|diff| %g, scale %g)", name, ri, o, gv, want, d, mag)
						}
					}
				}
			}
		}
	}
}
