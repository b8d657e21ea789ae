package convert

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/tokenizer"
)

// Calibration (activation-aware encoding).
//
// With Options.Calibrate set, the converter first writes the model as a
// temporary float CMF next to the output, runs it on the CPU over tokens
// of a calibration text with an observer that records the RMS of every
// input column of every linear layer, and then encodes each q4tp and
// q8_2f weight with those statistics (quant.EncodeOptions.ColStats), so
// that the encoders minimise the error of the layer outputs on such text
// rather than of the weights. The statistics are stored in the output as
// f32 [cols] tensors named CalibPrefix + weight name and listed in the
// header's calibration section.

// CalibPrefix starts the name of every calibration statistics tensor.
const CalibPrefix = "calibration."

// Calibration defaults.
const (
	DefaultCalibTokens = 8192 // tokens run through the model
	DefaultCalibCtx    = 512  // tokens per sequence (at most the trained context)
	maxCalibTextBytes  = 1 << 30
)

// Calibrate configures the calibration pass of a conversion.
type Calibrate struct {
	Text   string // path of a UTF-8 text file, optionally gzip-compressed
	Tokens int    // tokens to run (0: DefaultCalibTokens)
	Ctx    int    // tokens per sequence (0: DefaultCalibCtx, capped at max_position_embeddings)
}

// calibResult is what a calibration pass measured.
type calibResult struct {
	stats  map[string][]float32 // weight name → per-column RMS of its input
	record cmf.Calibration
}

// calibArchError reports an architecture the calibration pass cannot run,
// before any work is done.
func calibArchError(a *cmf.Arch) error {
	if !slices.Contains(model.Runnable(), a.ArchName) {
		return fmt.Errorf("convert: --calibrate runs the model on the CPU, which does not run %s yet (it runs %v); convert without --calibrate", a.ArchName, model.Runnable())
	}
	return nil
}

// calibrate runs the calibration pass for a conversion to out.
func calibrate(ctx context.Context, out string, hdr *cmf.Header, ts []srcTensor, blobs []blob, opt Options) (*calibResult, error) {
	c := opt.Calibrate
	if err := calibArchError(&hdr.Arch); err != nil {
		return nil, err
	}
	if hdr.TokenizerConfig == nil {
		return nil, fmt.Errorf("convert: --calibrate needs the model's tokenizer to read %s, and the source has none", c.Text)
	}
	text, err := ReadCalibrationText(c.Text)
	if err != nil {
		return nil, err
	}
	n := c.Tokens
	if n <= 0 {
		n = DefaultCalibTokens
	}
	seq := c.Ctx
	if seq <= 0 {
		seq = DefaultCalibCtx
	}
	if mp := hdr.Arch.MaxPositionEmbeddings; mp > 0 {
		seq = min(seq, mp)
	}
	seq = min(seq, n)

	t0 := time.Now()
	tmp := filepath.Join(filepath.Dir(out), fmt.Sprintf(".%s.calib-%08x.cmf", filepath.Base(out), rand.Uint32()))
	slog.Info("calibration: writing a temporary float model", "path", tmp)
	defer os.Remove(tmp)
	if err := writeFloatModel(ctx, tmp, hdr, ts, blobs); err != nil {
		return nil, err
	}
	f, err := cmf.Open(tmp)
	if err != nil {
		return nil, fmt.Errorf("convert: calibration: %w", err)
	}
	defer f.Close()
	m, err := model.Load(f, model.LoadOptions{Threads: opt.Threads})
	if err != nil {
		return nil, fmt.Errorf("convert: --calibrate: the model cannot run on the CPU: %w", err)
	}
	defer m.Close()
	tok, err := engine.LoadTokenizer(f)
	if err != nil {
		return nil, fmt.Errorf("convert: calibration: %w", err)
	}
	samples, err := CalibrationSamples(tok, text, n, seq)
	if err != nil {
		return nil, fmt.Errorf("convert: calibration text %s: %w", c.Text, err)
	}
	col := NewStatsCollector()
	total, err := RunCalibration(ctx, m, samples, col)
	if err != nil {
		return nil, err
	}
	res := &calibResult{stats: map[string][]float32{}, record: cmf.Calibration{
		Method: "rms-weighted", Dataset: filepath.Base(c.Text), Samples: len(samples), Tokens: total,
		Statistic: "rms",
	}}
	for name, s := range col.Stats {
		res.stats[name] = s.RMS()
	}
	slog.Info("calibration: done", "sequences", len(samples), "tokens", total, "weights", len(res.stats), "elapsed", time.Since(t0).Round(time.Millisecond))
	return res, nil
}

// ReadCalibrationText reads a calibration text file, gunzipping it when it
// starts with the gzip magic bytes. The text must be valid UTF-8.
func ReadCalibrationText(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("convert: calibration text: %w", err)
	}
	defer fh.Close()
	var r io.Reader = fh
	var magic [2]byte
	if n, _ := io.ReadFull(fh, magic[:]); n == 2 && magic == [2]byte{0x1f, 0x8b} {
		if _, err := fh.Seek(0, io.SeekStart); err != nil {
			return nil, fmt.Errorf("convert: calibration text %s: %w", path, err)
		}
		zr, err := gzip.NewReader(fh)
		if err != nil {
			return nil, fmt.Errorf("convert: calibration text %s: %w", path, err)
		}
		defer zr.Close()
		r = zr
	} else if _, err := fh.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("convert: calibration text %s: %w", path, err)
	}
	b, err := io.ReadAll(io.LimitReader(r, maxCalibTextBytes+1))
	if err != nil {
		return nil, fmt.Errorf("convert: calibration text %s: %w", path, err)
	}
	if len(b) > maxCalibTextBytes {
		return nil, fmt.Errorf("convert: calibration text %s is larger than %d bytes; take a sample of it", path, maxCalibTextBytes)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, fmt.Errorf("convert: calibration text %s is empty", path)
	}
	if !utf8.Valid(b) {
		return nil, fmt.Errorf("convert: calibration text %s is not UTF-8", path)
	}
	return b, nil
}

// CalibrationSamples cuts about n tokens of text into sequences of seq
// tokens taken from evenly spaced places of the text (each starting at a
// line start), so that a long text is sampled throughout rather than read
// from its beginning. Each sequence starts with BOS when the tokenizer
// adds one. A text with fewer tokens gives what it has.
func CalibrationSamples(tok *tokenizer.Tokenizer, text []byte, n, seq int) ([][]int, error) {
	if n <= 0 || seq <= 0 {
		return nil, fmt.Errorf("need positive token counts, got %d tokens in sequences of %d", n, seq)
	}
	var prefix []int
	if bos := tok.SpecialIDs().BOS; bos >= 0 {
		if ids := tok.Encode("", true, false); len(ids) > 0 && ids[0] == bos {
			prefix = []int{bos}
		}
	}
	if seq <= len(prefix) {
		return nil, fmt.Errorf("sequences of %d tokens are too short", seq)
	}
	count := (n + seq - 1) / seq
	var out [][]int
	for k := range count {
		off := k * len(text) / count
		if off > 0 {
			if i := bytes.IndexByte(text[off:], '\n'); i >= 0 {
				off += i + 1
			}
		}
		// A window of text long enough for seq tokens (grown when not).
		ids := prefix
		for win := 8 * seq; ; win *= 2 {
			end := min(len(text), off+win)
			for end < len(text) && !utf8.RuneStart(text[end]) {
				end++
			}
			got, err := tok.EncodeChecked(string(text[off:end]), false, false)
			if err != nil {
				return nil, err
			}
			ids = append(prefix[:len(prefix):len(prefix)], got...)
			if len(ids) >= seq || end == len(text) {
				break
			}
		}
		if len(ids) > seq {
			ids = ids[:seq]
		}
		if len(ids) > len(prefix) {
			out = append(out, ids)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no tokens in the text")
	}
	return out, nil
}

// StatsCollector is a model.Observer that accumulates the per-column RMS
// statistics of every linear layer's input, keyed by weight name. Its
// memory is one float64 per input column per weight.
type StatsCollector struct {
	Stats map[string]*quant.ColumnStats
	err   error
}

// NewStatsCollector returns an empty collector.
func NewStatsCollector() *StatsCollector {
	return &StatsCollector{Stats: map[string]*quant.ColumnStats{}}
}

// Observe implements model.Observer.
func (s *StatsCollector) Observe(weight string, x []float32, rows, cols int) {
	st := s.Stats[weight]
	if st == nil {
		st = quant.NewColumnStats(cols)
		s.Stats[weight] = st
	}
	if err := st.Add(x, rows); err != nil && s.err == nil {
		s.err = fmt.Errorf("%s: %w", weight, err)
	}
}

// Err returns the first error met while observing (a non-finite
// activation or a change of width).
func (s *StatsCollector) Err() error { return s.err }

// errReporter is an observer that can fail.
type errReporter interface {
	model.Observer
	Err() error
}

// RunCalibration runs each sample from an empty cache through m with obs
// installed, and returns the number of tokens run. The output head sees
// every position (logits are computed in pieces to bound memory).
func RunCalibration(ctx context.Context, m *model.Model, samples [][]int, obs model.Observer) (int, error) {
	longest := 0
	for _, s := range samples {
		longest = max(longest, len(s))
	}
	cache, err := m.NewCache(longest)
	if err != nil {
		return 0, fmt.Errorf("convert: calibration: %w", err)
	}
	m.SetObserver(obs)
	defer m.SetObserver(nil)
	const piece = 64
	total := 0
	for i, s := range samples {
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("convert: calibration interrupted: %w", err)
		}
		cache.Reset()
		for p := 0; p < len(s); p += piece {
			if _, err := m.Forward(cache, s[p:min(p+piece, len(s))], p, model.AllLogits); err != nil {
				return 0, fmt.Errorf("convert: calibration sequence %d: %w", i, err)
			}
		}
		if r, ok := obs.(errReporter); ok && r.Err() != nil {
			return 0, fmt.Errorf("convert: calibration sequence %d: %w", i, r.Err())
		}
		total += len(s)
	}
	return total, nil
}

// writeFloatModel writes the tensors as a float CMF the CPU can run:
// f32/f16/bf16 source tensors are copied as they are, others (GGUF
// quantized tensors, derived tensors) are stored as bf16 (matrices) or f32
// (vectors).
func writeFloatModel(ctx context.Context, path string, hdr *cmf.Header, ts []srcTensor, blobs []blob) error {
	th := *hdr
	th.QuantPolicy, th.Calibration = nil, nil
	specs := make([]cmf.TensorSpec, 0, len(ts)+len(blobs))
	counts := map[quant.DType]int{}
	for _, t := range ts {
		d := quant.F32
		if _, sd, ok := t.raw(); ok && (sd == quant.F32 || sd == quant.F16 || sd == quant.BF16) {
			d = sd
		} else if len(t.shape) >= 2 {
			d = quant.BF16
		}
		if len(t.shape) >= 2 {
			counts[d]++
		}
		specs = append(specs, cmf.TensorSpec{Name: t.name, DType: d, Shape: t.shape})
	}
	major := quant.F32 // the most common matrix format
	for _, d := range []quant.DType{quant.F32, quant.F16, quant.BF16} {
		if counts[d] > counts[major] {
			major = d
		}
	}
	th.QuantType = major.String()
	for _, b := range blobs {
		specs = append(specs, cmf.TensorSpec{Name: b.name, DType: quant.U8, Shape: []int{len(b.data)}})
	}
	w, err := cmf.Create(path, &th, specs, cmf.WriteOptions{})
	if err != nil {
		return fmt.Errorf("convert: calibration: %w", err)
	}
	defer w.Abort()
	var buf []float32
	for i, t := range ts {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("convert: interrupted: %w", err)
		}
		d := specs[i].DType
		if raw, sd, ok := t.raw(); ok && sd == d {
			if err := w.WriteTensor(t.name, raw); err != nil {
				return err
			}
		} else {
			rows, cols, err := quant.Matrix(t.shape)
			if err != nil {
				return fmt.Errorf("convert: %s: %w", t.name, err)
			}
			if cap(buf) < rows*cols {
				buf = make([]float32, rows*cols)
			}
			buf = buf[:rows*cols]
			if err := t.load(buf); err != nil {
				return fmt.Errorf("convert: %s: %w", t.name, err)
			}
			enc, err := quant.Encode(d, buf, t.shape, nil)
			if err != nil {
				return fmt.Errorf("convert: %s as %s: %w", t.name, d, err)
			}
			if err := w.WriteTensor(t.name, enc); err != nil {
				return err
			}
		}
		if t.release != nil {
			t.release()
		}
	}
	for _, b := range blobs {
		if err := w.WriteTensor(b.name, b.data); err != nil {
			return err
		}
	}
	return w.Close()
}

// calibTensorName is the name of a weight's statistics tensor.
func calibTensorName(weight string) string { return CalibPrefix + weight }

// specs returns the statistics tensors to store: one f32 [cols] tensor per
// weight whose encoding used statistics (stats[i] for weights[i]), in the
// weights' order. A nil result (or receiver) stores none.
func (r *calibResult) specs(weights []cmf.TensorSpec, stats [][]float32) []cmf.TensorSpec {
	if r == nil {
		return nil
	}
	var out []cmf.TensorSpec
	for i, w := range weights {
		if stats[i] != nil {
			out = append(out, cmf.TensorSpec{Name: calibTensorName(w.Name), DType: quant.F32, Shape: []int{len(stats[i])}})
		}
	}
	return out
}

// header returns the calibration section for the stored statistics.
func (r *calibResult) header(specs []cmf.TensorSpec) *cmf.Calibration {
	rec := r.record
	rec.Tensors = map[string]string{}
	for _, s := range specs {
		rec.Tensors[s.Name[len(CalibPrefix):]] = s.Name
	}
	return &rec
}

// write stores the statistics tensors of specs.
func (r *calibResult) write(w *cmf.Writer, specs []cmf.TensorSpec) error {
	for _, s := range specs {
		v := r.stats[s.Name[len(CalibPrefix):]]
		b, err := quant.Encode(quant.F32, v, s.Shape, nil)
		if err != nil {
			return fmt.Errorf("convert: %s: %w", s.Name, err)
		}
		if err := w.WriteTensor(s.Name, b); err != nil {
			return err
		}
	}
	return nil
}
