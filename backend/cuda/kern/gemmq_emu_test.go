package kern

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/quant"
)

// A sequential Go emulation of gemmq.cu's indexing: gemmq_actq's quants and
// their order, then gemmq_body's blocks, stagers, shared-memory stage
// layout, ldmatrix's lane-to-row mapping and the m16n8k32 s8 fragment
// layouts (PTX ISA: A a0 = A[g][4q..], a1 = A[g+8][4q..], a2 = A[g][16+4q..],
// a3 = A[g+8][16+4q..]; B b0 = B[4q..][g], b1 = B[16+4q..][g]; C c0,c1 =
// C[g][2q, 2q+1], c2,c3 = C[g+8][..], g = lane/4, q = lane%4) and the
// epilogue, for the three tiles. It checks the kernels' index arithmetic
// without a GPU; it is no evidence that the CUDA compiles to what it says
// (TestGPUGemmQParity is). It mirrors the .cu by hand: a change there
// needs the same change here.

type emuTile struct{ bm, bn, wm, kg int }

var emuTiles = map[string]emuTile{"": {128, 128, 2, 1}, "_t64": {64, 128, 2, 2}, "_d64": {64, 32, 4, 4}}

// emuActQ is gemmq_actq: quants [T][cols] (q4tp: each 8 in the order
// 0,2,4,6,1,3,5,7), scales [T][cols/32].
func emuActQ(x []float32, ldx, cols, T int, perm bool) ([]int8, []float32) {
	nb := cols / 32
	xq, d := make([]int8, T*cols), make([]float32, T*nb)
	for t := range T {
		for b := range nb {
			blk := x[t*ldx+32*b : t*ldx+32*b+32]
			var am float32
			nan := false
			for _, v := range blk {
				am = max(am, float32(math.Abs(float64(v))))
				nan = nan || v != v
			}
			if nan || !(am >= 0x1p-120) {
				continue
			}
			id := 127 / am
			for lane, v := range blk {
				p := lane
				if e := lane & 7; perm {
					p = lane&^7 + e>>1 + 4*(e&1)
				}
				xq[t*cols+32*b+p] = int8(math.RoundToEven(float64(v * id)))
			}
			d[t*nb+b] = am / 127
		}
	}
	return xq, d
}

// emuStager is one thread's weight unit: load + store of GemmQQ8 / GemmQQ4TP.
type emuStager struct {
	W          []byte
	rows, cols int
	q4         bool
}

// unit returns the 16 int8 weights of half h of group g of row o (zeros
// past the row's groups) and, for q4tp's first half, the group's rung.
func (s emuStager) unit(o, g, h int) (w [16]byte, rung float32) {
	o = min(o, s.rows-1)
	nb := s.cols / 32
	if !s.q4 {
		if g < nb {
			copy(w[:], s.W[o*s.cols+32*g+16*h:])
		}
		return w, 0
	}
	if g >= nb {
		return w, 0 // 0x88888888 words: nibbles 8, weights 0; rung 0
	}
	nib := s.W[o*nb*16+16*g+8*h:]
	for j := range 2 {
		v := binary.LittleEndian.Uint32(nib[4*j:])
		for b := range 4 {
			w[8*j+b] = byte(int8((v>>(8*b))&15) - 8)     // lo: nibble 2b
			w[8*j+4+b] = byte(int8((v>>(8*b+4))&15) - 8) // hi: nibble 2b+1
		}
	}
	if h == 0 {
		poff := s.rows * nb * 16
		a := binary.LittleEndian.Uint16(s.W[poff+4*o:])
		bb := binary.LittleEndian.Uint16(s.W[poff+4*o+2:])
		code := s.W[poff+4*s.rows+o*((5*nb+7)/8):]
		bit := 5 * g
		v := uint32(code[bit>>3])
		if bit&7 > 3 {
			v |= uint32(code[bit>>3+1]) << 8
		}
		k := int((v >> (bit & 7)) & 31)
		rung = float32(math.Exp2(float64(half.F16ToF32(a) + float32(k)*half.F16ToF32(bb))))
	}
	return w, rung
}

func (s emuStager) scale(o int) float32 {
	if s.q4 {
		return 1
	}
	return half.F16ToF32(binary.LittleEndian.Uint16(s.W[s.rows*s.cols+2*o:]))
}

// ldsm4 is ldmatrix .x4 .b16: lane l gives the byte address of row l%8 of
// matrix l/8; lane l receives in r[i] bytes 4(l%4)..+3 of row l/4 of matrix i.
func ldsm4(sm []byte, addr [32]int) (r [32][4]uint32) {
	for l := range 32 {
		for i := range 4 {
			r[l][i] = binary.LittleEndian.Uint32(sm[addr[8*i+l/4]+4*(l%4):])
		}
	}
	return r
}

func s8(w uint32, b int) int { return int(int8(w >> (8 * b))) }

// mma16832 is mma.m16n8k32 s8·s8→s32 from 0 on the warp's fragments.
func mma16832(a [32][4]uint32, b0, b1 [32]uint32) (c [32][4]int) {
	var A [16][32]int
	var B [32][8]int
	for l := range 32 {
		g, q := l/4, l%4
		for j := range 4 {
			A[g][4*q+j] = s8(a[l][0], j)
			A[g+8][4*q+j] = s8(a[l][1], j)
			A[g][16+4*q+j] = s8(a[l][2], j)
			A[g+8][16+4*q+j] = s8(a[l][3], j)
			B[4*q+j][g] = s8(b0[l], j)
			B[16+4*q+j][g] = s8(b1[l], j)
		}
	}
	for l := range 32 {
		g, q := l/4, l%4
		for e := range 4 {
			m, n := g+8*(e>>1), 2*q+e&1
			for k := range 32 {
				c[l][e] += A[m][k] * B[k][n]
			}
		}
	}
	return c
}

// emuGemmQ runs gemmq_body's block structure for tile tl on the quants.
func emuGemmQ(tl emuTile, st emuStager, xq []int8, d []float32, y []float32, ldy, T int, bias []float32, accumulate bool) {
	const threads = 256
	rows, cols := st.rows, st.cols
	wn := 8 / tl.wm
	tm, tn := tl.bm/tl.wm, tl.bn/wn
	ft, fn := tm/16, tn/8
	lds := tl.kg*32 + 16
	offB := tl.bm * lds
	offD := offB + tl.bn*lds
	offR := offD + tl.bm*tl.kg*4
	stage := offR + tl.bn*tl.kg*4
	uw, ux := tl.bn*tl.kg*2/threads, tl.bm*tl.kg*2/threads
	nb := cols / 32
	nk := (nb + tl.kg - 1) / tl.kg
	putF := func(sm []byte, off int, v float32) { binary.LittleEndian.PutUint32(sm[off:], math.Float32bits(v)) }
	getF := func(sm []byte, off int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(sm[off:])) }
	for bx := 0; bx*tl.bn < rows; bx++ {
		for by := 0; by*tl.bm < T; by++ {
			o0, t0 := bx*tl.bn, by*tl.bm
			sm := make([]byte, 2*stage)
			fill := func(s int) { // every thread's loads then stores of step s into stage s&1
				base := (s & 1) * stage
				for tid := range threads {
					for j := range uw {
						u := tid + threads*j
						r, g := u/(2*tl.kg), (u/2)%tl.kg
						w, rung := st.unit(o0+r, s*tl.kg+g, u&1)
						copy(sm[base+offB+r*lds+g*32+(u&1)*16:], w[:])
						if u&1 == 0 && st.q4 {
							putF(sm, base+offR+4*(g*tl.bn+r), rung)
						}
					}
					for j := range ux {
						u := tid + threads*j
						r, g := u/(2*tl.kg), (u/2)%tl.kg
						gg := s*tl.kg + g
						t := min(t0+r, T-1)
						for e := range 16 {
							var v int8
							if gg < nb {
								v = xq[t*cols+gg*32+(u&1)*16+e]
							}
							sm[base+r*lds+g*32+(u&1)*16+e] = byte(v)
						}
					}
					if tid < tl.bm*tl.kg {
						t, dg := min(t0+tid/tl.kg, T-1), tid%tl.kg
						var dv float32
						if s*tl.kg+dg < nb {
							dv = d[t*nb+s*tl.kg+dg]
						}
						putF(sm, base+offD+4*(dg*tl.bm+tid/tl.kg), dv)
					}
				}
			}
			acc := make([][][][4]float32, 8) // [warp][i][n][lane·4 + e] flattened below
			for w := range acc {
				acc[w] = make([][][4]float32, ft*fn)
				for i := range acc[w] {
					acc[w][i] = make([][4]float32, 32)
				}
			}
			fill(0)
			for s := range nk {
				base := (s & 1) * stage
				for warp := range 8 {
					wm0, wn0 := (warp/wn)*tm, (warp%wn)*tn
					for kg := range tl.kg {
						var fa [][32][4]uint32
						var fb [][32][4]uint32
						for i := range ft {
							var addr [32]int
							for l := range 32 {
								addr[l] = base + (wm0+(l&15))*lds + (l>>4)*16 + 16*i*lds + kg*32
							}
							fa = append(fa, ldsm4(sm, addr))
						}
						for p := range fn / 2 {
							var addr [32]int
							for l := range 32 {
								addr[l] = base + offB + (wn0+(l&7)+(l>>4)*8)*lds + ((l>>3)&1)*16 + 16*p*lds + kg*32
							}
							fb = append(fb, ldsm4(sm, addr))
						}
						for i := range ft {
							for n := range fn {
								var b0, b1 [32]uint32
								for l := range 32 {
									b0[l], b1[l] = fb[n>>1][l][(n&1)*2], fb[n>>1][l][(n&1)*2+1]
								}
								c := mma16832(fa[i], b0, b1)
								for l := range 32 {
									g4, q4 := l>>2, l&3
									d0 := getF(sm, base+offD+4*(kg*tl.bm+wm0+g4+16*i))
									d1 := getF(sm, base+offD+4*(kg*tl.bm+wm0+g4+16*i+8))
									rs := [2]float32{1, 1}
									if st.q4 {
										rs[0] = getF(sm, base+offR+4*(kg*tl.bn+wn0+2*q4+8*n))
										rs[1] = getF(sm, base+offR+4*(kg*tl.bn+wn0+2*q4+8*n+1))
									}
									a := &acc[warp][i*fn+n][l]
									a[0] += float32(c[l][0]) * (d0 * rs[0])
									a[1] += float32(c[l][1]) * (d0 * rs[1])
									a[2] += float32(c[l][2]) * (d1 * rs[0])
									a[3] += float32(c[l][3]) * (d1 * rs[1])
								}
							}
						}
					}
				}
				if s+1 < nk {
					fill(s + 1)
				}
			}
			for warp := range 8 {
				wm0, wn0 := (warp/wn)*tm, (warp%wn)*tn
				for l := range 32 {
					g4, q4 := l>>2, l&3
					for n := range fn {
						for h := range 2 {
							o := o0 + wn0 + 8*n + 2*q4 + h
							if o >= rows {
								continue
							}
							var bv float32
							if bias != nil {
								bv = bias[o]
							}
							for i := range ft {
								for u := range 2 {
									t := t0 + wm0 + 16*i + g4 + 8*u
									if t >= T {
										continue
									}
									v := acc[warp][i*fn+n][l][2*u+h]*st.scale(o) + bv
									if accumulate {
										v += y[t*ldy+o]
									}
									y[t*ldy+o] = v
								}
							}
						}
					}
				}
			}
		}
	}
}

// TestGemmQEmulation: the emulated kernels on q8_row and q4tp tensors
// against float64 sums of quant.Decode's weights × kern.ActQuant's
// activations (TestGPUGemmQParity's reference and tolerance), every tile,
// with partial blocks of rows and tokens and stages with fewer groups than
// the tile's; Y's padding and rows past T untouched.
func TestGemmQEmulation(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 9))
	vec := func(n int, s float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64()) * s
		}
		return v
	}
	for _, dt := range []quant.DType{quant.Q8Row, quant.Q4TP} {
		for _, sh := range [][3]int{{37, 96, 9}, {130, 160, 70}, {40, 64, 129}} {
			rows, cols, T := sh[0], sh[1], sh[2]
			wb, err := quant.Encode(dt, vec(rows*cols, 0.05), []int{rows, cols}, nil)
			if err != nil {
				t.Fatal(err)
			}
			wd, _ := quant.Decode(dt, wb, []int{rows, cols})
			ldx, ldy := cols+3, rows+2
			x := vec(T*ldx, 1)
			bias := vec(rows, 0.1)
			xq, d := emuActQ(x, ldx, cols, T, dt == quant.Q4TP)
			for name, tl := range emuTiles {
				t.Run(fmt.Sprintf("%s/%dx%d/T%d/gemmq%s", dt, rows, cols, T, name), func(t *testing.T) {
					y0 := vec((T+1)*ldy, 1)
					y := append([]float32(nil), y0...)
					emuGemmQ(tl, emuStager{wb, rows, cols, dt == quant.Q4TP}, xq, d, y, ldy, T, bias, true)
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
						}
					}
				})
			}
		}
	}
}
