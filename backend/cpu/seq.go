package cpu

import (
	"fmt"

	"github.com/cortiq/cortiq/backend"
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
	return c, nil
}

func (c *seq) Len() int     { return c.n }
func (c *seq) Cap() int     { return c.ctx }
func (c *seq) Bytes() int64 { return c.spec.KVBytes(c.ctx) }

func (c *seq) Truncate(n int) error {
	if n < 0 || n > c.n {
		return fmt.Errorf("cpu: truncate to %d positions, the sequence holds %d", n, c.n)
	}
	c.n = n
	return nil
}

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
