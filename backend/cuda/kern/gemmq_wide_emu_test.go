package kern

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/quant"
)

// A sequential Go emulation of gemmq.cu's wide tiles (gemmq_wide): each
// thread's fixed copy slots (weights, q4tp's code words, activations,
// scales in their [kg][g][i][u] order) stage by stage into the ring, the
// warps' rungs from the code windows, the B fragments from one word (q4tp,
// nibbles as 16·(n − 8)) or 8 bytes (q8_row) of a row's group, the A
// fragments through ldmatrix, the m16n8k32 product, the partial tiles of
// the cluster's KS blocks and their sum in rank order, and the epilogue
// with each block finishing its 1/KS of the tile. Like the other
// emulations it checks the index arithmetic and the schedule's data flow
// without a GPU, not the asynchronous copies' timing (TestGPUGemmQParity
// does that on the H200).
func emuGemmQWide(tl GemmQTile, q4 bool, W []byte, rows, cols int, xq []int8, d []float32, y []float32, ldy, T int,
	bias []float32, accumulate bool) (maxShared int) {
	const threads, CG, BN = 256, 8, 128
	fam, wb, pad := "q8row", 32, 32
	if q4 {
		fam, wb, pad = "q4tp", 16, 16
	}
	BM, FT, KS, NS := tl.BM, tl.BM/16, tl.KS, tl.NS
	lda, ldb, ldr := CG*32+16, CG*wb+pad, BN+4
	offD := BM * lda
	offW := offD + CG*BM*4
	offC := offW + BN*ldb
	stage := gemmqWideStage(fam, BM)
	rbOff := NS * stage
	nb := cols / 32
	nc := (nb + CG - 1) / CG
	cbytes := (5*nb + 7) / 8
	coff := rows*nb*16 + rows*4
	wend := coff + rows*cbytes
	cwu := CG * wb / 16
	putF := func(sm []byte, off int, v float32) { binary.LittleEndian.PutUint32(sm[off:], math.Float32bits(v)) }
	getF := func(sm []byte, off int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(sm[off:])) }
	rowOff := func(o int) int {
		if q4 {
			return o * nb * 16
		}
		return o * cols
	}
	touch := func(off, n int) { maxShared = max(maxShared, off+n) }
	for bx := 0; bx*BN < rows; bx++ {
		for bz := 0; bz*BM < T; bz++ {
			o0, t0 := bx*BN, bz*BM
			smem := make([][]byte, KS) // the cluster's shared memories
			for ks := range KS {
				sm := make([]byte, tl.Shared(fam))
				smem[ks] = sm
				c0, nk := ks*nc/KS, (ks+1)*nc/KS-ks*nc/KS
				issueW := func(s int) {
					base := (s % NS) * stage
					gb := (c0 + s) * CG
					for tid := range threads {
						cw := tid % cwu
						ok := gb+cw*16/wb < nb
						for j := range BN * cwu / threads {
							r := tid/cwu + j*(threads/cwu)
							dst := base + offW + r*ldb + cw*16
							touch(dst, 16)
							src := rowOff(min(o0+r, rows-1)) + c0*CG*wb + cw*16 + s*CG*wb
							for e := range 16 {
								var v byte
								if ok {
									v = W[src+e]
								}
								sm[dst+e] = v
							}
						}
						if q4 {
							cbase := coff + min(o0+tid>>1, rows-1)*cbytes
							a := (cbase+5*(c0+s))&^3 + 4*(tid&1)
							dst := base + offC + (tid>>1)*8 + 4*(tid&1)
							touch(dst, 4)
							for e := range 4 {
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
					base := (s % NS) * stage
					gb := (c0 + s) * CG
					for tid := range threads {
						ca, kd := tid%16, tid%CG
						oka, okd := gb+ca/2 < nb, gb+kd < nb
						for j := 0; tid+threads*j < BM*CG*2; j++ {
							r := tid/16 + 16*j
							dst := base + r*lda + ca*16
							touch(dst, 16)
							src := min(t0+min(r, BM-1), T-1)*cols + c0*CG*32 + ca*16 + s*CG*32
							for e := range 16 {
								var v int8
								if oka {
									v = xq[src+e]
								}
								sm[dst+e] = byte(v)
							}
						}
						for j := 0; tid+threads*j < BM*CG; j++ {
							r := tid/CG + (threads/CG)*j
							dst := base + offD + (kd*BM+(r&7)*2*FT+2*(r>>4)+(r>>3)&1)*4
							touch(dst, 4)
							var v float32
							if okd {
								v = d[min(t0+min(r, BM-1), T-1)*nb+c0*CG+kd+s*CG]
							}
							putF(sm, dst, v)
						}
					}
				}
				// acc[warp][i][n][lane][e]
				var acc [8][4][2][32][4]float32
				compute := func(s int) {
					base := (s % NS) * stage
					gv := min(CG, nb-(c0+s)*CG)
					for warp := range 8 {
						wr := 16 * warp
						wrb := rbOff + warp*CG*16*4
						if q4 {
							for lane := range 32 {
								rr, rh := lane&15, lane>>4
								o := min(o0+wr+rr, rows-1)
								p := coff + o*cbytes + 5*(c0+s)
								win := binary.LittleEndian.Uint64(sm[base+offC+(wr+rr)*8:])
								sh := (p & 3) * 8
								po := rows*nb*16 + 4*o
								a := half.F16ToF32(binary.LittleEndian.Uint16(W[po:]))
								b := half.F16ToF32(binary.LittleEndian.Uint16(W[po+2:]))
								for j := range 4 {
									kg := 4*rh + j
									if sh+5*kg+5 > 64 {
										panic("code window overflow")
									}
									code := int((win >> (sh + 5*kg)) & 31)
									var v float32
									if kg < gv {
										v = float32(math.Exp2(float64(a+float32(code)*b))) * 0.0625
									}
									touch(wrb+(kg*16+rr)*4, 4)
									putF(sm, wrb+(kg*16+rr)*4, v)
								}
							}
						}
						for kg := range CG { // every group, as the kernel (zeros past the slice)
							var fb [2][2][32]uint32
							var rs [2][32][2]float32
							for n := range 2 {
								for l := range 32 {
									g4, q := l>>2, l&3
									grp := base + offW + (wr+8*n+g4)*ldb + kg*wb
									if q4 {
										x := binary.LittleEndian.Uint32(sm[grp+4*q:])
										fb[n][0][l] = ((x << 4) & 0xF0F0F0F0) ^ 0x80808080
										fb[n][1][l] = (x & 0xF0F0F0F0) ^ 0x80808080
										rs[n][l][0] = getF(sm, wrb+(kg*16+8*n+2*q)*4)
										rs[n][l][1] = getF(sm, wrb+(kg*16+8*n+2*q+1)*4)
									} else {
										fb[n][0][l] = binary.LittleEndian.Uint32(sm[grp+8*q:])
										fb[n][1][l] = binary.LittleEndian.Uint32(sm[grp+8*q+4:])
										rs[n][l] = [2]float32{1, 1}
									}
								}
							}
							for i := range FT {
								var addr [32]int
								for l := range 32 {
									addr[l] = base + (l&15)*lda + (l>>4)*16 + 16*i*lda + kg*32
								}
								fa := ldsm4(sm, addr)
								for n := range 2 {
									c := mma16832(fa, fb[n][0], fb[n][1])
									for l := range 32 {
										sd := base + offD + (kg*BM+(l>>2)*2*FT)*4
										d0, d1 := getF(sm, sd+8*i), getF(sm, sd+8*i+4)
										a := &acc[warp][i][n][l]
										a[0] += float32(c[l][0]) * (d0 * rs[n][l][0])
										a[1] += float32(c[l][1]) * (d0 * rs[n][l][1])
										a[2] += float32(c[l][2]) * (d1 * rs[n][l][0])
										a[3] += float32(c[l][3]) * (d1 * rs[n][l][1])
									}
								}
							}
						}
					}
				}
				for s := range NS - 1 {
					if s < nk {
						issueW(s)
					}
				}
				for s := range NS - 1 {
					if s < nk {
						issueX(s)
					}
				}
				for s := range nk {
					if s+NS-1 < nk {
						issueW(s + NS - 1)
						issueX(s + NS - 1)
					}
					compute(s)
				}
				for warp := range 8 {
					for l := range 32 {
						g4, q := l>>2, l&3
						for i := range FT {
							for n := range 2 {
								for u := range 2 {
									off := 4 * ((16*i+g4+8*u)*ldr + 16*warp + 8*n + 2*q)
									touch(off, 8)
									putF(sm, off, acc[warp][i][n][l][2*u])
									putF(sm, off+4, acc[warp][i][n][l][2*u+1])
								}
							}
						}
					}
				}
			}
			U := BM * (BN / 4)
			for ks := range KS {
				for v := ks * U / KS; v < (ks+1)*U/KS; v++ {
					tl0, ol := v/(BN/4), (v%(BN/4))*4
					t := t0 + tl0
					var sum [4]float32
					for k := range KS {
						for e := range 4 {
							sum[e] += getF(smem[k], 4*(tl0*ldr+ol+e))
						}
					}
					if t >= T {
						continue
					}
					for e := range 4 {
						o := o0 + ol + e
						if o >= rows {
							continue
						}
						sc := float32(1)
						if !q4 {
							sc = half.F16ToF32(binary.LittleEndian.Uint16(W[rows*cols+2*o:]))
						}
						var bv float32
						if bias != nil {
							bv = bias[o]
						}
						val := sum[e]*sc + bv
						if accumulate {
							val += y[t*ldy+o]
						}
						y[t*ldy+o] = val
					}
				}
			}
		}
	}
	return maxShared
}

// emuActQPerm is gemmq_actq's rule in quant order perm (QuantPos).
func emuActQPerm(x []float32, ldx, cols, T, perm int) ([]int8, []float32) {
	xq0, d := emuActQ(x, ldx, cols, T, false)
	xq := make([]int8, len(xq0))
	for t := range T {
		for k := range cols {
			xq[t*cols+k&^31+QuantPos(k&31, perm)] = xq0[t*cols+k]
		}
	}
	return xq, d
}

// TestGemmQWideEmulation: every wide tile, emulated, on q8_row and q4tp
// tensors of odd shapes (rows not a multiple of 128; 3 groups (a partial
// chunk, fewer chunks than slices); 33 groups; 160 groups over up to 8
// slices of the ring) and T from 1 to 64 (several token blocks where T >
// BM) against float64 sums of quant.Decode's weights × kern.ActQuant's
// activations (tolerance 1e-5 of Σ|terms|, the GPU test's); every element
// outside the product untouched; the shared memory never overrun; and the
// NMSE of the cluster's split order against the single-accumulator order
// the CPU uses at most 1e-10.
func TestGemmQWideEmulation(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 19))
	vec := func(n int, s float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64()) * s
		}
		return v
	}
	shapes := [][3]int{{37, 96, 9}, {130, 1056, 16}, {129, 5120, 33}, {70, 160, 64}, {200, 2048, 1}}
	if testing.Short() {
		shapes = shapes[:2]
	}
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
			xq, d := emuActQPerm(x, ldx, cols, T, GemmQPerm(fam, "_w"))
			xqs, _ := emuActQ(x, ldx, cols, T, q4)
			for _, tl := range wideTiles(fam) {
				if tl.KS == 2 || tl.KS == 4 && tl.BM != 64 {
					continue // the tiles differ only in KS: 1, 8 and one 4 cover the slicing
				}
				t.Run(fmt.Sprintf("%s/%dx%d/T%d/gemmq%s", dt, rows, cols, T, tl.Suffix), func(t *testing.T) {
					used := checkEmuGemm(t, func(y []float32, ldy int, bias []float32, acc bool) int {
						return emuGemmQWide(tl, q4, wb, rows, cols, xq, d, y, ldy, T, bias, acc)
					}, q4, wb, wd, rows, cols, x, ldx, xqs, d, T, bias, vec)
					if used > tl.Shared(fam) {
						t.Fatalf("%d bytes of shared memory, %d touched", tl.Shared(fam), used)
					}
				})
			}
		}
	}
}

// TestGemmQWideTilesMatchSource: gemmq.cu's GEMMQ_WIDE_KS lines are
// kern's table (BM, FT = BM/16, NS), each instantiated for every cluster
// size, and each tile fits two blocks an SM (228 KB, 1 KB reserved each).
func TestGemmQWideTilesMatchSource(t *testing.T) {
	src, err := os.ReadFile("csrc/gemmq.cu")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^GEMMQ_WIDE_KS\((\w+), GQWQ\w+, (\d+), (\d+), (\d+)\)`)
	got := map[string][][2]int{}
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		bm, _ := strconv.Atoi(m[2])
		ft, _ := strconv.Atoi(m[3])
		ns, _ := strconv.Atoi(m[4])
		if ft*16 != bm {
			t.Errorf("%s: BM %d with FT %d", m[0], bm, ft)
		}
		got[m[1]] = append(got[m[1]], [2]int{bm, ns})
	}
	if fmt.Sprint(got) != fmt.Sprint(gemmqWide) {
		t.Fatalf("gemmq.cu's GEMMQ_WIDE_KS lines %v, kern's table %v", got, gemmqWide)
	}
	if !regexp.MustCompile(`GEMMQ_WIDE\(fam##_w##BM##k1, F, FT, 1, NS\)\s*\\\s*GEMMQ_WIDE\(fam##_w##BM##k2, F, FT, 2, NS\)\s*\\\s*` +
		`GEMMQ_WIDE\(fam##_w##BM##k4, F, FT, 4, NS\)\s*\\\s*GEMMQ_WIDE\(fam##_w##BM##k7, F, FT, 7, NS\)\s*\\\s*` +
		`GEMMQ_WIDE\(fam##_w##BM##k8, F, FT, 8, NS\)`).Match(src) {
		t.Error("GEMMQ_WIDE_KS does not instantiate KS = 1, 2, 4, 7, 8 (gemmqWideKS)")
	}
	deep := regexp.MustCompile(`(?m)^GEMMQ_WIDE_DEEP\((q4tp)_w64k(\d)d, GQWQ4, 4, (\d), 4\)`).FindAllStringSubmatch(string(src), -1)
	if len(deep) != len(gemmqDeepKSs) {
		t.Errorf("%d GEMMQ_WIDE_DEEP lines, want one a cluster size", len(deep))
	}
	for _, m := range deep {
		if m[2] != m[3] {
			t.Errorf("%s: name and KS differ", m[0])
		}
	}
	for fam := range gemmqWide {
		for _, tl := range wideTiles(fam) {
			blocks := 2
			if tl.Deep {
				blocks = 1
			}
			if sh := tl.Shared(fam); blocks*(sh+1024) > 228<<10 || tl.BM*(128+4)*4 > tl.NS*gemmqWideStage(fam, tl.BM) {
				t.Errorf("gemmq_%s%s: %d bytes of shared memory", fam, tl.Suffix, sh)
			}
		}
	}
}
