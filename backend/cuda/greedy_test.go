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
