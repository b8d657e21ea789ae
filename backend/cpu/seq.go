package cpu

import (
	"fmt"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/kernels"
)

// maxContext bounds a sequence's context length.
const maxContext = 1 << 24

// seq is one sequence's state: the keys and values of every attention
// layer for up to ctx positions (f32; K stored after k_norm and RoPE, V
// as projected), per layer laid out (kvHeads, ctx, headDim).
type seq struct {
	spec backend.SeqSpec
	ctx  int
	n    int
	k, v [][]float32 // per layer; nil for layers without attention
	// Per layer: the Gated DeltaNet state (conv inputs, recurrent
	// matrices); zero for layers without one, nil for models without any.
	gdn []kernels.GDNState
}

// NewSeq allocates the K/V cache of a sequence of up to ctx positions.
func (d *Device) NewSeq(s backend.SeqSpec, ctx int) (backend.Seq, error) {
	if ctx <= 0 || ctx > maxContext {
		return nil, fmt.Errorf("cpu: context length %d outside 1..%d", ctx, maxContext)
	}
	c := &seq{spec: s, ctx: ctx, k: make([][]float32, s.Layers), v: make([][]float32, s.Layers)}
	per := s.KVHeads * ctx * s.HeadDim
	for _, l := range s.Attention {
		if l < 0 || l >= s.Layers {
			return nil, fmt.Errorf("cpu: attention layer %d of %d", l, s.Layers)
		}
		c.k[l] = make([]float32, per)
		c.v[l] = make([]float32, per)
	}
	if len(s.DeltaNet) > 0 {
		d := s.DeltaNetShape
		_, _, cd := d.Dims()
		if d.KeyHeads <= 0 || d.ValueHeads <= 0 || d.KeyDim <= 0 || d.ValueDim <= 0 || d.ConvKernel < 1 {
			return nil, fmt.Errorf("cpu: deltanet state shape %+v", d)
		}
		c.gdn = make([]kernels.GDNState, s.Layers)
		for _, l := range s.DeltaNet {
			if l < 0 || l >= s.Layers || c.k[l] != nil {
				return nil, fmt.Errorf("cpu: deltanet layer %d of %d (or also an attention layer)", l, s.Layers)
			}
			c.gdn[l] = kernels.GDNState{Conv: make([]float32, (d.ConvKernel-1)*cd), S: make([]float32, d.ValueHeads*d.KeyDim*d.ValueDim)}
		}
	}
	return c, nil
}

func (c *seq) Len() int     { return c.n }
func (c *seq) Cap() int     { return c.ctx }
func (c *seq) Bytes() int64 { return c.spec.KVBytes(c.ctx) + c.spec.StateBytes() }

func (c *seq) Truncate(n int) error {
	if n < 0 || n > c.n {
		return fmt.Errorf("cpu: truncate to %d positions, the sequence holds %d", n, c.n)
	}
	if c.gdn != nil && n != c.n {
		if n != 0 {
			return fmt.Errorf("cpu: truncate to %d of %d positions: %w", n, c.n, backend.ErrNotRewindable)
		}
		for _, s := range c.gdn {
			clear(s.Conv)
			clear(s.S)
		}
	}
	c.n = n
	return nil
}

// SaveState copies the DeltaNet state of every layer into dst.
func (c *seq) SaveState(dst []float32) []float32 {
	n := int(c.spec.StateBytes() / 4)
	if cap(dst) < n {
		dst = make([]float32, n)
	}
	dst = dst[:0]
	for _, l := range c.spec.DeltaNet {
		dst = append(dst, c.gdn[l].Conv...)
		dst = append(dst, c.gdn[l].S...)
	}
	return dst
}

// RestoreState copies a saved DeltaNet state back and sets the length.
func (c *seq) RestoreState(st []float32, n int) error {
	if len(st) != int(c.spec.StateBytes()/4) || c.gdn == nil {
		return fmt.Errorf("cpu: restore a state of %d values into a sequence of %d", len(st), c.spec.StateBytes()/4)
	}
	if n < 0 || n > c.ctx {
		return fmt.Errorf("cpu: restore to length %d, context %d", n, c.ctx)
	}
	for _, l := range c.spec.DeltaNet {
		g := c.gdn[l]
		st = st[copy(g.Conv, st):]
		st = st[copy(g.S, st):]
	}
	c.n = n
	return nil
}

// CopyPrefix copies src's K/V rows [0, n) into c.
func (c *seq) CopyPrefix(src backend.Seq, n int) error {
	s, ok := src.(*seq)
	if !ok || len(s.k) != len(c.k) || s.spec.KVHeads != c.spec.KVHeads || s.spec.HeadDim != c.spec.HeadDim {
		return fmt.Errorf("cpu: copy a prefix between sequences of different shapes or devices")
	}
	if n < 0 || n > s.ctx || n > c.ctx {
		return fmt.Errorf("cpu: copy %d positions between contexts of %d and %d", n, s.ctx, c.ctx)
	}
	hd := c.spec.HeadDim
	for l := range c.k {
		if c.k[l] == nil || s.k[l] == nil {
			continue
		}
		for h := range c.spec.KVHeads {
			copy(c.head(l, h, false)[:n*hd], s.head(l, h, false)[:n*hd])
			copy(c.head(l, h, true)[:n*hd], s.head(l, h, true)[:n*hd])
		}
	}
	return nil
}

var _ backend.StateSaver = (*seq)(nil)

// head returns layer l's keys (or values) of kv head h: (ctx, headDim).
func (c *seq) head(l, h int, values bool) []float32 {
	per := c.ctx * c.spec.HeadDim
	if values {
		return c.v[l][h*per : (h+1)*per]
	}
	return c.k[l][h*per : (h+1)*per]
}

// kv returns the slot of position pos in head(l, h, values).
func (c *seq) kv(l, h, pos int, values bool) []float32 {
	hd := c.spec.HeadDim
	return c.head(l, h, values)[pos*hd : (pos+1)*hd]
}
