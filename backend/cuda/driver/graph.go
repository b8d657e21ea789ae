package driver

import "fmt"

// Graph is a captured CUgraph; GraphExec its executable instance.
type (
	Graph     uintptr
	GraphExec uintptr
)

// Capture modes (CUstreamCaptureMode).
const (
	CaptureGlobal      = 0
	CaptureThreadLocal = 1
	CaptureRelaxed     = 2
)

// BeginCapture starts recording the work queued on s (not running it).
func (c *Ctx) BeginCapture(s Stream, mode int) error {
	return c.call("cuStreamBeginCapture_v2", uintptr(s), uintptr(mode))
}

// EndCapture stops recording on s and returns the graph.
func (c *Ctx) EndCapture(s Stream) (Graph, error) {
	if err := c.call("cuStreamEndCapture", uintptr(s), c.out(0)); err != nil {
		return 0, err
	}
	return Graph(c.u64(0)), nil
}

// GraphNodes returns the number of nodes in g.
func (c *Ctx) GraphNodes(g Graph) (int, error) {
	if err := c.call("cuGraphGetNodes", uintptr(g), 0, c.out(0)); err != nil {
		return 0, err
	}
	return int(c.u64(0)), nil
}

// Instantiate makes an executable graph.
func (c *Ctx) Instantiate(g Graph) (GraphExec, error) {
	if err := c.call("cuGraphInstantiateWithFlags", c.out(0), uintptr(g), 0); err != nil {
		return 0, err
	}
	return GraphExec(c.u64(0)), nil
}

// GraphLaunch queues an executable graph on s.
func (c *Ctx) GraphLaunch(e GraphExec, s Stream) error {
	return c.call("cuGraphLaunch", uintptr(e), uintptr(s))
}

// UpdateError is returned by GraphUpdate when a graph's topology differs
// from the instance's, so the instance must be rebuilt.
type UpdateError struct{ Result int }

func (e *UpdateError) Error() string {
	return fmt.Sprintf("cuda: cuGraphExecUpdate: graph not updatable in place (CUgraphExecUpdateResult %d)", e.Result)
}

// GraphUpdate rewrites e's node parameters (kernel arguments, copy
// addresses) from g, a graph of the same topology, without re-instantiating.
func (c *Ctx) GraphUpdate(e GraphExec, g Graph) error {
	if !c.d.lib.has("cuGraphExecUpdate_v2") {
		return fmt.Errorf("cuda: cuGraphExecUpdate_v2 is not in this driver (needs CUDA 12.0)")
	}
	info := c.scratch[scratchOut+256 : scratchOut+256+24] // CUgraphExecUpdateResultInfo
	clear(info)
	err := c.call("cuGraphExecUpdate_v2", uintptr(e), uintptr(g), c.out(256))
	if res := int(c.i32(256)); err != nil && res != 0 {
		return fmt.Errorf("%w: %w", &UpdateError{Result: res}, err)
	}
	return err
}

// DestroyGraph frees a graph (instances made from it stay valid).
func (c *Ctx) DestroyGraph(g Graph) error {
	if g == 0 {
		return nil
	}
	return c.callAnyway("cuGraphDestroy", uintptr(g))
}

// DestroyGraphExec frees an executable graph.
func (c *Ctx) DestroyGraphExec(e GraphExec) error {
	if e == 0 {
		return nil
	}
	return c.callAnyway("cuGraphExecDestroy", uintptr(e))
}
