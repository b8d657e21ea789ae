package gguf

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var updateSeeds = flag.Bool("update-seeds", false, "rewrite the fuzz seed corpus in testdata/fuzz")

// FuzzOpen parses arbitrary bytes as a GGUF file. It must never panic;
// whatever parses must give consistent views, dequantize at the declared
// sizes, and survive a write/parse round trip unchanged.
func FuzzOpen(f *testing.F) {
	for _, s := range seedFiles(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			return
		}
		for _, kv := range file.KVs() {
			v := kv.Value
			v.String()
			v.Uint()
			v.Int()
			v.Float()
			v.Bool()
			v.Strings()
			v.Float32s()
			v.Int32s()
			v.Uint32s()
			v.Array()
			v.Any()
			if v.Type() != ValueArray && v.Len() != 0 {
				t.Fatalf("%q: scalar with length %d", kv.Key, v.Len())
			}
		}
		for _, ti := range file.Tensors() {
			raw := file.Raw(ti.Name)
			if int64(len(raw)) != ti.Size {
				t.Fatalf("%q: Raw %d bytes, Size %d", ti.Name, len(raw), ti.Size)
			}
			if ti.FileOffset%int64(file.Alignment()) != 0 {
				t.Fatalf("%q: misaligned at %d", ti.Name, ti.FileOffset)
			}
			if ti.Type.CanDequantize() && ti.Elements() <= 1<<16 {
				v, err := file.Float32(ti.Name)
				if err != nil || int64(len(v)) != ti.Elements() {
					t.Fatalf("%q: Float32: %d values, %v", ti.Name, len(v), err)
				}
			}
		}
		// write(parse(x)) is a fixed point of write∘parse.
		once := rewrite(t, file)
		again, err := Parse(once)
		if err != nil {
			t.Fatalf("re-parse: %v", err)
		}
		if twice := rewrite(t, again); !bytes.Equal(once, twice) {
			t.Fatal("write∘parse is not stable")
		}
	})
}

func rewrite(t *testing.T, f *File) []byte {
	t.Helper()
	w := NewWriter()
	w.Version = f.Version()
	for _, kv := range f.KVs() {
		if err := w.AddKV(kv.Key, kv.Value); err != nil {
			t.Fatalf("AddKV(%q): %v", kv.Key, err)
		}
	}
	for _, ti := range f.Tensors() {
		if err := w.AddRaw(ti.Name, ti.Type, ti.Shape(), f.Raw(ti.Name)); err != nil {
			t.Fatalf("AddRaw(%q): %v", ti.Name, err)
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// seedFiles returns small valid files covering the format's features.
func seedFiles(tb testing.TB) [][]byte {
	r := rand.New(rand.NewPCG(5, 5))
	enc := func(version uint32, kvs []KV, ts []tensorCase) []byte {
		w := NewWriter()
		w.Version = version
		for _, kv := range kvs {
			if err := w.AddKV(kv.Key, kv.Value); err != nil {
				tb.Fatal(err)
			}
		}
		for _, tc := range ts {
			if err := w.AddTensor(tc.name, tc.typ, tc.shape, tc.vals); err != nil {
				tb.Fatal(err)
			}
		}
		var b bytes.Buffer
		if _, err := w.WriteTo(&b); err != nil {
			tb.Fatal(err)
		}
		return b.Bytes()
	}
	nested, err := Array(ValueArray, Int32s([]int32{1, 2}), Strings([]string{"a"}))
	if err != nil {
		tb.Fatal(err)
	}
	return [][]byte{
		enc(3, nil, nil),
		enc(3, []KV{
			{"general.architecture", String("llama")},
			{"llama.block_count", Uint32(2)},
			{"llama.rope.freq_base", Float32(10000)},
			{"tokenizer.ggml.tokens", Strings([]string{"<s>", "a", "b"})},
			{"tokenizer.ggml.scores", Float32s([]float32{0, -1, -2})},
			{"tokenizer.ggml.token_type", Int32s([]int32{3, 1, 1})},
			{"x.flag", Bool(true)},
			{"x.i64", Int64(-5)},
			{"x.f64", Float64(0.5)},
			{"x.u8", Uint8s([]uint8{1, 2})},
			{"x.nested", nested},
		}, []tensorCase{
			{"token_embd.weight", TypeQ8_0, []int{2, 32}, randFloats(r, 64)},
			{"output_norm.weight", TypeF32, []int{4}, randFloats(r, 4)},
			{"blk.0.attn_q.weight", TypeQ4_0, []int{1, 32}, randFloats(r, 32)},
			{"f16", TypeF16, []int{3}, randFloats(r, 3)},
		}),
		enc(2, []KV{{KeyAlignment, Uint32(64)}, {"u16", Uint16(7)}, {"i8", Int8(-1)}}, []tensorCase{
			{"k4", TypeQ4_K, []int{256}, randFloats(r, 256)},
			{"bf", TypeBF16, []int{2, 1}, randFloats(r, 2)},
		}),
		enc(3, nil, []tensorCase{
			{"k6", TypeQ6_K, []int{256}, randFloats(r, 256)},
			{"k5", TypeQ5_K, []int{256}, randFloats(r, 256)},
			{"s", TypeF32, []int{}, []float32{1}},
		}),
	}
}

// TestWriteSeeds regenerates testdata/fuzz/FuzzOpen with -update-seeds.
func TestWriteSeeds(t *testing.T) {
	if !*updateSeeds {
		t.Skip("run with -update-seeds to rewrite the seed corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzOpen")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, s := range seedFiles(t) {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(s)))
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed%d", i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFuzzSeedsValid checks that the committed seeds are valid files.
func TestFuzzSeedsValid(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzOpen")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) < 3 {
		t.Fatalf("only %d seeds", len(ents))
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.SplitN(strings.TrimSpace(string(b)), "\n", 2)
		if len(lines) != 2 || lines[0] != "go test fuzz v1" {
			t.Fatalf("%s: not a corpus file", e.Name())
		}
		s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
		if err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		if _, err := Parse([]byte(s)); err != nil {
			t.Errorf("seed %s: %v", e.Name(), err)
		}
	}
}
