package kernels

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestMatVecsEqualsMatVec runs several products of mixed formats and
// shapes (some sharing an input, odd row counts) as one MatVecs and checks
// each result is bit-identical to its own MatVec.
func TestMatVecsEqualsMatVec(t *testing.T) {
	pool := NewPool(2)
	defer pool.Close()
	r := rand.New(rand.NewPCG(8, 9))
	for round := range 3 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			x1, x2 := randVec(r, 256), randVec(r, 96)
			var jobs []MatVecJob
			var want [][]float32
			for _, d := range floatFormats {
				for _, sh := range [][2]int{{13, 256}, {64, 256}, {5, 96}} {
					m, _ := randMat(t, r, d, sh[0], sh[1])
					x := x1
					if sh[1] == 96 {
						x = x2
					}
					y := make([]float32, sh[0])
					w := make([]float32, sh[0])
					pool.MatVec(m, x, w)
					jobs, want = append(jobs, MatVecJob{M: m, X: x, Y: y}), append(want, w)
				}
			}
			pool.MatVecs(jobs)
			for i, j := range jobs {
				for r := range want[i] {
					if j.Y[r] != want[i][r] {
						t.Fatalf("job %d (%s %d×%d) row %d: %v, MatVec %v", i, j.M.DType, j.M.Rows, j.M.Cols, r, j.Y[r], want[i][r])
					}
				}
			}
		})
	}
}

// TestMatVecsUp checks jobs whose input is SiLU(X)⊙Up, readied inside the
// operation by whichever worker reaches them first: each result equals
// SiLUMul then MatVec bit for bit, X holds the SwiGLU afterwards, and jobs
// without Up sharing an input slice are unaffected. Pools of 1..4 workers;
// jobs of a few rows (the work is above minParallelWork) so that workers
// meet on one job's input.
func TestMatVecsUp(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 11))
	for _, workers := range []int{1, 2, 4} {
		pool := NewPool(workers)
		for round := range 4 {
			x := randVec(r, 512)
			var jobs []MatVecJob
			var want [][]float32
			var glu [][]float32
			for i, d := range floatFormats {
				rows := []int{7, 64, 33}[i%3]
				m, _ := randMat(t, r, d, rows, 512)
				w := make([]float32, rows)
				if i%2 == 0 {
					g, u := randVec(r, 512), randVec(r, 512)
					h := append([]float32(nil), g...)
					SiLUMul(h, u)
					pool.MatVec(m, h, w)
					jobs, want, glu = append(jobs, MatVecJob{M: m, X: g, Y: make([]float32, rows), Up: u}), append(want, w), append(glu, h)
					continue
				}
				pool.MatVec(m, x, w)
				jobs, want, glu = append(jobs, MatVecJob{M: m, X: x, Y: make([]float32, rows)}), append(want, w), append(glu, nil)
			}
			pool.MatVecs(jobs)
			for i, j := range jobs {
				for o := range want[i] {
					if j.Y[o] != want[i][o] {
						t.Fatalf("%d workers, round %d, job %d (%s, up %v) row %d: %v, SiLUMul then MatVec %v", workers, round, i, j.M.DType, j.Up != nil, o, j.Y[o], want[i][o])
					}
				}
				if glu[i] != nil && !slices.Equal(j.X, glu[i]) {
					t.Fatalf("%d workers, job %d: X is not SiLU(X)⊙Up after the operation", workers, i)
				}
			}
		}
		pool.Close()
	}
}
