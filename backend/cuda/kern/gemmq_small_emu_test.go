package kern

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/quant"
)

// A sequential Go emulation of gemmq.cu's small-batch tiles (gemmq_small):
// the cp.async ring's slots and layout (weights as stored, q4tp's two code
// words a row and stage, activations, scales), the schedule of the
// prologue and main loop in program order (which stage is copied into
// which slot when, rungs one stage ahead), the warps' split along rows and
// K, the A fragments through ldmatrix, the B fragments expanded from the
// raw bytes, the m16n8k32 s8 product, the fixed-order reduction of the WK
// partials through the ring and the epilogue. Like gemmq_emu_test.go it
// checks the index arithmetic without a GPU, not what the CUDA compiles to
// nor the asynchronous copies' timing (TestGPUGemmQParity does).

type emuSmallOut struct {
	maxShared int // highest byte of the ring touched + 1
}

func emuGemmQSmall(tl GemmQTile, q4 bool, W []byte, rows, cols int, xq []int8, d []float32, y []float32, ldy, T int,
	bias []float32, accumulate bool) emuSmallOut {
	const threads = 256
	fam := "q8row"
	wb := 32
	if q4 {
		fam, wb = "q4tp", 16
	}
	ft, tn := tl.BM/16, tl.BN/tl.WN
	fn := tn / 8
	lda, ldb := tl.KG*32+16, tl.KG*wb+16
	offB := tl.BM * lda
	offD := offB + tl.BN*ldb
	offR := offD + tl.BM*tl.KG*4
	offC := offR
	if q4 {
		offC += tl.BN * tl.KG * 4
	}
	stage := tl.Shared(fam) / tl.NS
	ldr := tl.BN + 4
	nb := cols / 32
	nk := (nb + tl.KG - 1) / tl.KG
	cbytes := (5*nb + 7) / 8
	coff := rows*nb*16 + rows*4
	wend := coff + rows*cbytes
	var out emuSmallOut
	putF := func(sm []byte, off int, v float32) { binary.LittleEndian.PutUint32(sm[off:], math.Float32bits(v)) }
	getF := func(sm []byte, off int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(sm[off:])) }
	rowOff := func(o int) int {
		if q4 {
			return o * nb * 16
		}
		return o * cols
	}
	for bx := 0; bx*tl.BN < rows; bx++ {
		for by := 0; by*tl.BM < T; by++ {
			o0, t0 := bx*tl.BN, by*tl.BM
			sm := make([]byte, tl.NS*stage)
			touch := func(off, n int) {
				out.maxShared = max(out.maxShared, off+n)
			}
			issueW := func(s int) {
				base := (s % tl.NS) * stage
				cw := tl.KG * wb / 16
				for u := range tl.BN * cw {
					r, c := u/cw, u%cw
					g := s*tl.KG + c*16/wb
					dst := base + offB + r*ldb + c*16
					touch(dst, 16)
					for e := range 16 {
						var v byte
						if g < nb {
							v = W[rowOff(min(o0+r, rows-1))+s*tl.KG*wb+c*16+e]
						}
						sm[dst+e] = v
					}
				}
				if q4 {
					for u := range tl.BN * 2 {
						r := u >> 1
						p := coff + min(o0+r, rows-1)*cbytes + 5*tl.KG*s/8
						a := p&^3 + 4*(u&1)
						dst := base + offC + r*8 + 4*(u&1)
						touch(dst, 4)
						for e := range 4 {
							// Bytes past the tensor are zeros (the kernel reads
							// its last, partial word byte by byte).
							var v byte
							if a+e < wend {
								v = W[a+e]
							}
							sm[dst+e] = v
						}
					}
				}
			}
			issueX := func(s int) {
				base := (s % tl.NS) * stage
				for u := range tl.BM * tl.KG * 2 {
					r, c := u/(2*tl.KG), u%(2*tl.KG)
					g := s*tl.KG + c/2
					dst := base + r*lda + c*16
					touch(dst, 16)
					for e := range 16 {
						var v int8
						if g < nb {
							v = xq[min(t0+r, T-1)*cols+s*tl.KG*32+c*16+e]
						}
						sm[dst+e] = byte(v)
					}
				}
				for u := range tl.BM * tl.KG {
					r, kg := u/tl.KG, u%tl.KG
					g := s*tl.KG + kg
					var v float32
					if g < nb {
						v = d[min(t0+r, T-1)*nb+g]
					}
					touch(base+offD+(kg*tl.BM+r)*4, 4)
					putF(sm, base+offD+(kg*tl.BM+r)*4, v)
				}
			}
			rungs := func(s int) {
				base := (s % tl.NS) * stage
				for u := range tl.BN * tl.KG {
					r, kg := u/tl.KG, u%tl.KG
					g, o := s*tl.KG+kg, min(o0+r, rows-1)
					p := coff + o*cbytes + 5*tl.KG*s/8
					win := uint64(binary.LittleEndian.Uint32(sm[base+offC+r*8:])) |
						uint64(binary.LittleEndian.Uint32(sm[base+offC+r*8+4:]))<<32
					sh := (p&3)*8 + (5*tl.KG*s)%8 + 5*kg
					if sh+5 > 64 {
						panic("code window overflow")
					}
					code := int((win >> sh) & 31)
					var v float32
					if g < nb {
						po := rows*nb*16 + 4*o
						a := half.F16ToF32(binary.LittleEndian.Uint16(W[po:]))
						b := half.F16ToF32(binary.LittleEndian.Uint16(W[po+2:]))
						v = float32(math.Exp2(float64(a + float32(code)*b)))
					}
					touch(base+offR+(kg*tl.BN+r)*4, 4)
					putF(sm, base+offR+(kg*tl.BN+r)*4, v)
				}
			}
			// acc[warp][i][n][lane][e]
			acc := make([][][][32][4]float32, 8)
			for w := range acc {
				acc[w] = make([][][32][4]float32, ft)
				for i := range acc[w] {
					acc[w][i] = make([][32][4]float32, fn)
				}
			}
			compute := func(s int) {
				base := (s % tl.NS) * stage
				for warp := range 8 {
					wn, wk := (warp%tl.WN)*tn, warp/tl.WN
					for kk := range tl.KG / tl.WK {
						kg := kk*tl.WK + wk
						var b0, b1 [][32]uint32
						for n := range fn {
							var x0, x1 [32]uint32
							for l := range 32 {
								g4, q := l>>2, l&3
								grp := base + offB + (wn+g4)*ldb + 8*n*ldb + kg*wb
								if q4 {
									nib := func(x uint32) uint32 { return ((x & 0x0F0F0F0F) + 0x78787878) ^ 0x80808080 }
									sh := 4 * (q & 1)
									x0[l] = nib(binary.LittleEndian.Uint32(sm[grp+4*(q>>1):]) >> sh)
									x1[l] = nib(binary.LittleEndian.Uint32(sm[grp+8+4*(q>>1):]) >> sh)
								} else {
									x0[l] = binary.LittleEndian.Uint32(sm[grp+4*q:])
									x1[l] = binary.LittleEndian.Uint32(sm[grp+16+4*q:])
								}
							}
							b0, b1 = append(b0, x0), append(b1, x1)
						}
						for i := range ft {
							var addr [32]int
							for l := range 32 {
								addr[l] = base + (l&15)*lda + (l>>4)*16 + 16*i*lda + kg*32
							}
							fa := ldsm4(sm, addr)
							for n := range fn {
								c := mma16832(fa, b0[n], b1[n])
								for l := range 32 {
									g4, q := l>>2, l&3
									d0 := getF(sm, base+offD+4*(kg*tl.BM+g4+16*i))
									d1 := getF(sm, base+offD+4*(kg*tl.BM+g4+16*i+8))
									rs := [2]float32{1, 1}
									if q4 {
										rs[0] = getF(sm, base+offR+4*(kg*tl.BN+wn+2*q+8*n))
										rs[1] = getF(sm, base+offR+4*(kg*tl.BN+wn+2*q+8*n+1))
									}
									a := &acc[warp][i][n][l]
									a[0] += float32(c[l][0]) * (d0 * rs[0])
									a[1] += float32(c[l][1]) * (d0 * rs[1])
									a[2] += float32(c[l][2]) * (d1 * rs[0])
									a[3] += float32(c[l][3]) * (d1 * rs[1])
								}
							}
						}
					}
				}
			}
			// The kernel's schedule in program order.
			for s := range tl.NS - 1 {
				if s < nk {
					issueW(s)
				}
			}
			for s := range tl.NS - 1 {
				if s < nk {
					issueX(s)
				}
			}
			if q4 {
				rungs(0)
			}
			for s := range nk {
				if q4 && s+1 < nk {
					rungs(s + 1)
				}
				if s+tl.NS-1 < nk {
					issueW(s + tl.NS - 1)
					issueX(s + tl.NS - 1)
				}
				compute(s)
			}
			// Reduction through the ring, then the epilogue.
			for warp := range 8 {
				wn, wk := (warp%tl.WN)*tn, warp/tl.WN
				for l := range 32 {
					g4, q := l>>2, l&3
					for i := range ft {
						for n := range fn {
							for u := range 2 {
								off := 4 * (wk*tl.BM*ldr + (16*i+g4+8*u)*ldr + wn + 8*n + 2*q)
								touch(off, 8)
								putF(sm, off, acc[warp][i][n][l][2*u])
								putF(sm, off+4, acc[warp][i][n][l][2*u+1])
							}
						}
					}
				}
			}
			for idx := range tl.BM * tl.BN {
				tl0, ol := idx/tl.BN, idx%tl.BN
				t, o := t0+tl0, o0+ol
				if t >= T || o >= rows {
					continue
				}
				v := getF(sm, 4*(tl0*ldr+ol))
				for k := 1; k < tl.WK; k++ {
					v += getF(sm, 4*((k*tl.BM+tl0)*ldr+ol))
				}
				sc := float32(1)
				if !q4 {
					sc = half.F16ToF32(binary.LittleEndian.Uint16(W[rows*cols+2*o:]))
				}
				var bv float32
				if bias != nil {
					bv = bias[o]
				}
				v = v*sc + bv
				if accumulate {
					v += y[t*ldy+o]
				}
				y[t*ldy+o] = v
			}
		}
	}
	return out
}

// seqOrder is the single-accumulator order of the register-staged tiles
// and the CPU (groups left to right, acc += f(c)·(d·rung)), for the
// NMSE of the small tiles' split accumulation against it.
func seqOrder(q4 bool, W []byte, rows, cols int, xq []int8, d []float32, t, o int) float32 {
	st := emuStager{W, rows, cols, q4}
	nb := cols / 32
	var acc float32
	for g := range nb {
		var c int
		var rung float32 = 1
		for h := range 2 {
			w, r := st.unit(o, g, h)
			if h == 0 && q4 {
				rung = r
			}
			for e := range 16 {
				c += int(int8(w[e])) * int(xq[t*cols+32*g+16*h+e])
			}
		}
		acc += float32(c) * (d[t*nb+g] * rung)
	}
	return acc * st.scale(o)
}

// TestGemmQSmallEmulation: every small-batch tile, emulated, on q8_row and
// q4tp tensors of odd shapes (rows not a multiple of the tile's, 3 groups
// (fewer than a stage), 33 (a partial last stage), 160 (more stages than
// the ring)) and T from 1 to 64 (several token blocks where T > BM, as
// larger T would launch them) against float64 sums of quant.Decode's
// weights × kern.ActQuant's activations (tolerance 1e-5 of Σ|terms|, the
// GPU test's); every element outside the product untouched; the ring
// never overrun by the reduction. It also measures the NMSE of the small
// tiles' split-K order (WK partial sums added in a fixed order) against
// the single-accumulator order the other tiles and the CPU use: at most
// 1e-10 (float32 rounding gives ~1e-14).
func TestGemmQSmallEmulation(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 13))
	vec := func(n int, s float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64()) * s
		}
		return v
	}
	shapes := [][3]int{{37, 96, 9}, {70, 1056, 16}, {33, 5120, 33}, {130, 160, 64}, {64, 256, 1}}
	for _, dt := range []quant.DType{quant.Q8Row, quant.Q4TP} {
		q4 := dt == quant.Q4TP
		fam := "q8row"
		if q4 {
			fam = "q4tp"
		}
		for _, sh := range shapes {
			rows, cols, T := sh[0], sh[1], sh[2]
			wb, err := quant.Encode(dt, vec(rows*cols, 0.05), []int{rows, cols}, nil)
			if err != nil {
				t.Fatal(err)
			}
			wd, _ := quant.Decode(dt, wb, []int{rows, cols})
			ldx := cols + 3
			x := vec(T*ldx, 1)
			bias := vec(rows, 0.1)
			xq, d := emuActQ(x, ldx, cols, T, q4)
			for _, tl := range gemmqSmall[fam] {
				t.Run(fmt.Sprintf("%s/%dx%d/T%d/gemmq%s", dt, rows, cols, T, tl.Suffix), func(t *testing.T) {
					used := checkEmuGemm(t, func(y []float32, ldy int, bias []float32, acc bool) int {
						return emuGemmQSmall(tl, q4, wb, rows, cols, xq, d, y, ldy, T, bias, acc).maxShared
					}, q4, wb, wd, rows, cols, x, ldx, xq, d, T, bias, vec)
					if used > tl.Shared(fam) {
						t.Fatalf("ring of %d bytes, %d touched", tl.Shared(fam), used)
					}
				})
			}
		}
	}
}

// The Go table of small-batch tiles is gemmq.cu's GEMMQ_SMALL lines; every
// 64-row tile's ring (and q4tp's ladders) fits two blocks an SM of the
// H200 (228 KB an SM, 1 KB of it reserved a block), every 32-row "h" one
// a block (227 KB at most), and the h tiles make at most 128 blocks at
// GemmQWideRows rows (one wave at one an SM).
func TestGemmQSmallTilesMatchSource(t *testing.T) {
	src, err := os.ReadFile("csrc/gemmq.cu")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^GEMMQ_SMALL\((\w+?)_(s\w+), GQSQ\w+, (\d+), (\d+), (\d+), (\d+), (\d+), (\d+)\)`)
	got := map[string][]GemmQTile{}
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		n := make([]int, 6)
		for i := range n {
			n[i], _ = strconv.Atoi(m[3+i])
		}
		got[m[1]] = append(got[m[1]], GemmQTile{"_" + m[2], n[1], n[0], n[2], n[3], n[4], n[5], 0, false, false, false})
	}
	if fmt.Sprint(got) != fmt.Sprint(gemmqSmall) {
		t.Fatalf("gemmq.cu's GEMMQ_SMALL lines %v, kern's table %v", got, gemmqSmall)
	}
	for fam, tiles := range gemmqSmall {
		for _, tl := range tiles {
			sh := tl.Shared(fam) + 4*tl.BN // + q4tp's static ladder
			if h := strings.HasSuffix(tl.Suffix, "h"); h != (tl.BN == 32) || (!h && 2*(sh+1024) > 228<<10) || sh > 227<<10 {
				t.Errorf("gemmq_%s%s: %d bytes of shared memory (two blocks an SM for 64 rows, one for the h tiles)", fam, tl.Suffix, sh)
			}
			if tl.BN == 32 && (GemmQWideRows+31)/32 > 128 {
				t.Errorf("gemmq_%s%s: %d blocks at GemmQWideRows rows", fam, tl.Suffix, (GemmQWideRows+31)/32)
			}
		}
	}
}

// The embedded build spills in no more functions than the two known ones
// (mv_bf16_r4, mv_f16_r4: scripts/build-cuda's ptxas log names them): a
// kernel change that makes a gemmq_* tile spill fails here, on the CPU.
func TestBuildSpillsNoMore(t *testing.T) {
	b, err := os.ReadFile("build/manifest.json")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Status   string `json:"status"`
		Spilling *int   `json:"ptxas_functions_spilling"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.Status != "built" {
		t.Skip("manifest records no build")
	}
	if m.Spilling == nil {
		t.Fatal("the manifest records no ptxas spill count")
	}
	if *m.Spilling > 2 {
		t.Fatalf("ptxas reports %d spilling functions, at most 2 known (mv_bf16_r4, mv_f16_r4)", *m.Spilling)
	}
}

// checkEmuGemm runs an emulated int8 GEMM (run: into y with leading
// dimension ldy, optional bias, accumulate or store; it returns the
// shared-memory bytes touched) twice: with bias and accumulate into a
// random Y of T+1 rows and padded columns, against float64 sums of the
// decoded weights wd × kern.ActQuant's activations of x (tolerance 1e-5
// of Σ|terms|, every element outside the product untouched), and as a
// plain store, whose NMSE against the single-accumulator order of the
// CPU (seqOrder over xqSeq, the quants in the _s tiles' order) must stay
// under 1e-10. It returns the larger shared-memory extent of the two runs.
func checkEmuGemm(t *testing.T, run func(y []float32, ldy int, bias []float32, acc bool) int, q4 bool, wb []byte, wd []float32,
	rows, cols int, x []float32, ldx int, xqSeq []int8, d []float32, T int, bias []float32, vec func(int, float32) []float32) int {
	t.Helper()
	ldy := rows + 2
	y0 := vec((T+1)*ldy, 1)
	y := append([]float32(nil), y0...)
	used := run(y, ldy, bias, true)
	ys := make([]float32, T*rows)
	used = max(used, run(ys, rows, nil, false))
	var num, den float64
	for ti := range T + 1 {
		var xe []float64
		if ti < T {
			xe = ActQuant(x[ti*ldx : ti*ldx+cols])
		}
		for o := range ldy {
			if ti >= T || o >= rows {
				if y[ti*ldy+o] != y0[ti*ldy+o] {
					t.Fatalf("y[%d][%d] outside the product written", ti, o)
				}
				continue
			}
			want := float64(bias[o]) + float64(y0[ti*ldy+o])
			mag := math.Abs(want)
			for k, v := range xe {
				p := float64(wd[o*cols+k]) * v
				want += p
				mag += math.Abs(p)
			}
			if diff := math.Abs(float64(y[ti*ldy+o]) - want); diff > 1e-5*mag+1e-7 {
				t.Fatalf("y[%d][%d] = %g, reference %g (|diff| %g, scale %g)", ti, o, y[ti*ldy+o], want, diff, mag)
			}
			s := float64(seqOrder(q4, wb, rows, cols, xqSeq, d, ti, o))
			num += (float64(ys[ti*rows+o]) - s) * (float64(ys[ti*rows+o]) - s)
			den += s * s
		}
	}
	if nmse := num / den; nmse > 1e-10 || math.IsNaN(nmse) {
		t.Errorf("NMSE %.3g against the single-accumulator order (bound 1e-10)", nmse)
	} else {
		t.Logf("NMSE against the single-accumulator order %.3g", nmse)
	}
	return used
}
