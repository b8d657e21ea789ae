// Package convert turns Hugging Face checkpoints and GGUF files into CMF
// files: it maps the source configuration to cmf.Arch, checks every tensor
// the architecture needs, picks a storage format per tensor role (Policy),
// and streams tensors one at a time into the CMF writer, so peak memory
// stays near the largest tensor rather than the model.
package convert

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/quant"
)

// chunkFloats is the float32 buffer size of chunked encoding (32 MiB).
var chunkFloats = 8 << 20

// Version is recorded in the provenance of every converted file.
const Version = "0.1.0"

// Options tune a conversion.
type Options struct {
	Quant      quant.DType // default weight format
	Keep       []Rule      // --keep overrides, first match wins
	ShardBytes int64       // split the output into files of about this size (0: one file)
	// Progress receives (bytes done, bytes total) after each tensor.
	Progress func(done, total int64)
	// Threads encodes row chunks in parallel (0: GOMAXPROCS).
	Threads int
	// Calibrate, when set, runs the model on calibration text first and
	// encodes q4tp and q8_2f weights with the activation statistics
	// (calibrate.go).
	Calibrate *Calibrate
}

// Result summarises a conversion.
type Result struct {
	Files      []string
	Tensors    int
	InBytes    int64 // source tensor bytes read
	OutBytes   int64 // CMF tensor bytes written
	Elapsed    time.Duration
	Header     cmf.Header
	DTypeCount map[string]int   // tensors per stored format
	DTypeBytes map[string]int64 // bytes written per stored format
	// Fallbacks are the tensors stored in another format than asked,
	// because the format asked for cannot hold their shape.
	Fallbacks []Fallback
}

// srcTensor is one output tensor and how to produce it from the source.
type srcTensor struct {
	name  string
	shape []int
	// raw returns the source bytes and their format when they can be
	// copied as they are (f32/f16/bf16 sources); ok=false otherwise.
	raw func() (b []byte, d quant.DType, ok bool)
	// load decodes the tensor to float32 into dst (len = elements).
	load func(dst []float32) error
	// check, when set, reports early (before the output is created) that
	// load would fail, e.g. an unsupported source dtype.
	check func() error
	// loadRows, when set, decodes rows [r0, r1) alone, so the tensor can
	// be encoded in chunks.
	loadRows func(r0, r1 int, dst []float32) error
	release  func()
	inBytes  int64
}

// blob is a byte tensor carried along (the tokenizer).
type blob struct {
	name string
	data []byte
}

// write runs the common back half of every conversion.
func write(ctx context.Context, out string, hdr *cmf.Header, ts []srcTensor, blobs []blob, opt Options) (*Result, error) {
	t0 := time.Now()
	pol := &Policy{Default: opt.Quant, Keep: opt.Keep}
	hdr.QuantType = opt.Quant.String()
	hdr.QuantPolicy = pol.Record()
	specs := make([]cmf.TensorSpec, 0, len(ts)+len(blobs))
	res := &Result{DTypeCount: map[string]int{}, DTypeBytes: map[string]int64{}}
	var total int64
	for _, t := range ts {
		tied := hdr.Arch.TieWordEmbeddings && t.name == "model.embed_tokens.weight"
		d, _, fb := pol.choose(t.name, t.shape, tied)
		if fb != nil {
			res.Fallbacks = append(res.Fallbacks, *fb)
		}
		specs = append(specs, cmf.TensorSpec{Name: t.name, DType: d, Shape: t.shape})
		res.DTypeCount[d.String()]++
		total += t.inBytes
	}
	var cal *calibResult
	stats := make([][]float32, len(ts)) // calibration statistics used per tensor
	if opt.Calibrate != nil {
		var err error
		if cal, err = calibrate(ctx, out, hdr, ts, specs, blobs, opt); err != nil {
			return nil, err
		}
		defer cal.close()
		for i, sp := range specs {
			if sp.DType == quant.Q4TP || sp.DType == quant.Q82F {
				stats[i] = cal.stats[sp.Name]
			}
		}
	}
	calSpecs := cal.specs(specs[:len(ts)], stats)
	specs = append(specs, calSpecs...)
	for _, b := range blobs {
		specs = append(specs, cmf.TensorSpec{Name: b.name, DType: quant.U8, Shape: []int{len(b.data)}})
	}
	if cal != nil {
		hdr.Calibration = cal.header(calSpecs)
	}
	w, err := cmf.Create(out, hdr, specs, cmf.WriteOptions{ShardBytes: opt.ShardBytes})
	if err != nil {
		return nil, err
	}
	defer w.Abort() // no-op after a successful Close
	var buf []float32
	var enc []byte
	var done int64
	for i, t := range ts {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("convert: interrupted: %w", err)
		}
		d := specs[i].DType
		gq, err := cal.encoder(ctx, t.name)
		if err != nil {
			return nil, err
		}
		if raw, sd, ok := t.raw(); ok && sd == d {
			if err := w.WriteTensor(t.name, raw); err != nil {
				return nil, err
			}
		} else if t.loadRows != nil && d != quant.Q82F {
			// Row chunks: memory is the encoded tensor plus one chunk.
			rows, cols, _ := quant.Matrix(t.shape)
			nb, _ := quant.ExpectedBytes(d, t.shape)
			if int64(cap(enc)) < nb {
				enc = make([]byte, nb)
			}
			enc = enc[:nb]
			c, err := codecFor(d, gq)
			if err != nil {
				return nil, err
			}
			step := max(1, chunkFloats/max(cols, 1))
			n := min(rows, step) * cols
			if cap(buf) < n {
				buf = make([]float32, n)
			}
			for r0 := 0; r0 < rows; r0 += step {
				r1 := min(rows, r0+step)
				chunk := buf[:(r1-r0)*cols]
				if err := t.loadRows(r0, r1, chunk); err != nil {
					return nil, fmt.Errorf("convert: %s: %w", t.name, err)
				}
				if err := encodeChunk(c, enc, chunk, rows, cols, r0, opt.Threads, stats[i]); err != nil {
					return nil, fmt.Errorf("convert: %s as %s: %w", t.name, d, err)
				}
			}
			if err := w.WriteTensor(t.name, enc); err != nil {
				return nil, err
			}
		} else {
			rows, cols, err := quant.Matrix(t.shape)
			if err != nil {
				return nil, fmt.Errorf("convert: %s: %w", t.name, err)
			}
			n := rows * cols
			if cap(buf) < n {
				buf = make([]float32, n)
			}
			buf = buf[:n]
			if err := t.load(buf); err != nil {
				return nil, fmt.Errorf("convert: %s: %w", t.name, err)
			}
			nb, _ := quant.ExpectedBytes(d, t.shape)
			if int64(cap(enc)) < nb {
				enc = make([]byte, nb)
			}
			enc = enc[:nb]
			c, err := codecFor(d, gq)
			if err != nil {
				return nil, err
			}
			if err := encodeParallel(c, enc, buf, rows, cols, opt.Threads, stats[i]); err != nil {
				return nil, fmt.Errorf("convert: %s as %s: %w", t.name, d, err)
			}
			if err := w.WriteTensor(t.name, enc); err != nil {
				return nil, err
			}
		}
		if t.release != nil {
			t.release()
		}
		done += t.inBytes
		res.InBytes += t.inBytes
		res.OutBytes += w.Tensors()[i].Size
		res.DTypeBytes[d.String()] += w.Tensors()[i].Size
		if opt.Progress != nil {
			opt.Progress(done, total)
		}
	}
	if err := cal.write(w, calSpecs); err != nil {
		return nil, err
	}
	for _, b := range blobs {
		if err := w.WriteTensor(b.name, b.data); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	res.Files = w.Files()
	res.Tensors = len(specs)
	res.Elapsed = time.Since(t0)
	res.Header = *hdr
	return res, nil
}

// encodeParallel encodes rows in chunks on several goroutines. q8_2f fits
// its column field over the whole tensor first, so chunks agree. stats are
// the calibration statistics of the weight's input (nil: none).
func encodeParallel(c quant.Codec, dst []byte, w []float32, rows, cols, threads int, stats []float32) error {
	opt := &quant.EncodeOptions{ColStats: stats}
	if c.DType() == quant.Q82F {
		opt.Col = quant.FitColumns(w, rows, cols, stats)
	}
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	if threads == 1 || rows < 64 {
		return c.EncodeRows(dst, w, rows, cols, 0, opt)
	}
	chunk := (rows + threads - 1) / threads
	var wg sync.WaitGroup
	errs := make([]error, threads)
	for k := 0; k < threads; k++ {
		r0, r1 := k*chunk, min(rows, (k+1)*chunk)
		if r0 >= r1 {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = c.EncodeRows(dst, w[r0*cols:r1*cols], rows, cols, r0, opt)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// encodeChunk encodes rows [r0, r0+len(w)/cols) on several goroutines,
// with the calibration statistics stats (nil: none).
func encodeChunk(c quant.Codec, dst []byte, w []float32, rows, cols, r0, threads int, stats []float32) error {
	n := len(w) / cols
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	var opt *quant.EncodeOptions
	if stats != nil {
		opt = &quant.EncodeOptions{ColStats: stats}
	}
	if threads == 1 || n < 64 {
		return c.EncodeRows(dst, w, rows, cols, r0, opt)
	}
	per := (n + threads - 1) / threads
	var wg sync.WaitGroup
	errs := make([]error, threads)
	for k := 0; k < threads; k++ {
		a, b := k*per, min(n, (k+1)*per)
		if a >= b {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = c.EncodeRows(dst, w[a*cols:b*cols], rows, cols, r0+a, opt)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// decodeRaw converts f32/f16/bf16 little-endian bytes to float32.
func decodeRaw(d quant.DType, src []byte, dst []float32) error {
	switch d {
	case quant.F32:
		if len(src) != 4*len(dst) {
			return fmt.Errorf("convert: %d bytes for %d f32 values", len(src), len(dst))
		}
		for i := range dst {
			dst[i] = f32frombits(src[4*i:])
		}
	case quant.F16, quant.BF16:
		if len(src) != 2*len(dst) {
			return fmt.Errorf("convert: %d bytes for %d 16-bit values", len(src), len(dst))
		}
		conv := half.F16ToF32
		if d == quant.BF16 {
			conv = half.BF16ToF32
		}
		for i := range dst {
			dst[i] = conv(uint16(src[2*i]) | uint16(src[2*i+1])<<8)
		}
	default:
		return fmt.Errorf("convert: cannot decode %s", d)
	}
	return nil
}

// provenance hashes every input file (sha256) and records the source.
func provenance(src, format string, files []string) (*cmf.Provenance, error) {
	p := &cmf.Provenance{Source: src, SourceFormat: format, Converter: "cortiq", ConverterVersion: Version, CreatedAt: time.Now().UTC().Truncate(time.Second)}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, fmt.Errorf("convert: %w", err)
		}
		h := sha256.New()
		n, err := io.Copy(h, fh)
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("convert: hash %s: %w", f, err)
		}
		rel, _ := filepath.Rel(src, f)
		if rel == "" || rel == "." || filepath.IsAbs(rel) || len(rel) > 2 && rel[:2] == ".." {
			rel = filepath.Base(f)
		}
		p.Inputs = append(p.Inputs, cmf.InputFile{Path: rel, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))})
	}
	slog.Debug("hashed inputs", "files", len(files))
	return p, nil
}

// Run converts src, a Hugging Face directory or a .gguf file, to out.
func Run(ctx context.Context, src, out string, opt Options) (*Result, error) {
	st, err := os.Stat(src)
	if err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}
	if st.IsDir() {
		return FromHF(ctx, src, out, opt)
	}
	if isGGUF(src) {
		return FromGGUF(ctx, src, out, opt)
	}
	return nil, fmt.Errorf("convert: %s is neither a Hugging Face model directory nor a GGUF file", src)
}

func isGGUF(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var m [4]byte
	_, err = io.ReadFull(f, m[:])
	return err == nil && string(m[:]) == "GGUF"
}
