package engine_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/convert"
	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/quant"
)

func fixture(t *testing.T) *engine.Engine {
	t.Helper()
	p := filepath.Join(t.TempDir(), "m.cmf")
	if _, err := convert.FromHF(context.Background(), "../testdata/models/qwen3_f32", p, convert.Options{Quant: quant.F32}); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Open(p, engine.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

func TestGenerateStops(t *testing.T) {
	e := fixture(t)
	ctx := context.Background()
	prompt, err := e.Encode("<|im_start|>user\nTell me a story<|im_end|>\n<|im_start|>assistant\n", true)
	if err != nil {
		t.Fatal(err)
	}
	s, err := e.NewSession(256)
	if err != nil {
		t.Fatal(err)
	}
	var streamed strings.Builder
	ref, err := s.Generate(ctx, prompt, engine.GenOptions{MaxTokens: 12, IgnoreEOS: true, OnText: func(x string) error { streamed.WriteString(x); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if ref.Reason != "length" || len(ref.IDs) != 12 || streamed.String() != ref.Text {
		t.Fatalf("reason %s, %d ids, streamed %q vs text %q", ref.Reason, len(ref.IDs), streamed.String(), ref.Text)
	}
	if want := e.Tok.Decode(ref.IDs); ref.Text != want {
		t.Fatalf("text %q, decode of ids %q", ref.Text, want)
	}
	// The same prompt again reuses all but its last token from the cache
	// and, greedy, produces the same tokens.
	again, err := s.Generate(ctx, prompt, engine.GenOptions{MaxTokens: 12, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if again.CachedTokens != len(prompt)-1 || again.Text != ref.Text {
		t.Fatalf("reuse: cached %d of %d, text %q vs %q", again.CachedTokens, len(prompt), again.Text, ref.Text)
	}
	// A stop string cuts the text before it and is never emitted.
	if runes := []rune(ref.Text); len(runes) >= 6 {
		stop := string(runes[3:5])
		cut := strings.Index(ref.Text, stop)
		st, err := s.Generate(ctx, prompt, engine.GenOptions{MaxTokens: 12, IgnoreEOS: true, Stop: []string{stop}})
		if err != nil {
			t.Fatal(err)
		}
		if st.Reason != "stop" || st.Text != ref.Text[:cut] {
			t.Fatalf("stop %q: reason %s text %q, want %q", stop, st.Reason, st.Text, ref.Text[:cut])
		}
	} else {
		t.Errorf("greedy text %q too short for the stop-string check", ref.Text)
	}
	// An end-of-sequence token ends generation; its text is not emitted.
	saved := e.EOS
	e.EOS = []int32{int32(ref.IDs[3])}
	eos, err := s.Generate(ctx, prompt, engine.GenOptions{MaxTokens: 12})
	e.EOS = saved
	if err != nil {
		t.Fatal(err)
	}
	first := 0
	for first < 3 && ref.IDs[first] != ref.IDs[3] {
		first++
	}
	if eos.Reason != "eos" || len(eos.IDs) != first+1 || eos.Text != e.Tok.Decode(ref.IDs[:first]) {
		t.Fatalf("eos %d: reason %s ids %v text %q", ref.IDs[3], eos.Reason, eos.IDs, eos.Text)
	}
	// A full context ends generation with reason "context", not an error.
	small, _ := e.NewSession(len(prompt) + 3)
	full, err := small.Generate(ctx, prompt, engine.GenOptions{IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if full.Reason != "context" || len(full.IDs) != 4 {
		t.Fatalf("context end: reason %s after %d tokens", full.Reason, len(full.IDs))
	}
	// A cancelled context stops with its error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Generate(cctx, prompt, engine.GenOptions{MaxTokens: 5}); err == nil {
		t.Fatal("cancelled generation succeeded")
	}
}

// TestShardedModelRuns converts a fixture into several shard files and
// checks that the model opened from any of them computes the same logits.
func TestShardedModelRuns(t *testing.T) {
	dir := t.TempDir()
	one := filepath.Join(dir, "one.cmf")
	if _, err := convert.FromHF(context.Background(), "../testdata/models/qwen3_f32", one, convert.Options{Quant: quant.F32}); err != nil {
		t.Fatal(err)
	}
	res, err := convert.FromHF(context.Background(), "../testdata/models/qwen3_f32", filepath.Join(dir, "sh.cmf"), convert.Options{Quant: quant.F32, ShardBytes: 60_000})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Files) < 3 {
		t.Fatalf("%d shard files", len(res.Files))
	}
	ids := []int{5, 17, 300, 42, 9}
	logits := func(p string) []float32 {
		e, err := engine.Open(p, engine.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		s, _ := e.NewSession(16)
		l, _, err := s.Prefill(ids)
		if err != nil {
			t.Fatal(err)
		}
		return append([]float32(nil), l...)
	}
	want := logits(one)
	for _, f := range []string{res.Files[0], res.Files[len(res.Files)-1]} {
		got := logits(f)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s: logit %d = %v, unsharded %v", filepath.Base(f), i, got[i], want[i])
			}
		}
	}
}
