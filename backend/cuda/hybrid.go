package cuda

import (
	"fmt"

	"github.com/cortiq/cortiq/backend"
)

// The MoE and Gated DeltaNet blocks are not implemented on the GPU yet
// (issue 12, the GPU half): a step that uses them fails with this error,
// and NewSeq refuses a sequence with linear-attention state.

// MoE fails: not on the GPU yet.
func (st *state) MoE(w *backend.MoE) {
	st.fail(fmt.Errorf("cuda: the mixture-of-experts block: %w", backend.ErrUnsupported))
}

// DeltaNet fails: not on the GPU yet.
func (st *state) DeltaNet(w *backend.DeltaNet, layer int) {
	st.fail(fmt.Errorf("cuda: the Gated DeltaNet block (layer %d): %w", layer, backend.ErrUnsupported))
}
