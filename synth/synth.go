package synth

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/convert"
	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
)

// Options tune Write.
type Options struct {
	Seed       uint64
	ShardBytes int64
	Progress   func(done, total int64)
}

// Result summarises a written model.
type Result struct {
	Files   []string
	Tensors int
	Bytes   int64
	Params  int64
	Elapsed time.Duration
}

// Write creates a model of the given architecture with random weights in
// format d (per-tensor formats follow the converter's policy).
func Write(ctx context.Context, out string, arch cmf.Arch, d quant.DType, opt Options) (*Result, error) {
	t0 := time.Now()
	want, err := model.Tensors(&arch)
	if err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	want = append(want, model.MTPTensors(&arch)...)
	pol := &convert.Policy{Default: d}
	tokJSON, tc := byteTokenizer()
	hdr := &cmf.Header{Arch: arch, QuantType: d.String(), QuantPolicy: pol.Record(), TokenizerConfig: tc,
		Provenance: &cmf.Provenance{Source: "cortiq synth", SourceFormat: "synthetic", Converter: "cortiq", ConverterVersion: convert.Version,
			CreatedAt: time.Now().UTC().Truncate(time.Second), Notes: fmt.Sprintf("random weights, seed %d", opt.Seed)}}
	specs := make([]cmf.TensorSpec, 0, len(want)+1)
	var total, params int64
	for _, w := range want {
		dt, _ := pol.Choose(w.Name, w.Shape, arch.TieWordEmbeddings && w.Name == "model.embed_tokens.weight")
		specs = append(specs, cmf.TensorSpec{Name: w.Name, DType: dt, Shape: w.Shape})
		n, _ := quant.ExpectedBytes(dt, w.Shape)
		total += n
		r, c, _ := quant.Matrix(w.Shape)
		params += int64(r) * int64(c)
	}
	specs = append(specs, cmf.TensorSpec{Name: tc.Blob, DType: quant.U8, Shape: []int{len(tokJSON)}})
	w, err := cmf.Create(out, hdr, specs, cmf.WriteOptions{ShardBytes: opt.ShardBytes})
	if err != nil {
		return nil, err
	}
	defer w.Abort()
	var done int64
	buf := make([]byte, 8<<20)
	for i, s := range specs[:len(specs)-1] {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("synth: interrupted: %w", err)
		}
		if err := w.Begin(s.Name); err != nil {
			return nil, err
		}
		g := gen{seed: opt.Seed*1_000_003 + uint64(i)*0x9e3779b97f4a7c15, buf: buf}
		if err := g.tensor(w, s, &arch); err != nil {
			return nil, fmt.Errorf("synth: %s: %w", s.Name, err)
		}
		if err := w.End(); err != nil {
			return nil, err
		}
		done += w.Tensors()[i].Size
		if opt.Progress != nil {
			opt.Progress(done, total)
		}
	}
	if err := w.WriteTensor(tc.Blob, tokJSON); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return &Result{Files: w.Files(), Tensors: len(specs), Bytes: total, Params: params, Elapsed: time.Since(t0)}, nil
}

// gen fills tensors with random values of a sensible scale.
type gen struct {
	seed uint64
	buf  []byte
}

// std is the weight scale of a tensor role.
func std(name string, shape []int) float64 {
	cols := shape[len(shape)-1]
	return 1 / math.Sqrt(float64(max(cols, 1))) // keeps activations O(1) through a matvec
}

func (g *gen) tensor(w *cmf.Writer, s cmf.TensorSpec, a *cmf.Arch) error {
	rows, cols, _ := quant.Matrix(s.Shape)
	sd := std(s.Name, s.Shape)
	switch {
	case len(s.Shape) == 1 && strings.HasSuffix(s.Name, "norm.weight"):
		v := 1.0
		if a.NormStyle == "one_plus" && !strings.Contains(s.Name, "linear_attn.norm") {
			v = 0
		}
		return g.constF32(w, rows*cols, float32(v))
	case strings.HasSuffix(s.Name, ".A_log"):
		return g.constF32(w, rows*cols, float32(math.Log(4)))
	case strings.HasSuffix(s.Name, ".dt_bias") || strings.HasSuffix(s.Name, ".bias"):
		return g.constF32(w, rows*cols, 0)
	}
	switch s.DType {
	case quant.F32, quant.F16, quant.BF16:
		return g.floats(w, s.DType, rows*cols, sd)
	case quant.Q8Row, quant.Q82F:
		// int8 quants uniform in [-127, 127], row scale giving the std.
		if err := g.random(w, int64(rows)*int64(cols), func(b []byte) {
			for i := range b {
				if b[i] == 0x80 {
					b[i] = 0x81
				}
			}
		}); err != nil {
			return err
		}
		scale := half.F32ToF16(float32(sd * math.Sqrt(3) / 127))
		sb := make([]byte, 2*rows)
		for r := 0; r < rows; r++ {
			binary.LittleEndian.PutUint16(sb[2*r:], scale)
		}
		if _, err := w.Write(sb); err != nil {
			return err
		}
		if s.DType == quant.Q82F {
			pad := quant.Q82FColOffset(rows, cols) - int64(rows)*int64(cols) - int64(2*rows)
			cb := make([]byte, pad+4*int64(cols))
			for i := 0; i < cols; i++ {
				binary.LittleEndian.PutUint32(cb[pad+4*int64(i):], math.Float32bits(1))
			}
			_, err := w.Write(cb)
			return err
		}
		return nil
	case quant.Q4TP:
		gpr := cols / quant.GroupSize
		if err := g.random(w, int64(rows)*int64(gpr)*16, nil); err != nil {
			return err
		}
		// Ladder exp2(a + k·b) spanning 4× around the scale that gives sd
		// for uniform nibbles (std of -8..7 ≈ 4.6).
		b := 2.0 / 31
		aa := math.Log2(sd/4.6) - 1
		pb := make([]byte, 4*rows)
		for r := 0; r < rows; r++ {
			binary.LittleEndian.PutUint16(pb[4*r:], half.F32ToF16(float32(aa)))
			binary.LittleEndian.PutUint16(pb[4*r+2:], half.F32ToF16(float32(b)))
		}
		if _, err := w.Write(pb); err != nil {
			return err
		}
		return g.random(w, int64(rows)*int64(quant.Q4TPCodeStride(cols)), nil)
	}
	return fmt.Errorf("no generator for %s", s.DType)
}

func (g *gen) constF32(w *cmf.Writer, n int, v float32) error {
	b := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	_, err := w.Write(b)
	return err
}

// floats writes n uniform values with standard deviation sd.
func (g *gen) floats(w *cmf.Writer, d quant.DType, n int, sd float64) error {
	es := 4
	if d != quant.F32 {
		es = 2
	}
	a := float32(sd * math.Sqrt(3))
	return g.random(w, int64(n*es), func(b []byte) {
		for i := 0; i+es <= len(b); i += es {
			switch d {
			case quant.F32:
				u := binary.LittleEndian.Uint32(b[i:])
				binary.LittleEndian.PutUint32(b[i:], math.Float32bits((float32(u>>8)/(1<<23)-1)*a))
			case quant.F16, quant.BF16:
				u := binary.LittleEndian.Uint16(b[i:])
				f := (float32(u)/(1<<15) - 1) * a
				h := half.F32ToF16(f)
				if d == quant.BF16 {
					h = half.F32ToBF16(f)
				}
				binary.LittleEndian.PutUint16(b[i:], h)
			}
		}
	})
}

// random writes n random bytes in chunks, each chunk passed through fix
// (if not nil) before it is written. The stream depends only on the seed:
// it is cut into fixed 64 KiB blocks, each seeded by its index, which the
// workers fill in parallel.
func (g *gen) random(w *cmf.Writer, n int64, fix func([]byte)) error {
	const block = 64 << 10
	workers := runtime.GOMAXPROCS(0)
	for n > 0 {
		k := min(n, int64(len(g.buf)))
		b := g.buf[:k]
		nb := (len(b) + block - 1) / block
		var wg sync.WaitGroup
		for p := 0; p < workers; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := p; i < nb; i += workers {
					blk := b[i*block : min(len(b), (i+1)*block)]
					fillRandom(blk, g.seed+uint64(i)*0xbf58476d1ce4e5b9)
					if fix != nil {
						fix(blk)
					}
				}
			}()
		}
		wg.Wait()
		g.seed += 0x94d049bb133111eb
		if _, err := w.Write(b); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// fillRandom fills b from a splitmix64 stream.
func fillRandom(b []byte, s uint64) {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		s += 0x9e3779b97f4a7c15
		z := s
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(b[i:], z^(z>>31))
	}
	for ; i < len(b); i++ {
		s += 0x9e3779b97f4a7c15
		b[i] = byte(s >> 56)
	}
}

// byteTokenizer returns a minimal byte-level BPE tokenizer.json (the 256
// GPT-2 byte symbols, no merges, ChatML specials) and its config.
func byteTokenizer() ([]byte, *cmf.TokenizerConfig) {
	specials := []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
	vocab := map[string]int{}
	var added []map[string]any
	for i, s := range specials {
		vocab[s] = i
		added = append(added, map[string]any{"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
	}
	for b, r := range byteToRune() {
		vocab[string(r)] = len(specials) + b
	}
	tj := map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": added, "normalizer": nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"post_processor": nil,
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model":          map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil, "end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": []string{}},
	}
	b, _ := json.Marshal(tj)
	tmpl := "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
	return b, &cmf.TokenizerConfig{Kind: "hf_json", Blob: "tokenizer.json", ChatTemplate: tmpl, EOSToken: "<|im_end|>", EOSTokenIDs: []int{2, 0}, PadToken: "<|endoftext|>", PadTokenID: ptr(0)}
}

// byteToRune is GPT-2's bytes_to_unicode table.
func byteToRune() [256]rune {
	var t [256]rune
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff) {
			t[b] = rune(b)
		} else {
			t[b] = rune(256 + n)
			n++
		}
	}
	return t
}
