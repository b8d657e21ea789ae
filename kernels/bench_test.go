package kernels

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cortiq/cortiq/quant"
)

var isaFlag = flag.String("isa", "", "run the tests and benchmarks with this kernel set (generic, avx2, avx512) instead of the CPU's best")

func TestMain(m *testing.M) {
	flag.Parse()
	if *isaFlag != "" {
		found := false
		for l := isaGeneric; l <= isaAVX512; l++ {
			if l.String() == *isaFlag {
				if l > bestISA() {
					fmt.Fprintf(os.Stderr, "kernels: -isa=%s is not supported by this CPU\n", l)
					os.Exit(2)
				}
				useISA(l)
				testBest = l
				found = true
			}
		}
		if !found {
			fmt.Fprintf(os.Stderr, "kernels: unknown -isa=%q\n", *isaFlag)
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}

// Benchmarks per kernel and shape. MB/s is weight bytes streamed per
// second (b.SetBytes(weight bytes)), so it reads as memory bandwidth;
// the shapes are Llama-3.2-1B's matrices (q/o, gate/up, down, head).
//
//	go test ./kernels -run XXX -bench . -benchtime 2s [-args -isa=avx2]
var benchShapes = [][2]int{{2048, 2048}, {8192, 2048}, {2048, 8192}, {128256, 2048}}

// benchMat encodes a rows×cols matrix quickly: random stored bytes with
// sane scales (encoding a 128256-row q4tp matrix takes minutes).
func benchMat(b *testing.B, r *rand.Rand, d quant.DType, rows, cols int) *Mat {
	b.Helper()
	if d == quant.Q4TP || d == quant.Q8Row {
		n, err := quant.ExpectedBytes(d, []int{rows, cols})
		if err != nil {
			b.Fatal(err)
		}
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		if d == quant.Q4TP { // ladders: a = -10, b = 0.25 (f16)
			po := rows * cols / 2
			for i := range rows {
				data[po+4*i], data[po+4*i+1], data[po+4*i+2], data[po+4*i+3] = 0x00, 0xc9, 0x00, 0x34
			}
		} else { // scales 0.01
			for i := range rows {
				data[rows*cols+2*i], data[rows*cols+2*i+1] = 0x1f, 0x21
			}
		}
		m, err := NewMat(d, rows, cols, data)
		if err != nil {
			b.Fatal(err)
		}
		return m
	}
	m, _ := randMat(b, r, d, rows, cols)
	return m
}

// BenchmarkRows is one worker's row kernel over a whole matrix (no pool,
// input already quantized): the kernel's own speed.
func BenchmarkRows(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, sh := range benchShapes {
		for _, d := range []quant.DType{quant.Q8Row, quant.Q4TP, quant.BF16, quant.F16, quant.F32} {
			if sh[0] > 8192 && d != quant.Q8Row && d != quant.Q4TP {
				continue
			}
			m := benchMat(b, r, d, sh[0], sh[1])
			x, y := randVec(r, sh[1]), make([]float32, sh[0])
			k := kernelFor(d)
			var qb qbatch
			if k.qx != qNone {
				qb.reset(k.qx, m.Cols, 1)
				qb.quantize(x)
			}
			b.Run(fmt.Sprintf("%s/%s/%dx%d", ISA(), d, sh[0], sh[1]), func(b *testing.B) {
				b.SetBytes(int64(len(m.Data)))
				t := matvecTask{k: k, m: m, x: x, y: y}
				if k.qx != qNone {
					t.q = &qb
				}
				for b.Loop() {
					t.Run(0, m.Rows, 0)
				}
			})
		}
	}
}

// BenchmarkMatVecShapes is Pool.MatVec with the default pool (quantizing
// the input, splitting rows over the workers).
func BenchmarkMatVecShapes(b *testing.B) {
	r := rand.New(rand.NewPCG(2, 2))
	p := NewPool(0)
	defer p.Close()
	for _, sh := range benchShapes {
		for _, d := range []quant.DType{quant.Q8Row, quant.Q4TP, quant.BF16} {
			if sh[0] > 8192 && d == quant.BF16 {
				continue
			}
			m := benchMat(b, r, d, sh[0], sh[1])
			x, y := randVec(r, sh[1]), make([]float32, sh[0])
			b.Run(fmt.Sprintf("%s/%s/%dx%d/t%d", ISA(), d, sh[0], sh[1], p.Workers()), func(b *testing.B) {
				b.SetBytes(int64(len(m.Data)))
				for b.Loop() {
					p.MatVec(m, x, y)
				}
			})
		}
	}
}

// BenchmarkQuantize is the activation quantizer per input length.
func BenchmarkQuantize(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 3))
	for _, n := range []int{2048, 8192} {
		for _, l := range []qlayout{qPlain, qNib} {
			x := randVec(r, n)
			var qb qbatch
			qb.reset(l, n, 1)
			b.Run(fmt.Sprintf("%s/%d/layout%d", ISA(), n, l), func(b *testing.B) {
				b.SetBytes(int64(4 * n))
				for b.Loop() {
					qb.quantize(x)
				}
			})
		}
	}
}

// BenchmarkPrefill is Pool.MatMul over the layer matrices of a 1B-shaped
// model at 128 positions, reported as tokens per second of those
// matrices (one layer; the head is left out).
func BenchmarkPrefill(b *testing.B) {
	r := rand.New(rand.NewPCG(4, 4))
	p := NewPool(0)
	defer p.Close()
	const n = 128
	for _, d := range []quant.DType{quant.Q8Row, quant.Q4TP} {
		var ms []*Mat
		var bytes int64
		for _, sh := range [][2]int{{2048, 2048}, {512, 2048}, {512, 2048}, {2048, 2048}, {8192, 2048}, {8192, 2048}, {2048, 8192}} {
			m := benchMat(b, r, d, sh[0], sh[1])
			ms = append(ms, m)
			bytes += int64(len(m.Data))
		}
		X, Y := randVec(r, n*8192), make([]float32, n*8192)
		b.Run(fmt.Sprintf("%s/%s/layer/n%d", ISA(), d, n), func(b *testing.B) {
			b.SetBytes(bytes)
			for b.Loop() {
				for _, m := range ms {
					p.MatMul(m, X, n, Y)
				}
			}
			// 16 layers of a 1B model and no head: tok/s of the layers.
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds()/16, "tok/s")
		})
	}
}

// BenchmarkReadBandwidth streams a 512 MiB buffer with 1 and with
// DefaultThreads goroutines (each its own contiguous part): the machine's
// read bandwidth, the ceiling of decode. Run it beside the kernels: on a
// shared machine the figure moves with the neighbours' load.
func BenchmarkReadBandwidth(b *testing.B) {
	buf := make([]byte, 512<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	for _, th := range []int{1, DefaultThreads()} {
		b.Run(fmt.Sprintf("%s/t%d", ISA(), th), func(b *testing.B) {
			b.SetBytes(int64(len(buf)))
			var sum atomic.Uint64
			for b.Loop() {
				var wg sync.WaitGroup
				per := len(buf) / th
				for k := range th {
					wg.Go(func() { sum.Add(streamRead(buf[k*per : (k+1)*per])) })
				}
				wg.Wait()
			}
		})
	}
}

// BenchmarkDecodeMatVecs runs the matrix-vector products of one decode
// token of a Llama-3.2-1B-shaped model (16 layers of q/k/v/o/gate/up/down
// and the 128256-row head, distinct matrices: 0.77 GB for q4tp layers with
// a q8_row head, 1.24 GB for q8_row) through the default pool: tok/s and
// weight GB/s of the matvecs alone, without attention and the elementwise
// work. -benchtime 10x or more; it allocates the whole model.
func BenchmarkDecodeMatVecs(b *testing.B) {
	if testing.Short() {
		b.Skip("allocates a 1B-parameter model")
	}
	p := NewPool(0)
	defer p.Close()
	for _, d := range []quant.DType{quant.Q4TP, quant.Q8Row} {
		ms, bytes := decodeModel(b, d)
		x := make([]float32, 8192)
		for i := range x {
			x[i] = float32(i%17) - 8
		}
		y := make([]float32, 128256)
		b.Run(fmt.Sprintf("%s/%s/t%d", ISA(), d, p.Workers()), func(b *testing.B) {
			b.SetBytes(bytes)
			for b.Loop() {
				for _, m := range ms {
					p.MatVec(m, x, y)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// BenchmarkDecodeBandwidthShare alternates one token's matvecs (as
// BenchmarkDecodeMatVecs) with a read of 512 MiB by the same number of
// goroutines, and reports the median over the pairs of the matvecs' weight
// GB/s as a share of the read's: on a machine whose bandwidth moves with
// its neighbours' load, the ratio of measurements taken seconds apart.
func BenchmarkDecodeBandwidthShare(b *testing.B) {
	if testing.Short() {
		b.Skip("allocates a 1B-parameter model")
	}
	p := NewPool(0)
	defer p.Close()
	buf := make([]byte, 512<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	for _, d := range []quant.DType{quant.Q4TP, quant.Q8Row} {
		ms, bytes := decodeModel(b, d)
		x := make([]float32, 8192)
		y := make([]float32, 128256)
		b.Run(fmt.Sprintf("%s/%s/t%d", ISA(), d, p.Workers()), func(b *testing.B) {
			var shares, toks, bws []float64
			var sum atomic.Uint64
			for b.Loop() {
				t0 := time.Now()
				var wg sync.WaitGroup
				per := len(buf) / p.Workers()
				for k := range p.Workers() {
					wg.Go(func() { sum.Add(streamRead(buf[k*per : (k+1)*per])) })
				}
				wg.Wait()
				bw := float64(len(buf)) / time.Since(t0).Seconds()
				t1 := time.Now()
				for _, m := range ms {
					p.MatVec(m, x, y)
				}
				dt := time.Since(t1).Seconds()
				shares = append(shares, float64(bytes)/dt/bw)
				toks = append(toks, 1/dt)
				bws = append(bws, bw/1e9)
			}
			b.ReportMetric(100*median(shares), "%bw")
			b.ReportMetric(median(toks), "tok/s")
			b.ReportMetric(median(bws), "readGB/s")
		})
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// decodeModel returns the matrices of one decode token in order, with
// fast pseudo-random contents, and their bytes.
func decodeModel(b *testing.B, d quant.DType) ([]*Mat, int64) {
	var ms []*Mat
	var bytes int64
	seed := uint64(1)
	add := func(d quant.DType, rows, cols int) {
		n, err := quant.ExpectedBytes(d, []int{rows, cols})
		if err != nil {
			b.Fatal(err)
		}
		data := make([]byte, n)
		for i := 0; i+8 <= len(data); i += 8 {
			seed = seed*6364136223846793005 + 1442695040888963407
			binary.LittleEndian.PutUint64(data[i:], seed)
		}
		switch d {
		case quant.Q4TP: // ladders a = -10, b = 0.25
			po := rows * cols / 2
			for i := range rows {
				data[po+4*i], data[po+4*i+1], data[po+4*i+2], data[po+4*i+3] = 0x00, 0xc9, 0x00, 0x34
			}
		case quant.Q8Row: // scales 0.01
			for i := range rows {
				data[rows*cols+2*i], data[rows*cols+2*i+1] = 0x1f, 0x21
			}
		}
		m, err := NewMat(d, rows, cols, data)
		if err != nil {
			b.Fatal(err)
		}
		ms = append(ms, m)
		bytes += n
	}
	for range 16 {
		for _, sh := range [][2]int{{2048, 2048}, {512, 2048}, {512, 2048}, {2048, 2048}, {8192, 2048}, {8192, 2048}, {2048, 8192}} {
			add(d, sh[0], sh[1])
		}
	}
	add(quant.Q8Row, 128256, 2048)
	return ms, bytes
}

// BenchmarkSmallBatch is Pool.MatMul with one worker at the decode batch
// sizes of a server (n sequences, one position each) on the 1B shapes:
// GMAC/s of the kernel in use, the figure that bounds batched decode.
//
//	go test ./kernels -run XXX -bench SmallBatch -benchtime 200x
func BenchmarkSmallBatch(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 5))
	p := NewPool(1)
	defer p.Close()
	for _, d := range []quant.DType{quant.Q4TP, quant.Q8Row} {
		for _, sh := range [][2]int{{2048, 2048}, {2048, 8192}} {
			m := benchMat(b, r, d, sh[0], sh[1])
			for _, n := range []int{2, 4, 8, 16} {
				X, Y := randVec(r, n*sh[1]), make([]float32, n*sh[0])
				for _, k := range smallBatchKernels(d) {
					b.Run(fmt.Sprintf("%s/%s%s/%dx%d/n%d", ISA(), d, k.name, sh[0], sh[1], n), func(b *testing.B) {
						defer k.use()()
						b.SetBytes(int64(len(m.Data)))
						for b.Loop() {
							p.MatMul(m, X, n, Y)
						}
						b.ReportMetric(float64(n*sh[0]*sh[1])*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s")
					})
				}
			}
		}
	}
}
