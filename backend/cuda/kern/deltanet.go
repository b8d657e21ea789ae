package kern

import (
	"fmt"

	"github.com/cortiq/cortiq/backend/cuda/driver"
)

// DeltaNet is one Gated DeltaNet layer's kernels over a step's rows
// (csrc/deltanet.cu): dn_conv (the causal conv + SiLU over the carried
// inputs), dn_conv_state (the carried inputs advanced), dn_rule (gates, L2
// norms, the delta rule per (sequence, value head) walking its rows in
// order, the gated RMSNorm). Rows find their sequence's state from the
// per-row slots (Slot: the staged inputs), never from launch parameters.
type DeltaNet struct {
	KeyHeads, ValueHeads, KeyDim, ValueDim, ConvKernel int
	// Grouped: Proj rows are Qwen3-Next's [per key head q k v z][per key
	// head b a]; else Qwen3.5's [q_all k_all v_all | z | b | a].
	Grouped bool
	Proj    Ptr // rows × ProjWidth, Ldp apart
	Ldp     int
	ConvW   Ptr // cd × K
	// State is the layer's pool: per slot StateFloats floats
	// [conv (K−1)×cd | S nv×dk×dv].
	State Ptr
	Slot  Ptr // int32 per row
	Conv  Ptr // the conv output, rows × cd, Ldc apart
	Ldc   int
	ALog  Ptr // nv
	Dt    Ptr // dt_bias, nv
	NormW Ptr // dv
	Eps   float32
	Out   Ptr // rows × nv·dv, Ldo apart
	Ldo   int
}

// Dims returns key_dim, value_dim and conv_dim.
func (k DeltaNet) Dims() (kd, vd, cd int) {
	kd, vd = k.KeyHeads*k.KeyDim, k.ValueHeads*k.ValueDim
	return kd, vd, 2*kd + vd
}

// ProjWidth is the floats of one projection row (both layouts).
func (k DeltaNet) ProjWidth() int {
	_, _, cd := k.Dims()
	return cd + k.ValueHeads*k.ValueDim + 2*k.ValueHeads
}

// StateFloats is one sequence's state in the layer's pool.
func (k DeltaNet) StateFloats() int {
	_, _, cd := k.Dims()
	return (k.ConvKernel-1)*cd + k.ValueHeads*k.KeyDim*k.ValueDim
}

// dnMaxValueDim bounds a value head: dn_rule's block of at most 512
// threads (its __launch_bounds__: up to 128 registers a thread, the rows
// of S it keeps in registers).
const dnMaxValueDim = 512

// DNRuleThreads is dn_rule's block: P groups of dv rounded up to a warp,
// P = clamp(512/dvp, 1, 8) (each group takes every P-th row of S).
func DNRuleThreads(dv int) int {
	dvp := (dv + 31) / 32 * 32
	return dvp * max(1, min(8, 512/dvp))
}

// DNRuleShared is dn_rule's dynamic shared memory: S, q, k and one
// partial sum per thread.
func DNRuleShared(dk, dv int) int { return 4 * (dk*dv + 2*dk + DNRuleThreads(dv)) }

// dnMaxShared bounds dn_rule's shared memory (the H100/H200 opt-in
// maximum is 227 KB a block, less its static 256 bytes).
const dnMaxShared = 200 << 10

// ConvColumn is deltanet.cu's dn_col on the host (the tests' models use
// it): conv channel c's column in a projection row — split layout [q_all
// k_all v_all | z | b | a], grouped Qwen3-Next's [per key head q k v z][per
// key head b a].
func (k DeltaNet) ConvColumn(c int) int {
	if !k.Grouped {
		return c
	}
	dk, kd := k.KeyDim, k.KeyHeads*k.KeyDim
	rv := k.ValueHeads / k.KeyHeads * k.ValueDim
	per := 2*dk + 2*rv
	switch {
	case c < kd:
		return c/dk*per + c%dk
	case c < 2*kd:
		return (c-kd)/dk*per + dk + (c-kd)%dk
	}
	return (c-2*kd)/rv*per + 2*dk + (c-2*kd)%rv
}

// Check validates the geometry against the kernels' limits.
func (k DeltaNet) Check() error {
	if k.KeyHeads <= 0 || k.ValueHeads <= 0 || k.ValueHeads%k.KeyHeads != 0 || k.KeyDim <= 0 || k.ValueDim <= 0 || k.ConvKernel < 2 {
		return fmt.Errorf("kern: deltanet %d key heads × %d, %d value heads × %d, conv %d", k.KeyHeads, k.KeyDim, k.ValueHeads, k.ValueDim, k.ConvKernel)
	}
	_, vd, cd := k.Dims()
	if k.ValueDim > dnMaxValueDim || DNRuleShared(k.KeyDim, k.ValueDim) > dnMaxShared {
		return fmt.Errorf("kern: deltanet heads of %d×%d exceed dn_rule's block (≤%d values, %d bytes of shared memory)", k.KeyDim, k.ValueDim, dnMaxValueDim, dnMaxShared)
	}
	if k.Ldp < k.ProjWidth() || k.Ldc < cd || k.Ldo < vd {
		return fmt.Errorf("kern: deltanet strides %d/%d/%d for widths %d/%d/%d", k.Ldp, k.Ldc, k.Ldo, k.ProjWidth(), cd, vd)
	}
	return nil
}

// PackConv packs dn_conv's parameters.
func (k DeltaNet) PackConv(a *driver.Args) *driver.Args {
	return a.Ptr(k.Proj).Int(k.Ldp).Int(b2i(k.Grouped)).Int(k.KeyHeads).Int(k.KeyDim).Int(k.ValueHeads).Int(k.ValueDim).
		Ptr(k.ConvW).Int(k.ConvKernel).Ptr(k.State).Int(k.StateFloats()).Ptr(k.Slot).Ptr(k.Conv).Int(k.Ldc)
}

// PackConvState packs dn_conv_state's parameters.
func (k DeltaNet) PackConvState(a *driver.Args) *driver.Args {
	return a.Ptr(k.Proj).Int(k.Ldp).Int(b2i(k.Grouped)).Int(k.KeyHeads).Int(k.KeyDim).Int(k.ValueHeads).Int(k.ValueDim).
		Int(k.ConvKernel).Ptr(k.State).Int(k.StateFloats()).Ptr(k.Slot)
}

// PackRule packs dn_rule's parameters for a step of R rows.
func (k DeltaNet) PackRule(a *driver.Args, R int) *driver.Args {
	_, _, cd := k.Dims()
	return a.Ptr(k.Conv).Int(k.Ldc).Ptr(k.Proj).Int(k.Ldp).Int(b2i(k.Grouped)).Int(k.KeyHeads).Int(k.KeyDim).
		Int(k.ValueHeads).Int(k.ValueDim).Ptr(k.ALog).Ptr(k.Dt).Ptr(k.NormW).F32(k.Eps).
		Ptr(k.State).Int(k.StateFloats()).Int((k.ConvKernel - 1) * cd).Ptr(k.Slot).Int(R).Ptr(k.Out).Int(k.Ldo)
}

// ConvLaunch is dn_conv's and dn_conv_state's launch shape over R rows.
func (k DeltaNet) ConvLaunch(R int) driver.Config {
	_, _, cd := k.Dims()
	return driver.Config{Grid: driver.D2((cd+255)/256, R), Block: driver.D1(256)}
}

// RuleLaunch is dn_rule's launch shape over a step of seqs sequences.
func (k DeltaNet) RuleLaunch(seqs int) driver.Config {
	return driver.Config{Grid: driver.D2(k.ValueHeads, seqs), Block: driver.D1(DNRuleThreads(k.ValueDim)), Shared: DNRuleShared(k.KeyDim, k.ValueDim)}
}

// DNChunk is the chunked rule's chunk (deltanet.cu DN_C, kernels.DeltaChunk),
// DNChunkCols the columns of S one dn_chunk_state block carries (DN_J) and
// DNStateThreads its block (32·DN_SW).
const (
	DNChunk        = 64
	DNChunkCols    = 32
	DNStateThreads = 512
)

// ChunkFits reports whether the chunked rule (dn_chunk_prep,
// dn_chunk_state, dn_gnorm) takes these heads: dk and dv multiples of 4
// (its 16-byte copies and shared-memory reads), dk at most 128 (a
// dn_chunk_state block stages three chunks of dk-wide rows) and dv at most
// 512 (dn_chunk_prep stages the chunk's v rows).
func (k DeltaNet) ChunkFits() bool {
	return k.KeyDim%4 == 0 && k.ValueDim%4 == 0 && k.KeyDim <= 128 && k.ValueDim <= 512
}

// DNChunkFloats is the chunked rule's scratch a step row and value head:
// [U dv | W dk | Qe dk | Kd dk | M DNChunk | e^Γn | 3 pad].
func DNChunkFloats(dk, dv int) int { return dv + 3*dk + DNChunk + 4 }

// ChunkScratch is the bytes of the chunked rule's scratch over R rows.
func (k DeltaNet) ChunkScratch(R int) int64 {
	return 4 * int64(R) * int64(k.ValueHeads) * int64(DNChunkFloats(k.KeyDim, k.ValueDim))
}

// DNChunkBound bounds the chunks of a step of R rows of seqs sequences
// (each sequence's rows in chunks of DNChunk from its first): Σ⌈n/C⌉ ≤
// ⌊R/C⌋ + seqs, and at most R.
func DNChunkBound(R, seqs int) int { return min(R, R/DNChunk+seqs) }

// DNPrepShared and DNStateShared are dn_chunk_prep's and dn_chunk_state's
// dynamic shared memory.
func DNPrepShared(dk, dv int) int {
	return 4 * (2*DNChunk*(dk+4) + DNChunk*DNChunk + 4*DNChunk + DNChunk*dv)
}
func DNStateShared(dk int) int {
	return 4 * (dk*DNChunkCols + 3*DNChunk*dk + DNChunk*DNChunk + 2*DNChunk*DNChunkCols)
}

// PackChunk packs the chunked rule's parameters (all three kernels):
// dn_rule's, then the scratch X (ChunkScratch(R) bytes).
func (k DeltaNet) PackChunk(a *driver.Args, R int, X Ptr) *driver.Args {
	return k.PackRule(a, R).Ptr(X)
}

// ChunkLaunches are dn_chunk_prep's, dn_chunk_state's and dn_gnorm's
// launch shapes over a step of R rows of seqs sequences.
func (k DeltaNet) ChunkLaunches(R, seqs int) (prep, state, norm driver.Config) {
	slices := (k.ValueDim + DNChunkCols - 1) / DNChunkCols
	prep = driver.Config{Grid: driver.D2(k.ValueHeads, DNChunkBound(R, seqs)), Block: driver.D1(256), Shared: DNPrepShared(k.KeyDim, k.ValueDim)}
	state = driver.Config{Grid: driver.D2(k.ValueHeads*slices, seqs), Block: driver.D1(DNStateThreads), Shared: DNStateShared(k.KeyDim)}
	norm = driver.Config{Grid: driver.D2(k.ValueHeads, R), Block: driver.D1((k.ValueDim + 31) / 32 * 32)}
	return prep, state, norm
}

// ChunkCalls returns the layer's launches with the chunked rule (the
// prefill form: dn_conv, dn_conv_state, dn_chunk_prep, dn_chunk_state,
// dn_gnorm) over a step of R rows of seqs sequences, X its scratch.
func (k DeltaNet) ChunkCalls(R, seqs int, X Ptr) ([]call, error) {
	c, err := k.Calls(R, seqs)
	if err != nil {
		return nil, err
	}
	if !k.ChunkFits() {
		return nil, fmt.Errorf("kern: deltanet heads of %d×%d: the chunked rule needs dk, dv multiples of 4, dk ≤ 128, dv ≤ 512", k.KeyDim, k.ValueDim)
	}
	p, s, n := k.ChunkLaunches(R, seqs)
	return append(c[:2],
		call{"dn_chunk_prep", p, k.PackChunk(&driver.Args{}, R, X)},
		call{"dn_chunk_state", s, k.PackChunk(&driver.Args{}, R, X)},
		call{"dn_gnorm", n, k.PackChunk(&driver.Args{}, R, X)}), nil
}

// DeltaNetChunked queues ChunkCalls.
func (l *Launcher) DeltaNetChunked(k DeltaNet, R, seqs int, X Ptr) error {
	return l.run(k.ChunkCalls(R, seqs, X))
}

// Calls returns the layer's three launches over a step of R rows of seqs
// sequences, in order.
func (k DeltaNet) Calls(R, seqs int) ([]call, error) {
	if err := k.Check(); err != nil {
		return nil, err
	}
	if R < 1 || R > 65535 || seqs < 1 || seqs > R {
		return nil, fmt.Errorf("kern: deltanet over %d rows of %d sequences", R, seqs)
	}
	c, r := k.ConvLaunch(R), k.RuleLaunch(seqs)
	return []call{
		{"dn_conv", c, k.PackConv(&driver.Args{})},
		{"dn_conv_state", c, k.PackConvState(&driver.Args{})},
		{"dn_rule", r, k.PackRule(&driver.Args{}, R)},
	}, nil
}

// StepCalls returns a decode step's launches over R rows, each a sequence
// of its own: dn_conv_step (dn_conv and dn_conv_state in one launch, the
// same results), then dn_rule.
func (k DeltaNet) StepCalls(R int) ([]call, error) {
	c, err := k.Calls(R, R)
	if err != nil {
		return nil, err
	}
	c[0].name = "dn_conv_step"
	return append(c[:1], c[2]), nil
}

// DeltaNetStep queues StepCalls: the layer's kernels over a decode step of
// R rows of as many sequences.
func (l *Launcher) DeltaNetStep(k DeltaNet, R int) error {
	return l.run(k.StepCalls(R))
}

// DeltaNet queues the layer's kernels over a step of R rows of seqs
// sequences (the slots say which rows are whose).
func (l *Launcher) DeltaNet(k DeltaNet, R, seqs int) error {
	return l.run(k.Calls(R, seqs))
}
