package kernels

import (
	"fmt"
	"math/rand/v2"
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
					jobs, want = append(jobs, MatVecJob{m, x, y}), append(want, w)
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
