package cuda

import (
	"slices"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/synth"
)

// TestReplayMemo: a decode step the caller names (Batch.Step) replays
// without being packed again only when it is the last checked replay's
// step over the same sequences with nothing on the device changed since;
// another step id, no id, another order of the sequences, an upload, an
// eager step, a token outside the table or CheckEveryStep each take the
// full check.
func TestReplayMemo(t *testing.T) {
	f := newFake(t, 4)
	sh := netShape{dt: quant.Q4TP, H: 64, I: 96, nq: 4, nkv: 2, hd: 16, V: 72}
	spec := backend.SeqSpec{Layers: 1, Attention: []int{0}, KVHeads: 2, HeadDim: 16}
	d := fakeDevice(t, f, Options{Seqs: 4, Ctx: 64, MaxRows: 16, Graphs: true}, spec)
	a, b := f.net(t, sh), f.net(t, sh)
	s := []*seq{{d: d, slot: 0, ctx: 64}, {d: d, slot: 1, ctx: 64}}
	f.stepID = 1
	if err := f.step(t, d, s, [][]int{toks(4, 1), toks(6, 2)}, backend.LastLogits, a, sh.V); err != nil {
		t.Fatal(err)
	}
	dec := func(n *testNet, id uint64, seqs []*seq) {
		t.Helper()
		f.stepID = id
		if err := f.step(t, d, seqs, [][]int{{3}, {5}}, backend.LastLogits, n, sh.V); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(what string, replays, unchecked int) {
		t.Helper()
		if f.replays != replays || d.Unchecked() != unchecked {
			t.Fatalf("%s: %d replays (%d unchecked), want %d (%d)", what, f.replays, d.Unchecked(), replays, unchecked)
		}
	}
	dec(a, 1, s) // eager, then captured
	dec(a, 1, s) // checked, replayed
	expect("first replay", 1, 0)
	dec(a, 1, s)
	dec(a, 1, s)
	expect("the same step again", 3, 2)
	f.stepID = 1
	if err := f.step(t, d, s, [][]int{{3}, {sh.V}}, backend.LastLogits, a, sh.V); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Fatalf("a token outside the table after unchecked replays: %v", err)
	}
	dec(a, 1, s)
	expect("after the refused token", 4, 3)
	dec(b, 2, s) // another network: eager and recaptured
	expect("another step id", 4, 3)
	dec(b, 2, s) // checked
	dec(b, 2, s)
	expect("the other step", 6, 4)
	dec(b, 0, s) // no id: checked
	expect("no step id", 7, 4)
	dec(b, 2, s) // checked again (the memo was the id-less step's: none)
	dec(b, 2, []*seq{s[1], s[0]})
	expect("another order of the sequences", 9, 4)
	if _, err := d.LoadVec(make([]float32, 8)); err != nil {
		t.Fatal(err)
	}
	dec(b, 2, []*seq{s[1], s[0]})
	expect("after an upload", 10, 4)
	dec(b, 2, []*seq{s[1], s[0]})
	expect("after the upload's check", 11, 5)
	// A step that grows the logits buffer runs eagerly: the memo is gone.
	f.stepID = 2
	if err := f.step(t, d, s, [][]int{toks(6, 3), toks(7, 4)}, backend.AllLogits, b, sh.V); err != nil {
		t.Fatal(err)
	}
	dec(b, 2, s) // eager (the graph's logits moved) and recaptured
	dec(b, 2, s) // checked
	expect("after an eager step", 12, 5)
	d.opt.CheckEveryStep = true
	dec(b, 2, s)
	expect("CheckEveryStep", 13, 5)
}

// TestReplayMemoTwoModels: two models of one architecture (other
// weights) decoding by turns on one device give the logits each gives
// alone with every step checked: a replay is never skipped into the other
// model's graph.
func TestReplayMemoTwoModels(t *testing.T) {
	paths := make([]string, 2)
	for i := range paths {
		a, err := synth.Arch("tiny_qwen3_moe", "")
		if err != nil {
			t.Fatal(err)
		}
		paths[i] = synthFile(t, a, quant.Q8Row, uint64(i+1))
	}
	type run struct {
		m *model.Model
		c *model.Cache
	}
	open := func(d *Device, path string) run {
		m, c := loadOnFake(t, d, path, 64)
		return run{m, c}
	}
	device := func(every bool) *Device {
		f := newFake(t, 2)
		f.numeric, f.decoded = true, map[string][]float32{}
		return fakeOpen(f, Options{Seqs: 2, Ctx: 64, MaxRows: 16, Graphs: true, CheckEveryStep: every})
	}
	decode := func(rs []run, turns [][2]int) [][]float32 {
		var out [][]float32
		for _, r := range rs {
			if _, err := r.m.Forward(r.c, []int{1, 2, 3}, 0, model.LastLogits); err != nil {
				t.Fatal(err)
			}
		}
		for k, tn := range turns {
			for j := 0; j < tn[1]; j++ {
				r := rs[tn[0]]
				l, err := r.m.Forward(r.c, []int{(k*13 + j*7 + 4) % 200}, r.c.Len(), model.LastLogits)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, slices.Clone(l))
			}
		}
		return out
	}
	turns := [][2]int{{0, 4}, {1, 4}, {0, 3}, {1, 1}, {0, 1}, {1, 3}}
	shared := device(false)
	got := decode([]run{open(shared, paths[0]), open(shared, paths[1])}, turns)
	every := device(true)
	want := decode([]run{open(every, paths[0]), open(every, paths[1])}, turns)
	if shared.Unchecked() == 0 || every.Unchecked() != 0 {
		t.Fatalf("unchecked replays: %d with the memo, %d with CheckEveryStep", shared.Unchecked(), every.Unchecked())
	}
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("decode step %d: the logits differ from the checked run's", i)
		}
	}
	t.Logf("%d decode steps, %d replayed unchecked", len(want), shared.Unchecked())
}
