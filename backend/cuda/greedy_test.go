package cuda

import (
	"testing"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/backendtest"
)

// TestGreedyIDsOnFake: the device's greedy ids (Batch.Next) equal the
// argmax of the logits of the same steps, and the rows Batch.LogitsOf asks
// for beside them equal the logits-only run's, on the fake device with the
// kernels' numeric models (without them every logit is 0 and every id 0,
// which proves nothing).
func TestGreedyIDsOnFake(t *testing.T) {
	backendtest.CheckGreedy(t, func() backend.Device {
		f := newFake(t, 4)
		f.numeric, f.decoded = true, map[string][]float32{}
		return fakeOpen(f, Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: true})
	})
}

// TestSinkPut: a stage piece that starts and ends inside rows lands in
// the right places of per-sequence rows (Batch.OutRows), as in one block.
func TestSinkPut(t *testing.T) {
	const V, R = 7, 5
	flat := make([]float32, V*R)
	rows := make([][]float32, R)
	for r := range rows {
		rows[r] = make([]float32, V+3) // longer than a row: the tail stays untouched
	}
	pieces := [][2]int{{0, 3}, {3, 11}, {14, 1}, {15, 20}}
	for _, p := range pieces {
		x := make([]float32, p[1])
		for i := range x {
			x[i] = float32(p[0] + i + 1)
		}
		sink{flat: flat}.put(p[0], x)
		sink{rows: rows, V: V}.put(p[0], x)
	}
	for r := range rows {
		for c := range V + 3 {
			want := float32(0)
			if c < V {
				want = flat[r*V+c]
			}
			if rows[r][c] != want {
				t.Fatalf("row %d col %d: %v, want %v", r, c, rows[r][c], want)
			}
		}
	}
	if flat[34] != 35 || flat[0] != 1 {
		t.Fatalf("flat %v", flat)
	}
}
