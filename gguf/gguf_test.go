package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
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

func mustArray(t *testing.T, elem ValueType, elems ...Value) Value {
	t.Helper()
	v, err := Array(elem, elems...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// allKVs has one entry of every value type, arrays of each, and nesting.
func allKVs(t *testing.T) []KV {
	inner1 := Int32s([]int32{1, -2})
	inner2 := Int32s(nil)
	deep := mustArray(t, ValueArray, mustArray(t, ValueArray, Strings([]string{"x"})))
	return []KV{
		{"general.architecture", String("llama")},
		{"u8", Uint8(200)},
		{"i8", Int8(-100)},
		{"u16", Uint16(60000)},
		{"i16", Int16(-30000)},
		{"u32", Uint32(4000000000)},
		{"i32", Int32(-2000000000)},
		{"f32", Float32(1.5)},
		{"bool", Bool(true)},
		{"str", String("héllo\x00world")},
		{"u64", Uint64(math.MaxUint64)},
		{"i64", Int64(math.MinInt64)},
		{"f64", Float64(math.Pi)},
		{"empty.str", String("")},
		{"a.u8", Uint8s([]uint8{1, 2, 255})},
		{"a.i8", Int8s([]int8{-1, 2})},
		{"a.u16", Uint16s([]uint16{7})},
		{"a.i16", Int16s([]int16{-7, 8})},
		{"a.u32", Uint32s([]uint32{1, 4000000000})},
		{"a.i32", Int32s([]int32{-5, 6, 7})},
		{"a.f32", Float32s([]float32{0.25, -1e30})},
		{"a.bool", Bools([]bool{true, false, true})},
		{"a.str", Strings([]string{"<s>", "", "▁the"})},
		{"a.u64", Uint64s([]uint64{1 << 40})},
		{"a.i64", Int64s([]int64{-1 << 40, 3})},
		{"a.f64", Float64s([]float64{1e300})},
		{"a.empty", Float32s(nil)},
		{"a.nested", mustArray(t, ValueArray, inner1, inner2)},
		{"a.deep", deep},
	}
}

type tensorCase struct {
	name  string
	typ   Type
	shape []int
	vals  []float32
}

func writeTestFile(t *testing.T, path string, kvs []KV, tensors []tensorCase, version uint32) {
	t.Helper()
	w := NewWriter()
	w.Version = version
	for _, kv := range kvs {
		if err := w.AddKV(kv.Key, kv.Value); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range tensors {
		if err := w.AddTensor(tc.name, tc.typ, tc.shape, tc.vals); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	kvs := allKVs(t)
	tensors := []tensorCase{
		{"tok_embd.weight", TypeQ8_0, []int{3, 64}, randFloats(r, 3*64)},
		{"norm.weight", TypeF32, []int{7}, randFloats(r, 7)},
		{"f16.weight", TypeF16, []int{2, 3}, randFloats(r, 6)},
		{"bf16.weight", TypeBF16, []int{5}, randFloats(r, 5)},
		{"q4.weight", TypeQ4_0, []int{2, 2, 32}, randFloats(r, 128)},
		{"scalar", TypeF32, []int{}, []float32{42}},
		{"empty", TypeF32, []int{0, 4}, nil},
		{"k.weight", TypeQ4_K, []int{2, 256}, randFloats(r, 512)},
		{"k6.weight", TypeQ6_K, []int{1, 1, 1, 256}, randFloats(r, 256)},
	}
	for _, version := range []uint32{3, 2} {
		path := filepath.Join(t.TempDir(), "m.gguf")
		writeTestFile(t, path, kvs, tensors, version)
		f, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if f.Version() != version {
			t.Fatalf("Version = %d, want %d", f.Version(), version)
		}
		if f.Architecture() != "llama" || f.Alignment() != 32 || f.DataOffset()%32 != 0 {
			t.Fatalf("Architecture %q Alignment %d DataOffset %d", f.Architecture(), f.Alignment(), f.DataOffset())
		}
		got := f.KVs()
		if len(got) != len(kvs) {
			t.Fatalf("%d KVs, want %d", len(got), len(kvs))
		}
		for i, kv := range kvs {
			if got[i].Key != kv.Key {
				t.Fatalf("KV %d is %q, want %q (file order)", i, got[i].Key, kv.Key)
			}
			v, ok := f.KV(kv.Key)
			if !ok || v.Type() != kv.Value.Type() || v.ElemType() != kv.Value.ElemType() || !reflect.DeepEqual(v.Any(), kv.Value.Any()) {
				t.Fatalf("KV %q = %v (%s/%s), want %v", kv.Key, v.Any(), v.Type(), v.ElemType(), kv.Value.Any())
			}
		}

		infos := f.Tensors()
		if len(infos) != len(tensors) {
			t.Fatalf("%d tensors", len(infos))
		}
		for i, tc := range tensors {
			ti := infos[i]
			if ti.Name != tc.name || ti.Type != tc.typ || !slices.Equal(ti.Shape(), tc.shape) {
				t.Fatalf("tensor %d = %+v shape %v, want %s %s %v", i, ti, ti.Shape(), tc.name, tc.typ, tc.shape)
			}
			if ti.FileOffset%32 != 0 || ti.FileOffset != f.DataOffset()+ti.Offset {
				t.Fatalf("%s: offsets %d/%d", ti.Name, ti.Offset, ti.FileOffset)
			}
			want, _ := Quantize(tc.typ, tc.vals)
			if raw := f.Raw(tc.name); !bytes.Equal(raw, want) {
				t.Fatalf("%s: Raw differs from Quantize output", tc.name)
			}
			vals, err := f.Float32(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			exp := make([]float32, len(tc.vals))
			if err := Dequantize(tc.typ, want, exp); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(vals, exp) {
				t.Fatalf("%s: Float32 differs from Dequantize", tc.name)
			}
			dst := make([]float32, len(vals))
			if err := f.ReadFloat32Into(tc.name, dst); err != nil || !slices.Equal(dst, vals) {
				t.Fatalf("%s: ReadFloat32Into: %v", tc.name, err)
			}
			f.Release(tc.name)
		}
		// Exact and rounded plain types.
		check := func(name string, want []float32, round func(float32) float32) {
			t.Helper()
			got, err := f.Float32(name)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if got[i] != round(want[i]) {
					t.Fatalf("%s[%d] = %v, want %v", name, i, got[i], round(want[i]))
				}
			}
		}
		check("norm.weight", tensors[1].vals, func(x float32) float32 { return x })
		check("f16.weight", tensors[2].vals, half.RoundF16)
		check("bf16.weight", tensors[3].vals, half.RoundBF16)
		check("scalar", []float32{42}, func(x float32) float32 { return x })

		if _, ok := f.Tensor("nope"); ok || f.Raw("nope") != nil {
			t.Fatal("found a missing tensor")
		}
		if _, err := f.Float32("nope"); err == nil || !strings.Contains(err.Error(), `"nope"`) {
			t.Fatalf("missing tensor: %v", err)
		}
		if err := f.ReadFloat32Into("norm.weight", make([]float32, 3)); err == nil {
			t.Fatal("short destination accepted")
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if f.Raw("norm.weight") != nil {
			t.Fatal("Raw after Close")
		}
		if _, err := f.Float32("norm.weight"); err == nil {
			t.Fatal("Float32 after Close")
		}
	}
}

// TestShapeConvention pins the ggml dimension order on a hand-built file:
// dims [3, 2] (ne0 = 3 columns, ne1 = 2 rows) is a 2×3 row-major matrix.
func TestShapeConvention(t *testing.T) {
	var b rawFile
	b.header(3, 1, 0)
	b.str("m")
	b.u32(2)
	b.u64(3)
	b.u64(2)
	b.u32(uint32(TypeF32))
	b.u64(0)
	b.pad(32)
	for _, v := range []float32{1, 2, 3, 4, 5, 6} {
		b.u32(math.Float32bits(v))
	}
	f, err := Parse(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	ti, _ := f.Tensor("m")
	if !slices.Equal(ti.Dims, []int64{3, 2}) || !slices.Equal(ti.Shape(), []int{2, 3}) || ti.Elements() != 6 {
		t.Fatalf("Dims %v Shape %v", ti.Dims, ti.Shape())
	}
	v, _ := f.Float32("m")
	if !slices.Equal(v, []float32{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("values %v", v)
	}

	// The writer produces the same bytes from a PyTorch-order shape.
	w := NewWriter()
	if err := w.AddTensor("m", TypeF32, []int{2, 3}, []float32{1, 2, 3, 4, 5, 6}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := w.WriteTo(&out); err != nil {
		t.Fatal(err)
	}
	if want := b.Bytes(); !bytes.Equal(out.Bytes()[:len(want)], want) || out.Len() != 128 {
		t.Fatalf("writer output differs:\n%x\n%x", out.Bytes(), want)
	}
}

func TestAlignment(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	path := filepath.Join(t.TempDir(), "a.gguf")
	writeTestFile(t, path, []KV{{KeyAlignment, Uint32(256)}}, []tensorCase{
		{"a", TypeF32, []int{3}, randFloats(r, 3)},
		{"b", TypeQ8_0, []int{32}, randFloats(r, 32)},
		{"c", TypeF16, []int{1}, randFloats(r, 1)},
	}, 0)
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Alignment() != 256 || f.DataOffset()%256 != 0 {
		t.Fatalf("alignment %d, data at %d", f.Alignment(), f.DataOffset())
	}
	for _, ti := range f.Tensors() {
		if ti.FileOffset%256 != 0 {
			t.Fatalf("%s at %d", ti.Name, ti.FileOffset)
		}
	}
	w := NewWriter()
	if err := w.AddKV(KeyAlignment, Uint32(48)); err == nil {
		t.Fatal("alignment 48 accepted")
	}
}

func TestValueGetters(t *testing.T) {
	if u, ok := Int8(-1).Uint(); ok {
		t.Fatalf("Uint of -1 = %d", u)
	}
	if u, ok := Int32(7).Uint(); !ok || u != 7 {
		t.Fatal("Uint of int32 7")
	}
	if _, ok := Uint64(math.MaxUint64).Int(); ok {
		t.Fatal("Int of MaxUint64")
	}
	if i, ok := Uint16(9).Int(); !ok || i != 9 {
		t.Fatal("Int of uint16")
	}
	if f, ok := Uint32(3).Float(); !ok || f != 3 {
		t.Fatal("Float of uint32")
	}
	if f, ok := Float32(0.5).Float(); !ok || f != 0.5 {
		t.Fatal("Float of float32")
	}
	if _, ok := String("x").Float(); ok {
		t.Fatal("Float of string")
	}
	if _, ok := Bool(true).Uint(); ok {
		t.Fatal("Uint of bool")
	}
	if s, ok := String("x").String(); !ok || s != "x" {
		t.Fatal("String")
	}
	if _, ok := Uint8(1).String(); ok {
		t.Fatal("String of uint8")
	}
	if b, ok := Bool(true).Bool(); !ok || !b {
		t.Fatal("Bool")
	}
	if v, ok := Uint8s([]uint8{1, 200}).Int32s(); !ok || !slices.Equal(v, []int32{1, 200}) {
		t.Fatal("Int32s of uint8s")
	}
	if _, ok := Int64s([]int64{1 << 40}).Int32s(); ok {
		t.Fatal("Int32s of a too-large int64")
	}
	if v, ok := Int16s([]int16{3}).Uint32s(); !ok || v[0] != 3 {
		t.Fatal("Uint32s of int16s")
	}
	if _, ok := Int16s([]int16{-3}).Uint32s(); ok {
		t.Fatal("Uint32s of a negative")
	}
	if v, ok := Float64s([]float64{0.5}).Float32s(); !ok || v[0] != 0.5 {
		t.Fatal("Float32s of float64s")
	}
	if v, ok := Float32s([]float32{0.5}).Float64s(); !ok || v[0] != 0.5 {
		t.Fatal("Float64s of float32s")
	}
	if _, ok := Strings([]string{"a"}).Float32s(); ok {
		t.Fatal("Float32s of strings")
	}
	if _, ok := Uint8(1).Strings(); ok {
		t.Fatal("Strings of a scalar")
	}
	if v, ok := Bools([]bool{true}).Bools(); !ok || !v[0] {
		t.Fatal("Bools")
	}
	if a, ok := Uint16s([]uint16{4, 5}).Array(); !ok || len(a) != 2 || a[1].Type() != ValueUint16 {
		t.Fatal("Array of uint16s")
	} else if x, _ := a[1].Uint(); x != 5 {
		t.Fatal("Array element")
	}
	if _, ok := Uint8(1).Array(); ok {
		t.Fatal("Array of a scalar")
	}
	// Getters return copies.
	s := Strings([]string{"a"})
	c, _ := s.Strings()
	c[0] = "b"
	if again, _ := s.Strings(); again[0] != "a" {
		t.Fatal("Strings aliases the value")
	}
	if _, err := Array(ValueUint8, Int8(1)); err == nil {
		t.Fatal("mixed array accepted")
	}
	if v, err := Array(ValueFloat32, Float32(1), Float32(2)); err != nil || v.Len() != 2 {
		t.Fatal("Array of float32s")
	} else if f, ok := v.Float32s(); !ok || f[1] != 2 {
		t.Fatal("Array of float32s is not a typed slice")
	}
	var zero Value
	if zero.Len() != 0 || zero.Any() != nil {
		t.Fatal("zero Value")
	}
	if err := NewWriter().AddKV("z", zero); err == nil {
		t.Fatal("zero Value accepted by the writer")
	}
}

func TestWriterRejects(t *testing.T) {
	w := NewWriter()
	if err := w.AddKV("k", Uint8(1)); err != nil {
		t.Fatal(err)
	}
	if err := w.AddKV("k", Uint8(1)); err == nil {
		t.Fatal("duplicate key")
	}
	if err := w.AddTensor("a", TypeQ4_0, []int{2, 16}, make([]float32, 32)); err == nil || !strings.Contains(err.Error(), "block size") {
		t.Fatalf("row of 16 in Q4_0: %v", err)
	}
	if err := w.AddTensor("a", TypeF32, []int{2}, make([]float32, 3)); err == nil {
		t.Fatal("wrong value count")
	}
	if err := w.AddTensor("a", TypeF32, []int{1, 1, 1, 1, 1}, make([]float32, 1)); err == nil {
		t.Fatal("5 dims")
	}
	if err := w.AddTensor("a", TypeIQ2_XXS, []int{256}, make([]float32, 256)); !errors.Is(err, ErrUnsupportedType) {
		t.Fatalf("IQ2_XXS quantize: %v", err)
	}
	if err := w.AddRaw("a", TypeIQ2_XXS, []int{256}, make([]byte, 66)); err != nil {
		t.Fatal(err)
	}
	if err := w.AddRaw("a", TypeF32, []int{1}, make([]byte, 4)); err == nil {
		t.Fatal("duplicate tensor")
	}
	if err := w.AddRaw("b", TypeF32, []int{1}, make([]byte, 3)); err == nil {
		t.Fatal("short raw data")
	}
	// A file with an IQ2_XXS tensor parses; dequantizing names the problem.
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Float32("a")
	if !errors.Is(err, ErrUnsupportedType) || !strings.Contains(err.Error(), `"a"`) || !strings.Contains(err.Error(), "IQ2_XXS") {
		t.Fatalf("dequantizing IQ2_XXS: %v", err)
	}
	if len(f.Raw("a")) != 66 {
		t.Fatal("Raw of IQ2_XXS")
	}
}

// rawFile assembles GGUF bytes by hand, for malformed inputs.
type rawFile struct{ bytes.Buffer }

func (b *rawFile) u32(v uint32) { b.Write(binary.LittleEndian.AppendUint32(nil, v)) }
func (b *rawFile) u64(v uint64) { b.Write(binary.LittleEndian.AppendUint64(nil, v)) }
func (b *rawFile) str(s string) { b.u64(uint64(len(s))); b.WriteString(s) }
func (b *rawFile) header(version uint32, nTensors, nKV uint64) {
	b.WriteString("GGUF")
	b.u32(version)
	b.u64(nTensors)
	b.u64(nKV)
}
func (b *rawFile) pad(a int) {
	for b.Len()%a != 0 {
		b.WriteByte(0)
	}
}

// tensorInfo writes one tensor info with ggml-order dims.
func (b *rawFile) tensorInfo(name string, typ Type, off uint64, dims ...uint64) {
	b.str(name)
	b.u32(uint32(len(dims)))
	for _, d := range dims {
		b.u64(d)
	}
	b.u32(uint32(typ))
	b.u64(off)
}

func build(f func(b *rawFile)) []byte {
	var b rawFile
	f(&b)
	return b.Bytes()
}

func TestMalformed(t *testing.T) {
	// A valid small file: one KV, two F32 tensors of 8 elements.
	valid := func(b *rawFile) {
		b.header(3, 2, 1)
		b.str("general.architecture")
		b.u32(uint32(ValueString))
		b.str("llama")
		b.tensorInfo("a", TypeF32, 0, 8)
		b.tensorInfo("b", TypeF32, 32, 8)
		b.pad(32)
		b.Write(make([]byte, 64))
	}
	good := build(valid)
	if _, err := Parse(good); err != nil {
		t.Fatalf("baseline: %v", err)
	}
	kvFile := func(version uint32, f func(b *rawFile)) []byte {
		return build(func(b *rawFile) {
			b.header(version, 0, 1)
			f(b)
		})
	}
	oneTensor := func(kvs func(b *rawFile), nkv uint64, info func(b *rawFile), data int) []byte {
		return build(func(b *rawFile) {
			b.header(3, 1, nkv)
			if kvs != nil {
				kvs(b)
			}
			info(b)
			b.pad(32)
			b.Write(make([]byte, data))
		})
	}
	withVersion := func(v uint32) []byte {
		b := slices.Clone(good)
		binary.LittleEndian.PutUint32(b[4:], v)
		return b
	}
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "too short"},
		{"bad magic", append([]byte("GGUX"), good[4:]...), `bad magic "GGUX"`},
		{"legacy ggjt", append([]byte("tjgg"), good[4:]...), "legacy"},
		{"version 1", withVersion(1), "version 1 is not supported"},
		{"version 4", withVersion(4), "unsupported GGUF version 4"},
		{"big-endian", withVersion(0x03000000), "big-endian"},
		{"truncated header", good[:12], "tensor count"},
		{"truncated infos", good[:120], "truncated"},
		{"truncated data", good[:len(good)-1], "runs past the 63-byte data section"},
		{"absurd tensor count", build(func(b *rawFile) { b.header(3, 1<<62, 0) }), "cannot fit"},
		{"absurd kv count", build(func(b *rawFile) { b.header(3, 0, math.MaxUint64); b.Write(make([]byte, 100)) }), "cannot fit"},
		{"key length beyond file", kvFile(3, func(b *rawFile) { b.u64(1 << 40); b.Write(make([]byte, 20)) }), "past the end of the file"},
		{"string value beyond file", kvFile(3, func(b *rawFile) { b.str("k"); b.u32(uint32(ValueString)); b.u64(1000) }), "past the end of the file"},
		{"absurd array count", kvFile(3, func(b *rawFile) {
			b.str("k")
			b.u32(uint32(ValueArray))
			b.u32(uint32(ValueUint64))
			b.u64(1 << 60)
			b.Write(make([]byte, 64))
		}), "claims 1152921504606846976 uint64 elements"},
		{"absurd string array", kvFile(3, func(b *rawFile) {
			b.str("k")
			b.u32(uint32(ValueArray))
			b.u32(uint32(ValueString))
			b.u64(1 << 40)
		}), "claims"},
		{"truncated array", kvFile(3, func(b *rawFile) {
			b.str("k")
			b.u32(uint32(ValueArray))
			b.u32(uint32(ValueString))
			b.u64(2)
			b.str("a")
			b.Write(make([]byte, 7))
		}), "element 1"},
		{"unknown value type", kvFile(3, func(b *rawFile) { b.str("k"); b.u32(13); b.u64(0) }), "unknown value type 13"},
		{"unknown element type", kvFile(3, func(b *rawFile) { b.str("k"); b.u32(uint32(ValueArray)); b.u32(99); b.u64(0) }), "unknown element type 99"},
		{"arrays too deep", kvFile(3, func(b *rawFile) {
			b.str("k")
			b.u32(uint32(ValueArray))
			for range maxArrayDepth {
				b.u32(uint32(ValueArray))
				b.u64(1)
			}
			b.u32(uint32(ValueUint8))
			b.u64(0)
		}), "nests more than"},
		{"duplicate key", build(func(b *rawFile) {
			b.header(3, 0, 2)
			for range 2 {
				b.str("k")
				b.u32(uint32(ValueUint8))
				b.WriteByte(1)
			}
		}), `"k" at offset 38 appears twice`},
		{"alignment zero", kvFile(3, func(b *rawFile) { b.str(KeyAlignment); b.u32(uint32(ValueUint32)); b.u32(0) }), KeyAlignment},
		{"alignment not power of two", kvFile(3, func(b *rawFile) { b.str(KeyAlignment); b.u32(uint32(ValueUint32)); b.u32(24) }), KeyAlignment},
		{"alignment string", kvFile(3, func(b *rawFile) { b.str(KeyAlignment); b.u32(uint32(ValueString)); b.str("32") }), KeyAlignment},
		{"misaligned", oneTensor(nil, 0, func(b *rawFile) { b.tensorInfo("t", TypeF32, 4, 1) }, 64), "misaligned"},
		{"misaligned custom alignment", oneTensor(func(b *rawFile) { b.str(KeyAlignment); b.u32(uint32(ValueUint32)); b.u32(64) }, 1,
			func(b *rawFile) { b.tensorInfo("t", TypeF32, 32, 1) }, 128), "not a multiple of the alignment 64"},
		{"tensor beyond file", oneTensor(nil, 0, func(b *rawFile) { b.tensorInfo("t", TypeF32, 0, 100) }, 64), `tensor "t": data [0, 400) runs past`},
		{"tensor offset beyond file", oneTensor(nil, 0, func(b *rawFile) { b.tensorInfo("t", TypeF32, 1<<40, 1) }, 64), "runs past"},
		{"data start beyond file", build(func(b *rawFile) { b.header(3, 1, 0); b.tensorInfo("t", TypeF32, 0) }), "past the end"},
		{"unknown tensor type", oneTensor(nil, 0, func(b *rawFile) { b.tensorInfo("t", Type(31), 0, 32) }, 64), `"t" has unknown ggml type 31`},
		{"too many dims", oneTensor(nil, 0, func(b *rawFile) { b.tensorInfo("t", TypeF32, 0, 1, 1, 1, 1, 1) }, 64), "5 dimensions"},
		{"partial block", oneTensor(nil, 0, func(b *rawFile) { b.tensorInfo("t", TypeQ4_K, 0, 128, 2) }, 512), "row length 128 is not a multiple of the Q4_K block size 256"},
		{"dims overflow", oneTensor(nil, 0, func(b *rawFile) { b.tensorInfo("t", TypeF32, 0, 1<<32, 1<<32) }, 64), "too large"},
		{"duplicate tensor", build(func(b *rawFile) {
			b.header(3, 2, 0)
			b.tensorInfo("t", TypeF32, 0, 8)
			b.tensorInfo("t", TypeF32, 32, 8)
			b.pad(32)
			b.Write(make([]byte, 64))
		}), `"t" appears twice`},
		{"overlap", build(func(b *rawFile) {
			b.header(3, 2, 0)
			b.tensorInfo("t", TypeF32, 0, 16)
			b.tensorInfo("u", TypeF32, 32, 8)
			b.pad(32)
			b.Write(make([]byte, 64))
		}), `"t" and "u" overlap`},
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

	// Every proper prefix of a valid file is an error, never a panic.
	var w rawFile
	writeAll(t, &w)
	full := w.Bytes()
	if _, err := Parse(full); err != nil {
		t.Fatal(err)
	}
	for n := range len(full) {
		if _, err := Parse(full[:n]); err == nil {
			t.Fatalf("prefix of %d of %d bytes parsed", n, len(full))
		}
	}

	// Open reports the path; missing files keep their os error.
	path := filepath.Join(t.TempDir(), "bad.gguf")
	if err := os.WriteFile(path, good[:len(good)-1], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path); err == nil || !strings.Contains(err.Error(), path) || !errors.Is(err, ErrFormat) {
		t.Fatalf("Open truncated: %v", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing.gguf")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open missing: %v", err)
	}
	if _, err := Open(t.TempDir()); err == nil {
		t.Fatal("Open of a directory")
	}
}

// writeAll writes a small file using every value type and several tensor
// types (the last one ends exactly at the end of the file).
func writeAll(t *testing.T, out *rawFile) {
	t.Helper()
	r := rand.New(rand.NewPCG(9, 9))
	w := NewWriter()
	for _, kv := range allKVs(t) {
		if err := w.AddKV(kv.Key, kv.Value); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []tensorCase{
		{"a", TypeQ8_0, []int{32}, randFloats(r, 32)},
		{"b", TypeF32, []int{2, 4}, randFloats(r, 8)},
	} {
		if err := w.AddTensor(tc.name, tc.typ, tc.shape, tc.vals); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.WriteTo(out); err != nil {
		t.Fatal(err)
	}
}
