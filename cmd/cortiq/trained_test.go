package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/convert"
	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/kernels"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/safetensors"
)

// trainedRef is testdata/trained/brown_llama/reference.json: a small Llama
// trained on the Brown corpus (tools/refgen/trained.py), whose predictions
// are confident enough to show what each weight format costs.
type trainedRef struct {
	EvalIDs       []int     `json:"eval_ids"`
	GreedyIDs     []int     `json:"greedy_ids"`
	GreedyMargins []float64 `json:"greedy_margins"`
	Perplexity    struct {
		Ctx, Chunks int
		PPL         float64 `json:"ppl"`
		Tokens      int     `json:"tokens_scored"`
	} `json:"perplexity"`
}

// trainedDir is the trained fixture's Hugging Face directory.
var trainedDir = filepath.Join("..", "..", "testdata", "trained", "brown_llama")

// trainedEval holds what the fixture is measured against: transformers'
// logits on its eval ids, and the held-out text perplexity is scored on.
type trainedEval struct {
	ref  trainedRef
	want []float32 // transformers' logits, [len(ref.EvalIDs) × vocab]
	text string    // testdata/text/brown_eval.txt
	// base holds our f32 model's logits on every position of the
	// perplexity chunks (set once the f32 model has run): 24×256 positions
	// give a steadier top-1 and KL than the 256 eval ids alone.
	base [][]float32
}

// chunkLogits returns the logits of every position of the perplexity
// chunks (as perplexity() cuts them).
func (ev *trainedEval) chunkLogits(t *testing.T, e *engine.Engine) [][]float32 {
	t.Helper()
	toks := mustEncode(t, e, ev.text)
	ctx := ev.ref.Perplexity.Ctx
	s, err := e.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bos := e.Tok.SpecialIDs().BOS
	var out [][]float32
	for c := 0; c < ev.ref.Perplexity.Chunks && (c+1)*ctx <= len(toks); c++ {
		chunk := append([]int(nil), toks[c*ctx:(c+1)*ctx]...)
		if ids := e.Tok.Encode("", true, false); bos >= 0 && len(ids) > 0 && ids[0] == bos {
			chunk[0] = bos
		}
		s.Reset()
		l, err := e.Model.Forward(s.Cache(), chunk, 0, model.AllLogits)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

func loadTrainedEval(t *testing.T) *trainedEval {
	t.Helper()
	ev := &trainedEval{}
	b, err := os.ReadFile(filepath.Join(trainedDir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &ev.ref); err != nil {
		t.Fatal(err)
	}
	rs, err := safetensors.Open(filepath.Join(trainedDir, "reference.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	if ev.want, err = rs.Float32("logits"); err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(filepath.Join("..", "..", "testdata", "text", "brown_eval.txt"))
	if err != nil {
		t.Fatal(err)
	}
	ev.text = string(text)
	return ev
}

// trainedScore is how one converted model compares with transformers.
type trainedScore struct {
	top1   float64 // share of eval positions whose top token agrees
	kl     float64 // mean KL(transformers || ours), nats
	worst  float64 // max |Δlogit| over the logits' RMS
	ppl    float64 // perplexity on the eval text
	rel    float64 // ppl / transformers' ppl − 1
	tokens int     // tokens scored for ppl
	// Against our f32 model on every position of the perplexity chunks
	// (when trainedEval.base is set).
	textTop1, textKL float64
}

func (s trainedScore) String() string {
	r := fmt.Sprintf("top-1 agreement %.1f%%, mean KL %.2e nats, max |Δlogit|/rms %.2e, perplexity %.4f (%+.2f%%)",
		100*s.top1, s.kl, s.worst, s.ppl, 100*s.rel)
	if s.textKL > 0 {
		r += fmt.Sprintf("; on the eval text vs f32: top-1 %.1f%%, KL %.2e", 100*s.textTop1, s.textKL)
	}
	return r
}

// score runs the eval ids and the perplexity text through an open engine.
func (ev *trainedEval) score(t *testing.T, e *engine.Engine) trainedScore {
	t.Helper()
	T := len(ev.ref.EvalIDs)
	V := len(ev.want) / T
	s, err := e.NewSession(T)
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.Model.Forward(s.Cache(), ev.ref.EvalIDs, 0, model.AllLogits)
	if err != nil {
		t.Fatal(err)
	}
	var ss, worst, kl float64
	agree := 0
	for _, v := range ev.want {
		ss += float64(v) * float64(v)
	}
	rms := math.Sqrt(ss / float64(len(ev.want)))
	for p := 0; p < T; p++ {
		a, g := ev.want[p*V:(p+1)*V], got[p*V:(p+1)*V]
		if argmax(a) == argmax(g) {
			agree++
		}
		kl += klDiv(a, g)
		for j := range a {
			worst = max(worst, math.Abs(float64(a[j]-g[j]))/rms)
		}
	}
	res, err := perplexity(context.Background(), e, mustEncode(t, e, ev.text), ev.ref.Perplexity.Ctx, ev.ref.Perplexity.Chunks, nil)
	if err != nil {
		t.Fatal(err)
	}
	sc := trainedScore{top1: float64(agree) / float64(T), kl: kl / float64(T), worst: worst, ppl: res.PPL,
		rel: res.PPL/ev.ref.Perplexity.PPL - 1, tokens: res.Tokens}
	if ev.base != nil {
		n := 0
		for c, l := range ev.chunkLogits(t, e) {
			b := ev.base[c]
			for p := 0; p < len(l)/V; p++ {
				if argmax(b[p*V:(p+1)*V]) == argmax(l[p*V:(p+1)*V]) {
					sc.textTop1++
				}
				sc.textKL += klDiv(b[p*V:(p+1)*V], l[p*V:(p+1)*V])
				n++
			}
		}
		sc.textTop1 /= float64(n)
		sc.textKL /= float64(n)
	}
	return sc
}

// calibText is the calibration text: the fixture's training text, never
// the held-out eval text.
var calibText = filepath.Join("..", "..", "testdata", "text", "brown_train.txt.gz")

// TestTrainedModelFormats converts the trained fixture to every format and
// compares with transformers (float32, eager, from the bf16 checkpoint):
// f32 must match its logits, greedy ids and perplexity; the 8-bit formats
// must agree on the top-1 token at ≥ 95% of positions; q4tp is held to
// llama.cpp's Q4_0 (simulated on the same tensors) and q4tp calibrated on
// the training text (--calibrate) must beat plain q4tp.
func TestTrainedModelFormats(t *testing.T) {
	ev := loadTrainedEval(t)
	ref := &ev.ref
	var q40, q4 trainedScore
	for _, c := range []struct {
		q            string
		top1, pplRel float64 // minimum top-1 agreement, maximum perplexity increase
	}{
		// Perplexity against transformers, measured over the kernel sets
		// (-args -isa=generic|avx2|avx512): f32 and bf16 within 4.7e-8,
		// q8_row +1.4e-3..+2.1e-3, q8_2f −4.2e-4..+2.0e-4; allowed 3×.
		{"f32", 1, 1.5e-7}, {"bf16", 1, 1.5e-7}, {"q8_row", 0.95, 6e-3}, {"q8_2f", 0.95, 6e-3}, {"sim-q8_0", 0, 1}, {"sim-q4_0", 0, 1}, {"q4tp", 0, 0}, {"q4tp-calib", 0, 0}} {
		t.Run(c.q, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "m.cmf")
			src, q := trainedDir, c.q
			var extra []string
			if sim, ok := strings.CutPrefix(c.q, "sim-"); ok {
				// llama.cpp's Q4_0 / Q8_0 for comparison: the same tensors
				// fake-quantized (values rounded through the format) and
				// stored as f32; the head gets Q8_0 as in llama.cpp.
				src, q = simulateGGML(t, trainedDir, sim), "f32"
			}
			if base, ok := strings.CutSuffix(c.q, "-calib"); ok {
				q, extra = base, []string{"--calibrate", calibText, "--calib-tokens", "4096", "--calib-ctx", "256"}
			}
			if _, err := cli(t, append([]string{"convert", src, "-o", p, "--quant", q}, extra...)...); err != nil {
				t.Fatal(err)
			}
			e, err := engine.Open(p, engine.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if d, err := quant.ParseDType(q); err == nil && d.Quantized() {
				// The subtest tests the format it is named for: every
				// layer weight (192 and 512 columns) is stored as q.
				for _, tn := range e.File.Tensors {
					if len(tn.Shape) == 2 && tn.Name != "model.embed_tokens.weight" && tn.Name != "lm_head.weight" && tn.DType != d {
						t.Fatalf("%s is stored as %s, not %s", tn.Name, tn.DType, d)
					}
				}
			}
			sc := ev.score(t, e)
			t.Logf("%-10s %s (transformers %.4f, relative %+.2e)", c.q, sc, ref.Perplexity.PPL, sc.rel)
			switch c.q {
			case "sim-q4_0":
				q40 = sc
			case "q4tp":
				q4 = sc
			}
			if strings.HasPrefix(c.q, "sim-") {
				return // a comparison row, not a check
			}
			switch c.q {
			case "q4tp":
				// No plain 4-bit rounding reaches 95% top-1 on a model this
				// small (llama.cpp's Q4_0 does not either): q4tp is held
				// to Q4_0's quality, within 5 points of agreement and one
				// point of perplexity.
				c.top1, c.pplRel = q40.top1-0.05, q40.rel+0.01
			case "q4tp-calib":
				// Calibration must pay: lower KL and perplexity than plain
				// q4tp, and no worse agreement.
				c.top1, c.pplRel = q4.top1, q4.rel
				if sc.kl >= q4.kl {
					t.Errorf("calibrated q4tp: mean KL %.3e, plain %.3e", sc.kl, q4.kl)
				}
			}
			if sc.top1 < c.top1 {
				t.Errorf("%s: top-1 agreement %.1f%% < %.1f%%", c.q, 100*sc.top1, 100*c.top1)
			}
			if sc.rel > c.pplRel || (c.q == "f32" || c.q == "bf16") && math.Abs(sc.rel) > c.pplRel {
				t.Errorf("%s: perplexity %.4f vs transformers %.4f", c.q, sc.ppl, ref.Perplexity.PPL)
			}
			if sc.tokens != ref.Perplexity.Tokens {
				t.Errorf("%d tokens scored, transformers %d", sc.tokens, ref.Perplexity.Tokens)
			}
			if c.q == "f32" || c.q == "bf16" {
				// Measured 3.30e-6 of the RMS (generic, avx2), 3.45e-6 (avx512).
				if sc.worst > 1e-5 {
					t.Errorf("logits differ by %.2e of their RMS (tolerance 1e-5)", sc.worst)
				}
				out, err := cli(t, "run", p, "--ids", joinInts(ref.EvalIDs), "-n", "16", "--temperature", "0", "--ignore-eos", "--json")
				if err != nil {
					t.Fatal(err)
				}
				var gen struct{ IDs []int }
				json.Unmarshal([]byte(out), &gen)
				for i, id := range ref.GreedyIDs {
					if ref.GreedyMargins[i] < 1e-3 {
						break
					}
					if gen.IDs[i] != id {
						t.Fatalf("greedy %v, transformers %v", gen.IDs, ref.GreedyIDs)
					}
				}
			}
		})
	}
}

func mustEncode(t *testing.T, e *engine.Engine, s string) []int {
	ids, err := e.Encode(s, false)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func argmax(v []float32) int {
	b := 0
	for i, x := range v {
		if x > v[b] {
			b = i
		}
	}
	return b
}

// klDiv is KL(softmax(p) || softmax(q)) in nats.
func klDiv(p, q []float32) float64 {
	lse := func(v []float32) float64 {
		m := float64(v[argmax(v)])
		var z float64
		for _, x := range v {
			z += math.Exp(float64(x) - m)
		}
		return m + math.Log(z)
	}
	lp, lq := lse(p), lse(q)
	var kl float64
	for i := range p {
		a, b := float64(p[i])-lp, float64(q[i])-lq
		kl += math.Exp(a) * (a - b)
	}
	return kl
}

func joinInts(v []int) string {
	b := make([]byte, 0, 6*len(v))
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, []byte(itoaInt(x))...)
	}
	return string(b)
}

func itoaInt(x int) string { return strconv.Itoa(x) }

// simulateGGML writes a copy of the checkpoint whose 2-D weights are
// rounded through llama.cpp's Q4_0 or Q8_0 (quant.RefQ4_0/RefQ8_0), the
// output head through Q8_0, stored as f32.
func simulateGGML(t *testing.T, dir, format string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "sim")
	os.MkdirAll(out, 0o755)
	for _, f := range []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(out, f), b, 0o644)
	}
	st, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var ws []safetensors.WriteTensor
	for _, name := range st.Tensors() {
		info, _ := st.Tensor(name)
		v, err := st.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Shape) == 2 && info.Shape[1]%32 == 0 && name != "model.embed_tokens.weight" {
			if format == "q4_0" && name != "lm_head.weight" {
				v = quant.RefQ4_0(v)
			} else {
				v = quant.RefQ8_0(v)
			}
		}
		ws = append(ws, safetensors.WriteTensor{Name: name, DType: safetensors.F32, Shape: info.Shape, Data: safetensors.F32Bytes(v)})
	}
	if err := safetensors.Write(filepath.Join(out, "model.safetensors"), ws, nil); err != nil {
		t.Fatal(err)
	}
	return out
}

var calibExperiment = flag.Bool("calib-experiment", false, "run TestTrainedCalibrationExperiment (docs/quant.md)")

// gramCollector gathers, for the calibration experiment, the Gram matrix
// XᵀX of every linear layer's input, once per distinct input (q/k/v share
// one, gate/up another); the output head is skipped.
type gramCollector struct {
	grams map[string]*quant.Gram
	err   error
}

// gramKey maps a weight to the weight whose input it shares.
func gramKey(w string) string {
	for _, s := range [][2]string{{"self_attn.k_proj", "self_attn.q_proj"}, {"self_attn.v_proj", "self_attn.q_proj"}, {"mlp.up_proj", "mlp.gate_proj"}} {
		if r, ok := strings.CutSuffix(w, s[0]+".weight"); ok {
			return r + s[1] + ".weight"
		}
	}
	return w
}

func (g *gramCollector) Observe(w string, x []float32, rows, cols int) {
	if !strings.HasPrefix(w, "model.layers.") || gramKey(w) != w {
		return
	}
	gr := g.grams[w]
	if gr == nil {
		gr = quant.NewGram(cols)
		g.grams[w] = gr
	}
	if err := gr.Add(x, rows); err != nil && g.err == nil {
		g.err = err
	}
}

func (g *gramCollector) Err() error { return g.err }

// TestTrainedCalibrationExperiment is the experiment behind docs/quant.md's
// calibration table: it runs the fixture's f32 model on 4096 tokens of the
// training text, gathers each linear layer's input Gram matrix, encodes the
// weights in several ways, and scores each (fake-quantized: the decoded
// weights stored as f32, the head as q8_row and the embedding as plain
// q4tp, as the converter's policy stores them) on the held-out text.
// It also runs GPTQ sequentially: layer l calibrated on the model whose
// earlier layers are already quantized. Run it with
//
//	go test ./cmd/cortiq -run TrainedCalibrationExperiment -v -calib-experiment
//
// to see the table; it checks that GPTQ beats plain q4tp.
func TestTrainedCalibrationExperiment(t *testing.T) {
	if !*calibExperiment {
		t.Skip("the calibration experiment runs with -calib-experiment (about 15 s)")
	}
	ev := loadTrainedEval(t)
	f32 := filepath.Join(t.TempDir(), "f32.cmf")
	if _, err := cli(t, "convert", trainedDir, "-o", f32, "--quant", "f32"); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Open(f32, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	text, err := convert.ReadCalibrationText(calibText)
	if err != nil {
		t.Fatal(err)
	}
	samples, err := convert.CalibrationSamples(e.Tok, text, 4096, 256)
	if err != nil {
		t.Fatal(err)
	}
	col := &gramCollector{grams: map[string]*quant.Gram{}}
	if _, err := convert.RunCalibration(context.Background(), e.Model, samples, col); err != nil {
		t.Fatal(err)
	}
	ev.base = ev.chunkLogits(t, e)
	e.Close()

	st, err := safetensors.Open(filepath.Join(trainedDir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// One GPTQ encoder per input (NewGPTQ takes its Gram over), per option
	// set; the Gram matrices are copied first.
	gptqs := map[string]*quant.GPTQ{}
	gptqRoundTrip := func(name string, w []float32, shape []int, o quant.GPTQOptions) []float32 {
		k := fmt.Sprintf("%s %+v", gramKey(name), o)
		q := gptqs[k]
		if q == nil {
			g := quant.NewGram(shape[1])
			if err := g.Merge(col.grams[gramKey(name)]); err != nil {
				t.Fatal(err)
			}
			var err error
			if q, err = quant.NewGPTQ(g, o); err != nil {
				t.Fatal(err)
			}
			gptqs[k] = q
		}
		b := make([]byte, len(mustBytes(t, quant.Q4TP, shape)))
		if err := q.EncodeRows(b, w, shape[0], shape[1], 0); err != nil {
			t.Fatal(err)
		}
		out, err := quant.Decode(quant.Q4TP, b, shape)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	roundTrip := func(d quant.DType, w []float32, shape []int, opt *quant.EncodeOptions) []float32 {
		b, err := quant.Encode(d, w, shape, opt)
		if err != nil {
			t.Fatal(err)
		}
		out, err := quant.Decode(d, b, shape)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	variants := []struct {
		name string
		enc  func(name string, w []float32, shape []int, g *quant.Gram) []float32
	}{
		{"plain", func(_ string, w []float32, shape []int, _ *quant.Gram) []float32 {
			return roundTrip(quant.Q4TP, w, shape, nil)
		}},
		{"rms-weighted", func(_ string, w []float32, shape []int, g *quant.Gram) []float32 {
			return roundTrip(quant.Q4TP, w, shape, &quant.EncodeOptions{ColStats: g.RMS()})
		}},
		{"gptq", func(name string, w []float32, shape []int, _ *quant.Gram) []float32 {
			return gptqRoundTrip(name, w, shape, quant.GPTQOptions{Refine: -1})
		}},
		{"gptq+refine", func(name string, w []float32, shape []int, _ *quant.Gram) []float32 {
			return gptqRoundTrip(name, w, shape, quant.GPTQOptions{})
		}},
	}
	scores := map[string]trainedScore{}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "sim")
			var layerNum, layerDen float64
			writeSimulated(t, trainedDir, dir, func(name string, w []float32, shape []int) []float32 {
				switch {
				case len(shape) != 2 || shape[1]%32 != 0:
					return w
				case name == "lm_head.weight":
					return roundTrip(quant.Q8Row, w, shape, nil)
				case name == "model.embed_tokens.weight":
					return roundTrip(quant.Q4TP, w, shape, nil)
				}
				g := col.grams[gramKey(name)]
				if g == nil {
					t.Fatalf("no calibration statistics for %s", name)
				}
				got := v.enc(name, w, shape, g)
				num, den := g.OutputError(w, got)
				layerNum += num
				layerDen += den
				return got
			})
			t.Logf("%-13s relative layer output error on the calibration inputs %.4f", v.name, math.Sqrt(layerNum/layerDen))
			p := filepath.Join(t.TempDir(), "m.cmf")
			if _, err := cli(t, "convert", dir, "-o", p, "--quant", "f32"); err != nil {
				t.Fatal(err)
			}
			e, err := engine.Open(p, engine.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			scores[v.name] = ev.score(t, e)
			t.Logf("%-13s %s", v.name, scores[v.name])
		})
	}
	// Sequential GPTQ: layer l is calibrated on the inputs of the model
	// whose embedding and layers < l are already quantized.
	t.Run("gptq+refine-sequential", func(t *testing.T) {
		done := map[string][]float32{}
		fake := func(name string, w []float32, shape []int) []float32 {
			switch {
			case len(shape) != 2 || shape[1]%32 != 0:
				return w
			case name == "lm_head.weight":
				return roundTrip(quant.Q8Row, w, shape, nil)
			case name == "model.embed_tokens.weight":
				return roundTrip(quant.Q4TP, w, shape, nil)
			}
			if q, ok := done[name]; ok {
				return q
			}
			return w
		}
		open := func() *engine.Engine {
			dir := filepath.Join(t.TempDir(), "sim")
			writeSimulated(t, trainedDir, dir, fake)
			p := filepath.Join(t.TempDir(), "m.cmf")
			if _, err := cli(t, "convert", dir, "-o", p, "--quant", "f32"); err != nil {
				t.Fatal(err)
			}
			e, err := engine.Open(p, engine.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return e
		}
		for l := 0; ; l++ {
			prefix := fmt.Sprintf("model.layers.%d.", l)
			var names []string
			for _, n := range st.Tensors() {
				if strings.HasPrefix(n, prefix) && strings.HasSuffix(n, "_proj.weight") {
					names = append(names, n)
				}
			}
			if len(names) == 0 {
				break
			}
			e := open()
			lc := &gramCollector{grams: map[string]*quant.Gram{}}
			if _, err := convert.RunCalibration(context.Background(), e.Model, samples, lc); err != nil {
				t.Fatal(err)
			}
			e.Close()
			encs := map[string]*quant.GPTQ{}
			for _, n := range names {
				info, _ := st.Tensor(n)
				w, _ := st.Float32(n)
				k := gramKey(n)
				if encs[k] == nil {
					var err error
					if encs[k], err = quant.NewGPTQ(lc.grams[k], quant.GPTQOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				b := mustBytes(t, quant.Q4TP, info.Shape)
				if err := encs[k].EncodeRows(b, w, info.Shape[0], info.Shape[1], 0); err != nil {
					t.Fatal(err)
				}
				done[n], _ = quant.Decode(quant.Q4TP, b, info.Shape)
			}
		}
		e := open()
		defer e.Close()
		scores["sequential"] = ev.score(t, e)
		t.Logf("%-13s %s", "gptq+refine, sequential", scores["sequential"])
	})
	if g, p := scores["gptq+refine"], scores["plain"]; g.textKL >= p.textKL || g.rel >= p.rel {
		t.Errorf("gptq (%s) does not beat plain q4tp (%s)", g, p)
	}
}

// writeSimulated writes a copy of the Hugging Face checkpoint in src to
// dst with every tensor replaced by fn(name, values, shape), stored as f32.
func writeSimulated(t *testing.T, src, dst string, fn func(name string, w []float32, shape []int) []float32) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st, err := safetensors.Open(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var ws []safetensors.WriteTensor
	for _, name := range st.Tensors() {
		info, _ := st.Tensor(name)
		v, err := st.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		v = fn(name, v, info.Shape)
		ws = append(ws, safetensors.WriteTensor{Name: name, DType: safetensors.F32, Shape: info.Shape, Data: safetensors.F32Bytes(v)})
	}
	if err := safetensors.Write(filepath.Join(dst, "model.safetensors"), ws, nil); err != nil {
		t.Fatal(err)
	}
}

func mustBytes(t *testing.T, d quant.DType, shape []int) []byte {
	t.Helper()
	n, err := quant.ExpectedBytes(d, shape)
	if err != nil {
		t.Fatal(err)
	}
	return make([]byte, n)
}

// TestConvertCalibrateFlags checks the flag errors of convert --calibrate,
// all found before any conversion work.
func TestConvertCalibrateFlags(t *testing.T) {
	out := filepath.Join(t.TempDir(), "m.cmf")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--quant", "q8_row", "--calibrate", calibText}, "only changes q4tp and q8_2f"},
		{[]string{"--quant", "q4tp", "--calib-tokens", "64"}, "--calib-tokens needs --calibrate"},
		{[]string{"--quant", "q4tp", "--calib-method", "rms"}, "--calib-method needs --calibrate"},
		{[]string{"--quant", "q4tp", "--calibrate", calibText, "--calib-method", "awq"}, "--calib-method"},
		{[]string{"--quant", "q4tp", "--calibrate", calibText, "--calib-memory", "1KB"}, "--calib-memory"},
		{[]string{"--quant", "q4tp", "--calibrate", calibText, "--calib-tokens", "-1"}, "must not be negative"},
	} {
		_, err := cli(t, append([]string{"convert", trainedDir, "-o", out}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
	// --keep can bring q4tp under another default.
	if _, err := cli(t, "convert", trainedDir, "-o", out, "--quant", "q8_row", "--keep", `mlp\.down_proj=q4tp`, "--calibrate", calibText, "--calib-tokens", "256", "--calib-ctx", "128"); err != nil {
		t.Fatal(err)
	}
	m, err := cmf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if c := m.Header.Calibration; c == nil || len(c.Tensors) != 4 || c.Tokens != 256 {
		t.Fatalf("calibration section %+v, want the 4 down_proj weights over 256 tokens", c)
	}
}

// TestActivationQuantizationKL measures what the SIMD kernels' int8
// activations cost on the trained fixture stored as q8_row: the mean KL
// divergence from transformers over the eval ids with the generic kernels
// (float activations) and with each SIMD kernel set (activations rounded
// to int8 in blocks of 32, as llama.cpp does). docs/quant.md quotes these
// figures: generic 5.66e-4, avx2 1.03e-3, avx512 1.04e-3 nats.
func TestActivationQuantizationKL(t *testing.T) {
	sets := kernels.ISAs()
	if len(sets) < 2 {
		t.Skipf("this CPU runs only the %v kernels: no SIMD activation quantization to measure", sets)
	}
	ev := loadTrainedEval(t)
	p := filepath.Join(t.TempDir(), "m.cmf")
	if _, err := cli(t, "convert", trainedDir, "-o", p, "--quant", "q8_row"); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Open(p, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	T := len(ev.ref.EvalIDs)
	V := len(ev.want) / T
	kl := map[string]float64{}
	for _, set := range sets {
		prev, err := kernels.SetISA(set)
		if err != nil {
			t.Fatal(err)
		}
		s, err := e.NewSession(T)
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.Model.Forward(s.Cache(), ev.ref.EvalIDs, 0, model.AllLogits)
		kernels.SetISA(prev)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < T; i++ {
			kl[set] += klDiv(ev.want[i*V:(i+1)*V], got[i*V:(i+1)*V]) / float64(T)
		}
		t.Logf("q8_row, %s kernels: mean KL from transformers %.3g nats", set, kl[set])
	}
	// Generic: only the stored weights differ from transformers.
	if g := kl["generic"]; g < 0.8*5.66e-4 || g > 1.2*5.66e-4 {
		t.Errorf("generic kernels: KL %.3g, documented 5.66e-4", g)
	}
	for _, set := range sets[1:] {
		// int8 activations add error: more than the generic KL, and near
		// the documented figure.
		if kl[set] <= kl["generic"] || kl[set] < 0.8*1.04e-3 || kl[set] > 1.2*1.04e-3 {
			t.Errorf("%s kernels: KL %.3g (generic %.3g), documented about 1.04e-3", set, kl[set], kl["generic"])
		}
	}
}
