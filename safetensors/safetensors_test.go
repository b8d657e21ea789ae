package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/half"
)

func randFloats(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

func writeFile(t *testing.T, path string, tensors []WriteTensor, meta map[string]string) {
	t.Helper()
	if err := Write(path, tensors, meta); err != nil {
		t.Fatal(err)
	}
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	a := randFloats(r, 6*7)
	b := randFloats(r, 33)
	c := randFloats(r, 4*5)
	ints := make([]byte, 3*8)
	for i := range 3 {
		binary.LittleEndian.PutUint64(ints[8*i:], uint64(i*i))
	}
	path := filepath.Join(t.TempDir(), "m.safetensors")
	tensors := []WriteTensor{
		{Name: "z.f32", DType: F32, Shape: []int{6, 7}, Data: F32Bytes(a)},
		{Name: "a.f16", DType: F16, Shape: []int{33}, Data: F16Bytes(b)},
		{Name: "m.bf16", DType: BF16, Shape: []int{4, 1, 5}, Data: BF16Bytes(c)},
		{Name: "ids", DType: I64, Shape: []int{3}, Data: ints},
		{Name: "scalar", DType: F32, Shape: []int{}, Data: F32Bytes([]float32{2.5})},
		{Name: "empty", DType: F32, Shape: []int{0, 4}, Data: nil},
	}
	meta := map[string]string{"format": "pt", "quote\"d": "ü"}
	writeFile(t, path, tensors, meta)

	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	if got, want := f.Tensors(), []string{"a.f16", "empty", "ids", "m.bf16", "scalar", "z.f32"}; !slices.Equal(got, want) {
		t.Fatalf("Tensors() = %v, want %v", got, want)
	}
	if got := f.Metadata(); len(got) != 2 || got["format"] != "pt" || got["quote\"d"] != "ü" {
		t.Fatalf("Metadata() = %v", got)
	}
	for _, wt := range tensors {
		in, ok := f.Tensor(wt.Name)
		if !ok {
			t.Fatalf("Tensor(%q) missing", wt.Name)
		}
		if in.DType != wt.DType || !slices.Equal(in.Shape, wt.Shape) || in.Size != int64(len(wt.Data)) || in.Path != path {
			t.Fatalf("Tensor(%q) = %+v", wt.Name, in)
		}
		if got := f.Raw(wt.Name); !bytes.Equal(got, wt.Data) {
			t.Fatalf("Raw(%q) = %v, want %v", wt.Name, got, wt.Data)
		}
	}

	check := func(name string, want []float32, round func(float32) float32) {
		t.Helper()
		got, err := f.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
		}
		for i := range want {
			if got[i] != round(want[i]) {
				t.Fatalf("%s[%d] = %v, want %v", name, i, got[i], round(want[i]))
			}
		}
		dst := make([]float32, len(want))
		if err := f.ReadFloat32Into(name, dst); err != nil || !slices.Equal(dst, got) {
			t.Fatalf("ReadFloat32Into(%s): %v", name, err)
		}
	}
	id := func(x float32) float32 { return x }
	check("z.f32", a, id)
	check("a.f16", b, half.RoundF16)
	check("m.bf16", c, half.RoundBF16)
	check("scalar", []float32{2.5}, id)
	check("empty", nil, id)

	// Release drops pages, but the tensor reads back the same.
	f.Release("z.f32")
	check("z.f32", a, id)

	if err := f.ReadFloat32Into("z.f32", make([]float32, 5)); err == nil || !strings.Contains(err.Error(), "42 elements") {
		t.Fatalf("short destination: %v", err)
	}
	_, err = f.Float32("ids")
	if !errors.Is(err, ErrUnsupportedDType) || !strings.Contains(err.Error(), `"ids"`) || !strings.Contains(err.Error(), "I64") {
		t.Fatalf("decoding I64: %v", err)
	}
	if _, err := f.Float32("nope"); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("missing tensor: %v", err)
	}
	if f.Raw("nope") != nil {
		t.Fatal("Raw of a missing tensor is not nil")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if f.Raw("z.f32") != nil {
		t.Fatal("Raw after Close is not nil")
	}
	if _, err := f.Float32("z.f32"); err == nil {
		t.Fatal("Float32 after Close succeeded")
	}
	if err := f.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
}

// TestHeaderLayout pins the writer's output for a tiny file byte by byte.
func TestHeaderLayout(t *testing.T) {
	var buf bytes.Buffer
	err := Encode(&buf, []WriteTensor{{Name: "w", DType: F16, Shape: []int{2}, Data: []byte{0, 0x3c, 0, 0xc0}}}, map[string]string{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	hdr := `{"__metadata__":{"k":"v"},"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`
	for len(hdr)%8 != 0 {
		hdr += " "
	}
	want := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	want = append(want, hdr...)
	want = append(want, 0, 0x3c, 0, 0xc0)
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("got\n%q\nwant\n%q", buf.Bytes(), want)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	v, err := f.Float32("w")
	if err != nil || !slices.Equal(v, []float32{1, -2}) {
		t.Fatalf("Float32 = %v, %v", v, err)
	}
}

func TestDecodeFastMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 7, 1000} {
		src := make([]byte, 4*n)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		if n > 0 {
			binary.LittleEndian.PutUint32(src, 0x7fc00001) // a NaN payload must survive
		}
		fast := make([]float32, n)
		ref := make([]float32, n)
		decodeF32(fast, src)
		decodeF32Ref(ref, src)
		for i := range fast {
			if math.Float32bits(fast[i]) != math.Float32bits(ref[i]) {
				t.Fatalf("n=%d [%d]: fast %#x, reference %#x", n, i, math.Float32bits(fast[i]), math.Float32bits(ref[i]))
			}
		}
	}
	// The 16-bit decoders agree with the half package on every bit pattern.
	src := make([]byte, 2*65536)
	for i := range 65536 {
		binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
	}
	f16 := make([]float32, 65536)
	bf16 := make([]float32, 65536)
	decodeF16(f16, src)
	decodeBF16(bf16, src)
	for i := range 65536 {
		if math.Float32bits(f16[i]) != math.Float32bits(half.F16ToF32(uint16(i))) {
			t.Fatalf("f16 %#04x", i)
		}
		if math.Float32bits(bf16[i]) != math.Float32bits(half.BF16ToF32(uint16(i))) {
			t.Fatalf("bf16 %#04x", i)
		}
	}
}

// image builds a file from a header string and n data bytes.
func image(hdr string, n int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	b = append(b, hdr...)
	return append(b, make([]byte, n)...)
}

func TestMalformed(t *testing.T) {
	good := image(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8)
	if _, err := Parse(good); err != nil {
		t.Fatalf("baseline: %v", err)
	}
	lenPast := slices.Clone(good)
	binary.LittleEndian.PutUint64(lenPast, uint64(len(good)))
	huge := slices.Clone(good)
	binary.LittleEndian.PutUint64(huge, math.MaxUint64)

	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty file", nil, "too short"},
		{"truncated length", []byte{1, 0, 0}, "too short"},
		{"zero header", image("", 0), "header length is 0"},
		{"header length beyond file", lenPast, "runs past the end"},
		{"header length absurd", huge, "runs past the end"},
		{"truncated file", good[:len(good)-3], "run past the 5-byte data section"},
		{"not an object", image(`["a"]`, 0), "does not start with '{'"},
		{"bad JSON", image(`{"a":{"dtype":"F32",`, 0), `tensor "a": invalid entry`},
		{"bad JSON value", image(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},}`, 8), "header JSON"},
		{"trailing bytes", image(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} x`, 8), "after the header"},
		{"two objects", image(`{}{}`, 0), "after the header"},
		{"invalid UTF-8", image("{\"\xff\":{}}", 0), "UTF-8"},
		{"offsets out of range", image(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, 8), "run past the 8-byte data section"},
		{"offsets reversed", image(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, 8), "end before they begin"},
		{"offsets count", image(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}}`, 8), "has 1 values"},
		{"size mismatch", image(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 12), "needs 12 bytes"},
		{"overlap", image(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12), "overlap"},
		{"identical ranges", image(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}`, 4), "overlap"},
		{"unknown dtype", image(`{"a":{"dtype":"F12","shape":[2],"data_offsets":[0,3]}}`, 3), `unknown dtype "F12"`},
		{"missing dtype", image(`{"a":{"shape":[2],"data_offsets":[0,8]}}`, 8), "needs dtype"},
		{"null entry", image(`{"a":null}`, 0), "needs dtype"},
		{"negative dim", image(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}}`, 8), `tensor "a": invalid entry`},
		{"fractional dim", image(`{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}}`, 8), `tensor "a": invalid entry`},
		{"shape overflow", image(`{"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, 8), "too many elements"},
		{"sub-byte size", image(`{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}`, 2), "whole number of bytes"},
		{"duplicate name", image(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2), `lists "a" twice`},
		{"metadata not strings", image(`{"__metadata__":{"n":1}}`, 0), "__metadata__"},
		{"empty name", image(`{"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1), "empty tensor name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.data)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrFormat) {
				t.Errorf("error does not wrap ErrFormat: %v", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not mention %q", err, c.want)
			}
		})
	}

	// The same checks run on mapped files, and the error names the file.
	path := filepath.Join(t.TempDir(), "bad.safetensors")
	if err := os.WriteFile(path, good[:len(good)-3], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path); err == nil || !strings.Contains(err.Error(), path) || !errors.Is(err, ErrFormat) {
		t.Fatalf("Open truncated file: %v", err)
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path); err == nil || !strings.Contains(err.Error(), "too short") {
		t.Fatalf("Open empty file: %v", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open missing file: %v", err)
	}
	if _, err := Open(t.TempDir()); err == nil {
		t.Fatal("Open of a directory succeeded")
	}
}

// TestTolerated documents what parses although the reference writer never
// produces it.
func TestTolerated(t *testing.T) {
	cases := map[string][]byte{
		"gap and trailing bytes": image(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}`, 10),
		"padding":                image(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`+"   \n", 2),
		"null metadata":          image(`{"__metadata__":null}`, 0),
		"extra fields":           image(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1}}`, 2),
		"zero-size at same spot": image(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}`, 2),
		"all dtypes":             image(`{"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F4","shape":[2],"data_offsets":[1,2]},"c":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[2,5]},"d":{"dtype":"C64","shape":[1],"data_offsets":[5,13]}}`, 13),
	}
	for name, data := range cases {
		if _, err := Parse(data); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestWriteRejects(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name string
		ts   []WriteTensor
		want string
	}{
		{"size", []WriteTensor{{Name: "a", DType: F32, Shape: []int{2}, Data: make([]byte, 7)}}, "needs 8 bytes"},
		{"dtype", []WriteTensor{{Name: "a", DType: "F7", Shape: []int{1}, Data: make([]byte, 1)}}, "unknown dtype"},
		{"dup", []WriteTensor{{Name: "a", DType: U8, Data: []byte{1}}, {Name: "a", DType: U8, Data: []byte{1}}}, "twice"},
		{"name", []WriteTensor{{Name: "__metadata__", DType: U8, Data: []byte{1}}}, "invalid tensor name"},
		{"shape", []WriteTensor{{Name: "a", DType: U8, Shape: []int{-1}}}, "bad shape"},
	}
	for _, c := range cases {
		path := filepath.Join(dir, c.name)
		err := Write(path, c.ts, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.name, err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: failed Write left a file", c.name)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("temporary files left behind: %v", ents)
	}
}

func shardTensors(prefix string, n int, r *rand.Rand) ([]WriteTensor, map[string][]float32) {
	ts := []WriteTensor{}
	vals := map[string][]float32{}
	for i := range n {
		v := randFloats(r, 8+i)
		name := fmt.Sprintf("%s.%d.weight", prefix, i)
		ts = append(ts, WriteTensor{Name: name, DType: F32, Shape: []int{8 + i}, Data: F32Bytes(v)})
		vals[name] = v
	}
	return ts, vals
}

func writeIndex(t *testing.T, dir string, wm map[string]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"metadata":{"total_size":123},"weight_map":{`)
	first := true
	for k, v := range wm {
		if !first {
			b.WriteByte(',')
		}
		first = false
		fmt.Fprintf(&b, "%q:%q", k, v)
	}
	b.WriteString("}}")
	if err := os.WriteFile(filepath.Join(dir, IndexFile), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOpenDirSharded(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	dir := t.TempDir()
	t1, v1 := shardTensors("a", 3, r)
	t2, v2 := shardTensors("b", 2, r)
	s1, s2 := "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
	writeFile(t, filepath.Join(dir, s1), t1, map[string]string{"format": "pt"})
	writeFile(t, filepath.Join(dir, s2), t2, map[string]string{"format": "np", "extra": "x"})
	wm := map[string]string{}
	for name := range v1 {
		wm[name] = s1
	}
	for name := range v2 {
		wm[name] = s2
	}
	writeIndex(t, dir, wm)

	f, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Len() != 5 {
		t.Fatalf("Len = %d", f.Len())
	}
	if m := f.Metadata(); m["format"] != "pt" || m["extra"] != "x" {
		t.Fatalf("Metadata = %v", m)
	}
	for _, vals := range []map[string][]float32{v1, v2} {
		for name, want := range vals {
			got, err := f.Float32(name)
			if err != nil || !slices.Equal(got, want) {
				t.Fatalf("%s: %v %v", name, got, err)
			}
			in, _ := f.Tensor(name)
			if wantFile := wm[name]; filepath.Base(in.Path) != wantFile {
				t.Fatalf("%s: Path %s, want %s", name, in.Path, wantFile)
			}
		}
	}

	// Errors: a missing shard, a tensor assigned to the wrong shard, a
	// tensor stored in two shards, and an escaping path.
	bad := func(name string, mutate func(dir string), want string) {
		t.Helper()
		d := t.TempDir()
		writeFile(t, filepath.Join(d, s1), t1, nil)
		writeFile(t, filepath.Join(d, s2), t2, nil)
		writeIndex(t, d, wm)
		mutate(d)
		_, err := OpenDir(d)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v (want %q)", name, err, want)
		}
	}
	bad("missing shard", func(d string) { os.Remove(filepath.Join(d, s2)) }, s2+", which is missing")
	bad("wrong shard", func(d string) {
		m := clone(wm)
		m["a.0.weight"] = s2
		writeIndex(t, d, m)
	}, `puts "a.0.weight" in `+s2)
	bad("listed twice", func(d string) {
		writeFile(t, filepath.Join(d, s2), append(slices.Clone(t2), t1[1]), nil)
	}, `"a.1.weight" is in both`)
	bad("escaping path", func(d string) {
		m := clone(wm)
		m["a.0.weight"] = "../" + s1
		writeIndex(t, d, m)
	}, "not a plain relative path")
	bad("bad index", func(d string) {
		os.WriteFile(filepath.Join(d, IndexFile), []byte(`{"weight_map":`), 0o644)
	}, "malformed")
	bad("bad shard", func(d string) {
		os.WriteFile(filepath.Join(d, s1), []byte("short"), 0o644)
	}, "too short")
}

func clone(m map[string]string) map[string]string {
	c := map[string]string{}
	for k, v := range m {
		c[k] = v
	}
	return c
}

func TestOpenDirSingle(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	ts, vals := shardTensors("x", 2, r)

	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, SingleFile), ts, nil)
	writeFile(t, filepath.Join(dir, "other.safetensors"), ts[:1], nil) // ignored: model.safetensors wins
	f, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if f.Len() != 2 {
		t.Fatalf("Len = %d", f.Len())
	}
	for name, want := range vals {
		if got, err := f.Float32(name); err != nil || !slices.Equal(got, want) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	f.Close()

	lone := t.TempDir()
	writeFile(t, filepath.Join(lone, "adapter.safetensors"), ts, nil)
	if f, err := OpenDir(lone); err != nil || f.Len() != 2 {
		t.Fatalf("lone file: %v", err)
	} else {
		f.Close()
	}

	two := t.TempDir()
	writeFile(t, filepath.Join(two, "a.safetensors"), ts, nil)
	writeFile(t, filepath.Join(two, "b.safetensors"), ts, nil)
	if _, err := OpenDir(two); err == nil || !strings.Contains(err.Error(), "2 .safetensors files") {
		t.Fatalf("two files without index: %v", err)
	}
	if _, err := OpenDir(t.TempDir()); err == nil || !strings.Contains(err.Error(), "holds no") {
		t.Fatalf("empty dir: %v", err)
	}
	if _, err := OpenDir(filepath.Join(two, "nope")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing dir: %v", err)
	}
}

// TestFuzzSeedsValid checks that the committed seed corpus holds valid
// files, so that fuzzing starts from the interesting side of the parser.
func TestFuzzSeedsValid(t *testing.T) {
	seeds, err := readSeeds(filepath.Join("testdata", "fuzz", "FuzzParseHeader"))
	if err != nil {
		t.Fatal(err)
	}
	if len(seeds) < 3 {
		t.Fatalf("only %d seeds", len(seeds))
	}
	for name, data := range seeds {
		if _, err := Parse(data); err != nil {
			t.Errorf("seed %s: %v", name, err)
		}
	}
}
