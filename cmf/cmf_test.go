package cmf

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/cortiq/cortiq/quant"
)

func testHeader() *Header {
	bos := 1
	return &Header{
		Arch: Arch{
			ArchName: "llama", HiddenSize: 64, IntermediateSize: 96, NumLayers: 2,
			NumAttentionHeads: 4, NumKVHeads: 2, HeadDim: 16, VocabSize: 100,
			LayerTypes: []string{"full_attention", "full_attention"}, RMSNormEps: 1e-5,
			NormStyle: "standard", RopeTheta: 10000, PartialRotaryFactor: 1, HiddenAct: "silu",
			RopeScaling: &RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192},
		},
		QuantType:       "q8_row",
		QuantPolicy:     &QuantPolicy{Default: "q8_row", Rules: []PolicyRule{{Pattern: `norm\.weight$`, DType: "f32", Reason: "vectors stay f32"}}},
		Provenance:      &Provenance{Source: "test", SourceFormat: "synthetic", Converter: "cortiq", ConverterVersion: "test", CreatedAt: time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)},
		TokenizerConfig: &TokenizerConfig{Kind: "hf_json", Blob: "tokenizer.json", ChatTemplate: "{{ messages }}", BOSTokenID: &bos, EOSTokenIDs: []int{2, 3}},
		Skills:          []Skill{{Name: "terse", Kind: "system_prompt", SystemPrompt: "Answer briefly."}},
		Calibration:     &Calibration{Method: "rms", Samples: 4, Tensors: map[string]string{"w": "calib.w"}},
	}
}

type tdata struct {
	spec TensorSpec
	data []byte
}

func randTensors(r *rand.Rand, n int) []tdata {
	dts := []quant.DType{quant.F32, quant.F16, quant.BF16, quant.U8, quant.Q8Row, quant.Q4TP, quant.Q82F, quant.I32}
	var out []tdata
	for i := 0; i < n; i++ {
		dt := dts[i%len(dts)]
		shape := []int{1 + r.IntN(9), 32 * (1 + r.IntN(4))}
		if dt == quant.U8 || dt == quant.I32 {
			shape = []int{1 + r.IntN(1000)}
		}
		size, err := quant.ExpectedBytes(dt, shape)
		if err != nil {
			panic(err)
		}
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		out = append(out, tdata{TensorSpec{Name: "t" + string(rune('a'+i%26)) + strings.Repeat("x", i/26), DType: dt, Shape: shape}, b})
	}
	return out
}

func write(t testing.TB, path string, hdr *Header, ts []tdata, opt WriteOptions) []string {
	t.Helper()
	specs := make([]TensorSpec, len(ts))
	for i, x := range ts {
		specs[i] = x.spec
	}
	w, err := Create(path, hdr, specs, opt)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ts {
		// Write in uneven chunks to exercise the streaming path.
		if err := w.Begin(x.spec.Name); err != nil {
			t.Fatal(err)
		}
		for b := x.data; len(b) > 0; {
			n := min(len(b), 1+len(b)/3)
			if _, err := w.Write(b[:n]); err != nil {
				t.Fatal(err)
			}
			b = b[n:]
		}
		if err := w.End(); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return w.Files()
}

func checkModel(t *testing.T, m *Model, ts []tdata) {
	t.Helper()
	if len(m.Tensors) != len(ts) {
		t.Fatalf("%d tensors, want %d", len(m.Tensors), len(ts))
	}
	for _, x := range ts {
		tt, b, err := m.TensorData(x.spec.Name)
		if err != nil {
			t.Fatal(err)
		}
		if tt.DType != x.spec.DType || !equalInts(tt.Shape, x.spec.Shape) {
			t.Errorf("%s: got %s %v want %s %v", x.spec.Name, tt.DType, tt.Shape, x.spec.DType, x.spec.Shape)
		}
		if !bytes.Equal(b, x.data) {
			t.Errorf("%s: bytes differ", x.spec.Name)
		}
		if tt.Offset%TensorAlign != 0 {
			t.Errorf("%s: offset %d not aligned", tt.Name, tt.Offset)
		}
		if tt.Hash != xxh3.Hash(x.data) {
			t.Errorf("%s: hash", tt.Name)
		}
		if abs, ok := m.AbsOffset(tt); ok {
			if abs%TensorAlign != 0 || !bytes.Equal(m.PrimaryBytes()[abs:abs+tt.Size], x.data) {
				t.Errorf("%s: AbsOffset %d does not address the tensor in the primary mapping", tt.Name, abs)
			}
		}
	}
	for _, f := range m.files {
		if f.pre.DataOff%DataAlign != 0 {
			t.Errorf("data section at %d", f.pre.DataOff)
		}
	}
	if probs, err := m.Verify(context.Background(), nil); err != nil || len(probs) != 0 {
		t.Fatalf("verify: %v %v", probs, err)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(1, 1))
	ts := randTensors(r, 40)
	hdr := testHeader()
	p := filepath.Join(dir, "m.cmf")
	files := write(t, p, hdr, ts, WriteOptions{})
	if len(files) != 1 || files[0] != p {
		t.Fatalf("files %v", files)
	}
	m, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	checkModel(t, m, ts)
	// Header fields survive the trip.
	want := *hdr
	want.Format, want.Version, want.SectionHashes = "cmf", 1, m.Header.SectionHashes
	a, _ := json.Marshal(&want)
	b, _ := json.Marshal(&m.Header)
	if !bytes.Equal(a, b) {
		t.Fatalf("header changed:\n%s\n%s", a, b)
	}
	if m.Shards() != 1 || m.Header.Shard != nil {
		t.Fatal("unexpected shard info")
	}
	// Leftover temporary files must not exist.
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("dir has %d entries", len(ents))
	}
}

func TestEmptyAndZeroSizedTensors(t *testing.T) {
	p := filepath.Join(t.TempDir(), "e.cmf")
	write(t, p, testHeader(), nil, WriteOptions{})
	m, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	ts := []tdata{{TensorSpec{"z", quant.F32, []int{0, 4}}, nil}, {TensorSpec{"one", quant.F32, []int{1}}, []byte{1, 2, 3, 4}}}
	write(t, p, testHeader(), ts, WriteOptions{})
	m, err = Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	checkModel(t, m, ts)
}

func TestShards(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(2, 2))
	ts := randTensors(r, 30)
	p := filepath.Join(dir, "big.cmf")
	files := write(t, p, testHeader(), ts, WriteOptions{ShardBytes: 3000})
	if len(files) < 3 {
		t.Fatalf("expected several shards, got %v", files)
	}
	if filepath.Base(files[0]) != fmt.Sprintf("big-00001-of-%05d.cmf", len(files)) {
		t.Fatalf("shard name %s", files[0])
	}
	for i, f := range files {
		m, err := Open(f)
		if err != nil {
			t.Fatal(err)
		}
		if m.Shards() != len(files) || m.Header.Shard.Index != i {
			t.Fatalf("shard %d: %d shards, index %d", i, m.Shards(), m.Header.Shard.Index)
		}
		checkModel(t, m, ts)
		inOther := 0
		for k := range m.Tensors {
			if _, ok := m.AbsOffset(&m.Tensors[k]); !ok {
				inOther++
			}
		}
		if inOther == 0 || inOther == len(ts) {
			t.Fatalf("shard %d: %d of %d tensors in neighbouring shards", i, inOther, len(ts))
		}
		m.Close()
	}
	// A missing neighbour is an error naming the file.
	os.Rename(files[1], files[1]+".away")
	if _, err := Open(files[0]); err == nil || !strings.Contains(err.Error(), "shard 2") {
		t.Fatalf("missing shard: %v", err)
	}
	os.Rename(files[1]+".away", files[1])
	// A shard of another set is refused.
	other := write(t, filepath.Join(dir, "other.cmf"), testHeader(), ts, WriteOptions{ShardBytes: 3000})
	os.Rename(other[1], files[1])
	if _, err := Open(files[0]); err == nil || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("foreign shard: %v", err)
	}
}

func itoa(n int) string { return fmt.Sprint(n) }

func TestWriterMisuse(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.cmf")
	specs := []TensorSpec{{"a", quant.F32, []int{2}}, {"b", quant.F32, []int{2}}}
	w, err := Create(p, testHeader(), specs, WriteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTensor("b", make([]byte, 8)); err == nil {
		t.Fatal("out-of-order write accepted")
	}
	if err := w.Close(); err == nil {
		t.Fatal("Close after failure succeeded")
	}
	w, _ = Create(p, testHeader(), specs, WriteOptions{})
	if err := w.WriteTensor("a", make([]byte, 9)); err == nil {
		t.Fatal("oversized tensor accepted")
	}
	w.Abort()
	w, _ = Create(p, testHeader(), specs, WriteOptions{})
	_ = w.WriteTensor("a", make([]byte, 8))
	if err := w.Close(); err == nil || !strings.Contains(err.Error(), "1 of 2") {
		t.Fatalf("incomplete Close: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("failed writes left files: %v", ents)
	}
	if _, err := Create(p, testHeader(), []TensorSpec{{"q", quant.Q4TP, []int{2, 33}}}, WriteOptions{}); err == nil {
		t.Fatal("q4tp with 33 columns accepted")
	}
	if _, err := Create(p, testHeader(), []TensorSpec{{"a", quant.F32, []int{1}}, {"a", quant.F32, []int{1}}}, WriteOptions{}); err == nil {
		t.Fatal("duplicate name accepted")
	}
	bad := testHeader()
	bad.Arch.HiddenSize = 0
	if _, err := Create(p, bad, nil, WriteOptions{}); err == nil {
		t.Fatal("invalid arch accepted")
	}
}

// mutate rewrites parts of a valid single-file model and re-seals the hashes,
// so the structural checks behind them are exercised.
func mutate(t *testing.T, src, dst string, f func(pre *preamble, hdr *map[string]any, dir *[]Tensor, data []byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	pre, err := parsePreamble(b, int64(len(b)), true)
	if err != nil {
		t.Fatal(err)
	}
	var hdr map[string]any
	if err := json.Unmarshal(b[pre.HeaderOff:pre.HeaderOff+pre.HeaderN], &hdr); err != nil {
		t.Fatal(err)
	}
	ts, _, err := parseDirectory(b[pre.DirOff:pre.DirOff+pre.DirN], 1)
	if err != nil {
		t.Fatal(err)
	}
	data := append([]byte(nil), b[pre.DataOff:]...)
	data = f(pre, &hdr, &ts, data)
	hb, _ := json.Marshal(hdr)
	db := marshalDirectory(ts)
	pre.HeaderOff, pre.HeaderN = PreambleSize, uint64(len(hb))
	pre.DirOff, pre.DirN = pre.HeaderOff+pre.HeaderN, uint64(len(db))
	if pre.DataOff < pre.DirOff+pre.DirN {
		t.Fatal("mutation does not fit")
	}
	pre.HeaderHash, pre.DirHash = xxh3.Hash(hb), xxh3.Hash(db)
	out := make([]byte, pre.DataOff)
	copy(out, pre.marshal())
	copy(out[pre.HeaderOff:], hb)
	copy(out[pre.DirOff:], db)
	out = append(out, data...)
	if err := os.WriteFile(dst, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestMalformed(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(3, 3))
	ts := randTensors(r, 8)
	good := filepath.Join(dir, "good.cmf")
	write(t, good, testHeader(), ts, WriteOptions{})
	gb, _ := os.ReadFile(good)
	bad := filepath.Join(dir, "bad.cmf")
	expect := func(name, want string) {
		t.Helper()
		m, err := Open(bad)
		if err == nil {
			m.Close()
			t.Fatalf("%s: opened", name)
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: error %q does not mention %q", name, err, want)
		}
	}
	// Truncations anywhere.
	for _, n := range []int{0, 7, 100, PreambleSize, 200, DataAlign, len(gb) - 1} {
		os.WriteFile(bad, gb[:n], 0o644)
		m, err := Open(bad)
		if err == nil {
			m.Close()
			t.Fatalf("truncated to %d: opened", n)
		}
	}
	os.WriteFile(bad, gb[:len(gb)-1], 0o644)
	expect("truncated", "outside")

	b := append([]byte(nil), gb...)
	copy(b, "GGUF\x03\x00\x00\x00")
	os.WriteFile(bad, b, 0o644)
	expect("magic", "bad magic")

	newer := func(major uint16) {
		b := append([]byte(nil), gb...)
		binary.LittleEndian.PutUint16(b[8:], major)
		binary.LittleEndian.PutUint64(b[120:], xxh3.Hash(b[:120]))
		os.WriteFile(bad, b, 0o644)
	}
	newer(2)
	expect("newer major", "upgrade cortiq")
	newer(0)
	expect("major 0", "not valid")
	// A newer minor version opens.
	b = append([]byte(nil), gb...)
	binary.LittleEndian.PutUint16(b[10:], 7)
	binary.LittleEndian.PutUint64(b[120:], xxh3.Hash(b[:120]))
	os.WriteFile(bad, b, 0o644)
	if m, err := Open(bad); err != nil {
		t.Fatalf("newer minor: %v", err)
	} else {
		m.Close()
	}

	cases := []struct {
		name, want string
		f          func(pre *preamble, hdr *map[string]any, dir *[]Tensor, data []byte) []byte
	}{
		{"overlap", "overlap", func(_ *preamble, _ *map[string]any, d *[]Tensor, data []byte) []byte {
			(*d)[1].Offset = (*d)[0].Offset
			(*d)[1].Size = (*d)[0].Size
			(*d)[1].DType, (*d)[1].Shape = (*d)[0].DType, (*d)[0].Shape
			return data
		}},
		{"out of bounds", "outside", func(_ *preamble, _ *map[string]any, d *[]Tensor, data []byte) []byte {
			(*d)[2].Offset = int64(len(data)) + 256
			return data
		}},
		{"misaligned", "aligned", func(_ *preamble, _ *map[string]any, d *[]Tensor, data []byte) []byte {
			(*d)[2].Offset += 4
			return data
		}},
		{"size mismatch", "needs", func(_ *preamble, _ *map[string]any, d *[]Tensor, data []byte) []byte {
			(*d)[0].Size--
			return data
		}},
		{"absurd dim", "absurd", func(_ *preamble, _ *map[string]any, d *[]Tensor, data []byte) []byte {
			(*d)[0].Shape[0] = 1 << 45
			return data
		}},
		{"absurd elements", "2^40", func(_ *preamble, _ *map[string]any, d *[]Tensor, data []byte) []byte {
			(*d)[0].Shape = []int{1 << 30, 1 << 30}
			return data
		}},
		{"duplicate", "twice", func(_ *preamble, _ *map[string]any, d *[]Tensor, data []byte) []byte {
			(*d)[1].Name = (*d)[0].Name
			return data
		}},
		{"shard index", "shard", func(_ *preamble, _ *map[string]any, d *[]Tensor, data []byte) []byte {
			(*d)[1].Shard = 3
			return data
		}},
		{"bad format", "format", func(_ *preamble, h *map[string]any, _ *[]Tensor, data []byte) []byte {
			(*h)["format"] = "gguf"
			return data
		}},
		{"bad arch", "hidden_size", func(_ *preamble, h *map[string]any, _ *[]Tensor, data []byte) []byte {
			(*h)["arch"].(map[string]any)["hidden_size"] = -5
			return data
		}},
		{"missing hashes", "section_hashes", func(_ *preamble, h *map[string]any, _ *[]Tensor, data []byte) []byte {
			delete(*h, "section_hashes")
			return data
		}},
		{"data beyond file", "outside", func(p *preamble, _ *map[string]any, _ *[]Tensor, data []byte) []byte {
			p.DataN += 1 << 20
			return data
		}},
	}
	for _, c := range cases {
		mutate(t, good, bad, c.f)
		expect(c.name, c.want)
	}
	// Absurd tensor count in an otherwise valid directory.
	mutate(t, good, bad, func(_ *preamble, _ *map[string]any, _ *[]Tensor, data []byte) []byte { return data })
	b, _ = os.ReadFile(bad)
	pre, _ := parsePreamble(b, int64(len(b)), true)
	binary.LittleEndian.PutUint32(b[pre.DirOff:], 1<<30)
	pre.DirHash = xxh3.Hash(b[pre.DirOff : pre.DirOff+pre.DirN])
	copy(b, pre.marshal())
	os.WriteFile(bad, b, 0o644)
	expect("absurd count", "claims")
}

// TestVerifyCatchesFlips flips one byte in every section in turn and checks
// that Open or Verify fails and names the section.
func TestVerifyCatchesFlips(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(4, 4))
	ts := randTensors(r, 6)
	good := filepath.Join(dir, "good.cmf")
	write(t, good, testHeader(), ts, WriteOptions{})
	gb, _ := os.ReadFile(good)
	m0, err := Open(good)
	if err != nil {
		t.Fatal(err)
	}
	pre := *m0.files[0].pre
	type spot struct {
		off  int64
		want string
	}
	spots := []spot{
		{100, "preamble"}, {20, "preamble"},
		{int64(pre.HeaderOff) + 5, "header"},
		{int64(pre.DirOff) + 9, "directory"},
		{int64(pre.DataN+pre.DataOff) - 1, "data"}, // trailing padding
	}
	for _, tt := range m0.Tensors {
		spots = append(spots, spot{int64(pre.DataOff) + tt.Offset + tt.Size/2, "tensor " + tt.Name})
	}
	m0.Close()
	bad := filepath.Join(dir, "bad.cmf")
	for _, s := range spots {
		b := append([]byte(nil), gb...)
		b[s.off] ^= 0x10
		os.WriteFile(bad, b, 0o644)
		m, err := Open(bad)
		if err != nil {
			if !strings.Contains(err.Error(), s.want) {
				t.Errorf("flip at %d: open error %q does not name %q", s.off, err, s.want)
			}
			continue
		}
		probs, err := m.Verify(context.Background(), nil)
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, p := range probs {
			if strings.Contains(p.String(), s.want) {
				found = true
			}
		}
		if !found {
			t.Errorf("flip at %d (%s): verify reported %v", s.off, s.want, probs)
		}
	}
}

// makeSparse writes a model of 8 tensors totalling about total bytes of zeros.
func makeSparse(t testing.TB, path string, total int64) {
	var specs []TensorSpec
	for i := 0; i < 8; i++ {
		specs = append(specs, TensorSpec{Name: "w" + itoa(i), DType: quant.U8, Shape: []int{int(total / 8)}})
	}
	w, err := Create(path, testHeader(), specs, WriteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		if err := w.Begin(s.Name); err != nil {
			t.Fatal(err)
		}
		if err := w.WriteZeros(int64(s.Shape[0])); err != nil {
			t.Fatal(err)
		}
		if err := w.End(); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func BenchmarkOpen(b *testing.B) {
	for _, c := range []struct {
		name string
		size int64
	}{{"1KiB", 1 << 10}, {"8GiB", 1 << 33}} {
		b.Run(c.name, func(b *testing.B) {
			p := filepath.Join(b.TempDir(), "m.cmf")
			makeSparse(b, p, c.size)
			for b.Loop() {
				m, err := OpenWith(p, OpenOptions{NoVerify: true})
				if err != nil {
					b.Fatal(err)
				}
				m.Close()
			}
			b.ReportMetric(float64(c.size), "model_bytes")
		})
	}
}

func BenchmarkVerify(b *testing.B) {
	p := filepath.Join(b.TempDir(), "m.cmf")
	makeSparse(b, p, 256<<20)
	m, err := Open(p)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	b.SetBytes(256 << 20)
	for b.Loop() {
		if probs, err := m.Verify(context.Background(), nil); err != nil || len(probs) > 0 {
			b.Fatal(probs, err)
		}
	}
}

func TestSpecRulesEnforced(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.cmf")
	write(t, good, testHeader(), randTensors(rand.New(rand.NewPCG(5, 5)), 3), WriteOptions{})
	if st, _ := os.Stat(good); st.Mode().Perm()&0o044 == 0 {
		t.Fatalf("model file mode %v is not readable by others", st.Mode())
	}
	gb, _ := os.ReadFile(good)
	bad := filepath.Join(dir, "bad.cmf")
	reseal := func(b []byte) []byte {
		binary.LittleEndian.PutUint64(b[120:], xxh3.Hash(b[:120]))
		return b
	}
	for name, b := range map[string][]byte{
		"reserved byte":  reseal(func() []byte { b := append([]byte(nil), gb...); b[100] = 1; return b }()),
		"reserved algo":  reseal(func() []byte { b := append([]byte(nil), gb...); b[14] = 1; return b }()),
		"trailing bytes": append(append([]byte(nil), gb...), 0),
	} {
		os.WriteFile(bad, b, 0o644)
		if m, err := Open(bad); err == nil {
			m.Close()
			t.Errorf("%s: opened", name)
		}
	}
	// A header that cannot be written (NaN) fails Create without leaving a file.
	h := testHeader()
	h.Arch.RopeTheta = math.NaN()
	if _, err := Create(filepath.Join(dir, "nan.cmf"), h, nil, WriteOptions{}); err == nil {
		t.Fatal("NaN rope_theta accepted")
	}
	h = testHeader()
	h.Skills = []Skill{{Name: "x", Params: map[string]any{"t": math.Inf(1)}}}
	if _, err := Create(filepath.Join(dir, "inf.cmf"), h, nil, WriteOptions{}); err == nil {
		t.Fatal("unmarshalable header accepted")
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), "nan") || strings.Contains(e.Name(), "inf") {
			t.Fatalf("failed Create left %s", e.Name())
		}
	}
}
