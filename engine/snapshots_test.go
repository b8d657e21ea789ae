package engine_test

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cortiq/cortiq/convert"
	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
)

func hybridEngine(t *testing.T, opt engine.Options) *engine.Engine {
	t.Helper()
	p := filepath.Join(t.TempDir(), "m.cmf")
	if _, err := convert.FromHF(context.Background(), "../testdata/models/qwen3_next_f32", p, convert.Options{Quant: quant.F32}); err != nil {
		t.Fatal(err)
	}
	opt.Threads = 2
	e, err := engine.Open(p, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

func relDiff(a, b []float32) float64 {
	var worst, ss float64
	for i := range b {
		worst = math.Max(worst, math.Abs(float64(a[i]-b[i])))
		ss += float64(b[i]) * float64(b[i])
	}
	return worst / math.Sqrt(ss/float64(len(b)))
}

// TestHybridSnapshotResume checks prefix reuse on a hybrid model (Gated
// DeltaNet layers, whose state cannot be truncated): a prompt that shares
// a prefix with the session resumes from the latest snapshot inside it
// and computes the logits a fresh prefill does; a regenerated prompt
// resumes and reproduces its greedy reply; a continuation of the cached
// tokens prefills only the new ones; another session with a prompt
// sharing a prefix resumes from this session's snapshots.
func TestHybridSnapshotResume(t *testing.T) {
	e := hybridEngine(t, engine.Options{SnapshotInterval: 8})
	ctx := context.Background()
	a, err := e.Encode("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a short poem about the sea.<|im_end|>\n<|im_start|>assistant\n", true)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) < 20 {
		t.Fatalf("prompt of %d tokens is too short for the test", len(a))
	}
	s, err := e.NewSession(256)
	if err != nil {
		t.Fatal(err)
	}
	greedy := engine.GenOptions{MaxTokens: 6, IgnoreEOS: true}
	first, err := s.Generate(ctx, a, greedy)
	if err != nil {
		t.Fatal(err)
	}
	// Snapshots at 8, 16, 24, … of the prompt, at its end and at the
	// reply's end.
	if n, b := e.SnapshotStats(); n < 3 || b != int64(n)*e.Model.SnapshotBytes() {
		t.Fatalf("%d snapshots of %d bytes", n, b)
	}
	fresh := func(p []int) []float32 {
		c, err := e.Model.NewCache(256)
		if err != nil {
			t.Fatal(err)
		}
		l, err := e.Model.Forward(c, p, 0, model.LastLogits)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Clone(l)
	}

	// A prompt diverging after 20 tokens resumes from the snapshot at 16.
	b := append(slices.Clone(a[:20]), 7, 8, 9, 10, 11)
	got, keep, err := s.Prefill(b)
	if err != nil {
		t.Fatal(err)
	}
	if keep != 16 {
		t.Fatalf("resumed at %d, want the snapshot at 16", keep)
	}
	if d := relDiff(got, fresh(b)); d > 1e-5 {
		t.Fatalf("resumed prefill differs from a fresh one by %.3g of the RMS", d)
	}

	// Regenerating the first prompt resumes inside it (the snapshots past
	// 20 were dropped when b overwrote those positions; 16 is left) and
	// gives the same greedy reply.
	again, err := s.Generate(ctx, a, greedy)
	if err != nil {
		t.Fatal(err)
	}
	if again.CachedTokens != 16 || !slices.Equal(again.IDs, first.IDs) {
		t.Fatalf("regenerate: reused %d tokens, ids %v vs %v", again.CachedTokens, again.IDs, first.IDs)
	}

	// Continuing the conversation: the cached tokens plus new ones
	// prefill only the new ones.
	cont := append(slices.Clone(s.Tokens()), 12, 13, 14)
	got, keep, err = s.Prefill(cont)
	if err != nil {
		t.Fatal(err)
	}
	if keep != len(cont)-3 {
		t.Fatalf("continuation reused %d of %d", keep, len(cont))
	}
	if d := relDiff(got, fresh(cont)); d > 1e-5 {
		t.Fatalf("continued prefill differs from a fresh one by %.3g of the RMS", d)
	}

	// A new session with a prompt sharing a prefix resumes from the first
	// session's snapshot inside it (K/V rows copied from its cache), and
	// the first session goes on unaffected.
	s2, _ := e.NewSession(256)
	got, keep, err = s2.Prefill(b)
	if err != nil || keep != 16 {
		t.Fatalf("new session resumed at %d (%v), want 16 from the other session's snapshot", keep, err)
	}
	if d := relDiff(got, fresh(b)); d > 1e-5 {
		t.Fatalf("prefill resumed from another session differs from a fresh one by %.3g of the RMS", d)
	}
	more := append(slices.Clone(s.Tokens()), 15, 16)
	got, _, err = s.Prefill(more)
	if err != nil {
		t.Fatal(err)
	}
	if d := relDiff(got, fresh(more)); d > 1e-5 {
		t.Fatalf("the source session after the copy differs from a fresh prefill by %.3g of the RMS", d)
	}
	// A prompt sharing no snapshot's prefix starts from 0.
	s3, _ := e.NewSession(256)
	if _, keep, err := s3.Prefill([]int{3, 1, 4, 1, 5}); err != nil || keep != 0 {
		t.Fatalf("unrelated prompt reused %d (%v)", keep, err)
	}
	s3.Close()
	s.Close()
	s2.Close()
	if n, _ := e.SnapshotStats(); n != 0 {
		t.Fatalf("%d snapshots left after closing the sessions", n)
	}
}

// TestHybridSnapshotBudget checks that the LRU keeps the snapshots within
// their byte budget, evicting the least recently used.
func TestHybridSnapshotBudget(t *testing.T) {
	probe := hybridEngine(t, engine.Options{})
	per := probe.Model.SnapshotBytes()
	if per <= 0 {
		t.Fatal("no snapshot size")
	}
	e := hybridEngine(t, engine.Options{SnapshotInterval: 4, SnapshotBudget: 2*per + per/2})
	s, _ := e.NewSession(128)
	ids := make([]int, 30)
	for i := range ids {
		ids[i] = 10 + i
	}
	if _, _, err := s.Prefill(ids); err != nil {
		t.Fatal(err)
	}
	n, b := e.SnapshotStats()
	if n != 2 || b > 2*per+per/2 {
		t.Fatalf("%d snapshots, %d bytes for a budget of %d", n, b, 2*per+per/2)
	}
	// The two kept are the most recent (28 and 30): a prompt diverging at
	// 26 finds none and starts over.
	if _, keep, err := s.Prefill(append(slices.Clone(ids[:26]), 1, 2)); err != nil || keep != 0 {
		t.Fatalf("reused %d (%v), want 0", keep, err)
	}
}

// TestHybridSnapshotConcurrent resumes a session from another session's
// snapshot while that session keeps decoding (run it with -race): the
// copied rows are below the source's length, which its decode steps never
// write, and the result equals a fresh prefill.
func TestHybridSnapshotConcurrent(t *testing.T) {
	e := hybridEngine(t, engine.Options{SnapshotInterval: 8})
	a := make([]int, 30)
	for i := range a {
		a[i] = 20 + 3*i
	}
	s1, _ := e.NewSession(256)
	if _, _, err := s1.Prefill(a); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() {
		_, err := s1.Generate(context.Background(), append(slices.Clone(a), 5), engine.GenOptions{MaxTokens: 20, IgnoreEOS: true})
		done <- err
	}()
	b := append(slices.Clone(a[:27]), 9, 9, 9)
	s2, _ := e.NewSession(256)
	got, keep, err := s2.Prefill(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if keep != 24 {
		t.Fatalf("resumed at %d, want 24", keep)
	}
	c, _ := e.Model.NewCache(256)
	want, err := e.Model.Forward(c, b, 0, model.LastLogits)
	if err != nil {
		t.Fatal(err)
	}
	if d := relDiff(got, want); d > 1e-5 {
		t.Fatalf("differs from a fresh prefill by %.3g of the RMS", d)
	}
}

// TestHybridStaleSnapshotDropped: session B holds a snapshot of prefix P;
// it then resumes from session C's snapshot of another prefix Q (copying
// C's rows over its own), so its rows no longer hold P. A third session
// with prompt P must not resume from B's old snapshot: its logits equal a
// fresh prefill. (The server's concurrent test caught this as wrong greedy
// text after prefix reuse.)
func TestHybridStaleSnapshotDropped(t *testing.T) {
	e := hybridEngine(t, engine.Options{SnapshotInterval: 8})
	ids := func(s string) []int {
		v, err := e.Encode(s, true)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	p := ids("one two three four five six seven eight nine ten eleven twelve thirteen")
	q := ids("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho")
	if len(p) < 10 || len(q) < 18 || slices.Equal(p[:8], q[:8]) {
		t.Fatalf("prompts of %d and %d tokens do not fit the test", len(p), len(q))
	}
	sess := func() *engine.Session {
		s, err := e.NewSession(256)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	b, c, a := sess(), sess(), sess()
	if _, _, err := b.Prefill(p); err != nil { // B: snapshots of P at 8, len(P)
		t.Fatal(err)
	}
	if _, _, err := c.Prefill(q); err != nil { // C: snapshots of Q at 8, 16
		t.Fatal(err)
	}
	if _, _, err := b.Prefill(append(slices.Clone(q[:16]), p...)); err != nil { // B resumes from C's Q[:16]
		t.Fatal(err)
	}
	got, _, err := a.Prefill(p)
	if err != nil {
		t.Fatal(err)
	}
	got = slices.Clone(got)
	f := sess()
	want, _, err := f.Prefill(p) // may reuse, but only valid snapshots
	if err != nil {
		t.Fatal(err)
	}
	ref, err := e.Model.NewCache(256)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := e.Model.Forward(ref, p, 0, model.LastLogits)
	if err != nil {
		t.Fatal(err)
	}
	if d := relDiff(got, fresh); d > 1e-5 {
		t.Fatalf("prompt P after B moved to Q: logits off a fresh prefill by %.3g of RMS (stale snapshot used)", d)
	}
	if d := relDiff(want, fresh); d > 1e-5 {
		t.Fatalf("second session: %.3g", d)
	}
}
