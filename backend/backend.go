// Package backend is the boundary between the architectures (package
// model) and the devices that run them (backend/cpu; backend/cuda later).
//
// An architecture writes its step once, as a short loop over a closed set
// of fused block-level operations (Ops): Embed, Attention, MLP, Head, and
// one op per further block family (MoE, DeltaNet). Each op reads and
// updates the step's residual stream, which lives on the device: the model
// never sees activations, so a device is free to fuse inside an op (norm
// into the projection that consumes it, RoPE and the K/V append into the
// QKV epilogue) and to record the whole step once and replay it (a CUDA
// graph). An op enters the set when an architecture needs it, with a plain
// CPU implementation and a parity test.
//
// Weights are made resident once, from the CMF bytes as stored (LoadMat:
// no conversion at load), and referred to by handles in the weight structs
// of this package. Per-sequence state (the K/V cache, later the recurrent
// state of linear-attention layers) is a Seq, owned by the device; a step
// (Batch) runs rows of several sequences at once, so batched decode and
// chunked prefill are the same call.
//
// This package imports quant and rope only; model imports this package
// only.
package backend

import (
	"errors"
	"time"

	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/rope"
)

// Device makes weights and sequence state resident and runs steps.
type Device interface {
	// Name says what runs the steps ("cpu (8 threads, avx512)").
	Name() string
	// LoadMat makes the rows×cols weight matrix whose CMF bytes are data
	// resident. name is the tensor's name (calibration observers and error
	// messages report it). On the CPU data is used in place and must stay
	// mapped while the device uses it.
	LoadMat(name string, dt quant.DType, rows, cols int, data []byte) (Mat, error)
	// LoadVec makes a small float32 vector (a norm weight, a bias) resident.
	LoadVec(v []float32) (Vec, error)
	// NewRope prepares a rotary embedding's frequency table.
	NewRope(c RopeConfig) (Rope, error)
	// NewSeq allocates one sequence's state for up to ctx positions.
	NewSeq(s SeqSpec, ctx int) (Seq, error)
	// Run appends b's tokens to b's sequences by running step over them,
	// and writes the logits b asks for to b.Out.
	Run(b *Batch, step func(Ops)) error
	// Close releases the device's resources (weights, workers).
	Close() error
}

// Mat is a resident weight matrix (y = W·x, W row-major [Rows, Cols]).
type Mat interface {
	DType() quant.DType
	Dims() (rows, cols int)
}

// Vec is a resident float32 vector.
type Vec interface {
	Len() int
}

// Rope is a resident rotary embedding.
type Rope interface {
	// Dim is the number of rotated dimensions of a head.
	Dim() int
}

// Seq is one sequence's state on a device.
type Seq interface {
	Len() int // positions it holds
	Cap() int // positions it can hold (the context length)
	// Truncate keeps the first n positions. A sequence with
	// linear-attention state can only be emptied (n = 0) or kept as is
	// (n = Len()); other lengths are ErrNotRewindable.
	Truncate(n int) error
	Bytes() int64 // memory of its state
}

// StateSaver is a Seq whose linear-attention state can be copied out and
// back: hybrid models resume from snapshots of it at token boundaries
// instead of re-prefilling a shared prefix.
type StateSaver interface {
	// SaveState copies the linear-attention state of every DeltaNet layer
	// at the current length into dst (reused when large enough) and
	// returns it; its length is SeqSpec.StateBytes()/4.
	SaveState(dst []float32) []float32
	// RestoreState sets the linear-attention state to one SaveState
	// returned at length n and the length to n. The K/V rows of positions
	// [0, n) are kept as they are: they must still hold the tokens the
	// state was saved after (the caller's bookkeeping).
	RestoreState(state []float32, n int) error
	// CopyPrefix copies the K/V rows of positions [0, n) of every
	// attention layer from src, a sequence of the same spec on the same
	// device, so that a state saved from src at length n can be restored
	// here. src's rows [0, n) must not change during the call.
	CopyPrefix(src Seq, n int) error
}

// ErrUnsupported says that a device does not implement an operation or a
// variant of one yet (the wrapped error names it).
var ErrUnsupported = errors.New("backend: not supported by this device yet")

// ErrNotRewindable says that a sequence's linear-attention state (which
// summarises the whole prefix in a fixed size) cannot be rolled back to
// an earlier position.
var ErrNotRewindable = errors.New("backend: a linear-attention state cannot be rolled back")

// SeqSpec describes the state one sequence needs.
type SeqSpec struct {
	// Attention lists the layers with a K/V cache (full attention).
	Attention []int
	Layers    int // layers in all
	KVHeads   int
	HeadDim   int
	// DeltaNet lists the layers with a Gated DeltaNet state (conv inputs
	// and recurrent matrices), all of the shape DeltaNetShape.
	DeltaNet      []int
	DeltaNetShape DeltaNetShape
	// MoE is the shape of the mixture-of-experts layers (zero when there
	// are none). It is no part of a sequence's state: a device sizes its
	// step scratch with it (Planner).
	MoE MoEShape
}

// MoEShape is a mixture-of-experts layer's size: Experts of width Inter,
// TopK of them per token, a shared expert of width SharedInter (0: none).
type MoEShape struct {
	Experts, TopK, Inter, SharedInter int
}

// KVBytes is the K/V memory of one sequence of ctx positions (f32 keys
// and values of every attention layer).
func (s SeqSpec) KVBytes(ctx int) int64 {
	return 2 * int64(len(s.Attention)) * int64(s.KVHeads) * int64(ctx) * int64(s.HeadDim) * 4
}

// StateBytes is the fixed-size linear-attention state of one sequence
// (f32), independent of its length.
func (s SeqSpec) StateBytes() int64 {
	return int64(len(s.DeltaNet)) * s.DeltaNetShape.StateBytes()
}

// DeltaNetShape is the geometry of a Gated DeltaNet layer.
type DeltaNetShape struct {
	KeyHeads, ValueHeads int // value heads are a multiple of key heads (GVA)
	KeyDim, ValueDim     int
	ConvKernel           int // causal conv kernel size K
}

// Dims returns key_dim (nk·dk), value_dim (nv·dv) and conv_dim (2·kd+vd).
func (d DeltaNetShape) Dims() (kd, vd, cd int) {
	kd, vd = d.KeyHeads*d.KeyDim, d.ValueHeads*d.ValueDim
	return kd, vd, 2*kd + vd
}

// StateBytes is one layer's state: K-1 conv input rows of conv_dim and a
// KeyDim×ValueDim matrix per value head, f32.
func (d DeltaNetShape) StateBytes() int64 {
	_, _, cd := d.Dims()
	return 4 * (int64(d.ConvKernel-1)*int64(cd) + int64(d.ValueHeads)*int64(d.KeyDim)*int64(d.ValueDim))
}

// Logits selects the logits a Batch returns.
type Logits int

const (
	NoLogits   Logits = iota // none: only fill the sequences' state
	LastLogits               // each sequence's last row: [len(Seqs) × vocab]
	AllLogits                // every row, sequences in order: [rows × vocab]
)

// Batch is one step: Tokens[i] are appended to Seqs[i] at its current
// length. The rows of the step are the sequences' tokens in order.
type Batch struct {
	Seqs   []Seq
	Tokens [][]int
	// RopeLen[i], when set, is the sequence length that dynamic RoPE
	// scaling uses for sequence i (transformers recomputes the frequencies
	// from the last position of each forward call, which may span several
	// steps); 0 means the sequence's length after this step.
	RopeLen []int
	Logits  Logits
	Out     []float32 // receives the logits; len ≥ rows wanted × vocab
	// Next, when set (LastLogits only, one entry per sequence), asks a
	// device that implements Argmaxer for each sequence's greedy next token
	// (argmax of its last row's logits, ties to the lowest id) instead of
	// the logits: only the ids leave the device, and Out is not written
	// unless LogitsOf asks for some rows.
	Next []int32
	// LogitsOf, with Next, lists sequences (indices into Seqs, ascending)
	// whose last-row logits are also written to Out, in that order
	// (Out[k·vocab:(k+1)·vocab] for LogitsOf[k]): one step serves greedy
	// rows with ids and sampling rows with logits.
	LogitsOf []int
	// OutRows, when set (LastLogits only), replaces Out: the k-th row of
	// logits Out would receive (sequence k, or LogitsOf[k] with Next) is
	// written to OutRows[k], of at least vocab floats: the callers'
	// per-sequence buffers, filled without a copy through one block.
	OutRows [][]float32
	// Step, when non-zero, names the step function Run is given and
	// promises that the launches it makes depend on the batch's shape
	// alone (the sequences in order, their token counts, Logits, whether
	// Next is set, LogitsOf, how many OutRows) and on the device's own
	// state, never on token values or positions: a device that replays
	// recorded decode steps may then replay a step equal in all of these
	// to the last one it replayed without deriving its launches again.
	// Package model sets its Model's id.
	Step uint64
}

// Argmaxer is a device that can pick greedy tokens itself (Batch.Next).
type Argmaxer interface {
	Argmaxes() bool
}

// Rows returns the number of rows (tokens) of the step.
func (b *Batch) Rows() int {
	n := 0
	for _, t := range b.Tokens {
		n += len(t)
	}
	return n
}

// Ops is the closed set of fused operations a step is written in. Each op
// updates the step's residual stream x ([rows × hidden], on the device).
type Ops interface {
	// Embed sets x to the rows of table selected by the step's tokens.
	Embed(table Mat)
	// Attention adds the attention block of layer to x:
	// x += o_proj(attend(rope(qk_norm(q,k)), v)) over norm(x), appending
	// the rows' keys and values to their sequences' caches.
	Attention(w *Attention, layer int)
	// MLP adds the SwiGLU block to x: x += down(silu(gate(n)) ⊙ up(n)),
	// n = norm(x).
	MLP(w *MLP)
	// MoE adds the sparse mixture-of-experts block to x: over n = norm(x),
	// Σ_top-k w_e·expert_e(n) (+ σ(shared_gate·n)·shared(n)). Only the
	// selected experts' weights are read; a step's rows are grouped by
	// expert so that each is read once per step.
	MoE(w *MoE)
	// DeltaNet adds the Gated DeltaNet block of layer to x:
	// x += out_proj(gated_norm(delta_rule(conv(in_proj(norm(x)))))),
	// advancing each sequence's conv and recurrent state of that layer.
	DeltaNet(w *DeltaNet, layer int)
	// Head computes head(norm(x)) for the rows the batch asks for.
	Head(w *Head)
}

// Norm is an RMSNorm: x/rms(x)·w, or x/rms(x)·(1+w) when OnePlus (the
// zero-centred weights of Qwen3-Next and Qwen3.5).
type Norm struct {
	W       Vec
	Eps     float32
	OnePlus bool
}

// Attention is one full-attention block's weights (GQA with RoPE).
type Attention struct {
	Norm       Norm
	Q, K, V, O Mat // Q: (Heads·HeadDim, H); K, V: (KVHeads·HeadDim, H); O: (H, Heads·HeadDim)
	BQ, BK, BV Vec // biases, nil when absent
	BO         Vec
	QNorm      *Norm // per-head RMSNorm of q and k before RoPE, nil when absent
	KNorm      *Norm
	Rope       Rope
	Heads      int
	KVHeads    int
	HeadDim    int
	// Gated: Q is (2·Heads·HeadDim, H) with the rows of head j laid out
	// [q_j ; gate_j], and the attention output is multiplied by
	// σ(gate) before O (Qwen3-Next, Qwen3.5).
	Gated bool
}

// MLP is a SwiGLU feed-forward block's weights.
type MLP struct {
	Norm              Norm
	Gate, Up, Down    Mat // Gate, Up: (I, H); Down: (H, I)
	BGate, BUp, BDown Vec // biases, nil when absent
}

// Expert is one SwiGLU expert: down(silu(gate(x)) ⊙ up(x)).
type Expert struct {
	Gate, Up, Down Mat // Gate, Up: (I, H); Down: (H, I)
}

// MoE is a sparse mixture-of-experts block's weights: a router softmax
// over all experts in f32, the TopK largest (ties to the lower index),
// renormalised when Renorm (norm_topk_prob), and an optional shared expert
// scaled per row by σ(SharedGate·x).
type MoE struct {
	Norm       Norm
	Router     Mat // (experts, H)
	Experts    []Expert
	TopK       int
	Renorm     bool
	Shared     *Expert // nil when absent
	SharedGate Mat     // (1, H), with Shared
}

// DeltaNet is a Gated DeltaNet block's weights (architectures.md §6.4).
// Exactly one projection layout is set: Qwen3-Next's QKVZ and BA, whose
// output rows are grouped by key head ([q_g, k_g, v_g, z_g] and [b_g, a_g]
// per key head g), or Qwen3.5's split QKV (q_all | k_all | v_all), Z, B, A.
type DeltaNet struct {
	Norm         Norm
	Shape        DeltaNetShape
	QKVZ, BA     Mat  // (2·kd+2·vd, H), (2·nv, H)
	QKV, Z, B, A Mat  // (2·kd+vd, H), (vd, H), (nv, H), (nv, H)
	Conv         Vec  // (conv_dim·K): conv1d.weight [conv_dim, 1, K] row-major
	ALog, DtBias Vec  // (nv)
	GateNorm     Norm // per value head (dv), standard weights: norm(o)·w·silu(z)
	Out          Mat  // (H, vd)
}

// Head is the final norm and the output projection (the embedding table
// when tied).
type Head struct {
	Norm Norm
	W    Mat // (vocab, H)
}

// RopeConfig describes a rotary position embedding (package rope computes
// its frequency tables on the host).
type RopeConfig = rope.Config

// Observer sees the input of every linear layer during a step, for
// calibration: Observe gets the weight's tensor name and the rows×cols
// row-major inputs (one row per position) that the weight multiplies. x is
// the device's own buffer, valid only during the call.
type Observer interface {
	Observe(weight string, x []float32, rows, cols int)
}

// Observable is a device that can report linear-layer inputs.
type Observable interface {
	SetObserver(o Observer)
}

// PrefillSizer is a device with a preferred number of prompt positions a
// prefill step processes together (a GPU's matrix products want hundreds;
// the CPU's 64). model.Load uses it when no batch is asked for.
type PrefillSizer interface {
	PrefillRows() int
}

// Planner is a device that checks, before any weight is loaded, that a
// model fits: weightBytes of weights, the state of its sequences (spec),
// and step scratch for rows of at most widest floats. The error names the
// numbers. model.Load calls it when the device has it.
type Planner interface {
	Plan(weightBytes int64, spec SeqSpec, widest int) error
}

// Prober is a device that measures its own memory read bandwidth: a
// streaming read of a device buffer of about bytes (less where the device
// has less memory free), timed on the device, the best of several runs, in
// GB/s (1e9 bytes a second). cortiq bench compares a decode's weight
// traffic with it when the device provides it, instead of the host's
// probe.
type Prober interface {
	ReadProbe(bytes int64) (gbps float64, err error)
}

// StepTimer is a device that can time its decode steps on the device, to
// tell the time its kernels take from the gaps between them (launch
// latency, dependencies): cortiq bench reports both for a decode step.
type StepTimer interface {
	// TimeSteps starts timing (discarding earlier figures) or stops it.
	// While on, the first decode step runs its kernels one by one, each
	// between a pair of device events, and later decode steps are timed
	// whole by an event pair around their launches (a replayed graph).
	TimeSteps(on bool)
	// StepTimes returns what was measured since TimeSteps(true).
	StepTimes() StepTimes
}

// StepTimes are a StepTimer's figures, in device time.
type StepTimes struct {
	Steps    int           // decode steps timed whole
	Graphs   int           // how many of them were replayed graphs
	StepTime time.Duration // their sum
	// Unchecked: how many of the Graphs replayed without packing the step
	// again to compare it with the recording (Batch.Step).
	Unchecked  int
	Kernels    int           // kernels of the one step timed kernel by kernel
	KernelTime time.Duration // the sum of those kernels' times
	// Host wall time of the Steps timed whole, entry to return of Run:
	// HostRun in all, of which HostCheck packing each step to compare it
	// with its recorded graph and HostWait after the launches (the
	// device's remaining work, the result copies, the syncs).
	HostRun, HostCheck, HostWait time.Duration
}

// Releaser is a device whose sequences hold pooled resources (a GPU's
// K/V slots) that Release returns; on other devices a sequence is simply
// dropped.
type Releaser interface {
	Release(s Seq)
}

// Release returns s's resources to dev when dev pools them.
func Release(dev Device, s Seq) {
	if r, ok := dev.(Releaser); ok {
		r.Release(s)
	}
}

// ErrNoDevice says that a requested device is not present or cannot be
// used; the wrapped error says why.
var ErrNoDevice = errors.New("backend: no such device")
