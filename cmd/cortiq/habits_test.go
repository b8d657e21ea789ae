package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/sample"
	"github.com/cortiq/cortiq/units"
)

// cliIO runs the command line in-process with stdin and returns stdout
// and stderr apart.
func cliIO(t *testing.T, stdin io.Reader, args ...string) (string, string, error) {
	t.Helper()
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	root.SetIn(stdin)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// runJSON is `run --json`'s output.
type runJSON struct {
	IDs    []int  `json:"ids"`
	Text   string `json:"text"`
	Reason string `json:"finish_reason"`
	Seed   uint64 `json:"seed"`
}

func runOnce(t *testing.T, args ...string) runJSON {
	t.Helper()
	out, errOut, err := cliIO(t, nil, append([]string{"run", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("run %v: %v\n%s", args, err, errOut)
	}
	var r runJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("run --json output %q: %v", out, err)
	}
	return r
}

// TestThreadsClamped: --threads beyond the machine's CPUs is used as the
// CPU count, with exactly one warning line (run, convert and bench).
func TestThreadsClamped(t *testing.T) {
	p := convertFixture(t, "qwen3_f32", "f32")
	defer func(f func() int) { numCPU = f }(numCPU)
	numCPU = func() int { return 2 }
	want := "cortiq: warning: --threads 100000 is more than this machine's 2 CPUs; using 2\n"
	_, errOut, err := cliIO(t, nil, "run", p, "--ids", "1,2,3", "-n", "2", "--threads", "100000", "--json")
	if err != nil {
		t.Fatal(err)
	}
	if errOut != want {
		t.Fatalf("stderr %q, want the one line %q", errOut, want)
	}
	out := filepath.Join(t.TempDir(), "m.cmf")
	_, errOut, err = cliIO(t, nil, "convert", filepath.Join("..", "..", "testdata", "models", "qwen3_f32"), "-o", out, "--quant", "f32", "--threads", "100000")
	if err != nil || errOut != want {
		t.Fatalf("convert: %v, stderr %q", err, errOut)
	}
	// Within the machine: no warning.
	_, errOut, err = cliIO(t, nil, "run", p, "--ids", "1,2,3", "-n", "2", "--threads", "2", "--json")
	if err != nil || errOut != "" {
		t.Fatalf("--threads 2: %v, stderr %q", err, errOut)
	}
}

// TestContextRefusedBeforeAllocating: a --ctx whose KV cache and buffers
// exceed the available memory is refused, naming the limit, before the
// cache is allocated.
func TestContextRefusedBeforeAllocating(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tiny.cmf")
	if _, err := cli(t, "synth", "--shape", "tiny_llama", "--quant", "f32", "-o", p); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Open(p, engine.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	need := e.Model.SessionBytes(131072) // tiny_llama's trained context
	fit := e.Model.SessionBytes(1000)
	e.Close()
	defer func(f func() (int64, bool)) { memAvailable = f }(memAvailable)
	memAvailable = func() (int64, bool) { return fit, true }
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err = cliIO(t, nil, "run", p, "--ids", "1,2,3", "-n", "2", "--ctx", "131072", "--threads", "2")
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a context beyond the memory available was accepted")
	}
	for _, w := range []string{"131072 tokens", units.Bytes(need), units.Bytes(fit), "at most 1000 tokens fit", "--ctx"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
	if got := int64(after.TotalAlloc - before.TotalAlloc); got > need/2 {
		t.Errorf("%d bytes allocated before refusing (the session needs %d)", got, need)
	}
	// The same in chat and perplexity (whose logits of every position
	// count too).
	for _, args := range [][]string{
		{"chat", p, "--ctx", "131072"},
		{"perplexity", p, "--text", filepath.Join("..", "..", "testdata", "text", "brown_eval.txt"), "--ctx", "131072"},
	} {
		if _, _, err := cliIO(t, nil, args...); err == nil || !regexp.MustCompile(`at most \d+ tokens fit`).MatchString(err.Error()) {
			t.Errorf("%v: %v", args, err)
		}
	}
	// A larger prefill batch needs more: refused at the same context.
	if _, _, err := cliIO(t, nil, "run", p, "--ids", "1,2,3", "-n", "2", "--ctx", "1000", "--batch", "1000", "--threads", "2"); err == nil || !strings.Contains(err.Error(), "--batch") {
		t.Errorf("--ctx 1000 --batch 1000: %v", err)
	}
	// bench checks its context (-p prompt tokens) too.
	if _, _, err := cliIO(t, nil, "bench", p, "-p", "131072", "-n", "0", "--no-probe", "--threads", "2"); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("bench -p 131072: %v", err)
	}
	// The limit itself fits.
	if _, _, err := cliIO(t, nil, "run", p, "--ids", "1,2,3", "-n", "2", "--ctx", "1000", "--threads", "2"); err != nil {
		t.Fatalf("--ctx 1000: %v", err)
	}
	if got, ok := parseMemAvailable([]byte("MemTotal:       32768000 kB\nMemFree:  100 kB\nMemAvailable:   16384000 kB\n")); !ok || got != 16384000*1024 {
		t.Fatalf("parseMemAvailable = %d, %v", got, ok)
	}
	if _, ok := parseMemAvailable([]byte("MemTotal: 5 kB\n")); ok {
		t.Fatal("parseMemAvailable without the line succeeded")
	}
}

// TestMaxTokensBeyondContext: an explicit -n that the context cannot hold
// after the prompt is an error naming the room left (run and chat); the
// largest -n that fits is accepted.
func TestMaxTokensBeyondContext(t *testing.T) {
	p := convertFixture(t, "qwen3_f32", "f32")
	_, _, err := cliIO(t, nil, "run", p, "--ids", "1,2,3,4", "--ctx", "32", "-n", "30", "--ignore-eos", "--temperature", "0")
	if err == nil || !strings.Contains(err.Error(), "-n 30 does not fit: the 32-token context leaves room for 29 tokens after the 4-token prompt") {
		t.Fatalf("run -n 30 in 32: %v", err)
	}
	r := runOnce(t, p, "--ids", "1,2,3,4", "--ctx", "32", "-n", "29", "--ignore-eos", "--temperature", "0")
	if len(r.IDs) != 29 || r.Reason != "length" {
		t.Fatalf("run -n 29 in 32: %d ids, %s", len(r.IDs), r.Reason)
	}
	_, _, err = cliIO(t, strings.NewReader("hi\n"), "chat", p, "--ctx", "32", "-n", "32")
	if err == nil || !strings.Contains(err.Error(), "-n 32 does not fit") {
		t.Fatalf("chat -n 32 in 32: %v", err)
	}
}

// TestModelFlag: -m/--model works wherever a model is taken, with the
// same result as the positional form.
func TestModelFlag(t *testing.T) {
	p := convertFixture(t, "qwen3_f32", "f32")
	txt := filepath.Join(t.TempDir(), "t.txt")
	writeFile(t, txt, strings.Repeat("The quick brown fox jumps over the lazy dog. ", 8))
	for _, args := range [][]string{
		{"run", "Hello!", "-n", "4", "--seed", "7", "--json"},
		{"logits", "--ids", "1,2,3"},
		{"inspect"},
		{"verify"},
		{"perplexity", "--text", txt, "--ctx", "16"},
	} {
		pos, _, err1 := cliIO(t, nil, append([]string{args[0], p}, args[1:]...)...)
		flagged, _, err2 := cliIO(t, nil, append([]string{args[0], "-m", p}, args[1:]...)...)
		long, _, err3 := cliIO(t, nil, append([]string{args[0], "--model", p}, args[1:]...)...)
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("%s: %v / %v / %v", args[0], err1, err2, err3)
		}
		if pos != flagged || pos != long {
			t.Errorf("%s: -m output differs:\n%s\n%s", args[0], pos, flagged)
		}
	}
	for _, args := range [][]string{{"tokenize", "--json"}, {"chat", "-n", "2", "--temperature", "0"}} {
		a, _, err1 := cliIO(t, strings.NewReader("Hello world\n"), append([]string{args[0], p}, args[1:]...)...)
		b, _, err2 := cliIO(t, strings.NewReader("Hello world\n"), append([]string{args[0], "-m", p}, args[1:]...)...)
		if err1 != nil || err2 != nil || a != b || a == "" {
			t.Errorf("%s: %v %v\n%q\n%q", args[0], err1, err2, a, b)
		}
	}
	// bench takes several models: -m adds one before the arguments.
	if out, _, err := cliIO(t, nil, "bench", "-m", p, p, "-p", "8", "-n", "2", "-r", "1", "--no-probe", "--threads", "1"); err != nil || strings.Count(out, "| "+p+" |") != 4 {
		t.Errorf("bench -m: %v\n%s", err, out)
	}
	if _, _, err := cliIO(t, nil, "inspect"); err == nil || !strings.Contains(err.Error(), "-m/--model") {
		t.Errorf("inspect without a model: %v", err)
	}
	if _, _, err := cliIO(t, nil, "run", "-m", p, "a", "b"); err == nil {
		t.Error("run -m with two prompts accepted")
	}
}

// TestPromptFromStdin: "-" or no prompt with a non-terminal standard
// input reads the prompt from it.
func TestPromptFromStdin(t *testing.T) {
	p := convertFixture(t, "qwen3_f32", "f32")
	want := runOnce(t, p, "Hello there!", "-n", "6", "--temperature", "0", "--ignore-eos")
	for _, args := range [][]string{{"run", "--json", p, "-"}, {"run", "--json", p}} {
		out, _, err := cliIO(t, strings.NewReader("Hello there!\n"), append(args, "-n", "6", "--temperature", "0", "--ignore-eos")...)
		if err != nil {
			t.Fatal(err)
		}
		var r runJSON
		json.Unmarshal([]byte(out), &r)
		if !slices.Equal(r.IDs, want.IDs) {
			t.Errorf("%v: ids %v, with the prompt as an argument %v", args, r.IDs, want.IDs)
		}
	}
	if _, _, err := cliIO(t, strings.NewReader(""), "run", p, "-"); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty standard input: %v", err)
	}
	if _, _, err := cliIO(t, strings.NewReader(""), "run", p); err == nil || !strings.Contains(err.Error(), "give a PROMPT") {
		t.Errorf("no prompt at all: %v", err)
	}
}

// TestSeed: without --seed two runs at temperature 0.8 differ; with the
// same --seed, or the seed a run reported, they agree; --verbose prints
// the seed.
func TestSeed(t *testing.T) {
	p := convertFixture(t, "qwen3_f32", "f32")
	args := []string{p, "--ids", "1,2,3", "-n", "24", "--ignore-eos", "--temperature", "0.8"}
	a, b := runOnce(t, args...), runOnce(t, args...)
	if a.Seed == b.Seed || slices.Equal(a.IDs, b.IDs) {
		t.Fatalf("two seedless runs agree: seeds %d %d, ids %v", a.Seed, b.Seed, a.IDs)
	}
	c, d := runOnce(t, append(args, "--seed", "42")...), runOnce(t, append(args, "--seed", "42")...)
	if c.Seed != 42 || !slices.Equal(c.IDs, d.IDs) || c.Text != d.Text {
		t.Fatalf("--seed 42 twice: %v / %v", c.IDs, d.IDs)
	}
	again := runOnce(t, append(args, "--seed", fmt.Sprint(a.Seed))...)
	if !slices.Equal(again.IDs, a.IDs) {
		t.Fatalf("the reported seed %d does not reproduce the run", a.Seed)
	}
	_, errOut, err := cliIO(t, nil, append([]string{"run", "--json", "--verbose"}, args...)...)
	if err != nil || !regexp.MustCompile(`msg=sampling seed=\d+ `).MatchString(errOut) {
		t.Fatalf("--verbose does not print the seed: %v\n%s", err, errOut)
	}
}

// TestSamplingDefaultsShared: run and chat start from sample.Defaults.
func TestSamplingDefaultsShared(t *testing.T) {
	d := sample.Defaults()
	want := map[string]string{
		"temperature": fmt.Sprint(d.Temperature), "top-k": fmt.Sprint(d.TopK), "top-p": fmt.Sprint(d.TopP),
		"min-p": fmt.Sprint(d.MinP), "repeat-penalty": fmt.Sprint(d.RepeatPenalty), "repeat-last-n": fmt.Sprint(d.RepeatLastN),
		"presence-penalty": "0", "frequency-penalty": "0", "seed": "-1",
	}
	for _, c := range []func() *cobra.Command{newRun, newChat} {
		cmd := c()
		for name, v := range want {
			f := cmd.Flags().Lookup(name)
			if f == nil || f.DefValue != v {
				t.Errorf("%s --%s: default %v, want %s", cmd.Name(), name, f, v)
			}
		}
	}
}

// TestConvertFallbackWarning: q4tp asked for shapes it cannot hold stores
// q8_row with one warning line giving the count and the reason, and the
// summary is a table.
func TestConvertFallbackWarning(t *testing.T) {
	out := filepath.Join(t.TempDir(), "m.cmf")
	stdout, errOut, err := cliIO(t, nil, "convert", filepath.Join("..", "..", "testdata", "models", "qwen2_f32"), "-o", out, "--quant", "q4tp")
	if err != nil {
		t.Fatal(err)
	}
	want := "cortiq: warning: 14 tensors stored as q8_row instead of q4tp: q4tp needs a matrix with a multiple of 32 columns (model.layers.0.self_attn.q_proj.weight [48 48] and 13 more)\n"
	if errOut != want {
		t.Fatalf("stderr %q, want %q", errOut, want)
	}
	if strings.Contains(stdout, "map[") {
		t.Fatalf("summary prints a Go map:\n%s", stdout)
	}
	if !regexp.MustCompile(`(?m)^  format +tensors +bytes\n  q8_row +15 +[0-9.]+ kB\n  f32 +11 +[0-9.]+ kB$`).MatchString(stdout) {
		t.Fatalf("summary table:\n%s", stdout)
	}
	// A fixture q4tp can hold (llama_bf16_tied: hidden 64, ffn 96): no
	// warning, and q4tp is stored.
	stdout, errOut, err = cliIO(t, nil, "convert", filepath.Join("..", "..", "testdata", "models", "llama_bf16_tied"), "-o", out+"2", "--quant", "q4tp")
	if err != nil || errOut != "" || !regexp.MustCompile(`(?m)^  q4tp +14 `).MatchString(stdout) {
		t.Fatalf("llama_bf16_tied as q4tp: %v, stderr %q\n%s", err, errOut, stdout)
	}
}

// TestPerplexityNoCarriageReturn: perplexity into a log (not a terminal)
// writes no '\r'.
func TestPerplexityNoCarriageReturn(t *testing.T) {
	p := convertFixture(t, "qwen3_f32", "f32")
	txt := filepath.Join(t.TempDir(), "t.txt")
	writeFile(t, txt, strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20))
	out, errOut, err := cliIO(t, nil, "perplexity", p, "--text", txt, "--ctx", "16")
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsRune(out+errOut, '\r') {
		t.Fatalf("carriage return in the output: %q %q", out, errOut)
	}
}

// TestSynthSizes: synth prints parameters and bytes in units that show
// a tiny model's size (it printed "0.000 B params").
func TestSynthSizes(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tiny.cmf")
	out, err := cli(t, "synth", "--shape", "tiny_llama", "--quant", "q8_row", "-o", p)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`tiny_llama q8_row, ([0-9.]+ K) params, ([0-9.]+ kB) in `).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("synth output %q", out)
	}
	e, err := engine.Open(p, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	r := inspectReport(e.File)
	if want := units.Count(r.Params); m[1] != want {
		t.Errorf("params %q, file holds %s", m[1], want)
	}
}

// TestLogitsSummary: logits without --json prints the top 5 per position,
// agreeing with the full --json output.
func TestLogitsSummary(t *testing.T) {
	p := convertFixture(t, "qwen3_f32", "f32")
	out, _, err := cliIO(t, nil, "logits", p, "--ids", "1,2,3,4")
	if err != nil {
		t.Fatal(err)
	}
	js, _, err := cliIO(t, nil, "logits", p, "--ids", "1,2,3,4", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var lg struct{ Logits [][]float32 }
	if err := json.Unmarshal([]byte(js), &lg); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 1+4 {
		t.Fatalf("%d lines:\n%s", len(lines), out)
	}
	for pos, l := range lines[1:] {
		f := strings.Split(l, " | ")
		if len(f) != 5 {
			t.Fatalf("position %d: %d tokens shown: %q", pos, len(f), l)
		}
		best := argmax(lg.Logits[pos])
		if !strings.Contains(f[0], fmt.Sprintf("  %d %q (%.3f, ", best, mustDecode(t, p, best), lg.Logits[pos][best])) {
			t.Errorf("position %d: first shown %q, argmax is %d (%.3f)", pos, f[0], best, lg.Logits[pos][best])
		}
	}
}

func mustDecode(t *testing.T, p string, id int) string {
	e, err := engine.Open(p, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	return e.Tok.Decode([]int{id})
}

// TestInspectJSONSnakeCase: every key of inspect --json is snake_case.
func TestInspectJSONSnakeCase(t *testing.T) {
	p := convertFixture(t, "qwen3_f32", "q8_row")
	out, _, err := cliIO(t, nil, "inspect", "--json", p)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatal(err)
	}
	snake := regexp.MustCompile(`^[a-z0-9]+(_[a-z0-9]+)*$`)
	var keys []string
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				keys = append(keys, k)
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(v)
	if len(keys) < 50 {
		t.Fatalf("only %d keys", len(keys))
	}
	for _, k := range keys {
		if !snake.MatchString(k) {
			t.Errorf("key %q is not snake_case", k)
		}
	}
}
