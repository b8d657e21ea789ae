package model_test

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
)

// llama1B is the shape of Llama-3.2-1B (targets.md measures llama.cpp on
// it): hidden 2048, 16 layers, GQA 32/8, FFN 8192, vocab 128256, tied.
func llama1B() cmf.Arch {
	return cmf.Arch{
		ArchName: "llama", HiddenSize: 2048, IntermediateSize: 8192, NumLayers: 16, NumAttentionHeads: 32,
		NumKVHeads: 8, HeadDim: 64, VocabSize: 128256, RMSNormEps: 1e-5, NormStyle: "standard", RopeTheta: 500000,
		RopeScaling:       &cmf.RopeScaling{Type: "llama3", Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192},
		TieWordEmbeddings: true, PartialRotaryFactor: 1, MaxPositionEmbeddings: 131072, HiddenAct: "silu",
	}
}

// fillRandom writes valid random bytes of a tensor in format d, scaled
// so that W·x keeps the size of x (weights of std ≈ 1/√cols): activations
// stay well inside the float range through the layers, as in a real
// model, and the kernels do the same work.
func fillRandom(r *rand.Rand, d quant.DType, rows, cols int, b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	n := rows * cols
	std := 1 / math.Sqrt(float64(cols))
	switch d {
	case quant.F32:
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(r.NormFloat64()*std)))
		}
	case quant.F16, quant.BF16:
		for i := 0; i < n; i++ {
			v := float32(r.NormFloat64() * std)
			h := half.F32ToBF16(v)
			if d == quant.F16 {
				h = half.F32ToF16(v)
			}
			binary.LittleEndian.PutUint16(b[2*i:], h)
		}
	case quant.Q8Row, quant.Q82F:
		// Uniform int8 quants have std ≈ 73.
		s := half.F32ToF16(float32(std / 73))
		for i := 0; i < rows; i++ {
			binary.LittleEndian.PutUint16(b[n+2*i:], s)
		}
		if d == quant.Q82F {
			off := int(quant.Q82FColOffset(rows, cols))
			clear(b[n+2*rows : off])
			for i := 0; i < cols; i++ {
				binary.LittleEndian.PutUint32(b[off+4*i:], math.Float32bits(1))
			}
		}
	case quant.Q4TP:
		// Uniform nibbles minus 8 have std ≈ 4.6; a flat ladder.
		po := rows * cols / 32 * 16
		a := half.F32ToF16(float32(math.Log2(std / 4.6)))
		for i := 0; i < rows; i++ {
			binary.LittleEndian.PutUint16(b[po+4*i:], a)
			binary.LittleEndian.PutUint16(b[po+4*i+2:], 0)
		}
	}
}

// writeSynthetic writes a CMF file of architecture a with random weights:
// matrices in format d (the tied embedding/head q8_row under q4tp, as the
// converter's policy does), vectors f32.
func writeSynthetic(tb testing.TB, path string, a cmf.Arch, d quant.DType) {
	tb.Helper()
	ts, err := model.Tensors(&a)
	if err != nil {
		tb.Fatal(err)
	}
	specs := make([]cmf.TensorSpec, len(ts))
	for i, t := range ts {
		dt := d
		if len(t.Shape) == 1 {
			dt = quant.F32
		} else if d == quant.Q4TP && t.Name == "model.embed_tokens.weight" {
			dt = quant.Q8Row
		}
		specs[i] = cmf.TensorSpec{Name: t.Name, DType: dt, Shape: t.Shape}
	}
	hdr := &cmf.Header{Arch: a, QuantType: d.String()}
	w, err := cmf.Create(path, hdr, specs, cmf.WriteOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	defer w.Abort()
	r := rand.New(rand.NewPCG(1, 1))
	for _, s := range specs {
		nb, _ := quant.ExpectedBytes(s.DType, s.Shape)
		buf := make([]byte, nb)
		rows, cols, _ := quant.Matrix(s.Shape)
		if len(s.Shape) == 1 {
			for i := 0; i < cols; i++ {
				binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(1))
			}
		} else {
			fillRandom(r, s.DType, rows, cols, buf)
		}
		if err := w.WriteTensor(s.Name, buf); err != nil {
			tb.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
}

// weightBytes is what one decode step reads: every tensor but the
// embedding, which is read once more as the head when tied.
func weightBytes(m *cmf.Model) int64 {
	var n int64
	for _, t := range m.Tensors {
		if t.Name != "model.embed_tokens.weight" || m.Header.Arch.TieWordEmbeddings {
			n += t.Size
		}
	}
	return n
}

// BenchmarkLlama1B runs decode and prefill on a random-weight model of the
// Llama-3.2-1B shape in each format (MB/s = weight bytes read per second
// of decode). The model file is written to a temp dir first (about 1 GB);
// set CORTIQ_BENCH_MODEL to a CMF file to benchmark that file instead.
func BenchmarkLlama1B(b *testing.B) {
	files := map[string]string{}
	if p := os.Getenv("CORTIQ_BENCH_MODEL"); p != "" {
		files[filepath.Base(p)] = p
	} else {
		dir := b.TempDir()
		for _, d := range []quant.DType{quant.Q8Row, quant.Q4TP} {
			p := filepath.Join(dir, d.String()+".cmf")
			writeSynthetic(b, p, llama1B(), d)
			files[d.String()] = p
		}
	}
	for name, p := range files {
		cm, err := cmf.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		m, err := model.Load(cm, opts(b, 0, 0))
		if err != nil {
			b.Fatal(err)
		}
		V := m.Arch.VocabSize
		ids := prompt(64, min(V, 1000), 1)
		b.Run(name+"/decode", func(b *testing.B) {
			c, err := m.NewCache(512)
			if err != nil {
				b.Fatal(err)
			}
			forward(b, m, c, ids[:8], 0, model.NoLogits)
			b.SetBytes(weightBytes(cm))
			for b.Loop() {
				if c.Len() == c.Cap() {
					_ = c.Truncate(8)
				}
				if _, err := m.Forward(c, ids[c.Len()%len(ids):][:1], c.Len(), model.LastLogits); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
		})
		b.Run(name+"/prefill64", func(b *testing.B) {
			c, err := m.NewCache(len(ids))
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				c.Reset()
				if _, err := m.Forward(c, ids, 0, model.LastLogits); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(ids))/b.Elapsed().Seconds(), "tok/s")
		})
		m.Close()
		cm.Close()
	}
}
