package safetensors

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var updateSeeds = flag.Bool("update-seeds", false, "rewrite the fuzz seed corpus in testdata/fuzz")

// FuzzParseHeader feeds arbitrary bytes to the parser as a whole file. It
// must never panic; whatever parses must give views and decodes of the
// declared sizes, and must survive a write/parse round trip unchanged.
func FuzzParseHeader(f *testing.F) {
	for _, s := range seedFiles() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			return
		}
		var ws []WriteTensor
		for _, name := range file.Tensors() {
			in, ok := file.Tensor(name)
			if !ok {
				t.Fatalf("Tensors lists %q but Tensor does not find it", name)
			}
			raw := file.Raw(name)
			if int64(len(raw)) != in.Size {
				t.Fatalf("%q: Raw has %d bytes, Size %d", name, len(raw), in.Size)
			}
			if in.Elements() <= 1<<16 {
				v, err := file.Float32(name)
				if in.DType.Decodable() && (err != nil || int64(len(v)) != in.Elements()) {
					t.Fatalf("%q: Float32: %d values, %v", name, len(v), err)
				}
				if !in.DType.Decodable() && err == nil {
					t.Fatalf("%q: %s decoded", name, in.DType)
				}
			}
			ws = append(ws, WriteTensor{Name: name, DType: in.DType, Shape: in.Shape, Data: raw})
		}
		var buf bytes.Buffer
		if err := Encode(&buf, ws, file.Metadata()); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := Parse(buf.Bytes())
		if err != nil {
			t.Fatalf("re-parse: %v", err)
		}
		if !slices.Equal(again.Tensors(), file.Tensors()) {
			t.Fatalf("names changed: %v vs %v", again.Tensors(), file.Tensors())
		}
		for _, name := range file.Tensors() {
			a, _ := file.Tensor(name)
			b, _ := again.Tensor(name)
			if a.DType != b.DType || !slices.Equal(a.Shape, b.Shape) || !bytes.Equal(file.Raw(name), again.Raw(name)) {
				t.Fatalf("%q changed in round trip", name)
			}
		}
	})
}

// seedFiles returns small valid files covering each header feature.
func seedFiles() [][]byte {
	enc := func(ts []WriteTensor, meta map[string]string) []byte {
		var b bytes.Buffer
		if err := Encode(&b, ts, meta); err != nil {
			panic(err)
		}
		return b.Bytes()
	}
	return [][]byte{
		enc(nil, nil),
		enc([]WriteTensor{{Name: "w", DType: F32, Shape: []int{2, 2}, Data: F32Bytes([]float32{1, -2, 3.5, 0})}}, map[string]string{"format": "pt"}),
		enc([]WriteTensor{
			{Name: "h", DType: F16, Shape: []int{3}, Data: F16Bytes([]float32{1, 2, 3})},
			{Name: "b", DType: BF16, Shape: []int{1, 2}, Data: BF16Bytes([]float32{-1, 0.5})},
			{Name: "s", DType: F32, Shape: []int{}, Data: F32Bytes([]float32{7})},
			{Name: "e", DType: F32, Shape: []int{0}, Data: nil},
		}, nil),
		enc([]WriteTensor{
			{Name: "i", DType: I64, Shape: []int{1}, Data: make([]byte, 8)},
			{Name: "q", DType: F4, Shape: []int{2, 2}, Data: []byte{0x12, 0x34}},
			{Name: "u", DType: U8, Shape: []int{3}, Data: []byte{1, 2, 3}},
		}, map[string]string{"a": "b", "c": ""}),
	}
}

// TestWriteSeeds regenerates testdata/fuzz/FuzzParseHeader when run with
// -update-seeds.
func TestWriteSeeds(t *testing.T) {
	if !*updateSeeds {
		t.Skip("run with -update-seeds to rewrite the seed corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzParseHeader")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, s := range seedFiles() {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(s)))
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed%d", i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// readSeeds reads a Go fuzz corpus directory of single []byte entries.
func readSeeds(dir string) (map[string][]byte, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		lines := strings.SplitN(strings.TrimSpace(string(b)), "\n", 2)
		if len(lines) != 2 || lines[0] != "go test fuzz v1" {
			return nil, fmt.Errorf("%s: not a fuzz corpus file", e.Name())
		}
		v := strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")")
		s, err := strconv.Unquote(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		out[e.Name()] = []byte(s)
	}
	return out, nil
}
