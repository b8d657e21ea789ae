package kern_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/kern"
)

// TestEmuDeltaNet runs deltanet.cu's own source on the host (the binary
// scripts/emu-deltanet builds with emu/common.cuh's thread-per-CUDA-thread
// emulation, named by CORTIQ_EMU_DELTANET; skipped without it) over steps
// that mix sequences, and compares each step's conv output, block output
// and state pool with dnReference (the CPU kernels), at four head shapes
// (the parity suite's; dk = dv = 128; dk = 40, dv = 24: rows not a
// multiple of the thread groups, a partial warp of columns; dk = 160, dv =
// 128: more rows a thread than dn_rule keeps in registers, its shared-
// memory path) and both projection layouts, with dn_rule ("rule") and
// with the chunked rule ("chunk": dn_chunk_prep, dn_chunk_state, dn_gnorm;
// the shapes kern.DeltaNet.ChunkFits takes), the last step's sequences
// long enough for whole and partial chunks.
func TestEmuDeltaNet(t *testing.T) {
	bin := os.Getenv("CORTIQ_EMU_DELTANET")
	if bin == "" {
		t.Skip("CORTIQ_EMU_DELTANET is not set (scripts/emu-deltanet builds the emulator and sets it)")
	}
	dir := t.TempDir()
	in, outPath := filepath.Join(dir, "in.bin"), filepath.Join(dir, "out.bin")
	steps := [][]int32{
		{1, 1, 1, 1, 1, 3, 0, 0},
		{1, 3, 0},
		{2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 1, 1},
		{2, 0, 1, 3},
		// Chunks: 70 rows (a whole chunk and 6), a decode row, 130 (two
		// and 2), 64 (exactly one).
		append(append(append(runOf(0, 70), 3), runOf(1, 130)...), runOf(2, 64)...),
	}
	const seqs = 4
	for _, mode := range []string{"rule", "chunk"} {
		for _, shape := range []struct{ nk, nv, dk, dv int }{{2, 4, 16, 8}, {1, 2, 128, 128}, {2, 4, 40, 24}, {1, 1, 160, 128}} {
			for _, grouped := range []bool{false, true} {
				r := rng(41 + shape.dk)
				k, convW, aLog, dtBias, normW := dnLayer(&r, shape.nk, shape.nv, shape.dk, shape.dv, grouped)
				if mode == "chunk" && !k.ChunkFits() {
					continue
				}
				_, vd, cd := k.Dims()
				pw, stride := k.ProjWidth(), k.StateFloats()
				pool := r.vec(seqs*stride, 0.2)
				ref := append([]float32(nil), pool...)
				for si, slots := range steps {
					if mode == "rule" && si == len(steps)-1 {
						break // the long step is for chunks (dn_rule over it: minutes of emulated barriers; the GPU tests run it)
					}
					R := len(slots)
					proj := r.vec(R*pw, 1)
					nseq := stepSeqs(slots)
					var b []byte
					for _, v := range []int{k.KeyHeads, k.ValueHeads, k.KeyDim, k.ValueDim, 4, b2i(grouped), R, seqs, nseq, kern.DNRuleThreads(k.ValueDim), kern.DNRuleShared(k.KeyDim, k.ValueDim)} {
						b = binary.LittleEndian.AppendUint32(b, uint32(v))
					}
					b = binary.LittleEndian.AppendUint32(b, math.Float32bits(k.Eps))
					b = append(b, f32bytes(proj)...)
					for _, s := range slots {
						b = binary.LittleEndian.AppendUint32(b, uint32(s))
					}
					for _, v := range [][]float32{convW, aLog, dtBias, normW, pool} {
						b = append(b, f32bytes(v)...)
					}
					if err := os.WriteFile(in, b, 0o644); err != nil {
						t.Fatal(err)
					}
					if out, err := exec.Command(bin, in, outPath, mode).CombinedOutput(); err != nil {
						t.Fatalf("%v: %s", err, out)
					}
					o, err := os.ReadFile(outPath)
					if err != nil {
						t.Fatal(err)
					}
					got := bytesf32(o)
					if len(got) != R*cd+R*vd+seqs*stride {
						t.Fatalf("the emulator wrote %d floats, want %d", len(got), R*cd+R*vd+seqs*stride)
					}
					wantConv, wantOut := dnReference(k, proj, slots, ref, convW, aLog, dtBias, normW)
					name := fmt.Sprintf("%s %v grouped=%v step %d", mode, shape, grouped, si)
					dnClose(t, name+": conv", got[:R*cd], wantConv, 1e-5)
					dnClose(t, name+": out", got[R*cd:R*cd+R*vd], wantOut, 1e-4)
					pool = got[R*cd+R*vd:]
					dnClose(t, name+": pool", pool, ref, 1e-5)
				}
				t.Logf("%s %v grouped=%v: ok", mode, shape, grouped)
			}
		}
	}
}

// runOf is n rows of slot s.
func runOf(s int32, n int) []int32 {
	r := make([]int32, n)
	for i := range r {
		r[i] = s
	}
	return r
}

// stepSeqs is the number of sequences (runs of one slot) in a step's rows.
func stepSeqs(slots []int32) int {
	n := 0
	for i, s := range slots {
		if i == 0 || slots[i-1] != s {
			n++
		}
	}
	return n
}
