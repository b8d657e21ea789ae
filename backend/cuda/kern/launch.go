package kern

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/quant"
)

// Typed launchers: one method per kernel family, packing the parameters
// csrc/*.cu declares and choosing the launch shape its comments give. Each
// builds its launches with a pure function (tested on the CPU against the
// manifest) and queues them on the launcher's stream.

// Ptr is a device address (driver.DevicePtr).
type Ptr = driver.DevicePtr

// MaxMatvecRows is the most activation rows one matvec launch serves;
// Matvec splits larger R into launches of at most this many.
const MaxMatvecRows = 8

// Attention partials per (row, query head, split): m, l and hd values.
const attnWarps, attnMaxG = 4, 8

// AttnPartFloats is the size, in floats, of the partials buffer Attention
// needs.
func AttnPartFloats(R, nq, nsplit, hd int) int { return R * nq * nsplit * (hd + 2) }

// attn_tiles (csrc/attn.cu): positions a tile, most splits, and the head
// dimensions it takes.
const (
	attnTileRows       = 32
	AttnTilesMaxSplits = 64
)

// AttnTilesFits reports whether attn_tiles (f16: attn_tiles_h over a
// float16 cache) serves heads of hd dimensions with q rows at stride ldq
// floats (float4 loads: both multiples of 4; 16-byte copies of f16 rows:
// hd a multiple of 8).
func AttnTilesFits(hd, ldq int, f16 bool) bool {
	return hd >= 4 && hd <= 256 && hd%4 == 0 && ldq%4 == 0 && (!f16 || hd%8 == 0)
}

// AttnTilesShared is attn_tiles' dynamic shared memory in bytes: q of 8
// heads and a two-stage ring of K and V tiles at a conflict-free stride
// (floats: 4·odd; halves: hd + 8).
func AttnTilesShared(hd int, f16 bool) int {
	if f16 {
		return 4*8*hd + 2*4*attnTileRows*(hd+8)
	}
	st := 4 * ((hd / 4) | 1)
	return 4 * (8*hd + 4*attnTileRows*st)
}

// AttnTilesSplits is the number of splits of a row's positions attn_tiles
// is launched with for rows rows: at least two blocks an SM over the
// (split, kv head, row) grid, at most AttnTilesMaxSplits (H200, 8B shape,
// BenchmarkGPUAttention: 64 rows of 192 positions 43.6 µs at one split,
// 46.7 at two; 16 rows of 512 30.6 at two, 37.4 at five). The kernel
// gives each split at least one tile, so a short row leaves the later
// splits empty.
func AttnTilesSplits(sms, nkv, rows int) int {
	n := max(1, nkv*rows)
	return max(1, min(AttnTilesMaxSplits, (2*sms+n-1)/n))
}

// call is one kernel launch.
type call struct {
	name string
	cfg  driver.Config
	args *driver.Args
}

// Launcher queues kernels of a module on one stream, with programmatic
// dependent launch when PDL is set.
type Launcher struct {
	M      *Module
	C      *driver.Ctx
	Stream driver.Stream
	PDL    bool
	// Debug waits for every kernel and names the one that failed (a
	// faulting kernel otherwise surfaces at a later synchronisation).
	Debug bool
}

// On returns a launcher for stream s.
func (m *Module) On(c *driver.Ctx, s driver.Stream, pdl bool) *Launcher {
	return &Launcher{M: m, C: c, Stream: s, PDL: pdl}
}

func (l *Launcher) run(cs []call, err error) error {
	if err != nil {
		return err
	}
	for _, k := range cs {
		k.cfg.Stream, k.cfg.PDL = l.Stream, l.PDL
		if k.cfg.Shared > 0 { // static + dynamic beyond 48 KB needs the opt-in (Module.OptIn calls the driver once a size)
			if err := l.M.OptIn(l.C, k.name, k.cfg.Shared); err != nil {
				return err
			}
		}
		if err := l.M.Launch(l.C, k.name, k.cfg, k.args); err != nil {
			return err
		}
		if l.Debug {
			if err := l.C.StreamSync(l.Stream); err != nil {
				return fmt.Errorf("kern: %s (grid %v, block %v) failed: %w", k.name, k.cfg.Grid, k.cfg.Block, err)
			}
		}
	}
	return nil
}

func one(name string, grid, block driver.Dim3, shared int, a *driver.Args) []call {
	return []call{{name, driver.Config{Grid: grid, Block: block, Shared: shared}, a}}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// mvFamily names the matvec/gemm kernel family of a format; q8_2f uses
// q8_row's kernels on prescaled activations.
// mvNames: mv_<family>_r<R> by family and R−1 (no formatting per launch:
// a decode step's check packs hundreds of them).
var mvNames = func() map[string][MaxMatvecRows]string {
	m := map[string][MaxMatvecRows]string{}
	for _, fam := range []string{"f32", "f16", "bf16", "q8row", "q4tp"} {
		var n [MaxMatvecRows]string
		for r := range n {
			n[r] = fmt.Sprintf("mv_%s_r%d", fam, r+1)
		}
		m[fam] = n
	}
	return m
}()

func mvFamily(d quant.DType) (string, error) {
	switch d {
	case quant.F32:
		return "f32", nil
	case quant.F16:
		return "f16", nil
	case quant.BF16:
		return "bf16", nil
	case quant.Q8Row, quant.Q82F:
		return "q8row", nil
	case quant.Q4TP:
		return "q4tp", nil
	}
	return "", fmt.Errorf("kern: no matvec for format %s", d)
}

// DefaultSMs sizes grids when the multiprocessor count is unknown (an H200).
const DefaultSMs = 132

// mqSharedBudget bounds the dynamic shared memory of one quantized-activation
// matvec launch (the H100/H200 opt-in maximum is 227 KB a block).
const mqSharedBudget = 200 << 10

// quantizedActs reports whether a format's matvec runs on int8 activations
// quantized in the kernel (matvec.cu's mq_* kernels).
func quantizedActs(d quant.DType) bool { return d == quant.Q8Row || d == quant.Q82F || d == quant.Q4TP }

// MatvecLaunch returns the kernel and launch shape of one matvec launch of
// R ≤ MaxMatvecRows activation rows on a device with sms multiprocessors
// (0: DefaultSMs), as the production Matvec queues it. The kernel lab
// times the production kernel through it.
func MatvecLaunch(d quant.DType, rows, cols, R, sms int) (string, driver.Config, error) {
	fam, err := mvFamily(d)
	if err != nil {
		return "", driver.Config{}, err
	}
	if R < 1 || R > MaxMatvecRows || rows < 1 || cols < 1 || (d == quant.Q4TP && cols%32 != 0) {
		return "", driver.Config{}, fmt.Errorf("kern: matvec %s %d×%d with %d rows", d, rows, cols, R)
	}
	name := mvNames[fam][R-1]
	if !quantizedActs(d) {
		return name, driver.Config{Grid: driver.D1((rows + 7) / 8), Block: driver.D1(128)}, nil
	}
	if sms <= 0 {
		sms = DefaultSMs
	}
	shared := MatvecShared(cols, R)
	if shared > mqSharedBudget {
		return "", driver.Config{}, fmt.Errorf("kern: matvec %s with %d columns needs %d bytes of shared memory for %d rows (at most %d)", d, cols, shared, R, mqSharedBudget)
	}
	// One block of 16 warps a multiprocessor: each block quantizes its
	// activations once, so fewer, wider blocks repeat that work less (the
	// SwiGLU prologue of a down projection reads 2·cols floats a row).
	return name, driver.Config{Grid: driver.D1(min((rows+15)/16, sms)), Block: driver.D1(512), Shared: shared}, nil
}

// FloatMatmulLaunch names the kernel and launch of the float32-exact
// product over T > MaxMatvecRows activation rows and float weights (f32,
// f16, bf16) on a GPU of sms multiprocessors: mm_<family> (matvec.cu),
// blocks of 32 weight rows × 32 tokens, or mm_<family>_t16 (× 16 tokens)
// where the 32-token blocks would be fewer than the multiprocessors (a
// router of 128 experts over 512 rows: 64 blocks); 256 threads, gemm_*'s
// parameters. Steps of that many rows over float weights take it instead
// of launches of mv_*_r8 (each re-reading the weights).
func FloatMatmulLaunch(d quant.DType, rows, T, sms int) (name string, grid, block driver.Dim3) {
	fam, _ := mvFamily(d)
	gx := (rows + 31) / 32
	if sms <= 0 {
		sms = DefaultSMs
	}
	if gx*((T+31)/32) < sms {
		return "mm_" + fam + "_t16", driver.D2(gx, (T+15)/16), driver.D1(256)
	}
	return "mm_" + fam, driver.D2(gx, (T+31)/32), driver.D1(256)
}

// MatvecShared is the dynamic shared memory of a quantized-activation
// matvec: per activation row, ⌈cols/32⌉ blocks of 32 int8 quants and a
// (scale, Σq) pair.
func MatvecShared(cols, R int) int { return R * ((cols+31)/32*40 + 128) }

// MatvecRowsPerLaunch is the most activation rows one launch takes: 8, or
// fewer where their quantized copies would not fit in shared memory.
func MatvecRowsPerLaunch(d quant.DType, cols int) int {
	if !quantizedActs(d) {
		return MaxMatvecRows
	}
	return max(1, min(MaxMatvecRows, mqSharedBudget/MatvecShared(cols, 1)))
}

// Prologues of the quantized-activation matvecs (matvec.cu's pro).
const (
	ProPlain = 0 // x as is
	ProNorm  = 1 // RMSNorm of x times the norm weight
	ProNorm1 = 2 // zero-centred RMSNorm: times (1 + weight)
	ProSilu  = 3 // silu(x[i])·x[xoff+i]
)

// MQ is one quantized-activation matvec (mv_q8row_r*, mv_q4tp_r*): up to
// three tensors of one format and width stacked (rows side by side in y),
// over a prologue of x (ProPlain, ProNorm, ProNorm1 with Norm and Eps,
// ProSilu with XOff).
type MQ struct {
	W          [3]Ptr
	Rows       [3]int
	Bias       [3]Ptr
	Cols       int
	X          Ptr
	Ldx, XOff  int
	Y          Ptr
	Ldy        int
	Accumulate bool
	Norm       Ptr
	Eps        float32
	Pro        int
}

// Pack packs into a the kernel parameters for activation rows r0.. of m.
func (m MQ) Pack(a *driver.Args, r0 int) *driver.Args {
	return a.Ptr(m.W[0]).Ptr(m.W[1]).Ptr(m.W[2]).Int(m.Rows[0]).Int(m.Rows[1]).Int(m.Rows[2]).Int(m.Cols).
		Ptr(m.X.Add(int64(4 * r0 * m.Ldx))).Int(m.Ldx).Int(m.XOff).Ptr(m.Y.Add(int64(4 * r0 * m.Ldy))).Int(m.Ldy).
		Ptr(m.Bias[0]).Ptr(m.Bias[1]).Ptr(m.Bias[2]).Int(b2i(m.Accumulate)).Ptr(m.Norm).F32(m.Eps).Int(m.Pro)
}

// Calls returns the launches of m over R activation rows for format d
// (q8_row, q4tp; q8_2f's quants with x prescaled and ProPlain).
func (m MQ) Calls(d quant.DType, R, sms int) ([]call, error) {
	if !quantizedActs(d) || m.Pro < ProPlain || m.Pro > ProSilu || (m.Pro == ProNorm || m.Pro == ProNorm1) && m.Norm == 0 {
		return nil, fmt.Errorf("kern: quantized-activation matvec over %s with prologue %d", d, m.Pro)
	}
	rows := m.Rows[0] + m.Rows[1] + m.Rows[2]
	if R < 1 || m.Rows[0] < 1 || m.Rows[1] < 0 || m.Rows[2] < 0 || m.Cols < 1 || (d == quant.Q4TP && m.Cols%32 != 0) {
		return nil, fmt.Errorf("kern: matvec %s %d×%d with %d rows", d, rows, m.Cols, R)
	}
	per := MatvecRowsPerLaunch(d, m.Cols)
	var cs []call
	for r0 := 0; r0 < R; r0 += per {
		name, cfg, err := MatvecLaunch(d, rows, m.Cols, min(per, R-r0), sms)
		if err != nil {
			return nil, err
		}
		cs = append(cs, call{name, cfg, m.Pack(new(driver.Args), r0)})
	}
	return cs, nil
}

func matvecCalls(d quant.DType, W Ptr, rows, cols int, x Ptr, ldx int, y Ptr, ldy, R int, bias Ptr, accumulate bool, sms int) ([]call, error) {
	if _, err := mvFamily(d); err != nil {
		return nil, err
	}
	if R < 1 || rows < 1 || cols < 1 || (d == quant.Q4TP && cols%32 != 0) {
		return nil, fmt.Errorf("kern: matvec %s %d×%d with %d rows", d, rows, cols, R)
	}
	if quantizedActs(d) {
		return MQ{W: [3]Ptr{W}, Rows: [3]int{rows}, Bias: [3]Ptr{bias}, Cols: cols, X: x, Ldx: ldx, Y: y, Ldy: ldy, Accumulate: accumulate}.Calls(d, R, sms)
	}
	if R > MaxMatvecRows {
		a := new(driver.Args).Ptr(W).Int(rows).Int(cols).Ptr(x).Int(ldx).Ptr(y).Int(ldy).Int(R).Ptr(bias).Int(b2i(accumulate))
		name, grid, block := FloatMatmulLaunch(d, rows, R, sms)
		return one(name, grid, block, 0, a), nil
	}
	name, cfg, err := MatvecLaunch(d, rows, cols, R, sms)
	if err != nil {
		return nil, err
	}
	a := new(driver.Args).Ptr(W).Int(rows).Int(cols).Ptr(x).Int(ldx).Ptr(y).Int(ldy).Ptr(bias).Int(b2i(accumulate))
	return []call{{name, cfg, a}}, nil
}

// MatvecQ queues a quantized-activation matvec (see MQ) over R rows.
func (l *Launcher) MatvecQ(d quant.DType, m MQ, R int) error {
	cs, err := m.Calls(d, R, l.M.SMs)
	return l.run(cs, err)
}

// Matvec queues y[r][o] (=|+=) Σ_i W[o,i]·x[r][i] (+bias[o]) for R rows
// (bias 0 for none): float weights over more than MaxMatvecRows rows as
// one mm_* (FloatMatmulLaunch). For q8_2f, x must already be prescaled
// (Q82FPrescale).
func (l *Launcher) Matvec(d quant.DType, W Ptr, rows, cols int, x Ptr, ldx int, y Ptr, ldy, R int, bias Ptr, accumulate bool) error {
	return l.run(matvecCalls(d, W, rows, cols, x, ldx, y, ldy, R, bias, accumulate, l.M.SMs))
}

func gemmCalls(d quant.DType, W Ptr, rows, cols int, x Ptr, ldx int, y Ptr, ldy, T int, bias Ptr, accumulate bool) ([]call, error) {
	fam, err := mvFamily(d)
	if err != nil {
		return nil, err
	}
	if T < 1 || rows < 1 || cols < 1 || (d == quant.Q4TP && cols%32 != 0) {
		return nil, fmt.Errorf("kern: gemm %s %d×%d with %d rows", d, rows, cols, T)
	}
	a := new(driver.Args).Ptr(W).Int(rows).Int(cols).Ptr(x).Int(ldx).Ptr(y).Int(ldy).Int(T).Ptr(bias).Int(b2i(accumulate))
	name, grid, block := GemmKernel(fam, rows, T)
	return one(name, grid, block, 0, a), nil
}

// GemmBlocksMin is the block count under which GemmKernel takes the
// 64-token tile: two blocks for each of the H200's 132 SMs, roughly.
const GemmBlocksMin = 256

// GemmKernel names the prefill GEMM kernel of family fam (f32, f16, bf16,
// q8row, q4tp) for rows weight rows and T activation rows, with its launch
// shape (gemm.cu): blocks of 128 weight rows × 128 tokens (gemm_<fam>)
// when that makes at least GemmBlocksMin blocks, else of 128 × 64
// (gemm_<fam>_t64: short prefills, narrow outputs); 256 threads, no
// dynamic shared memory.
func GemmKernel(fam string, rows, T int) (name string, grid, block driver.Dim3) {
	gx := (rows + 127) / 128
	if gx*((T+127)/128) >= GemmBlocksMin {
		return "gemm_" + fam, driver.D2(gx, (T+127)/128), driver.D1(256)
	}
	return "gemm_" + fam + "_t64", driver.D2(gx, (T+63)/64), driver.D1(256)
}

// Gemm queues the prefill product Y[t][o] (=|+=) Σ_k W[o,k]·X[t][k]
// (+bias[o]) for T rows on tensor cores (see gemm.cu for its roundings).
// For q8_2f, X must already be prescaled.
func (l *Launcher) Gemm(d quant.DType, W Ptr, rows, cols int, x Ptr, ldx int, y Ptr, ldy, T int, bias Ptr, accumulate bool) error {
	return l.run(gemmCalls(d, W, rows, cols, x, ldx, y, ldy, T, bias, accumulate))
}

// GemmQSupported reports whether the int8 tensor-core GEMM (gemmq.cu)
// takes a d tensor at device address W with cols columns: q8_row, q8_2f
// (on prescaled activations) and q4tp, cols % 32 == 0, W 16-byte aligned.
func GemmQSupported(d quant.DType, W Ptr, cols int) bool {
	return quantizedActs(d) && cols > 0 && cols%ActQuantBlock == 0 && W%16 == 0
}

// GemmQScratch is the scratch a GemmQ over T activation rows of cols
// columns needs: the int8 quants (T·cols bytes) and their scales (T·cols/32
// floats).
func GemmQScratch(cols, T int) (quants, scales int64) {
	return int64(T) * int64(cols), 4 * int64(T) * int64(cols/ActQuantBlock)
}

// GemmQTile is one tile of gemmq.cu: BN weight rows × BM tokens a block;
// for the small-batch tiles (gemmq_<fmt>_s*, the GEMMQ_SMALL lines) also
// the warps along rows (WN) and along K (WK), the groups of 32 a stage
// (KG) and the stages of the cp.async ring (NS; 0 for the register-staged
// tiles "", "_t64", "_d64").
//
// The wide tiles (gemmq_<fmt>_w<BM>k<KS>, the GEMMQ_WIDE lines; Wide) have
// BN = 128, a ring of NS stages of 8 groups, and split K over a cluster of
// KS blocks (grid (⌈rows/128⌉, KS, ⌈T/BM⌉)); WN, WK and KG are 0.
type GemmQTile struct {
	Suffix         string
	BN, BM         int
	WN, WK, KG, NS int
	KS             int
	F16            bool // a gemmh_q4tp_w* tile (f16 activations and weights; GemmQ.F16)
	Split          bool // a half tile whose warps split the tokens in two (suffix t: 32 rows a warp)
	// A half tile's WK 2 (suffix r): its warps split each stage's groups in
	// two, 32 rows a warp (the small tiles' WK: warps along K).
	Deep bool // a _w64k<KS>d tile: one block an SM, 4 stages (compared, not picked)
}

// Small reports whether t is one of the cp.async ring tiles gemmq_<fmt>_s*.
func (t GemmQTile) Small() bool { return t.NS > 0 && t.KS == 0 }

// Wide reports whether t is one of the cluster tiles gemmq_<fmt>_w*.
func (t GemmQTile) Wide() bool { return t.KS > 0 }

// gemmqWideStage is a wide tile's ring stage for family fam: BM activation
// rows of 8·32+16 bytes, 8·BM scales, 128 weight rows of 8·WB + pad bytes
// (q4tp 16+16, q8row 32+32) and, for q4tp, 128·8 code bytes.
func gemmqWideStage(fam string, BM int) int {
	if fam == "q4tp" {
		return BM*272 + 32*BM + 128*144 + 128*8
	}
	return BM*272 + 32*BM + 128*288
}

// Shared is the dynamic shared memory of t for family fam: NS stages of
// BM activation rows of KG·32+16 bytes, BN weight rows of KG·WB+16 bytes
// (WB = 32 for q8row, 16 for q4tp), BM·KG scales and, for q4tp, BN·KG rungs
// and BN·8 code bytes (gemmq_small's layout).
func (t GemmQTile) Shared(fam string) int {
	if t.F16 {
		// NS stages of BM f16 activation rows of KG·64+16 bytes and 128
		// weight rows of KG·16+16 (their code bytes in the padding), then
		// each warp's rung pairs (its KG/WK groups × 16·WT·WK rows).
		rw, wk := 16, max(t.WK, 1)
		if t.Split {
			rw = 32
		}
		return t.NS*(t.BM*(t.KG*64+16)+128*(t.KG*16+16)) + 8*(t.KG/wk)*(rw*wk)*4
	}
	if t.Wide() {
		sh := t.NS * gemmqWideStage(fam, t.BM)
		if fam == "q4tp" {
			sh += 8 * 8 * 16 * 4 // each warp's rungs: 8 groups × 16 rows
		}
		return sh
	}
	if !t.Small() {
		return 0
	}
	wb, q4 := 32, fam == "q4tp"
	if q4 {
		wb = 16
	}
	stage := t.BM*(t.KG*32+16) + t.BN*(t.KG*wb+16) + t.BM*t.KG*4
	if q4 {
		stage += t.BN*t.KG*4 + t.BN*8
	}
	return t.NS * stage
}

var gemmqBig = []GemmQTile{{Suffix: "", BN: 128, BM: 128}, {Suffix: "_t64", BN: 128, BM: 64}, {Suffix: "_d64", BN: 32, BM: 64}}

// gemmqSmall mirrors gemmq.cu's GEMMQ_SMALL lines (TestGemmQSmallTilesMatchSource).
var gemmqSmall = map[string][]GemmQTile{
	"q4tp": {
		{"_s16", 64, 16, 1, 8, 8, 6, 0, false, false, false}, {"_s16h", 32, 16, 1, 8, 8, 16, 0, false, false, false}, {"_s32", 64, 32, 2, 4, 4, 9, 0, false, false, false},
		{"_s32h", 32, 32, 1, 8, 8, 12, 0, false, false, false}, {"_s64", 64, 64, 4, 2, 4, 6, 0, false, false, false}, {"_s64h", 32, 64, 2, 4, 8, 8, 0, false, false, false},
	},
	"q8row": {
		{"_s16", 64, 16, 1, 8, 8, 5, 0, false, false, false}, {"_s16h", 32, 16, 1, 8, 8, 12, 0, false, false, false}, {"_s32", 64, 32, 2, 4, 8, 4, 0, false, false, false},
		{"_s32h", 32, 32, 1, 8, 8, 10, 0, false, false, false}, {"_s64", 64, 64, 4, 2, 4, 5, 0, false, false, false}, {"_s64h", 32, 64, 2, 4, 8, 7, 0, false, false, false},
	},
}

// gemmqWide mirrors gemmq.cu's GEMMQ_WIDE_KS lines (BM, NS; every KS of
// 1, 2, 4, 8; TestGemmQWideTilesMatchSource).
var gemmqWide = map[string][][2]int{"q4tp": {{16, 4}, {32, 3}, {64, 2}}, "q8row": {{16, 2}, {32, 2}, {64, 2}}}

// gemmqWideKS are the cluster sizes each wide tile is compiled for (7:
// 32 clusters of 7 fit the H200 at once where 32 of 8 do not, clusterCaps);
// gemmqDeepKSs the deep tiles'.
var (
	gemmqWideKS  = []int{1, 2, 4, 7, 8}
	gemmqDeepKSs = []int{1, 2, 4, 8}
)

func wideTiles(fam string) []GemmQTile {
	var ts []GemmQTile
	for _, bn := range gemmqWide[fam] {
		for _, ks := range gemmqWideKS {
			ts = append(ts, GemmQTile{Suffix: fmt.Sprintf("_w%dk%d", bn[0], ks), BN: 128, BM: bn[0], NS: bn[1], KS: ks})
		}
	}
	if fam == "q4tp" { // gemmq.cu's GEMMQ_WIDE_DEEP lines
		for _, ks := range gemmqDeepKSs {
			ts = append(ts, GemmQTile{Suffix: fmt.Sprintf("_w64k%dd", ks), BN: 128, BM: 64, NS: 4, KS: ks, Deep: true})
		}
	}
	return ts
}

// gemmhWide mirrors gemmq.cu's GEMMH_WIDE_KS lines (BM, NS, WT, CG, WK, CA; every KS).
var gemmhWide = [][6]int{{16, 3, 1, 8, 1, 0}, {32, 2, 1, 8, 1, 0}, {64, 2, 1, 8, 1, 0}, {64, 2, 1, 8, 1, 1}}

// GemmHTiles lists the half wide tiles (gemmh_q4tp_w<BM>k<KS>[t|c4|r]: KG
// is their groups a stage, Split their token-split warps, WK 2 their
// group-split warps).
func GemmHTiles() []GemmQTile {
	var ts []GemmQTile
	for _, bn := range gemmhWide {
		for _, ks := range gemmqWideKS {
			t := GemmQTile{Suffix: fmt.Sprintf("_w%dk%d", bn[0], ks), BN: 128, BM: bn[0], NS: bn[1], KS: ks, KG: bn[3], F16: true,
				Split: bn[2] == 2, WK: bn[4]}
			if t.Split {
				t.Suffix += "t"
			}
			if t.KG == 4 {
				t.Suffix += "c4"
			}
			if t.WK == 2 {
				t.Suffix += "r"
			}
			if bn[5] == 1 {
				t.Suffix += "ca"
			}
			ts = append(ts, t)
		}
	}
	return ts
}

// GemmHScratch is the f16 activations an F16 GemmQ over T rows of cols
// columns needs (its Quants): 2·T·cols bytes.
func GemmHScratch(cols, T int) int64 { return 2 * int64(T) * int64(cols) }

// GemmQTiles lists every int8 GEMM tile of family fam (q8row, q4tp): the
// register-staged ones, the small-batch ones, then the wide ones.
func GemmQTiles(fam string) []GemmQTile {
	return append(append(append([]GemmQTile(nil), gemmqBig...), gemmqSmall[fam]...), wideTiles(fam)...)
}

// GemmQSlots is the number of wide-tile blocks the H200 holds at once
// (two an SM × 132 SMs).
const GemmQSlots = 264

// ClusterCaps[ks] is how many clusters of ks wide-tile blocks (two blocks
// an SM) the device runs at once, for ks 1 to 8. A cluster's blocks must
// share a GPC, so this is less than GemmQSlots/ks: on the H200 30 clusters
// of 8 (240 blocks), not 33 — a launch of 32 clusters of 8 (the 8B model's
// o and down projections) ran its last 2 in a second wave, twice the time
// (ncu, stop 22). The default is the H200's (ncu's occupancy table for the
// 64-token tiles); Load replaces it with the driver's answer for its device
// (cuOccupancyMaxActiveClusters, where the driver has it).
type ClusterCaps [9]int

// H200ClusterCaps are the H200's (132 SMs) cluster capacities.
var H200ClusterCaps = ClusterCaps{0, 264, 132, 79, 62, 47, 39, 32, 30}

var clusterCaps atomic.Pointer[ClusterCaps]

func init() { clusterCaps.Store(&H200ClusterCaps) }

// gemmqSlotKS (CORTIQ_CUDA_GEMMQ_KS=slots, read once) brings back the K
// split that ignored the cluster capacities: an experiment's switch.
var gemmqSlotKS = os.Getenv("CORTIQ_CUDA_GEMMQ_KS") == "slots"

// CurrentClusterCaps are the capacities GemmQWideKS picks with.
func CurrentClusterCaps() ClusterCaps { return *clusterCaps.Load() }

// SetClusterCaps sets the capacities GemmQWideKS picks with (Load sets
// those of the device it loads on; the process holds one set).
func SetClusterCaps(c ClusterCaps) { clusterCaps.Store(&c) }

// GemmQWideKS is the cluster size (K split) of the wide tiles for rows ×
// cols: the largest of 8, 7, 4, 2 whose ⌈rows/128⌉ clusters all run at once
// (ClusterCaps) and that leaves every block a chunk of 8 groups, else 1.
func GemmQWideKS(rows, cols int) int {
	bx, nc := (rows+127)/128, (cols/32+7)/8
	if gemmqSlotKS { // stop 21's rule, for comparison: blocks within the slots, clusters of 8, 4, 2
		for _, ks := range []int{8, 4, 2} {
			if bx*ks <= GemmQSlots && ks <= nc {
				return ks
			}
		}
		return 1
	}
	caps := clusterCaps.Load()
	for _, ks := range []int{8, 7, 4, 2} {
		if bx <= caps[ks] && ks <= nc {
			return ks
		}
	}
	return 1
}

// gemmqDeep (CORTIQ_CUDA_GEMMQ_DEEP=1, read once) makes GemmQSuffix pick
// the deep wide tiles for q4tp at 33 to 64 rows: an experiment's switch
// for the end-to-end figures, not a user option.
var gemmqDeep = os.Getenv("CORTIQ_CUDA_GEMMQ_DEEP") == "1"

// gemmqDeepKS is GemmQWideKS for one block an SM (132 slots).
func gemmqDeepKS(rows, cols int) int {
	bx, nc := (rows+127)/128, (cols/32+7)/8
	for _, ks := range []int{8, 4, 2} {
		if bx*ks <= GemmQSlots/2 && ks <= nc {
			return ks
		}
	}
	return 1
}

// GemmQPerm is gemmq_actq's quant order for tile suffix of family fam: 2
// (q4tp) or 3 (q8row) for the wide tiles, else 1 for q4tp, 0 for q8row
// (gemmq.cu documents the orders).
func GemmQPerm(fam, suffix string) int {
	if strings.HasPrefix(suffix, "_w") {
		if fam == "q4tp" {
			return 2
		}
		return 3
	}
	return b2i(fam == "q4tp")
}

func gemmqTile(fam, suffix string) (GemmQTile, bool) {
	for _, t := range GemmQTiles(fam) {
		if t.Suffix == suffix {
			return t, true
		}
	}
	return GemmQTile{}, false
}

// GemmQWideRows is the weight-row count above which the small-batch tiles
// take 64 rows a block (two blocks an SM); outputs of at most this many
// rows take the 32-row "h" tiles (at most 128 blocks: one wave at one an
// SM, with the deeper rings that fit one an SM).
const GemmQWideRows = 4096

// GemmQSuffix is the tile of family fam GemmQKernel picks for rows × cols
// weights: T ≤ 64 (batched decode) the wide tile of the fewest tokens ≥ T
// (16, 32, 64) with GemmQWideKS's cluster (the _s tiles stay for
// comparison: ForceTile); larger T for
// q8row 128 × 64 (_t64: on the H200 308 µs against the 128 × 128 tile's
// 417 at 14336×4096, T = 512), for q4tp 128 × 128 when that makes at least
// GemmBlocksMin blocks, else 128 × 64.
func GemmQSuffix(fam string, rows, cols, T int) string {
	if T <= 64 {
		bm := 16
		for bm < T {
			bm *= 2
		}
		if bm == 64 && fam == "q4tp" && gemmqDeep {
			return fmt.Sprintf("_w64k%dd", gemmqDeepKS(rows, cols))
		}
		return fmt.Sprintf("_w%dk%d", bm, GemmQWideKS(rows, cols))
	}
	if fam != "q8row" && ((rows+127)/128)*((T+127)/128) >= GemmBlocksMin {
		return ""
	}
	return "_t64"
}

// GemmQKernel names the int8 GEMM kernel of family fam (q8row, q4tp) that
// GemmQSuffix picks for rows weight rows and T activation rows, with its
// launch shape: grid (⌈rows/BN⌉, ⌈T/BM⌉), 256 threads.
func GemmQKernel(fam string, rows, cols, T int) (name string, grid, block driver.Dim3) {
	name, cfg, _ := GemmQLaunch(fam, GemmQSuffix(fam, rows, cols, T), rows, T)
	return name, cfg.Grid, cfg.Block
}

// GemmQLaunch is the launch of tile suffix of family fam over rows weight
// rows and T tokens, with the tile's dynamic shared memory.
func GemmQLaunch(fam, suffix string, rows, T int) (string, driver.Config, error) {
	t, ok := gemmqTile(fam, suffix)
	if !ok {
		return "", driver.Config{}, fmt.Errorf("kern: no int8 gemm tile gemmq_%s%s", fam, suffix)
	}
	if t.Wide() {
		return "gemmq_" + fam + suffix, driver.Config{Grid: driver.D3((rows+t.BN-1)/t.BN, t.KS, (T+t.BM-1)/t.BM),
			Block: driver.D1(256), Shared: t.Shared(fam)}, nil
	}
	return "gemmq_" + fam + suffix, driver.Config{Grid: driver.D2((rows+t.BN-1)/t.BN, (T+t.BM-1)/t.BM),
		Block: driver.D1(256), Shared: t.Shared(fam)}, nil
}

// ActQuantLaunch is the launch of gemmq_actq over T rows of cols columns.
func ActQuantLaunch(cols, T int) driver.Config {
	return driver.Config{Grid: driver.D2((cols/ActQuantBlock+7)/8, T), Block: driver.D1(256)}
}

// ActProLaunch is the launch of gemmq_actq_pro and gemmh_acth with
// prologue pro over T rows of cols columns: ActQuantLaunch's, but for the
// RMSNorm prologues, whose every block reads its whole row for the sum of
// squares, only enough blocks a row for about two blocks an SM of the 132
// (the warps loop over the row's blocks of 32). (A block a row reading
// the row once into registers was slower at 64 rows on the H200: 11.7 µs
// a call against ~7.8, stop 21 run 3 — 64 blocks, one load after another.)
func ActProLaunch(cols, T, pro int) driver.Config {
	c := ActQuantLaunch(cols, T)
	if pro == ProNorm || pro == ProNorm1 {
		c.Grid.X = uint32(min(int(c.Grid.X), max(1, (264+T-1)/T)))
	}
	return c
}

// GemmQ is one int8 tensor-core GEMM: Y[t][o] (=|+=) Σ_k W[o,k]·X[t][k]
// (+bias[o]) over T activation rows, X quantized per block of 32
// (ActQuant) into the scratch Quants and Scales (GemmQScratch bytes) first.
type GemmQ struct {
	W              Ptr
	Rows, Cols     int
	X              Ptr
	Ldx            int
	Quants, Scales Ptr
	Y              Ptr
	Ldy            int
	Bias           Ptr
	Accumulate     bool
	// F16 runs a q4tp GEMM of T ≤ 64 rows on the half wide tiles
	// (gemmh_acth into Quants, GemmHScratch bytes, then gemmh_q4tp_w*:
	// f16 activations, f16 weights with the group's rung folded in, f32
	// sums; Scales unused) instead of the int8 ones; Pro as there.
	F16 bool
	// More: up to two more tensors of the same format and width over the
	// same activations (q|k|v, gate|up), their outputs Y's columns after
	// Rows (then after Rows + More[0].Rows): the wide tiles (T ≤ 64) and
	// above 64 rows GemmQStacked take them.
	More []GemmQPart
	// SwiGLU (F16 only, g over gate and one more tensor, up, of as many
	// rows, no accumulate): instead of writing Y, the launch writes
	// h = silu(gate)·up as the half wide tiles' f16 activations (the order
	// gemmh_acth writes, rows Ldh apart) at SwiGLU: the down projection's
	// input, as Y then gemmh_acth's ProSilu would give it, bit for bit.
	SwiGLU Ptr
	Ldh    int
	// ForceTile runs the tile of suffix Tile ("" the 128 × 128 one, "_t64",
	// "_s16h", ...; GemmQTiles) instead of GemmQSuffix's choice (benchmarks
	// and tests compare the tiles).
	ForceTile bool
	Tile      string
	// Pro: the quantizer applies a prologue to X first (gemmq_actq_pro;
	// gemmh_acth for F16): ProNorm / ProNorm1 (RMSNorm by ProW with
	// ProEps over Cols), ProSilu (silu(X)·ProU, ProU at X's stride).
	Pro        int
	ProU, ProW Ptr
	ProEps     float32
}

// PackQuant packs into a gemmq_actq's parameters for g in quant order
// perm (GemmQPerm).
func (g GemmQ) PackQuant(a *driver.Args, perm int) *driver.Args {
	return a.Ptr(g.X).Int(g.Ldx).Int(g.Cols).Ptr(g.Quants).Ptr(g.Scales).Int(perm)
}

// PackQuantPro packs gemmq_actq_pro's parameters: PackQuant's, then the
// prologue pro (ProNorm, ProNorm1: RMSNorm by w with eps; ProSilu:
// silu(X)·u, u at X's stride).
func (g GemmQ) PackQuantPro(a *driver.Args, perm, pro int, u, w Ptr, eps float32) *driver.Args {
	k, onePlus := pro, 0
	if pro == ProNorm1 {
		k, onePlus = ProNorm, 1
	}
	return g.PackQuant(a, perm).Int(k).Ptr(u).Ptr(w).F32(eps).Int(onePlus)
}

// Pack packs into a the GEMM kernel's parameters for g over T rows.
func (g GemmQ) Pack(a *driver.Args, T int) *driver.Args {
	return a.Ptr(g.W).Int(g.Rows).Int(g.Cols).Ptr(g.Quants).Ptr(g.Scales).Ptr(g.Y).Int(g.Ldy).Int(T).
		Ptr(g.Bias).Int(b2i(g.Accumulate))
}

// GemmQPart is one more tensor of a stacked GemmQ.
type GemmQPart struct {
	W    Ptr
	Rows int
	Bias Ptr
}

// parts is g's tensors, three of them (zero rows past the last).
func (g GemmQ) parts() [3]GemmQPart {
	p := [3]GemmQPart{{g.W, g.Rows, g.Bias}}
	copy(p[1:], g.More)
	return p
}

// StackedRows is the number of weight rows of g's tensors together, each
// rounded up to the wide tiles' 128 (what a wide launch covers).
func (g GemmQ) StackedRows() int {
	n := 0
	for _, p := range g.parts() {
		n += (p.Rows + 127) / 128 * 128
	}
	return n
}

// PackWide packs into a the wide tiles' parameters (GEMMQW_PARAMS) for g
// over T rows.
func (g GemmQ) PackWide(a *driver.Args, T int) *driver.Args {
	p := g.parts()
	return a.Ptr(p[0].W).Ptr(p[1].W).Ptr(p[2].W).Int(p[0].Rows).Int(p[1].Rows).Int(p[2].Rows).Int(g.Cols).
		Ptr(g.Quants).Ptr(g.Scales).Ptr(g.Y).Int(g.Ldy).Int(T).Ptr(p[0].Bias).Ptr(p[1].Bias).Ptr(p[2].Bias).
		Int(b2i(g.Accumulate))
}

// GemmQStacked is the tile suffix of stacked tensors over more than 64
// rows: gemmq_<fam>_t64s, _t64's tile with grid z over the tensors and the
// wide tiles' parameters.
const GemmQStacked = "_t64s"

// Suffix is the tile g takes over T rows of family fam: GemmQStacked for
// stacked tensors (More) over more than 64 rows, else GemmQSuffix's choice
// for their stacked rows.
func (g GemmQ) Suffix(fam string, T int) string {
	if len(g.More) > 0 && T > 64 {
		return GemmQStacked
	}
	return GemmQSuffix(fam, g.StackedRows(), g.Cols, T)
}

// WideParams reports whether tile suffix takes the wide tiles' parameters
// (PackWide: three tensors) rather than Pack's.
func WideParams(suffix string) bool { return strings.HasPrefix(suffix, "_w") || suffix == GemmQStacked }

// Launch is the launch of g's tile suffix of family fam over T rows:
// GemmQLaunch's, or for GemmQStacked grid (⌈the largest tensor's rows /
// 128⌉, ⌈T/64⌉, tensors), 256 threads.
func (g GemmQ) Launch(fam, suffix string, T int) (string, driver.Config, error) {
	if suffix != GemmQStacked {
		return GemmQLaunch(fam, suffix, g.StackedRows(), T)
	}
	if fam != "q8row" && fam != "q4tp" {
		return "", driver.Config{}, fmt.Errorf("kern: no int8 gemm tile gemmq_%s%s", fam, suffix)
	}
	n := g.Rows
	for _, p := range g.More {
		n = max(n, p.Rows)
	}
	return "gemmq_" + fam + suffix, driver.Config{Grid: driver.D3((n+127)/128, (T+63)/64, 1+len(g.More)), Block: driver.D1(256)}, nil
}

// Calls returns the two launches of g over T rows for format d (q8_2f: X
// already prescaled).
func (g GemmQ) Calls(d quant.DType, T int) ([]call, error) {
	fam, err := mvFamily(d)
	if err != nil {
		return nil, err
	}
	total := g.Rows
	for _, p := range g.More {
		if !GemmQSupported(d, p.W, g.Cols) || p.Rows < 1 {
			return nil, fmt.Errorf("kern: int8 gemm %s part %d×%d (W at %#x)", d, p.Rows, g.Cols, uint64(p.W))
		}
		total += p.Rows
	}
	if !GemmQSupported(d, g.W, g.Cols) || T < 1 || g.Rows < 1 || g.Ldx < g.Cols || g.Ldy < total || len(g.More) > 2 {
		return nil, fmt.Errorf("kern: int8 gemm %s %d×%d (W at %#x, %d more) with %d rows", d, g.Rows, g.Cols, uint64(g.W), len(g.More), T)
	}
	switch g.Pro {
	case ProPlain:
	case ProNorm, ProNorm1, ProSilu:
		if g.Pro == ProSilu && g.ProU == 0 || g.Pro != ProSilu && g.ProW == 0 {
			return nil, fmt.Errorf("kern: int8 gemm prologue %d without its input (u %#x, norm weight %#x)", g.Pro, uint64(g.ProU), uint64(g.ProW))
		}
	default:
		return nil, fmt.Errorf("kern: int8 gemm prologue %d", g.Pro)
	}
	if g.F16 {
		return g.f16Calls(fam, T)
	}
	if g.SwiGLU != 0 {
		return nil, fmt.Errorf("kern: a SwiGLU epilogue on the int8 gemm (only the half wide tiles have it)")
	}
	suffix := g.Suffix(fam, T)
	if g.ForceTile {
		suffix = g.Tile
	}
	if len(g.More) > 0 && !WideParams(suffix) {
		return nil, fmt.Errorf("kern: int8 gemm tile gemmq_%s%s over %d stacked tensors (only the wide and %s tiles take them)", fam, suffix, 1+len(g.More), GemmQStacked)
	}
	qname, qa := "gemmq_actq", g.PackQuant(new(driver.Args), GemmQPerm(fam, suffix))
	if g.Pro != ProPlain {
		qname, qa = "gemmq_actq_pro", g.PackQuantPro(new(driver.Args), GemmQPerm(fam, suffix), g.Pro, g.ProU, g.ProW, g.ProEps)
	}
	cfg := ActProLaunch(g.Cols, T, g.Pro)
	name, gcfg, err := g.Launch(fam, suffix, T)
	if err != nil {
		return nil, err
	}
	ga := g.Pack(new(driver.Args), T)
	if WideParams(suffix) {
		ga = g.PackWide(new(driver.Args), T)
	}
	return []call{{qname, cfg, qa}, {name, gcfg, ga}}, nil
}

// GemmHLaunch is the launch of the half wide tile suffix over rows
// stacked weight rows (GemmQ.StackedRows) and T tokens.
func GemmHLaunch(suffix string, rows, T int) (string, driver.Config, error) {
	for _, t := range GemmHTiles() {
		if t.Suffix == suffix {
			return "gemmh_q4tp" + suffix, driver.Config{Grid: driver.D3((rows+127)/128, t.KS, (T+t.BM-1)/t.BM),
				Block: driver.D1(256), Shared: t.Shared("q4tp")}, nil
		}
	}
	return "", driver.Config{}, fmt.Errorf("kern: no half gemm tile gemmh_q4tp%s", suffix)
}

// GemmHSuffix is the half wide tile for rows stacked weight rows, cols
// columns and T tokens: GemmQSuffix's int8 pick (no deep half tiles);
// with CORTIQ_CUDA_GEMMH_CA=1 the 64-token tiles whose activations are
// copied through L1 (suffix ca).
func GemmHSuffix(rows, cols, T int) string {
	suffix := strings.TrimSuffix(GemmQSuffix("q4tp", rows, cols, T), "d")
	if gemmhCA && T > 32 {
		suffix += "ca"
	}
	return suffix
}

// gemmhCA (CORTIQ_CUDA_GEMMH_CA=1, read once): the 64-token half tiles
// copy their activations through L1 (cp.async.ca), so that the second
// block of an SM may find the first's: an experiment's switch.
var gemmhCA = os.Getenv("CORTIQ_CUDA_GEMMH_CA") == "1"

// HalfLaunch is the launch of the half wide tile suffix for g over T
// tokens (GemmHLaunch's; with SwiGLU, a block takes 64 rows of gate and
// the same 64 of up).
func (g GemmQ) HalfLaunch(suffix string, T int) (string, driver.Config, error) {
	name, cfg, err := GemmHLaunch(suffix, g.StackedRows(), T)
	if err != nil || g.SwiGLU == 0 {
		return name, cfg, err
	}
	if len(g.More) != 1 || g.More[0].Rows != g.Rows || g.Accumulate || g.Ldh < g.Rows || g.Rows%32 != 0 {
		return "", cfg, fmt.Errorf("kern: a SwiGLU half GEMM over gate and up of %d rows (%d more tensors, accumulate %v, ldh %d)", g.Rows, len(g.More), g.Accumulate, g.Ldh)
	}
	cfg.Grid.X = uint32((g.Rows + 63) / 64)
	return name, cfg, nil
}

// PackF16 packs into a gemmh_acth's parameters for g with prologue pro
// (ProPlain, ProNorm, ProNorm1: RMSNorm by w with eps; ProSilu: silu(X)·u).
func (g GemmQ) PackF16(a *driver.Args, pro int, u, w Ptr, eps float32) *driver.Args {
	k, onePlus := pro, 0
	if pro == ProNorm1 {
		k, onePlus = ProNorm, 1
	}
	return a.Ptr(g.X).Int(g.Ldx).Int(g.Cols).Ptr(g.Quants).Int(k).Ptr(u).Ptr(w).F32(eps).Int(onePlus)
}

// PackWideF16 packs into a the half wide tiles' parameters for g over T rows.
func (g GemmQ) PackWideF16(a *driver.Args, T int) *driver.Args {
	p := g.parts()
	return a.Ptr(p[0].W).Ptr(p[1].W).Ptr(p[2].W).Int(p[0].Rows).Int(p[1].Rows).Int(p[2].Rows).Int(g.Cols).
		Ptr(g.Quants).Ptr(g.Y).Int(g.Ldy).Int(T).Ptr(p[0].Bias).Ptr(p[1].Bias).Ptr(p[2].Bias).Int(b2i(g.Accumulate)).
		Ptr(g.SwiGLU).Int(g.Ldh)
}

func (g GemmQ) f16Calls(fam string, T int) ([]call, error) {
	if fam != "q4tp" || T > 64 {
		return nil, fmt.Errorf("kern: the half wide GEMM takes q4tp over at most 64 rows, not %s over %d", fam, T)
	}
	suffix := GemmHSuffix(g.StackedRows(), g.Cols, T)
	if g.ForceTile {
		suffix = g.Tile
	}
	name, cfg, err := g.HalfLaunch(suffix, T)
	if err != nil {
		return nil, err
	}
	qa := g.PackF16(new(driver.Args), g.Pro, g.ProU, g.ProW, g.ProEps)
	return []call{{"gemmh_acth", ActProLaunch(g.Cols, T, g.Pro), qa}, {name, cfg, g.PackWideF16(new(driver.Args), T)}}, nil
}

// ActQuant queues gemmq_actq: T rows of X (ldx apart, cols % 32 == 0)
// quantized per block of 32 into XQ [T][cols] and D [T][cols/32], in
// format d's order (q4tp permuted).
func (l *Launcher) ActQuant(d quant.DType, X Ptr, ldx, cols int, XQ, D Ptr, T int) error {
	g := GemmQ{X: X, Ldx: ldx, Cols: cols, Quants: XQ, Scales: D}
	cfg := ActQuantLaunch(cols, T)
	return l.run([]call{{"gemmq_actq", cfg, g.PackQuant(new(driver.Args), b2i(d == quant.Q4TP))}}, nil)
}

// GemmQ queues g over T rows (see GemmQ).
func (l *Launcher) GemmQ(d quant.DType, g GemmQ, T int) error {
	cs, err := g.Calls(d, T)
	return l.run(cs, err)
}

func prescaleCalls(W Ptr, rows, cols int, x Ptr, ldx int, xs Ptr, ldxs, R int) []call {
	a := new(driver.Args).Ptr(W).I64(quant.Q82FColOffset(rows, cols)).Int(cols).Ptr(x).Int(ldx).Ptr(xs).Int(ldxs)
	return one("q82f_prescale", driver.D2((cols+255)/256, R), driver.D1(256), 0, a)
}

// Q82FPrescale queues xs[r] = x[r] ⊙ col for a rows×cols q8_2f tensor W.
func (l *Launcher) Q82FPrescale(W Ptr, rows, cols int, x Ptr, ldx int, xs Ptr, ldxs, R int) error {
	return l.run(prescaleCalls(W, rows, cols, x, ldx, xs, ldxs, R), nil)
}

func embedCalls(d quant.DType, W Ptr, rows, cols int, ids, out Ptr, ldo, R int) ([]call, error) {
	fam, err := mvFamily(d)
	if err != nil {
		return nil, err
	}
	if d == quant.Q82F {
		fam = "q82f"
	}
	a := new(driver.Args).Ptr(W).Int(rows).Int(cols).Ptr(ids).Ptr(out).Int(ldo)
	return one("embed_"+fam, driver.D1(R), driver.D1(256), 0, a), nil
}

// Embed queues out[r] = row ids[r] of the table (zeros for an id outside it).
func (l *Launcher) Embed(d quant.DType, W Ptr, rows, cols int, ids, out Ptr, ldo, R int) error {
	return l.run(embedCalls(d, W, rows, cols, ids, out, ldo, R))
}

func rmsnormCalls(x Ptr, ldx int, w, y Ptr, ldy, n, R int, eps float32, onePlus bool) []call {
	a := new(driver.Args).Ptr(x).Int(ldx).Ptr(w).Ptr(y).Int(ldy).Int(n).F32(eps).Int(b2i(onePlus))
	return one("rmsnorm", driver.D1(R), driver.D1(256), 0, a)
}

// RMSNorm queues y[r] = rmsnorm(x[r])·(w or 1+w); y may be x.
func (l *Launcher) RMSNorm(x Ptr, ldx int, w, y Ptr, ldy, n, R int, eps float32, onePlus bool) error {
	return l.run(rmsnormCalls(x, ldx, w, y, ldy, n, R, eps, onePlus), nil)
}

func headNormCalls(x Ptr, ldx int, w Ptr, nheads, hd, R int, eps float32, onePlus bool) []call {
	a := new(driver.Args).Ptr(x).Int(ldx).Ptr(w).Int(hd).F32(eps).Int(b2i(onePlus))
	return one("head_rmsnorm", driver.D2(nheads, R), driver.D1(32), 0, a)
}

// HeadRMSNorm queues the per-head norm of nheads heads of hd at each row's start, in place.
func (l *Launcher) HeadRMSNorm(x Ptr, ldx int, w Ptr, nheads, hd, R int, eps float32, onePlus bool) error {
	return l.run(headNormCalls(x, ldx, w, nheads, hd, R, eps, onePlus), nil)
}

func ropeCalls(x Ptr, ldx, nheads, hd, rot int, inv Ptr, mscale float32, pos Ptr, R int) []call {
	a := new(driver.Args).Ptr(x).Int(ldx).Int(hd).Int(rot).Ptr(inv).F32(mscale).Ptr(pos)
	return one("rope", driver.D2(nheads, R), driver.D1(64), 0, a)
}

// Rope queues the rotary embedding of nheads heads at each row's start, in place, at positions pos[r].
func (l *Launcher) Rope(x Ptr, ldx, nheads, hd, rot int, inv Ptr, mscale float32, pos Ptr, R int) error {
	return l.run(ropeCalls(x, ldx, nheads, hd, rot, inv, mscale, pos, R), nil)
}

func kvAppendCalls(k Ptr, ldk int, v Ptr, ldv int, kc, vc, pos, slot Ptr, nkv, hd, ctx, R int) []call {
	a := new(driver.Args).Ptr(k).Int(ldk).Ptr(v).Int(ldv).Ptr(kc).Ptr(vc).Ptr(pos).Ptr(slot).Int(nkv).Int(hd).Int(ctx)
	return one("kv_append", driver.D2(nkv, R), driver.D1(128), 0, a)
}

// KVAppend queues the copy of k[r], v[r] into the caches at pos[r] of slot[r].
func (l *Launcher) KVAppend(k Ptr, ldk int, v Ptr, ldv int, kc, vc, pos, slot Ptr, nkv, hd, ctx, R int) error {
	return l.run(kvAppendCalls(k, ldk, v, ldv, kc, vc, pos, slot, nkv, hd, ctx, R), nil)
}

// HeadNorms are the per-head q/k RMSNorms rope_qk_append applies before
// the rotation (Qwen3): weights of hd floats (0: no norm of that kind),
// one eps and zero-centring for both.
type HeadNorms struct {
	Q, K    Ptr
	Eps     float32
	OnePlus bool
}

// Pack appends the norms' four parameters (qw, kw, eps, one_plus).
func (n HeadNorms) Pack(a *driver.Args) *driver.Args {
	return a.Ptr(n.Q).Ptr(n.K).F32(n.Eps).Int(b2i(n.OnePlus))
}

func ropeQKAppendCalls(qkv Ptr, ld, nq, nkv, hd, rot int, inv Ptr, mscale float32, pos, slot, kc, vc Ptr, ctx, R int, f16 bool, n HeadNorms) []call {
	a := new(driver.Args).Ptr(qkv).Int(ld).Int(nq).Int(nkv).Int(hd).Int(rot).Ptr(inv).F32(mscale).
		Ptr(pos).Ptr(slot).Ptr(kc).Ptr(vc).Int(ctx)
	return one(RopeQKAppendKernel(f16), driver.D2(nq+nkv, R), driver.D1(64), 0, n.Pack(a))
}

// RopeQKAppend queues RoPE of q and k in a fused q|k|v row and the K/V
// append (f16: into float16 caches, rounded to nearest even), each q and k
// head first RMS-normalised when n has its weights.
func (l *Launcher) RopeQKAppend(qkv Ptr, ld, nq, nkv, hd, rot int, inv Ptr, mscale float32, pos, slot, kc, vc Ptr, ctx, R int, f16 bool, n HeadNorms) error {
	return l.run(ropeQKAppendCalls(qkv, ld, nq, nkv, hd, rot, inv, mscale, pos, slot, kc, vc, ctx, R, f16, n), nil)
}

func attentionCalls(q Ptr, ldq int, kc, vc, pos, slot, part, out Ptr, ldo, R, nq, nkv, hd, ctx, nsplit int, scale float32) ([]call, error) {
	if nkv < 1 || nq%nkv != 0 || hd < 1 || hd > 256 || nsplit < 1 {
		return nil, fmt.Errorf("kern: attention with %d query heads, %d kv heads, head size %d, %d splits", nq, nkv, hd, nsplit)
	}
	a := new(driver.Args).Ptr(q).Int(ldq).Ptr(kc).Ptr(vc).Ptr(pos).Ptr(slot).Ptr(part).
		Int(nq).Int(nkv).Int(hd).Int(ctx).Int(nsplit).F32(scale)
	b := new(driver.Args).Ptr(part).Ptr(out).Int(ldo).Int(nq).Int(hd).Int(nsplit)
	return append(one("attn_split", driver.D3(nsplit, nkv, R), driver.D1(128), attnWarps*attnMaxG*(hd+2)*4, a),
		one("attn_merge", driver.D2(nq, R), driver.D1(128), 0, b)...), nil
}

// Attention queues split-K decode attention over each row's cache (length
// pos[r]+1 read on the device, clamped to [0, ctx]) and the merge into out;
// part holds AttnPartFloats(R, nq, nsplit, hd) floats. Zero-length
// attention is defined as zeros: a row with pos[r] < 0 attends to no
// position and its output row is written as zeros (attn_merge writes 0
// where the softmax denominator is 0), not the NaN of 0/0. Splits that get
// no position contribute nothing to the merge.
func (l *Launcher) Attention(q Ptr, ldq int, kc, vc, pos, slot, part, out Ptr, ldo, R, nq, nkv, hd, ctx, nsplit int, scale float32) error {
	return l.run(attentionCalls(q, ldq, kc, vc, pos, slot, part, out, ldo, R, nq, nkv, hd, ctx, nsplit, scale))
}

func attentionTilesCalls(q Ptr, ldq int, kc, vc, pos, slot, part, cnt, out Ptr, ldo, R, nq, nkv, hd, ctx, nsplit int, scale float32, f16 bool, outh Ptr) ([]call, error) {
	if nkv < 1 || nq%nkv != 0 || !AttnTilesFits(hd, ldq, f16) || ldo%4 != 0 || nsplit < 1 || nsplit > AttnTilesMaxSplits || outh != 0 && nq*hd%32 != 0 {
		return nil, fmt.Errorf("kern: tiled attention with %d query heads, %d kv heads, head size %d, q stride %d, out stride %d, %d splits", nq, nkv, hd, ldq, ldo, nsplit)
	}
	a := new(driver.Args).Ptr(q).Int(ldq).Ptr(kc).Ptr(vc).Ptr(pos).Ptr(slot).Ptr(part).Ptr(cnt).Ptr(out).Int(ldo).
		Int(nq).Int(nkv).Int(hd).Int(ctx).Int(nsplit).F32(scale).Ptr(outh)
	return one(AttnTilesKernel(f16), driver.D3(nsplit, nkv, R), driver.D1(128), AttnTilesShared(hd, f16), a), nil
}

// RopeArgs are rope_qk_append's rotation operands as attn_rope_tiles
// takes them: rot of the head's dimensions rotated with the inverse
// frequencies inv (rot/2 floats) and the factor mscale, and the q/k norms.
type RopeArgs struct {
	Inv    Ptr
	MScale float32
	Rot    int
	Norms  HeadNorms
}

func attentionRopeTilesCalls(qkv Ptr, ld int, kc, vc, pos, slot, part, cnt, out Ptr, ldo, R, nq, nkv, hd, ctx, nsplit int, scale float32, f16 bool, ra RopeArgs) ([]call, error) {
	c, err := attentionTilesCalls(qkv, ld, kc, vc, pos, slot, part, cnt, out, ldo, R, nq, nkv, hd, ctx, nsplit, scale, f16, 0)
	if err != nil {
		return nil, err
	}
	if ld < (nq+2*nkv)*hd || ra.Rot > hd || ra.Rot%2 != 0 {
		return nil, fmt.Errorf("kern: attention with its rotation: q|k|v rows of %d for %d+2·%d heads of %d, %d dimensions rotated", ld, nq, nkv, hd, ra.Rot)
	}
	c[0].name = AttnRopeTilesKernel(f16)
	ra.Norms.Pack(c[0].args.Ptr(ra.Inv).F32(ra.MScale).Int(ra.Rot))
	return c, nil
}

// AttentionRopeTiles queues RopeQKAppend then AttentionTiles as one launch
// (attn_rope_tiles): the rotation (and the q/k norms) of each row's heads
// of the q|k|v rows qkv (ld floats apart; left as they are) and the K/V
// append, then the attention over them, the same bits. The rows must be
// distinct sequences (slots): a decode step.
func (l *Launcher) AttentionRopeTiles(qkv Ptr, ld int, kc, vc, pos, slot, part, cnt, out Ptr, ldo, R, nq, nkv, hd, ctx, nsplit int, scale float32, f16 bool, ra RopeArgs) error {
	return l.run(attentionRopeTilesCalls(qkv, ld, kc, vc, pos, slot, part, cnt, out, ldo, R, nq, nkv, hd, ctx, nsplit, scale, f16, ra))
}

// AttnMMAFits reports whether attn_mma_h (tensor-core attention over a
// float16 cache: the half-GEMM steps') serves G query heads a kv head of
// hd dimensions with q rows at stride ldq floats: hd 64 or 128, G ≤ 16.
func AttnMMAFits(hd, ldq, G int) bool {
	return (hd == 64 || hd == 128) && ldq%4 == 0 && G >= 1 && G <= 16
}

// AttnMMAKernel names attn_mma_h for heads of hd dimensions (AttnMMAFits;
// with CORTIQ_CUDA_ATTN=w4, heads of 128 on the 4-warp variant).
func AttnMMAKernel(hd int) string { n, _, _ := AttnMMAVariant(hd, attnW4); return n }

// AttnMMAVariant is attn_mma_h's kernel, warps a block and dynamic shared
// memory for heads of hd dimensions (w4: heads of 128 on the 4-warp
// variant): the query tile (16 rows of hd + 8 halves) and each warp's
// two-stage ring of 16 K and 16 V rows.
func AttnMMAVariant(hd int, w4 bool) (name string, warps, shared int) {
	name, warps = fmt.Sprintf("attn_mma_h_d%d", hd), 4
	if hd == 128 {
		warps = 2
		if w4 {
			name, warps = name+"w4", 4
		}
	}
	return name, warps, 2 * (16 + warps*2*2*16) * (hd + 8)
}

// attnW4 (CORTIQ_CUDA_ATTN=w4, read once) runs heads of 128 dimensions on
// attn_mma_h_d128w4 (4 warps, 74 KB of rings, three blocks an SM) instead
// of 2 warps: an experiment's switch.
var attnW4 = os.Getenv("CORTIQ_CUDA_ATTN") == "w4"

// AttnMMAWarps is attn_mma_h's warps a block for heads of hd dimensions
// (4 for 64, 2 for 128: a block's rings within 48 KB; 4 with
// CORTIQ_CUDA_ATTN=w4).
func AttnMMAWarps(hd int) int { _, w, _ := AttnMMAVariant(hd, attnW4); return w }

// AttnMMAShared is attn_mma_h's dynamic shared memory in bytes (AttnMMAVariant).
func AttnMMAShared(hd int) int { _, _, sh := AttnMMAVariant(hd, attnW4); return sh }

func attentionMMACalls(q Ptr, ldq int, kc, vc, pos, slot, part, cnt, out Ptr, ldo, R, nq, nkv, hd, ctx, nsplit int, scale float32, outh Ptr, w4 bool) ([]call, error) {
	if nkv < 1 || nq%nkv != 0 || !AttnMMAFits(hd, ldq, nq/nkv) || ldo%4 != 0 || nsplit < 1 || nsplit > AttnTilesMaxSplits || outh != 0 && nq*hd%32 != 0 {
		return nil, fmt.Errorf("kern: tensor-core attention with %d query heads, %d kv heads, head size %d, q stride %d, out stride %d, %d splits", nq, nkv, hd, ldq, ldo, nsplit)
	}
	a := new(driver.Args).Ptr(q).Int(ldq).Ptr(kc).Ptr(vc).Ptr(pos).Ptr(slot).Ptr(part).Ptr(cnt).Ptr(out).Int(ldo).
		Int(nq).Int(nkv).Int(hd).Int(ctx).Int(nsplit).F32(scale).Ptr(outh)
	name, warps, shared := AttnMMAVariant(hd, w4)
	return one(name, driver.D3(nsplit, nkv, R), driver.D1(32*warps), shared, a), nil
}

// AttentionMMA queues AttentionTiles' attention over float16 caches on the
// tensor cores (attn_mma_h: q·scale and the softmax weights rounded to
// f16, so not AttentionTiles' bits): same buffers, splits and outputs; w4
// takes the 4-warp variant for heads of 128 (AttnMMAVariant).
func (l *Launcher) AttentionMMA(q Ptr, ldq int, kc, vc, pos, slot, part, cnt, out Ptr, ldo, R, nq, nkv, hd, ctx, nsplit int, scale float32, outh Ptr, w4 bool) error {
	return l.run(attentionMMACalls(q, ldq, kc, vc, pos, slot, part, cnt, out, ldo, R, nq, nkv, hd, ctx, nsplit, scale, outh, w4))
}

// AttnTilesKernel names the tiled attention kernel of a float32 or
// float16 cache.
func AttnTilesKernel(f16 bool) string {
	if f16 {
		return "attn_tiles_h"
	}
	return "attn_tiles"
}

// AttnRopeTilesKernel names attn_rope_tiles (rope_qk_append and
// attn_tiles in one launch, for steps whose rows are each a sequence of
// its own) for a float32 or float16 cache.
func AttnRopeTilesKernel(f16 bool) string {
	if f16 {
		return "attn_rope_tiles_h"
	}
	return "attn_rope_tiles"
}

// RopeQKAppendKernel names rope_qk_append for a float32 or float16 cache.
func RopeQKAppendKernel(f16 bool) string {
	if f16 {
		return "rope_qk_append_h"
	}
	return "rope_qk_append"
}

// AttentionTiles queues the same attention as Attention in one launch
// (attn_tiles; f16: attn_tiles_h over float16 caches): part holds
// AttnPartFloats(R, nq, nsplit, hd) floats (unused when nsplit is 1), cnt
// R·nkv int32 counters that are zero before the first launch (the kernel
// leaves them zero). outh, when not 0, also receives the output as the
// half wide GEMM's f16 activations (GemmHScratch(nq·hd, R) bytes, the
// order gemmh_acth writes).
func (l *Launcher) AttentionTiles(q Ptr, ldq int, kc, vc, pos, slot, part, cnt, out Ptr, ldo, R, nq, nkv, hd, ctx, nsplit int, scale float32, f16 bool, outh Ptr) error {
	return l.run(attentionTilesCalls(q, ldq, kc, vc, pos, slot, part, cnt, out, ldo, R, nq, nkv, hd, ctx, nsplit, scale, f16, outh))
}

func siluMulCalls(g, u Ptr, ldi int, h Ptr, ldh, n, R int) []call {
	a := new(driver.Args).Ptr(g).Ptr(u).Int(ldi).Ptr(h).Int(ldh).Int(n)
	return one("silu_mul", driver.D2((n+255)/256, R), driver.D1(256), 0, a)
}

// SiluMul queues h[r][i] = silu(g[r][i])·u[r][i].
func (l *Launcher) SiluMul(g, u Ptr, ldi int, h Ptr, ldh, n, R int) error {
	return l.run(siluMulCalls(g, u, ldi, h, ldh, n, R), nil)
}

func addCalls(y Ptr, ldy int, x Ptr, ldx, n, R int) []call {
	a := new(driver.Args).Ptr(y).Int(ldy).Ptr(x).Int(ldx).Int(n)
	return one("add", driver.D2((n+255)/256, R), driver.D1(256), 0, a)
}

// Add queues y[r][i] += x[r][i].
func (l *Launcher) Add(y Ptr, ldy int, x Ptr, ldx, n, R int) error {
	return l.run(addCalls(y, ldy, x, ldx, n, R), nil)
}

func argmaxCalls(logits Ptr, ld, n int, next Ptr, R int) []call {
	a := new(driver.Args).Ptr(logits).Int(ld).Int(n).Ptr(next)
	return one("argmax", driver.D1(R), driver.D1(1024), 0, a)
}

// Argmax queues next[r] = argmax of logits[r] (ties to the lowest index).
func (l *Launcher) Argmax(logits Ptr, ld, n int, next Ptr, R int) error {
	return l.run(argmaxCalls(logits, ld, n, next, R), nil)
}

// SampleStateBytes is the size of one row's sampler state (sample.cu).
const SampleStateBytes = 32

func sampleCalls(logits Ptr, ld, n int, state, next Ptr, R int) []call {
	a := new(driver.Args).Ptr(logits).Int(ld).Int(n).Ptr(state).Ptr(next)
	return one("sample", driver.D1(R), driver.D1(1024), 0, a)
}

// Sample queues next[r] drawn with the per-row parameters and RNG state
// in state (SampleStateBytes per row, see sample.cu).
func (l *Launcher) Sample(logits Ptr, ld, n int, state, next Ptr, R int) error {
	return l.run(sampleCalls(logits, ld, n, state, next, R), nil)
}

func probeCalls(p Ptr, n16 int64, sink Ptr, sms int) []call {
	a := new(driver.Args).Ptr(p).I64(n16).Ptr(sink)
	return one("probe_read", driver.D1(4*max(sms, 1)), driver.D1(256), 0, a)
}

// ProbeRead queues a streaming read of n16 16-byte words at p, summed into *sink.
func (l *Launcher) ProbeRead(p Ptr, n16 int64, sink Ptr, sms int) error {
	return l.run(probeCalls(p, n16, sink, sms), nil)
}

// MoE kernels (moe.cu).

func moeRouteCalls(logits Ptr, ldl, E, k int, renorm bool, ids, w Ptr, R int) []call {
	a := new(driver.Args).Ptr(logits).Int(ldl).Int(E).Int(k).Int(b2i(renorm)).Ptr(ids).Ptr(w)
	return one("moe_route", driver.D1(R), driver.D1(256), 0, a)
}

// MoERoute queues, for R rows of router logits (ldl apart, E experts), the
// softmax in place, the top k expert ids and their weights (renormalised
// when renorm) into ids/w [R][k].
func (l *Launcher) MoERoute(logits Ptr, ldl, E, k int, renorm bool, ids, w Ptr, R int) error {
	return l.run(moeRouteCalls(logits, ldl, E, k, renorm, ids, w, R), nil)
}

// mv_moe_*'s xmode: whose activations a slot's products read, and what
// they write.
const (
	MoEXRow  = 0 // the slot's row (s / k): gate|up, y[s][m·rowsE + o]
	MoEXSlot = 1 // the slot's own row (s): the down products of each slot's SwiGLU
	MoEXGLU  = 2 // as MoEXRow over gate and up (nmat 2), writing y[s][o] = silu(gate)·up (MoEGLUFits)
)

// MoEGLUFits reports whether mv_moe_* takes xmode MoEXGLU for experts of
// format d and cols columns (q4tp rows of at most 128 groups: two lane
// segments of a warp hold an output's gate and up rows).
func MoEGLUFits(d quant.DType, cols int) bool {
	return d == quant.Q4TP && cols%32 == 0 && cols/32 <= 128
}

// MoEMatvecShared is the dynamic shared memory of mv_moe_* over nx
// activation rows of cols.
func MoEMatvecShared(cols, nx int) int { return MatvecShared(cols, nx) }

// MoEMatvecGrid is the grid of mv_moe_* over nslot slots × nmat
// matrices of rowsE rows: a block's 16 warps take 2 rows each a pass (q4tp:
// 32/q4s_lanes rows, one a lane segment), at most one block per
// multiprocessor.
func MoEMatvecGrid(nslot, nmat, rowsE, sms int) driver.Dim3 {
	if sms <= 0 {
		sms = DefaultSMs
	}
	return driver.D1(min((nslot*nmat*rowsE+31)/32, sms))
}

// MoEExpertFamily names the mv_moe_* kernel of experts stored as d
// ("" when there is none: q8_2f).
func MoEExpertFamily(d quant.DType) string {
	switch d {
	case quant.Q8Row:
		return "q8row"
	case quant.Q4TP:
		return "q4tp"
	case quant.F32:
		return "f32"
	case quant.F16:
		return "f16"
	case quant.BF16:
		return "bf16"
	}
	return ""
}

// MoEMatvecSharedFor is the dynamic shared memory of mv_moe_* over experts
// of format d: the quantized activations of nx rows, none for float ones.
func MoEMatvecSharedFor(d quant.DType, cols, nx int) int {
	if !quantizedActs(d) {
		return 0
	}
	return MatvecShared(cols, nx)
}

func moeMatvecCalls(d quant.DType, table Ptr, E, nmat int, ids Ptr, nslot, k, rowsE, cols int, x Ptr, ldx, xoff, xmode int, y Ptr, ldy, pro, sms int) ([]call, error) {
	fam := MoEExpertFamily(d)
	nx := nslot / max(k, 1)
	if xmode == MoEXSlot {
		nx = nslot
	}
	out := nmat * rowsE
	if xmode == MoEXGLU {
		out = rowsE
	}
	switch {
	case fam == "":
		return nil, fmt.Errorf("kern: no expert matvec for %s", d)
	case xmode == MoEXGLU && (nmat != 2 || !MoEGLUFits(d, cols)):
		return nil, fmt.Errorf("kern: expert matvec %s with the SwiGLU epilogue over %d matrices of %d columns", d, nmat, cols)
	case k < 1 || nslot < 1 || nslot%k != 0 || (quantizedActs(d) && (nx > 64 || nslot > MoESlots)) || (d == quant.Q4TP && cols%32 != 0) || (pro != ProPlain && pro != ProSilu) ||
		E < 1 || nmat < 1 || nmat > 2 || xmode < MoEXRow || xmode > MoEXGLU || ldy < out:
		return nil, fmt.Errorf("kern: expert matvec %s over %d slots of top %d, %d × %d×%d of %d experts, prologue %d", d, nslot, k, nmat, rowsE, cols, E, pro)
	}
	a := new(driver.Args).Ptr(table).Int(E).Int(nmat).Ptr(ids).Int(nslot).Int(k).Int(rowsE).Int(cols).Ptr(x).Int(ldx).Int(xoff).Int(xmode).
		Ptr(y).Int(ldy).Int(pro).Ptr(0).F32(0)
	return one("mv_moe_"+fam, MoEMatvecGrid(nslot, nmat, rowsE, sms), driver.D1(512), MoEMatvecSharedFor(d, cols, nx), a), nil
}

// MoESlots bounds the slots of one quantized expert launch (mv_moe_q8row,
// mv_moe_q4tp, mv_moe_dc_*): their ids are staged in shared memory.
const MoESlots = 64

// MoEMatvec queues y[s][m·rowsE + o] = W_{m,ids[s]}[o]·x'[xrow(s)] for
// nslot slots of top-k routing and nmat matrices (1, or 2: gate and up
// together) of E experts each, W_{m,e} at table[m·E + e]: xmode 0 shares
// row s/k's activations among a row's slots, xmode 1 uses row s (pro
// kern.ProSilu: silu(x)·x[xoff:]), xmode 2 (MoEXGLU) is xmode 0 writing
// y[s][o] = silu(gate)·up instead of both products.
func (l *Launcher) MoEMatvec(d quant.DType, table Ptr, E, nmat int, ids Ptr, nslot, k, rowsE, cols int, x Ptr, ldx, xoff, xmode int, y Ptr, ldy, pro int) error {
	return l.run(moeMatvecCalls(d, table, E, nmat, ids, nslot, k, rowsE, cols, x, ldx, xoff, xmode, y, ldy, pro, l.M.SMs))
}

// MoERouterRows is the router rows a block of moe_router_f32 takes (a
// warp each).
const MoERouterRows = 4

// MoERouterFits reports whether moe_router_f32 takes a router of E rows of
// H float32 weights at w (H a multiple of 4, at most MoERouterMaxH,
// 16-byte aligned rows).
func MoERouterFits(E, H int, w Ptr) bool {
	return E >= 1 && E <= MoEMaxExperts && H >= 4 && H%4 == 0 && H <= MoERouterMaxH && w%16 == 0
}

// MoERouterArgs are moe_router_f32's operands for R rows of x (ldx apart)
// of width H: the input RMSNorm (weights Norm, Eps, OnePlus), the router
// W [E][H] float32, the routing (top K, Renorm) into Logits [R][Ldl],
// IDs/W8 [R][K], the normalised rows into XB (Ldxb apart), Cnt: R int32
// counters, zero (the kernel leaves them zero); with SGW (the shared
// expert's gate, H float32 weights) its logits into SG [R].
type MoERouterArgs struct {
	X                Ptr
	Ldx              int
	Norm             Ptr
	Eps              float32
	OnePlus          bool
	Router           Ptr
	H, E, K          int
	Renorm           bool
	Logits           Ptr
	Ldl              int
	IDs, W8, XB, Cnt Ptr
	Ldxb, R          int
	SGW, SG          Ptr
}

// Check reports operands moe_router_f32 does not take.
func (m MoERouterArgs) Check() error {
	if !MoERouterFits(m.E, m.H, m.Router) || m.K < 1 || m.K > m.E || m.R < 1 || m.Ldl < m.E || m.Ldx < m.H || m.Ldxb < m.H ||
		(m.SGW != 0) != (m.SG != 0) || m.SGW%16 != 0 {
		return fmt.Errorf("kern: fused router of %d experts × %d (top %d) over %d rows", m.E, m.H, m.K, m.R)
	}
	return nil
}

// Pack appends moe_router_f32's parameters to a.
func (m MoERouterArgs) Pack(a *driver.Args) *driver.Args {
	return a.Ptr(m.X).Int(m.Ldx).Ptr(m.Norm).F32(m.Eps).Int(b2i(m.OnePlus)).Ptr(m.Router).Int(m.H).Int(m.E).Int(m.K).
		Int(b2i(m.Renorm)).Ptr(m.Logits).Int(m.Ldl).Ptr(m.IDs).Ptr(m.W8).Ptr(m.XB).Int(m.Ldxb).Ptr(m.Cnt).Ptr(m.SGW).Ptr(m.SG)
}

// Grid and Block are moe_router_f32's launch shape.
func (m MoERouterArgs) Grid() driver.Dim3 {
	return driver.D2((m.E+b2i(m.SGW != 0)+MoERouterRows-1)/MoERouterRows, m.R)
}
func (m MoERouterArgs) Block() driver.Dim3 { return driver.D1(32 * MoERouterRows) }

func moeRouterCalls(m MoERouterArgs) ([]call, error) {
	if err := m.Check(); err != nil {
		return nil, err
	}
	return one("moe_router_f32", m.Grid(), m.Block(), 0, m.Pack(new(driver.Args))), nil
}

// MoERouter queues moe_router_f32: RMSNorm, router logits, routing (as
// MoERoute) and the normalised rows, in one launch.
func (l *Launcher) MoERouter(m MoERouterArgs) error { return l.run(moeRouterCalls(m)) }

// MoEDownCombineGrid is the grid of mv_moe_dc_* over R rows of rowsE
// outputs: a warp an output, one block a multiprocessor at most.
func MoEDownCombineGrid(R, rowsE, sms int) driver.Dim3 {
	if sms <= 0 {
		sms = DefaultSMs
	}
	return driver.D1(max(1, min((R*rowsE+15)/16, sms)))
}

// MoEDownCombineArgs are mv_moe_dc_*'s operands: Table the E experts'
// down matrices (rowsE×cols each), IDs/W8 the routing of NSlot = R·K
// slots, X the slots' gate|up rows (Ldx apart, up at Xoff, ProSilu; with
// GLU their SwiGLU products already, mv_moe_*'s MoEXGLU rows: ProPlain), Y
// the residual rows (Ldy apart) added to, YS/G the shared expert's output
// rows (Ldy apart) and gate logits (0: none).
type MoEDownCombineArgs struct {
	Table                Ptr
	E                    int
	IDs                  Ptr
	NSlot, K, Rows, Cols int
	X                    Ptr
	Ldx, Xoff            int
	GLU                  bool
	Y                    Ptr
	Ldy                  int
	W8, YS, G            Ptr
}

// Check reports operands mv_moe_dc_* over experts stored as d does not
// take (at most 64 slots: the prologue's rows).
func (m MoEDownCombineArgs) Check(d quant.DType) error {
	if !quantizedActs(d) || MoEExpertFamily(d) == "" || m.K < 1 || m.NSlot < m.K || m.NSlot%m.K != 0 || m.NSlot > 64 ||
		(d == quant.Q4TP && m.Cols%32 != 0) || m.E < 1 || m.Ldy < m.Rows || m.Ldx < m.Xoff+m.Cols {
		return fmt.Errorf("kern: down+combine %s over %d slots of top %d, %d×%d of %d experts", d, m.NSlot, m.K, m.Rows, m.Cols, m.E)
	}
	return nil
}

// Pack appends mv_moe_dc_*'s parameters to a.
func (m MoEDownCombineArgs) Pack(a *driver.Args) *driver.Args {
	pro := ProSilu
	if m.GLU {
		pro = ProPlain
	}
	return a.Ptr(m.Table).Int(m.E).Ptr(m.IDs).Int(m.NSlot).Int(m.K).Int(m.Rows).Int(m.Cols).Ptr(m.X).Int(m.Ldx).Int(m.Xoff).
		Int(pro).Ptr(m.Y).Int(m.Ldy).Ptr(m.W8).Ptr(m.YS).Ptr(m.G)
}

func moeDownCombineCalls(d quant.DType, m MoEDownCombineArgs, sms int) ([]call, error) {
	if err := m.Check(d); err != nil {
		return nil, err
	}
	return one("mv_moe_dc_"+MoEExpertFamily(d), MoEDownCombineGrid(m.NSlot/m.K, m.Rows, sms), driver.D1(512), MatvecShared(m.Cols, m.NSlot),
		m.Pack(new(driver.Args))), nil
}

// MoEDownCombine queues mv_moe_dc_*: the down products of every slot and
// their weighted sum (then the gated shared expert) added to Y, equal to
// MoEMatvec (xmode 1, ProSilu) then MoECombine.
func (l *Launcher) MoEDownCombine(d quant.DType, m MoEDownCombineArgs) error {
	return l.run(moeDownCombineCalls(d, m, l.M.SMs))
}

// MoEFFArgs are mv_moe_ff_*'s operands: a decode step's expert FFN in one
// launch. TGU is the gate|up table ([gate E | up E], I×H each), TD the
// down table (H×I), IDs/W8 the routing of NSlot = R·K slots, X the
// normalised rows (Ldx apart), GU the slots' gate|up scratch (Ldgu ≥ 2·I
// apart), Y the residual rows (Ldy apart) added to, YS/G the shared
// expert's output rows (Ldy apart) and gate logits (0: none), Bar two
// zeroed uints of the grid barrier (kept zero between launches).
type MoEFFArgs struct {
	TGU, TD        Ptr
	E              int
	IDs            Ptr
	NSlot, K, I, H int
	X              Ptr
	Ldx            int
	GU             Ptr
	Ldgu           int
	Y              Ptr
	Ldy            int
	W8, YS, G, Bar Ptr
}

// Check reports operands mv_moe_ff_* over experts stored as d does not
// take: those of its two phases (MoEMatvec's and MoEDownCombine's).
func (m MoEFFArgs) Check(d quant.DType) error {
	dc := MoEDownCombineArgs{Table: m.TD, E: m.E, IDs: m.IDs, NSlot: m.NSlot, K: m.K, Rows: m.H, Cols: m.I, X: m.GU, Ldx: m.Ldgu, Xoff: m.I,
		Y: m.Y, Ldy: m.Ldy, W8: m.W8, YS: m.YS, G: m.G}
	if err := dc.Check(d); err != nil {
		return err
	}
	if (d == quant.Q4TP && m.H%32 != 0) || m.Ldx < m.H || m.Ldgu < 2*m.I || m.Bar == 0 {
		return fmt.Errorf("kern: expert FFN %s of %d×%d over rows %d apart, gate|up %d apart", d, m.I, m.H, m.Ldx, m.Ldgu)
	}
	return nil
}

// Pack appends mv_moe_ff_*'s parameters to a.
func (m MoEFFArgs) Pack(a *driver.Args) *driver.Args {
	return a.Ptr(m.TGU).Ptr(m.TD).Int(m.E).Ptr(m.IDs).Int(m.NSlot).Int(m.K).Int(m.I).Int(m.H).Ptr(m.X).Int(m.Ldx).Ptr(m.GU).
		Int(m.Ldgu).Ptr(m.Y).Int(m.Ldy).Ptr(m.W8).Ptr(m.YS).Ptr(m.G).Ptr(m.Bar)
}

// MoEFFGrid is mv_moe_ff_*'s grid: one block a multiprocessor at most (the
// grid barrier needs every block resident), as many as either phase uses.
func MoEFFGrid(nslot, k, I, H, sms int) driver.Dim3 {
	if sms <= 0 {
		sms = DefaultSMs
	}
	a, b := MoEMatvecGrid(nslot, 2, I, sms).X, MoEDownCombineGrid(nslot/max(k, 1), H, sms).X
	return driver.D1(min(max(int(a), int(b)), sms))
}

// MoEFFShared is mv_moe_ff_*'s dynamic shared memory: the larger of its
// phases' quantized activations (nslot/k rows of H, nslot rows of I).
func MoEFFShared(nslot, k, I, H int) int {
	return max(MatvecShared(H, nslot/max(k, 1)), MatvecShared(I, nslot))
}

func moeFFCalls(d quant.DType, m MoEFFArgs, sms int) ([]call, error) {
	if err := m.Check(d); err != nil {
		return nil, err
	}
	return one("mv_moe_ff_"+MoEExpertFamily(d), MoEFFGrid(m.NSlot, m.K, m.I, m.H, sms), driver.D1(512), MoEFFShared(m.NSlot, m.K, m.I, m.H),
		m.Pack(new(driver.Args))), nil
}

// MoEFF queues mv_moe_ff_*: MoEMatvec's gate|up products (xmode 0,
// ProPlain) then MoEDownCombine in one launch, bitwise the same.
func (l *Launcher) MoEFF(d quant.DType, m MoEFFArgs) error {
	return l.run(moeFFCalls(d, m, l.M.SMs))
}

func moeCombineCalls(x Ptr, ldx int, y Ptr, ldy int, w Ptr, k int, ys, g Ptr, n, R int, inv Ptr) []call {
	a := new(driver.Args).Ptr(x).Int(ldx).Ptr(y).Int(ldy).Ptr(w).Int(k).Ptr(ys).Ptr(g).Int(n).Ptr(inv)
	return one("moe_combine", driver.D2((n+255)/256, R), driver.D1(256), 0, a)
}

// MoECombine queues x[r] += Σ_j w[r][j]·y[m(r·k+j)] (+ σ(g[r])·ys[r] when
// ys is set) for R rows of n, m = inv (MoESort's sorted rows) or the
// identity when inv is 0.
func (l *Launcher) MoECombine(x Ptr, ldx int, y Ptr, ldy int, w Ptr, k int, ys, g Ptr, n, R int, inv Ptr) error {
	return l.run(moeCombineCalls(x, ldx, y, ldy, w, k, ys, g, n, R, inv), nil)
}

// Grouped experts (moe.cu): limits and tile of moe_sort / gemmq_moe_*.
const (
	MoETile       = 32   // MOE_BM: sorted rows a tile, all of one expert
	MoEMaxSlots   = 8192 // MOE_MAXSLOT: rows × top-k of one moe_sort
	MoEMaxExperts = 1024 // MOE_MAXE
	MoERouterMaxH = 8192 // MR_MAXH: moe_router_f32's widest row (its normalised copy in shared memory)
)

// MoETiles bounds the tiles of nslot (row, slot) pairs over E experts:
// each non-empty expert (at most min(E, nslot)) wastes less than one.
func MoETiles(nslot, E int) int { return (nslot+MoETile-1)/MoETile + min(E, nslot) }

// MoEGroupedSupported reports whether experts of format d, cols columns
// (gate/up: the width; down: the inner size) and the given base pointers
// can run grouped on gemmq_moe_*.
func MoEGroupedSupported(d quant.DType, cols, nslot, E int, ptrs []Ptr) bool {
	if d != quant.Q8Row && d != quant.Q4TP || cols%ActQuantBlock != 0 || nslot > MoEMaxSlots || E > MoEMaxExperts {
		return false
	}
	for _, p := range ptrs {
		if p%16 != 0 {
			return false
		}
	}
	return true
}

// MoESortLaunch is moe_sort's launch over E experts: a block an expert
// (each counts every expert's slots and places its own).
func MoESortLaunch(E int) (grid, block driver.Dim3) { return driver.D1(E), driver.D1(512) }

func moeSortCalls(ids Ptr, nslot, E int, perm, inv, tileE Ptr, ntile int) []call {
	a := new(driver.Args).Ptr(ids).Int(nslot).Int(E).Ptr(perm).Ptr(inv).Ptr(tileE).Int(ntile)
	g, b := MoESortLaunch(E)
	return one("moe_sort", g, b, 0, a)
}

// MoESort queues the sort of nslot expert ids by expert into perm (ntile ×
// MoETile sorted rows: the slot, −1 for padding), inv (each slot's sorted
// row) and tileE (each tile's expert, −1 unused).
func (l *Launcher) MoESort(ids Ptr, nslot, E int, perm, inv, tileE Ptr, ntile int) error {
	return l.run(moeSortCalls(ids, nslot, E, perm, inv, tileE, ntile), nil)
}

func moeGatherCalls(xq, d Ptr, cols, k int, perm, tileE, xqs, ds Ptr, ntile int) []call {
	a := new(driver.Args).Ptr(xq).Ptr(d).Int(cols).Int(k).Ptr(perm).Ptr(tileE).Ptr(xqs).Ptr(ds)
	return one("moe_gather_q", driver.D1(ntile*MoETile), driver.D1(128), 0, a)
}

// MoEGatherQ queues the copy of each sorted row's int8 activations (row
// perm[i]/k of xq, d: gemmq_actq's layout) into xqs, ds.
func (l *Launcher) MoEGatherQ(xq, d Ptr, cols, k int, perm, tileE, xqs, ds Ptr, ntile int) error {
	return l.run(moeGatherCalls(xq, d, cols, k, perm, tileE, xqs, ds, ntile), nil)
}

// GemmQMoELaunch is the launch of gemmq_moe_<fam> over ntile tiles of
// rowsE weight rows.
func GemmQMoELaunch(rowsE, ntile int) (grid, block driver.Dim3) {
	return driver.D2((rowsE+63)/64, ntile), driver.D1(256)
}

func gemmqMoECalls(d quant.DType, table, tileE Ptr, rowsE, cols int, xqs, ds, y Ptr, ldy, ntile int) ([]call, error) {
	fam := map[quant.DType]string{quant.Q8Row: "q8row", quant.Q4TP: "q4tp"}[d]
	if fam == "" {
		return nil, fmt.Errorf("kern: grouped experts in %s (q8_row or q4tp only)", d)
	}
	a := new(driver.Args).Ptr(table).Ptr(tileE).Int(rowsE).Int(cols).Ptr(xqs).Ptr(ds).Ptr(y).Int(ldy).Int(ntile * MoETile)
	g, b := GemmQMoELaunch(rowsE, ntile)
	return one("gemmq_moe_"+fam, g, b, 0, a), nil
}

// GemmQMoE queues Y[i] = W_e·x̂[i] for the sorted rows of every used tile,
// e its expert, W_e = table[e] (rowsE×cols, format d).
func (l *Launcher) GemmQMoE(d quant.DType, table, tileE Ptr, rowsE, cols int, xqs, ds, y Ptr, ldy, ntile int) error {
	return l.run(gemmqMoECalls(d, table, tileE, rowsE, cols, xqs, ds, y, ldy, ntile))
}

// Gated attention (gate.cu).

func gateSplitCalls(src Ptr, ldsrc int, qkv Ptr, ldq int, gate Ptr, ldg, nq, hd, kv, R int) []call {
	a := new(driver.Args).Ptr(src).Int(ldsrc).Ptr(qkv).Int(ldq).Ptr(gate).Int(ldg).Int(nq).Int(hd).Int(kv)
	return one("gate_split", driver.D2((nq*hd+kv+255)/256, R), driver.D1(256), 0, a)
}

// GateSplit queues the split of gated q_proj rows [q_h ; gate_h]… | k | v
// into qkv rows q… | k | v and gate rows.
func (l *Launcher) GateSplit(src Ptr, ldsrc int, qkv Ptr, ldq int, gate Ptr, ldg, nq, hd, kv, R int) error {
	return l.run(gateSplitCalls(src, ldsrc, qkv, ldq, gate, ldg, nq, hd, kv, R), nil)
}

func gateMulCalls(y Ptr, ldy int, g Ptr, ldg, n, R int) []call {
	a := new(driver.Args).Ptr(y).Int(ldy).Ptr(g).Int(ldg).Int(n)
	return one("gate_mul", driver.D2((n+255)/256, R), driver.D1(256), 0, a)
}

// GateMul queues y ⊙= σ(g) over R rows of n.
func (l *Launcher) GateMul(y Ptr, ldy int, g Ptr, ldg, n, R int) error {
	return l.run(gateMulCalls(y, ldy, g, ldg, n, R), nil)
}

// QuantPos is where gemmq_actq puts element i (0..31) of a block of 32 in
// quant order perm (GemmQPerm): 0 as is, 1 each 8 as 0,2,4,6,1,3,5,7, 2
// and 3 the wide tiles' orders (element 8q+m at 4q + m/2 + 16·(m%2), or at
// 4q + m%4 + 16·(m/4)).
func QuantPos(i, perm int) int {
	q, m := i>>3, i&7
	switch perm {
	case 1:
		return i&^7 + m>>1 + 4*(m&1)
	case 2:
		return 4*q + m>>1 + 16*(m&1)
	case 3:
		return 4*q + m&3 + 16*(m>>2)
	}
	return i
}
