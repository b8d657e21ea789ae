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

	"github.com/cortiq/cortiq/backend/cpu"
	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/tokenizer"
)

// Calibration (activation-aware encoding).
//
// With Options.Calibrate set, the converter first writes the model as a
// temporary float CMF next to the output and runs it on the CPU over
// tokens of a calibration text with an observer on every linear layer's
// input. It records each input column's RMS (stored in the output as f32
// [cols] tensors named CalibPrefix + weight name and listed in the
// header's calibration section); q8_2f weights fit their column field with
// it. q4tp weights are encoded by GPTQ (method "gptq", the default: the
// Gram matrix XᵀX of each distinct input, see quant.GPTQ) or with the RMS
// weighting their error (method "rms"). Gram matrices take 8·cols² bytes
// each (twice that while encoding), so they are gathered for a window of
// weights at a time within Calibrate.Memory, one run over the tokens per
// window, in the order the weights are written.

// CalibPrefix starts the name of every calibration statistics tensor.
const CalibPrefix = "calibration."

// Calibration defaults.
const (
	DefaultCalibTokens = 8192    // tokens run through the model
	DefaultCalibCtx    = 512     // tokens per sequence (at most the trained context)
	DefaultCalibMemory = 4 << 30 // bytes of Gram matrices held at once (method gptq)
	maxCalibTextBytes  = 1 << 30
)

// Calibration methods for q4tp weights.
const (
	CalibGPTQ = "gptq" // GPTQ with the inputs' Gram matrices (default)
	CalibRMS  = "rms"  // error weighted by the inputs' per-column RMS
)

// Calibrate configures the calibration pass of a conversion.
type Calibrate struct {
	Text   string // path of a UTF-8 text file, optionally gzip-compressed
	Tokens int    // tokens to run (0: DefaultCalibTokens)
	Ctx    int    // tokens per sequence (0: DefaultCalibCtx, capped at max_position_embeddings)
	Method string // CalibGPTQ ("": the default) or CalibRMS
	Memory int64  // bytes of Gram matrices at once (0: DefaultCalibMemory)
	// Progress receives (tokens run, tokens to run) after each sequence
	// of each calibration pass.
	Progress func(done, total int64)
}

// calibResult is what a calibration pass measured, and for GPTQ the
// means to measure more: the temporary model stays open until close.
type calibResult struct {
	stats  map[string][]float32 // weight name → per-column RMS of its input
	record cmf.Calibration

	// GPTQ: the q4tp weights it encodes, in write order, with their
	// columns; the window of encoders loaded; the first weight after it.
	order  []string
	cols   map[string]int
	budget int64
	win    map[string]*quant.GPTQ
	next   int
	rerun  func(ctx context.Context, obs model.Observer) error
	closer []func()
}

// close releases the temporary model.
func (r *calibResult) close() {
	for i := len(r.closer) - 1; i >= 0; i-- {
		r.closer[i]()
	}
	r.closer = nil
}

// calibArchError reports an architecture the calibration pass cannot run,
// before any work is done.
func calibArchError(a *cmf.Arch) error {
	if !slices.Contains(model.Runnable(), a.ArchName) {
		return fmt.Errorf("convert: --calibrate runs the model on the CPU, which does not run %s yet (it runs %v); convert without --calibrate", a.ArchName, model.Runnable())
	}
	return nil
}

// calibrate runs the calibration pass for a conversion to out whose
// tensors ts get the formats of specs. The caller closes the result.
func calibrate(ctx context.Context, out string, hdr *cmf.Header, ts []srcTensor, specs []cmf.TensorSpec, blobs []blob, opt Options) (_ *calibResult, err error) {
	c := opt.Calibrate
	method := c.Method
	if method == "" {
		method = CalibGPTQ
	}
	if method != CalibGPTQ && method != CalibRMS {
		return nil, fmt.Errorf("convert: calibration method %q: want %s or %s", c.Method, CalibGPTQ, CalibRMS)
	}
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
	res := &calibResult{stats: map[string][]float32{}, cols: map[string]int{}, budget: c.Memory}
	if res.budget <= 0 {
		res.budget = DefaultCalibMemory
	}
	defer func() {
		if err != nil {
			res.close()
		}
	}()
	tmp := filepath.Join(filepath.Dir(out), fmt.Sprintf(".%s.calib-%08x.cmf", filepath.Base(out), rand.Uint32()))
	slog.Info("calibration: writing a temporary float model", "path", tmp)
	res.closer = append(res.closer, func() { os.Remove(tmp) })
	if err := writeFloatModel(ctx, tmp, hdr, ts, blobs); err != nil {
		return nil, err
	}
	f, err := cmf.OpenWith(tmp, cmf.OpenOptions{NoVerify: true}) // just written, and temporary
	if err != nil {
		return nil, fmt.Errorf("convert: calibration: %w", err)
	}
	res.closer = append(res.closer, func() { f.Close() })
	dev := cpu.New(opt.Threads)
	res.closer = append(res.closer, func() { dev.Close() })
	m, err := model.Load(f, model.LoadOptions{Device: dev})
	if err != nil {
		return nil, fmt.Errorf("convert: --calibrate: the model cannot run on the CPU: %w", err)
	}
	res.closer = append(res.closer, m.Close)
	tok, err := engine.LoadTokenizer(f)
	if err != nil {
		return nil, fmt.Errorf("convert: calibration: %w", err)
	}
	samples, err := CalibrationSamples(tok, text, n, seq)
	if err != nil {
		return nil, fmt.Errorf("convert: calibration text %s: %w", c.Text, err)
	}
	res.rerun = func(ctx context.Context, obs model.Observer) error {
		_, err := runCalibration(ctx, m, samples, obs, c.Progress)
		return err
	}
	if method == CalibGPTQ {
		for _, sp := range specs {
			if sp.DType == quant.Q4TP {
				_, cols, _ := quant.Matrix(sp.Shape)
				res.order = append(res.order, sp.Name)
				res.cols[sp.Name] = cols
			}
		}
	}
	// The first run gathers every weight's RMS and the first window's
	// Gram matrices.
	stats := NewStatsCollector()
	obs := multiObserver{stats}
	grams := res.window()
	if grams != nil {
		obs = append(obs, grams)
	}
	total, err := runCalibration(ctx, m, samples, obs, c.Progress)
	if err != nil {
		return nil, err
	}
	for name, s := range stats.Stats {
		res.stats[name] = s.RMS()
	}
	// Weights the model never multiplied (an untied embedding) are
	// encoded without statistics.
	res.order = slices.DeleteFunc(res.order, func(n string) bool { return res.stats[n] == nil })
	if err := res.load(grams); err != nil {
		return nil, err
	}
	if len(res.order) == 0 {
		method = CalibRMS // no q4tp weight to encode by GPTQ: the statistics alone were used
	}
	res.record = cmf.Calibration{Method: method, Dataset: filepath.Base(c.Text), Samples: len(samples), Tokens: total, Statistic: "rms"}
	slog.Info("calibration: statistics gathered", "method", method, "sequences", len(samples), "tokens", total, "weights", len(res.stats), "elapsed", time.Since(t0).Round(time.Millisecond))
	return res, nil
}

// window returns the Gram collector for the weights from r.next on that
// fit the memory budget (at least one; counted as if no two shared an
// input), or nil when no weight is left.
func (r *calibResult) window() *gramObserver {
	if r.next >= len(r.order) {
		return nil
	}
	o := &gramObserver{want: map[string]bool{}, grams: map[string]*quant.Gram{}, owner: map[string]bool{}}
	var used int64
	for _, name := range r.order[r.next:] {
		b := quant.GPTQBytes(r.cols[name])
		if len(o.want) > 0 && used+b > r.budget {
			break
		}
		o.want[name] = true
		used += b
	}
	return o
}

// load factors the gathered Gram matrices into the window's encoders.
func (r *calibResult) load(o *gramObserver) error {
	if o == nil {
		return nil
	}
	if err := o.Err(); err != nil {
		return err
	}
	r.win = map[string]*quant.GPTQ{}
	made := map[*quant.Gram]*quant.GPTQ{}
	for r.next < len(r.order) && o.want[r.order[r.next]] {
		name := r.order[r.next]
		g := o.grams[name]
		if g == nil {
			return fmt.Errorf("convert: calibration: %s was not seen in the calibration run", name)
		}
		q := made[g]
		if q == nil {
			var err error
			if q, err = quant.NewGPTQ(g, quant.GPTQOptions{}); err != nil {
				return fmt.Errorf("convert: calibration: %s: %w", name, err)
			}
			made[g] = q
		}
		r.win[name] = q
		r.next++
	}
	return nil
}

// encoder returns the GPTQ encoder of a weight, running the calibration
// again for the next window when the weight is past the loaded one; nil
// for a weight GPTQ does not encode (or a nil receiver).
func (r *calibResult) encoder(ctx context.Context, name string) (*quant.GPTQ, error) {
	if r == nil || r.cols[name] == 0 {
		return nil, nil
	}
	if q := r.win[name]; q != nil {
		return q, nil
	}
	if r.next >= len(r.order) || r.order[r.next] != name {
		return nil, nil // never multiplied by the model: no statistics
	}
	r.win = nil // let the previous window go before gathering the next
	t0 := time.Now()
	o := r.window()
	if err := r.rerun(ctx, o); err != nil {
		return nil, err
	}
	if err := r.load(o); err != nil {
		return nil, err
	}
	slog.Info("calibration: gathered the next window of Gram matrices", "weights", len(o.want), "elapsed", time.Since(t0).Round(time.Millisecond))
	return r.win[name], nil
}

// gramObserver gathers the Gram matrices of the inputs of the weights in
// want. Weights observed one after the other on the very same buffer
// (q/k/v, gate/up) share one matrix, added once.
type gramObserver struct {
	want    map[string]bool
	grams   map[string]*quant.Gram
	owner   map[string]bool // the weight whose observation adds to its matrix
	last    *float32
	lastLen int
	lastG   *quant.Gram
	err     error
}

func (o *gramObserver) Observe(w string, x []float32, rows, cols int) {
	if len(x) == 0 {
		return
	}
	same := &x[0] == o.last && len(x) == o.lastLen
	if !same {
		o.last, o.lastLen, o.lastG = &x[0], len(x), nil
	}
	if !o.want[w] {
		return
	}
	g, ok := o.grams[w]
	if !ok {
		if same && o.lastG != nil && o.lastG.Cols() == cols {
			g = o.lastG
		} else {
			g = quant.NewGram(cols)
			o.owner[w] = true
		}
		o.grams[w] = g
	}
	o.lastG = g
	if !o.owner[w] {
		return
	}
	if g.Cols() != cols {
		o.fail(fmt.Errorf("%s: input of %d columns, then %d", w, g.Cols(), cols))
		return
	}
	if err := g.Add(x, rows); err != nil {
		o.fail(fmt.Errorf("%s: %w", w, err))
	}
}

func (o *gramObserver) fail(err error) {
	if o.err == nil {
		o.err = err
	}
}

// Err returns the first error met while observing.
func (o *gramObserver) Err() error { return o.err }

// multiObserver passes every observation to each of its observers.
type multiObserver []errReporter

func (m multiObserver) Observe(w string, x []float32, rows, cols int) {
	for _, o := range m {
		o.Observe(w, x, rows, cols)
	}
}

func (m multiObserver) Err() error {
	for _, o := range m {
		if err := o.Err(); err != nil {
			return err
		}
	}
	return nil
}

// gptqCodec is the q4tp codec with rows encoded by a GPTQ encoder.
type gptqCodec struct {
	quant.Codec
	q *quant.GPTQ
}

func (c gptqCodec) EncodeRows(dst []byte, w []float32, rows, cols, r0 int, _ *quant.EncodeOptions) error {
	return c.q.EncodeRows(dst, w, rows, cols, r0)
}

// codecFor returns the codec of d, encoding by GPTQ when q is set.
func codecFor(d quant.DType, q *quant.GPTQ) (quant.Codec, error) {
	c, err := quant.CodecFor(d)
	if err != nil || q == nil {
		return c, err
	}
	return gptqCodec{c, q}, nil
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
	return runCalibration(ctx, m, samples, obs, nil)
}

// runCalibration is RunCalibration reporting tokens run to progress
// (nil: none).
func runCalibration(ctx context.Context, m *model.Model, samples [][]int, obs model.Observer, progress func(done, total int64)) (int, error) {
	longest, all := 0, int64(0)
	for _, s := range samples {
		longest = max(longest, len(s))
		all += int64(len(s))
	}
	cache, err := m.NewCache(longest)
	if err != nil {
		return 0, fmt.Errorf("convert: calibration: %w", err)
	}
	if err := m.SetObserver(obs); err != nil {
		return 0, fmt.Errorf("convert: calibration: %w", err)
	}
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
		if progress != nil {
			progress(int64(total), all)
		}
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
