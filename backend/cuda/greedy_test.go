package cuda

import (
	"testing"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/backendtest"
)

// TestGreedyIDsOnFake: the device's greedy ids (Batch.Next) equal the
// argmax of the logits of the same steps, on the fake device.
func TestGreedyIDsOnFake(t *testing.T) {
	backendtest.CheckGreedy(t, func() backend.Device {
		return fakeOpen(newFake(t, 4), Options{Seqs: 4, Ctx: 128, MaxRows: 64, Graphs: true})
	})
}
