package kern

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/quant"
)

// Every typed launcher packs exactly the parameters its kernel declares
// (sizes from the manifest, which TestEmbeddedArtifacts ties to the PTX).
func TestLaunchersMatchManifest(t *testing.T) {
	m, err := ReadManifest()
	if err != nil {
		t.Fatal(err)
	}
	if !m.Built() {
		t.Skip("manifest records no build")
	}
	var all []call
	add := func(cs []call, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, cs...)
	}
	for _, d := range []quant.DType{quant.F32, quant.F16, quant.BF16, quant.Q8Row, quant.Q82F, quant.Q4TP} {
		for R := 1; R <= 17; R++ {
			add(matvecCalls(d, 0x1000, 64, 256, 0x2000, 256, 0x3000, 64, R, 0, true, 0))
		}
		if !quantizedActs(d) { // the float product's 32-token tile (the small ones above take _t16)
			add(matvecCalls(d, 0x1000, 4096, 256, 0x2000, 256, 0x3000, 4096, 512, 0, false, 132))
		}
		add(gemmCalls(d, 0x1000, 64, 256, 0x2000, 256, 0x3000, 64, 100, 0x4000, false))    // 64-token tile
		add(gemmCalls(d, 0x1000, 14336, 4096, 0x2000, 4096, 0x3000, 14336, 512, 0, false)) // 128-token tile
		add(embedCalls(d, 0x1000, 64, 256, 0x2000, 0x3000, 256, 3))
		if quantizedActs(d) {
			fam, _ := mvFamily(d)
			for _, T := range []int{9, 32, 64, 100, 512} { // the int8 GEMM's picks, then every tile forced
				for _, rows := range []int{14336, 4096} {
					add(GemmQ{W: 0x1000, Rows: rows, Cols: 4096, X: 0x2000, Ldx: 4096, Quants: 0x3000, Scales: 0x4000,
						Y: 0x5000, Ldy: 14336, Bias: 0x6000}.Calls(d, T))
				}
			}
			for _, T := range []int{100, 512} { // q|k|v stacked above 64 rows (GemmQStacked)
				add(GemmQ{W: 0x1000, Rows: 4096, Cols: 2048, X: 0x2000, Ldx: 2048, Quants: 0x3000, Scales: 0x4000,
					Y: 0x5000, Ldy: 5120, More: []GemmQPart{{W: 0x7000, Rows: 512}, {W: 0x8000, Rows: 512}}}.Calls(d, T))
			}
			for _, pro := range []int{ProNorm, ProNorm1, ProSilu} { // the quantizer's prologues
				add(GemmQ{W: 0x1000, Rows: 4096, Cols: 4096, X: 0x2000, Ldx: 8192, Quants: 0x3000, Scales: 0x4000,
					Y: 0x5000, Ldy: 4096, Pro: pro, ProU: 0x7000, ProW: 0x8000, ProEps: 1e-6}.Calls(d, 64))
			}
			for _, tl := range GemmQTiles(fam) {
				add(GemmQ{W: 0x1000, Rows: 130, Cols: 4096, X: 0x2000, Ldx: 4096, Quants: 0x3000, Scales: 0x4000,
					Y: 0x5000, Ldy: 130, ForceTile: true, Tile: tl.Suffix}.Calls(d, 64))
			}
			if d == quant.Q4TP { // the half wide tiles: each forced
				for _, tl := range GemmHTiles() {
					add(GemmQ{W: 0x1000, Rows: 130, Cols: 4096, X: 0x2000, Ldx: 4096, Quants: 0x3000, Y: 0x5000, Ldy: 130,
						F16: true, ForceTile: true, Tile: tl.Suffix}.Calls(d, 64))
				}
			}
		}
	}
	add(prescaleCalls(0x1000, 64, 256, 0x2000, 256, 0x3000, 256, 4), nil)
	add(rmsnormCalls(1, 2, 3, 4, 5, 6, 7, 1e-6, true), nil)
	add(headNormCalls(1, 2, 3, 4, 5, 6, 1e-6, false), nil)
	add(ropeCalls(1, 2, 3, 4, 5, 6, 1, 7, 8), nil)
	add(kvAppendCalls(1, 2, 3, 4, 5, 6, 7, 8, 2, 64, 100, 3), nil)
	add(ropeQKAppendCalls(1, 2, 8, 2, 64, 64, 3, 1, 4, 5, 6, 7, 100, 3, false, HeadNorms{}), nil)
	add(ropeQKAppendCalls(1, 2, 8, 2, 64, 64, 3, 1, 4, 5, 6, 7, 100, 3, true, HeadNorms{Q: 8, K: 9, Eps: 1e-6}), nil)
	add(attentionCalls(1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 8, 2, 64, 100, 4, 0.125))
	add(attentionTilesCalls(1, 192, 3, 4, 5, 6, 7, 8, 9, 128, 3, 8, 2, 64, 100, 4, 0.125, false, 0))
	add(attentionTilesCalls(1, 192, 3, 4, 5, 6, 7, 8, 9, 128, 3, 8, 2, 64, 100, 4, 0.125, true, 10))
	for _, f16 := range []bool{false, true} {
		add(attentionRopeTilesCalls(1, 768, 3, 4, 5, 6, 7, 8, 9, 512, 3, 8, 2, 64, 100, 4, 0.125, f16, RopeArgs{Inv: 11, MScale: 1, Rot: 32, Norms: HeadNorms{Q: 12, K: 13, Eps: 1e-6}}))
	}
	add(attentionMMACalls(1, 192, 3, 4, 5, 6, 7, 8, 9, 128, 3, 8, 2, 64, 100, 4, 0.125, 10, false))
	add(attentionMMACalls(1, 1024, 3, 4, 5, 6, 7, 8, 9, 1024, 3, 8, 2, 128, 100, 1, 0.125, 0, false))
	add(attentionMMACalls(1, 1024, 3, 4, 5, 6, 7, 8, 9, 1024, 3, 8, 2, 128, 100, 1, 0.125, 0, true))
	add(siluMulCalls(1, 2, 3, 4, 5, 6, 7), nil)
	add(addCalls(1, 2, 3, 4, 5, 6), nil)
	add(argmaxCalls(1, 2, 3, 4, 5), nil)
	add(sampleCalls(1, 2, 3, 4, 5, 6), nil)
	add(probeCalls(1, 2, 3, 132), nil)
	add(moeRouteCalls(1, 8, 8, 2, true, 2, 3, 3), nil)
	for _, d := range []quant.DType{quant.Q8Row, quant.Q4TP} {
		add(moeMatvecCalls(d, 1, 8, 2, 2, 6, 2, 32, 64, 3, 64, 0, 0, 4, 64, ProPlain, 132))
		add(moeMatvecCalls(d, 1, 8, 1, 2, 6, 2, 64, 32, 3, 64, 32, 1, 4, 64, ProSilu, 132))
	}
	for _, d := range []quant.DType{quant.F32, quant.F16, quant.BF16} {
		add(moeMatvecCalls(d, 1, 8, 2, 2, 6, 2, 32, 64, 3, 64, 0, 0, 4, 64, ProPlain, 132))
	}
	add(moeCombineCalls(1, 64, 2, 64, 3, 2, 4, 5, 64, 3, 6), nil)
	add(moeRouterCalls(MoERouterArgs{X: 1, Ldx: 64, Norm: 2, Eps: 1e-6, Router: 16, H: 64, E: 8, K: 2, Logits: 3, Ldl: 8, IDs: 4, W8: 5, XB: 6, Ldxb: 64, Cnt: 7, R: 2}))
	add(moeRouterCalls(MoERouterArgs{X: 1, Ldx: 64, Norm: 2, Eps: 1e-6, Router: 16, H: 64, E: 8, K: 2, Logits: 3, Ldl: 8, IDs: 4, W8: 5, XB: 6, Ldxb: 64, Cnt: 7, R: 2,
		SGW: 32, SG: 9}))
	for _, d := range []quant.DType{quant.Q4TP, quant.Q8Row} {
		add(moeDownCombineCalls(d, MoEDownCombineArgs{Table: 1, E: 8, IDs: 2, NSlot: 4, K: 2, Rows: 64, Cols: 32, X: 3, Ldx: 64, Xoff: 32, Y: 4, Ldy: 64, W8: 5}, 132))
		add(moeFFCalls(d, MoEFFArgs{TGU: 1, TD: 2, E: 8, IDs: 3, NSlot: 4, K: 2, I: 32, H: 64, X: 4, Ldx: 64, GU: 5, Ldgu: 64, Y: 6, Ldy: 64, W8: 7, Bar: 8}, 132))
	}
	add(moeSortCalls(1, 48, 8, 2, 3, 4, MoETiles(48, 8)), nil)
	add(moeGatherCalls(1, 2, 64, 2, 3, 4, 5, 6, MoETiles(48, 8)), nil)
	for _, d := range []quant.DType{quant.Q8Row, quant.Q4TP} {
		add(gemmqMoECalls(d, 1, 2, 96, 64, 3, 4, 5, 192, MoETiles(48, 8)))
	}
	add(gateSplitCalls(1, 96, 2, 64, 3, 32, 2, 16, 32, 3), nil)
	add(gateMulCalls(1, 32, 2, 32, 32, 3), nil)
	for _, grouped := range []bool{false, true} {
		dn := DeltaNet{KeyHeads: 16, ValueHeads: 32, KeyDim: 128, ValueDim: 128, ConvKernel: 4, Grouped: grouped,
			Proj: 1, Ldp: 12352, ConvW: 2, State: 3, Slot: 4, Conv: 5, Ldc: 8192, ALog: 6, Dt: 7, NormW: 8, Eps: 1e-6, Out: 9, Ldo: 4096}
		add(dn.Calls(3, 2))
		add(dn.StepCalls(3))
		add(dn.ChunkCalls(100, 2, 10))
	}
	used := map[string]bool{}
	for _, c := range all {
		k, ok := m.Kernel(c.name)
		if !ok {
			t.Fatalf("launcher names %s, not in the build", c.name)
		}
		if err := c.args.Check(paramsOf(k)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if c.cfg.Grid.X == 0 || c.cfg.Block.X == 0 {
			t.Fatalf("%s: empty launch shape %+v", c.name, c.cfg)
		}
		used[c.name] = true
	}
	for _, k := range m.Kernels {
		// lab_* (csrc/lab.cu) are launched by package lab, whose
		// TestCUDAVariantTable checks them against the manifest.
		if !used[k.Name] && !strings.HasPrefix(k.Name, "lab_") {
			t.Errorf("kernel %s has no launcher", k.Name)
		}
	}
}

// Matvec splits R > 8 into launches of 8 with the row offsets applied.
func TestMatvecSplitsRows(t *testing.T) {
	cs, err := matvecCalls(quant.Q4TP, 0x1000, 64, 256, 0x2000, 260, 0x3000, 70, 19, 0, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantNames := []string{"mv_q4tp_r8", "mv_q4tp_r8", "mv_q4tp_r3"}
	if len(cs) != len(wantNames) {
		t.Fatalf("%d launches", len(cs))
	}
	for i, c := range cs {
		b := c.args.Bytes()
		// MQ's parameters: x is the 8th, y the 11th.
		x := binary.LittleEndian.Uint64(b[c.args.Offset(7):])
		y := binary.LittleEndian.Uint64(b[c.args.Offset(10):])
		if c.name != wantNames[i] || x != 0x2000+uint64(4*8*i*260) || y != 0x3000+uint64(4*8*i*70) {
			t.Fatalf("launch %d: %s x %#x y %#x", i, c.name, x, y)
		}
		// The quantized-activation kernels: block 512, grid ⌈rows/16⌉ up to
		// SMs, shared memory for the rows' int8 copies.
		if c.cfg.Grid.X != 4 || c.cfg.Block.X != 512 || c.cfg.Shared != MatvecShared(256, []int{8, 8, 3}[i]) {
			t.Fatalf("launch %d shape %+v", i, c.cfg)
		}
	}
	if _, cfg, _ := MatvecLaunch(quant.Q8Row, 128256, 4096, 1, 132); cfg.Grid.X != 132 || cfg.Shared != 128*40+128 {
		t.Errorf("head matvec shape %+v: want grid SMs, 5248 bytes shared", cfg)
	}
	if _, cfg, _ := MatvecLaunch(quant.F16, 64, 256, 1, 132); cfg.Grid.X != 8 || cfg.Block.X != 128 || cfg.Shared != 0 {
		t.Errorf("f16 matvec shape %+v", cfg)
	}
	// 28672 columns (a 70B down projection): 35968 bytes a row, so 5 rows a launch.
	cs, err = matvecCalls(quant.Q4TP, 0x1000, 64, 28672, 0x2000, 28672, 0x3000, 64, 8, 0, false, 0)
	if err != nil || len(cs) != 2 || cs[0].name != "mv_q4tp_r5" || cs[1].name != "mv_q4tp_r3" {
		t.Errorf("wide matvec split: %v %v", err, cs)
	}
	if _, err := matvecCalls(quant.Q4TP, 1, 64, 100, 2, 100, 3, 64, 1, 0, false, 0); err == nil {
		t.Error("q4tp with 100 columns accepted")
	}
	if _, err := matvecCalls(quant.U8, 1, 64, 64, 2, 64, 3, 64, 1, 0, false, 0); err == nil {
		t.Error("a matvec over raw bytes accepted")
	}
	if _, err := attentionCalls(1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 6, 4, 64, 10, 2, 1); err == nil {
		t.Error("6 query heads over 4 kv heads accepted")
	}
}

// MQ launches: stacked rows size the grid; a norm prologue without a
// weight, an unknown prologue or a float format are refused.
func TestMQCalls(t *testing.T) {
	m := MQ{W: [3]Ptr{0x1000, 0x2000, 0x3000}, Rows: [3]int{4096, 1024, 1024}, Cols: 4096, X: 0x4000, Ldx: 4096, Y: 0x5000, Ldy: 6144, Norm: 0x6000, Pro: ProNorm}
	cs, err := m.Calls(quant.Q4TP, 1, 132)
	if err != nil || len(cs) != 1 || cs[0].name != "mv_q4tp_r1" || cs[0].cfg.Grid.X != 132 || cs[0].cfg.Shared != 128*40+128 {
		t.Fatalf("q|k|v launch: %v %+v", err, cs)
	}
	bad := []MQ{m, m, m}
	bad[0].Norm = 0
	bad[1].Pro = 7
	bad[2].Rows[0] = 0
	for i, b := range bad {
		if _, err := b.Calls(quant.Q4TP, 1, 132); err == nil {
			t.Errorf("bad MQ %d accepted", i)
		}
	}
	if _, err := m.Calls(quant.F16, 1, 132); err == nil {
		t.Error("an MQ over f16 accepted")
	}
}

// GemmKernel's tiles cover every weight row and token, and it takes the
// 128-token tile exactly when that makes GemmBlocksMin blocks or more.
func TestGemmKernelTiles(t *testing.T) {
	for _, c := range []struct {
		rows, T int
		name    string
	}{
		{64, 1, "gemm_q4tp_t64"}, {130, 100, "gemm_q4tp_t64"}, {4096, 512, "gemm_q4tp_t64"},
		{14336, 512, "gemm_q4tp"}, {8192, 512, "gemm_q4tp"}, {4096, 1024, "gemm_q4tp"}, {128, 32768, "gemm_q4tp"},
	} {
		name, grid, block := GemmKernel("q4tp", c.rows, c.T)
		bm := 128
		if strings.HasSuffix(name, "_t64") {
			bm = 64
		}
		if name != c.name || block.X != 256 || block.Y != 1 || grid.Z != 1 {
			t.Errorf("%d×T%d: %s block %v, want %s, 256", c.rows, c.T, name, block, c.name)
		}
		if int(grid.X)*128 < c.rows || int(grid.X-1)*128 >= c.rows || int(grid.Y)*bm < c.T || int(grid.Y-1)*bm >= c.T {
			t.Errorf("%d×T%d: grid %v does not tile 128×%d blocks", c.rows, c.T, grid, bm)
		}
		if big := int((c.rows+127)/128) * ((c.T + 127) / 128); (bm == 128) != (big >= GemmBlocksMin) {
			t.Errorf("%d×T%d: %d blocks of 128 tokens, took %s", c.rows, c.T, big, name)
		}
	}
}

// GemmQKernel's tiles cover every weight row and token: for T ≤ 64 the
// wide tile of the fewest tokens ≥ T with GemmQWideKS's cluster (the
// largest K split whose clusters all fit the H200 at once, at least a chunk of 8
// groups a block; its ring's shared memory), else 128 × 128 exactly when
// that makes GemmBlocksMin blocks, else 128 × 64.
func TestGemmQKernelTiles(t *testing.T) {
	defer SetClusterCaps(CurrentClusterCaps())
	SetClusterCaps(H200ClusterCaps)
	for _, c := range []struct {
		rows, cols, T int
		name          string
	}{
		{37, 4096, 1, "gemmq_q4tp_w16k8"}, {4096, 4096, 16, "gemmq_q4tp_w16k7"}, {14336, 4096, 16, "gemmq_q4tp_w16k2"},
		{14336, 4096, 17, "gemmq_q4tp_w32k2"}, {4096, 4096, 32, "gemmq_q4tp_w32k7"}, {4096, 4096, 64, "gemmq_q4tp_w64k7"},
		{4096, 14336, 64, "gemmq_q4tp_w64k7"}, {1024, 4096, 64, "gemmq_q4tp_w64k8"}, {3840, 4096, 64, "gemmq_q4tp_w64k8"},
		{6144, 4096, 33, "gemmq_q4tp_w64k4"},
		{28672, 4096, 64, "gemmq_q4tp_w64k1"}, {4096, 96, 64, "gemmq_q4tp_w64k1"}, {4096, 512, 9, "gemmq_q4tp_w16k2"},
		{130, 4096, 65, "gemmq_q4tp_t64"}, {4096, 4096, 512, "gemmq_q4tp_t64"}, {14336, 4096, 512, "gemmq_q4tp"},
		{4096, 4096, 1024, "gemmq_q4tp"},
	} {
		name, grid, block := GemmQKernel("q4tp", c.rows, c.cols, c.T)
		tl, ok := gemmqTile("q4tp", strings.TrimPrefix(name, "gemmq_q4tp"))
		if name != c.name || !ok || block.X != 256 || block.Y != 1 {
			t.Errorf("%d×%d T%d: %s block %v, want %s, 256", c.rows, c.cols, c.T, name, block, c.name)
			continue
		}
		bn, bm := tl.BN, tl.BM
		gy, gt := grid.Y, grid.Y
		if tl.Wide() {
			gy, gt = uint32(tl.KS), grid.Z
			if grid.Y != gy {
				t.Errorf("%s: grid %v, want %d K slices", name, grid, tl.KS)
			}
		} else if grid.Z != 1 {
			t.Errorf("%s: grid %v", name, grid)
		}
		if int(grid.X)*bn < c.rows || int(grid.X-1)*bn >= c.rows || int(gt)*bm < c.T || int(gt-1)*bm >= c.T {
			t.Errorf("%d×T%d: grid %v does not tile %d×%d blocks", c.rows, c.T, grid, bn, bm)
		}
		if tl.Wide() && tl.KS > 1 && (int(grid.X)*tl.KS > GemmQSlots || int(grid.X) > H200ClusterCaps[tl.KS]) {
			t.Errorf("%s: %d clusters of %d, the H200 runs %d at once", name, grid.X, tl.KS, H200ClusterCaps[tl.KS])
		}
		_, cfg, err := GemmQLaunch("q4tp", tl.Suffix, c.rows, c.T)
		if err != nil || cfg.Shared != tl.Shared("q4tp") || (cfg.Shared > 0) != (tl.Small() || tl.Wide()) {
			t.Errorf("%s: shared %d (%v)", name, cfg.Shared, err)
		}
	}
	if name, _, _ := GemmQKernel("q8row", 14336, 4096, 512); name != "gemmq_q8row_t64" {
		t.Errorf("q8row 14336×T512: %s, want gemmq_q8row_t64", name)
	}
	if name, _, _ := GemmQKernel("q8row", 4096, 4096, 64); name != "gemmq_q8row_w64k7" {
		t.Errorf("q8row 4096×T64: %s, want gemmq_q8row_w64k7", name)
	}
	if _, _, err := GemmQLaunch("q4tp", "_s8", 64, 8); err == nil {
		t.Error("an unknown tile launched")
	}
	if GemmQPerm("q4tp", "_w64k8") != 2 || GemmQPerm("q8row", "_w16k1") != 3 || GemmQPerm("q4tp", "_s64") != 1 || GemmQPerm("q8row", "") != 0 {
		t.Error("GemmQPerm")
	}
}

// GemmQ quantizes first (gemmq_actq over T rows, q4tp's quants permuted)
// and refuses what the kernels do not take.
func TestGemmQCalls(t *testing.T) {
	g := GemmQ{W: 0x1000, Rows: 130, Cols: 1056, X: 0x2000, Ldx: 1060, Quants: 0x3000, Scales: 0x4000, Y: 0x5000, Ldy: 130}
	for _, d := range []quant.DType{quant.Q8Row, quant.Q82F, quant.Q4TP} {
		cs, err := g.Calls(d, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) != 2 || cs[0].name != "gemmq_actq" || !strings.HasPrefix(cs[1].name, "gemmq_") {
			t.Fatalf("%s: launches %v", d, cs)
		}
		if cs[0].cfg.Grid.X != 5 || cs[0].cfg.Grid.Y != 100 || cs[0].cfg.Block.X != 256 {
			t.Errorf("%s: gemmq_actq launch %+v", d, cs[0].cfg)
		}
		b := cs[0].args.Bytes()
		if perm := binary.LittleEndian.Uint32(b[len(b)-4:]); (perm == 1) != (d == quant.Q4TP) {
			t.Errorf("%s: perm %d", d, perm)
		}
	}
	bad := []GemmQ{g, g, g, g}
	bad[0].Cols = 1000 // not whole blocks
	bad[1].W = 0x1008  // not 16-byte aligned
	bad[2].Ldx = 1000
	bad[3].Rows = 0
	for i, b := range bad {
		if _, err := b.Calls(quant.Q4TP, 9); err == nil {
			t.Errorf("case %d accepted", i)
		}
	}
	if _, err := g.Calls(quant.BF16, 9); err == nil {
		t.Error("a bf16 int8 gemm accepted")
	}
}

// TestGemmQWideKSClusterCaps: the K split follows the device's cluster
// capacities: with the H200's, 32 row tiles take clusters of 7 (32 of 8 do
// not fit at once), 30 take 8, 48 take 4; with a device that holds only
// 20 clusters of 8 and 24 of 7, 32 row tiles take 4; a cluster never
// outgrows the chunks of K (8 groups each).
func TestGemmQWideKSClusterCaps(t *testing.T) {
	defer SetClusterCaps(CurrentClusterCaps())
	SetClusterCaps(H200ClusterCaps)
	for _, c := range []struct{ rows, cols, ks int }{
		{4096, 4096, 7}, {3840, 4096, 8}, {4096, 14336, 7}, {6144, 4096, 4}, {14336, 4096, 2}, {28672, 4096, 1},
		{4096, 512, 2}, {4096, 1792, 7}, {4096, 1536, 4}, {128, 256, 1},
	} {
		if ks := GemmQWideKS(c.rows, c.cols); ks != c.ks {
			t.Errorf("H200, %d×%d: KS %d, want %d", c.rows, c.cols, ks, c.ks)
		}
	}
	small := H200ClusterCaps
	small[8], small[7] = 20, 24
	SetClusterCaps(small)
	if ks := GemmQWideKS(4096, 4096); ks != 4 {
		t.Errorf("20 clusters of 8, 24 of 7, 4096×4096: KS %d, want 4", ks)
	}
	if ks := GemmQWideKS(2560, 4096); ks != 8 {
		t.Errorf("20 clusters of 8, 2560×4096: KS %d, want 8", ks)
	}
	for ks := 1; ks <= 8; ks++ {
		if H200ClusterCaps[ks]*ks > GemmQSlots {
			t.Errorf("H200ClusterCaps[%d] = %d: more blocks than the %d slots", ks, H200ClusterCaps[ks], GemmQSlots)
		}
	}
}

// attn_mma_h takes heads of 64 or 128 dimensions and GQA groups up to 16
// (one 16-row query tile), and refuses the rest.
func TestAttnMMAFits(t *testing.T) {
	for _, c := range []struct {
		hd, ldq, G int
		ok         bool
	}{{128, 4096, 4, true}, {64, 2048, 16, true}, {128, 4096, 17, false}, {80, 4096, 4, false}, {256, 4096, 4, false},
		{128, 4098, 4, false}, {64, 64, 1, true}, {128, 4096, 0, false}} {
		if got := AttnMMAFits(c.hd, c.ldq, c.G); got != c.ok {
			t.Errorf("AttnMMAFits(%d, %d, %d) = %v", c.hd, c.ldq, c.G, got)
		}
	}
	if _, err := attentionMMACalls(1, 4096, 3, 4, 5, 6, 7, 8, 9, 4096, 3, 32, 1, 128, 100, 1, 0.1, 0, false); err == nil {
		t.Error("a GQA group of 32 was launched on one 16-row tile")
	}
	for _, hd := range []int{64, 128} {
		if name, w, sh := AttnMMAVariant(hd, false); sh != 2*(16+w*64)*(hd+8) || sh > 48<<10 || name != fmt.Sprintf("attn_mma_h_d%d", hd) {
			t.Errorf("AttnMMAVariant(%d) = %s, %d warps, %d bytes", hd, name, w, sh)
		}
	}
	if name, w, sh := AttnMMAVariant(128, true); name != "attn_mma_h_d128w4" || w != 4 || sh != 2*(16+256)*136 {
		t.Errorf("AttnMMAVariant(128, w4) = %s, %d warps, %d bytes", name, w, sh)
	}
}

// mv_moe_*'s SwiGLU epilogue (MoEXGLU) is packed only where the kernel
// takes it: q4tp gate|up (nmat 2) of at most 128 groups a row, y rows of
// at least rowsE; the other modes keep their checks.
func TestMoEGLUCalls(t *testing.T) {
	for _, c := range []struct {
		d               quant.DType
		nmat, cols, ldy int
		xmode           int
		ok              bool
	}{
		{quant.Q4TP, 2, 2048, 768, MoEXGLU, true},
		{quant.Q4TP, 2, 4096, 768, MoEXGLU, true},
		{quant.Q4TP, 2, 4128, 768, MoEXGLU, false}, // 129 groups: one segment a warp
		{quant.Q4TP, 1, 2048, 768, MoEXGLU, false},
		{quant.Q8Row, 2, 2048, 768, MoEXGLU, false},
		{quant.Q4TP, 2, 2048, 767, MoEXGLU, false},
		{quant.Q4TP, 2, 2048, 768, MoEXRow, false}, // both products need 2·rowsE
		{quant.Q4TP, 2, 2048, 1536, MoEXRow, true},
		{quant.Q4TP, 2, 2048, 1536, 3, false},
	} {
		calls, err := moeMatvecCalls(c.d, 1<<20, 8, c.nmat, 2<<20, 8, 8, 768, c.cols, 3<<20, c.cols, 0, c.xmode, 4<<20, c.ldy, ProPlain, 132)
		if (err == nil) != c.ok {
			t.Fatalf("%s nmat %d cols %d ldy %d xmode %d: error %v, want ok %v", c.d, c.nmat, c.cols, c.ldy, c.xmode, err, c.ok)
		}
		if err == nil && (len(calls) != 1 || calls[0].name != "mv_moe_"+MoEExpertFamily(c.d)) {
			t.Fatalf("%s xmode %d: calls %v", c.d, c.xmode, calls)
		}
	}
	if MoEGLUFits(quant.Q4TP, 2050) || !MoEGLUFits(quant.Q4TP, 32) {
		t.Fatal("MoEGLUFits: rows of whole groups up to 128 groups")
	}
}

// TestPrefillLaunchShapes: the float product takes 16-token tiles when
// 32-token ones would leave multiprocessors idle (a 128-expert router over
// 512 rows: 64 blocks → 128), else 32; stacked tensors above 64 rows take
// GemmQStacked with grid z over them and x over the largest, at most 64
// rows the wide tiles, one tensor GemmQSuffix's tile.
func TestPrefillLaunchShapes(t *testing.T) {
	if n, g, b := FloatMatmulLaunch(quant.F32, 128, 512, 132); n != "mm_f32_t16" || g != driver.D2(4, 32) || b != driver.D1(256) {
		t.Errorf("router 128×2048 over 512 rows: %s %v %v", n, g, b)
	}
	if n, g, _ := FloatMatmulLaunch(quant.BF16, 4096, 512, 132); n != "mm_bf16" || g != driver.D2(128, 16) {
		t.Errorf("4096 rows over 512: %s %v", n, g)
	}
	qkv := GemmQ{W: 0x1000, Rows: 4096, Cols: 2048, More: []GemmQPart{{W: 0x2000, Rows: 512}, {W: 0x3000, Rows: 512}}}
	if s := qkv.Suffix("q4tp", 512); s != GemmQStacked {
		t.Errorf("q|k|v over 512 rows: tile %q", s)
	}
	name, cfg, err := qkv.Launch("q4tp", GemmQStacked, 512)
	if err != nil || name != "gemmq_q4tp_t64s" || cfg.Grid != driver.D3(32, 8, 3) || cfg.Block != driver.D1(256) {
		t.Errorf("q|k|v over 512 rows: %s %+v %v", name, cfg, err)
	}
	if s := qkv.Suffix("q4tp", 64); !strings.HasPrefix(s, "_w") {
		t.Errorf("q|k|v over 64 rows: tile %q, want a wide one", s)
	}
	one := GemmQ{W: 0x1000, Rows: 4096, Cols: 2048}
	if s := one.Suffix("q4tp", 512); s != GemmQSuffix("q4tp", 4096, 2048, 512) || WideParams(s) {
		t.Errorf("one tensor over 512 rows: tile %q", s)
	}
	if _, _, err := qkv.Launch("f32", GemmQStacked, 512); err == nil {
		t.Error("a stacked int8 tile for f32 accepted")
	}
}
