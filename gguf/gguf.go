// Package gguf reads (and, for tests and fixtures, writes) GGUF files, the
// model format of llama.cpp/ggml, versions 2 and 3 (little-endian).
//
// A file is a header (magic "GGUF", version, tensor count, metadata count),
// metadata key/value pairs, tensor infos (name, dimensions, ggml type,
// offset), then the data section, which starts at the next multiple of the
// alignment (metadata "general.alignment", default 32) after the infos.
//
// Open maps the file read-only and validates everything before returning:
// counts and lengths are checked against the bytes left before anything is
// allocated (so absurd values give an error, not an out-of-memory crash),
// arrays may nest only a few levels deep, tensor types must be known, rows
// must be whole blocks, and tensor data must be aligned, inside the file
// and free of overlaps. Tensors are then read one at a time: Raw is a
// zero-copy view of the mapping, Float32 and ReadFloat32Into dequantize,
// and Release drops a tensor's pages after use.
//
// # Shapes
//
// ggml lists dimensions fastest-varying first: ne[0] is the row length
// (columns), ne[1] the number of rows. TensorInfo.Dims keeps that order;
// TensorInfo.Shape reverses it to the row-major order of PyTorch and
// safetensors, so a weight stored by convert_hf_to_gguf.py from a PyTorch
// tensor of shape [out, in] has Dims [in, out] and Shape [out, in], and its
// dequantized values are that row-major [out, in] matrix.
//
// # Helpers for converters
//
// UnpermuteQK undoes the row permutation that llama.cpp's converter applies
// to the Q and K projections of llama-family models (for interleaved
// RoPE), giving back Hugging Face's rotate_half order; PermuteQK is its
// inverse. Dequantize and Quantize work on raw block data independent of a
// File; FileTypeName names general.file_type values.
package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"slices"
	"sort"
)

// Magic opens every GGUF file.
const Magic = "GGUF"

// DefaultAlignment is the data alignment when general.alignment is absent.
const DefaultAlignment = 32

// KeyAlignment is the metadata key that overrides the data alignment.
const KeyAlignment = "general.alignment"

const (
	maxDims       = 4       // GGML_MAX_DIMS
	maxArrayDepth = 8       // arrays of arrays nest at most this deep
	maxAlignment  = 1 << 30 // sanity bound on general.alignment
	maxElements   = 1 << 56 // bounds size arithmetic on untrusted shapes
	minKVBytes    = 8 + 4 + 1
	minInfoBytes  = 8 + 4 + 4 + 8
)

// ErrFormat is wrapped by every error about malformed input.
var ErrFormat = errors.New("malformed GGUF file")

// ErrUnsupportedType is wrapped by errors from dequantizing or quantizing a
// tensor type this package does not implement.
var ErrUnsupportedType = errors.New("tensor type not supported")

// KV is one metadata entry.
type KV struct {
	Key   string
	Value Value
}

// TensorInfo describes one tensor.
type TensorInfo struct {
	Name string
	Type Type
	// Dims are in ggml order: Dims[0] (ne[0]) varies fastest and is the
	// row length. See Shape for PyTorch order.
	Dims []int64
	// Offset is the data offset relative to the data section, as stored.
	Offset int64
	// FileOffset is the absolute offset of the data in the file.
	FileOffset int64
	// Size is the data size in bytes.
	Size int64
}

// Shape returns the dimensions in row-major (PyTorch) order, the reverse
// of Dims: [ne1, ne0] for a matrix.
func (t TensorInfo) Shape() []int {
	s := make([]int, len(t.Dims))
	for i, d := range t.Dims {
		s[len(s)-1-i] = int(d)
	}
	return s
}

// Elements returns the number of elements (1 for zero dimensions).
func (t TensorInfo) Elements() int64 {
	n := int64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// File is an opened GGUF file. Its methods may be called concurrently,
// except Close.
type File struct {
	version   uint32
	data      []byte
	mapped    bool
	path      string
	kvs       []KV
	kvIndex   map[string]int
	tensors   []TensorInfo
	tIndex    map[string]int
	alignment int64
	dataStart int64
}

// Open maps the GGUF file at path and validates it.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("gguf: %s: %w: not a regular file", path, ErrFormat)
	}
	data, mapped, err := mapFile(fd, st.Size())
	if err != nil {
		return nil, fmt.Errorf("gguf: %s: %w", path, err)
	}
	f, err := parse(data)
	if err != nil {
		if mapped {
			_ = unmap(data)
		}
		return nil, fmt.Errorf("gguf: %s: %w", path, err)
	}
	f.mapped, f.path = mapped, path
	if mapped && len(f.tensors) > 0 {
		advise(data, f.dataStart, int64(len(data))-f.dataStart, adviceSequential)
	}
	return f, nil
}

// Parse validates data as a whole GGUF file held in memory. The returned
// File refers to data, which must not change while it is in use.
func Parse(data []byte) (*File, error) {
	f, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	return f, nil
}

// cursor reads little-endian values from a byte slice with bounds checks.
type cursor struct {
	b   []byte
	off int
}

func (c *cursor) left() int { return len(c.b) - c.off }

func (c *cursor) take(n int, what string) ([]byte, error) {
	if n < 0 || n > c.left() {
		return nil, fmt.Errorf("%w: %s at offset %d needs %d bytes, %d left (truncated file?)", ErrFormat, what, c.off, n, c.left())
	}
	b := c.b[c.off : c.off+n : c.off+n]
	c.off += n
	return b, nil
}

func (c *cursor) u32(what string) (uint32, error) {
	b, err := c.take(4, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (c *cursor) u64(what string) (uint64, error) {
	b, err := c.take(8, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

func (c *cursor) str(what string) (string, error) {
	at := c.off
	n, err := c.u64(what + " length")
	if err != nil {
		return "", err
	}
	if n > uint64(c.left()) {
		return "", fmt.Errorf("%w: %s at offset %d has length %d, past the end of the file (%d bytes left)", ErrFormat, what, at, n, c.left())
	}
	b, _ := c.take(int(n), what)
	return string(b), nil
}

func parse(data []byte) (*File, error) {
	c := &cursor{b: data}
	if len(data) < 4 {
		return nil, fmt.Errorf("%w: file is %d bytes, too short for a GGUF header", ErrFormat, len(data))
	}
	if m := string(data[:4]); m != Magic {
		switch m {
		case "lmgg", "fmgg", "tjgg", "algg", "GGML", "GGMF", "GGJT", "GGLA":
			return nil, fmt.Errorf("%w: legacy ggml/ggjt file (magic %q), not GGUF", ErrFormat, m)
		}
		return nil, fmt.Errorf("%w: bad magic %q, want %q", ErrFormat, m, Magic)
	}
	c.off = 4
	version, err := c.u32("version")
	if err != nil {
		return nil, err
	}
	switch {
	case version == 2 || version == 3:
	case version == 1:
		return nil, fmt.Errorf("%w: GGUF version 1 is not supported (only 2 and 3)", ErrFormat)
	case bits.ReverseBytes32(version) == 2 || bits.ReverseBytes32(version) == 3:
		return nil, fmt.Errorf("%w: big-endian GGUF (version %d) is not supported", ErrFormat, bits.ReverseBytes32(version))
	default:
		return nil, fmt.Errorf("%w: unsupported GGUF version %d (only 2 and 3)", ErrFormat, version)
	}
	nTensors, err := c.u64("tensor count")
	if err != nil {
		return nil, err
	}
	nKV, err := c.u64("metadata count")
	if err != nil {
		return nil, err
	}
	left := uint64(c.left())
	if nTensors > left/minInfoBytes || nKV > left/minKVBytes || nTensors*minInfoBytes+nKV*minKVBytes > left {
		return nil, fmt.Errorf("%w: %d tensors and %d metadata entries cannot fit in the %d bytes after the header", ErrFormat, nTensors, nKV, left)
	}

	f := &File{
		version:   version,
		data:      data,
		kvs:       make([]KV, 0, min(nKV, 1<<12)),
		kvIndex:   make(map[string]int, min(nKV, 1<<12)),
		tensors:   make([]TensorInfo, 0, min(nTensors, 1<<12)),
		tIndex:    make(map[string]int, min(nTensors, 1<<12)),
		alignment: DefaultAlignment,
	}
	for i := range nKV {
		at := c.off
		key, err := c.str(fmt.Sprintf("key of metadata entry %d", i))
		if err != nil {
			return nil, err
		}
		if _, dup := f.kvIndex[key]; dup {
			return nil, fmt.Errorf("%w: metadata key %q at offset %d appears twice", ErrFormat, key, at)
		}
		t, err := c.u32(fmt.Sprintf("type of metadata %q", key))
		if err != nil {
			return nil, err
		}
		v, err := c.value(ValueType(t), 0, key)
		if err != nil {
			return nil, err
		}
		f.kvIndex[key] = len(f.kvs)
		f.kvs = append(f.kvs, KV{key, v})
	}
	if v, ok := f.KV(KeyAlignment); ok {
		a, isInt := v.Uint()
		if !isInt || a == 0 || a&(a-1) != 0 || a > maxAlignment {
			return nil, fmt.Errorf("%w: %s must be a power-of-two integer up to 2^30, got %s %v", ErrFormat, KeyAlignment, v.Type(), v.Any())
		}
		f.alignment = int64(a)
	}

	for i := range nTensors {
		ti, err := c.tensorInfo(i)
		if err != nil {
			return nil, err
		}
		if _, dup := f.tIndex[ti.Name]; dup {
			return nil, fmt.Errorf("%w: tensor name %q appears twice", ErrFormat, ti.Name)
		}
		if ti.Offset%f.alignment != 0 {
			return nil, fmt.Errorf("%w: tensor %q: offset %d is not a multiple of the alignment %d (misaligned)", ErrFormat, ti.Name, ti.Offset, f.alignment)
		}
		f.tIndex[ti.Name] = len(f.tensors)
		f.tensors = append(f.tensors, ti)
	}

	f.dataStart = (int64(c.off) + f.alignment - 1) / f.alignment * f.alignment
	if len(f.tensors) > 0 && f.dataStart > int64(len(data)) {
		return nil, fmt.Errorf("%w: data section would start at %d, past the end of the %d-byte file", ErrFormat, f.dataStart, len(data))
	}
	dataLen := int64(len(data)) - f.dataStart
	for i := range f.tensors {
		t := &f.tensors[i]
		if t.Offset > dataLen || t.Size > dataLen-t.Offset {
			return nil, fmt.Errorf("%w: tensor %q: data [%d, %d) runs past the %d-byte data section (truncated file?)", ErrFormat, t.Name, t.Offset, uint64(t.Offset)+uint64(t.Size), dataLen)
		}
		t.FileOffset = f.dataStart + t.Offset
	}
	order := make([]int, len(f.tensors))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool {
		ta, tb := &f.tensors[order[a]], &f.tensors[order[b]]
		if ta.Offset != tb.Offset {
			return ta.Offset < tb.Offset
		}
		return ta.Size < tb.Size
	})
	var prev *TensorInfo
	for _, i := range order {
		t := &f.tensors[i]
		if t.Size == 0 {
			continue
		}
		if prev != nil && t.Offset < prev.Offset+prev.Size {
			return nil, fmt.Errorf("%w: tensors %q and %q overlap", ErrFormat, prev.Name, t.Name)
		}
		prev = t
	}
	return f, nil
}

func (c *cursor) tensorInfo(i uint64) (TensorInfo, error) {
	name, err := c.str(fmt.Sprintf("name of tensor %d", i))
	if err != nil {
		return TensorInfo{}, err
	}
	nd, err := c.u32(fmt.Sprintf("dimension count of tensor %q", name))
	if err != nil {
		return TensorInfo{}, err
	}
	if nd > maxDims {
		return TensorInfo{}, fmt.Errorf("%w: tensor %q has %d dimensions, more than %d", ErrFormat, name, nd, maxDims)
	}
	dims := make([]int64, nd)
	elems := uint64(1)
	for j := range dims {
		d, err := c.u64(fmt.Sprintf("dimension %d of tensor %q", j, name))
		if err != nil {
			return TensorInfo{}, err
		}
		if d != 0 && (d > maxElements || elems > maxElements/d) {
			return TensorInfo{}, fmt.Errorf("%w: tensor %q: dimensions are too large", ErrFormat, name)
		}
		elems *= d
		dims[j] = int64(d)
	}
	tt, err := c.u32(fmt.Sprintf("type of tensor %q", name))
	if err != nil {
		return TensorInfo{}, err
	}
	typ := Type(tt)
	tr, ok := typeTraits[typ]
	if !ok {
		return TensorInfo{}, fmt.Errorf("%w: tensor %q has unknown ggml type %d", ErrFormat, name, tt)
	}
	if nd > 0 && dims[0]%tr.blockSize != 0 {
		return TensorInfo{}, fmt.Errorf("%w: tensor %q: row length %d is not a multiple of the %s block size %d", ErrFormat, name, dims[0], typ, tr.blockSize)
	}
	if nd == 0 && tr.blockSize != 1 {
		return TensorInfo{}, fmt.Errorf("%w: tensor %q: a scalar cannot be %s", ErrFormat, name, typ)
	}
	off, err := c.u64(fmt.Sprintf("offset of tensor %q", name))
	if err != nil {
		return TensorInfo{}, err
	}
	if off > math.MaxInt64 {
		return TensorInfo{}, fmt.Errorf("%w: tensor %q: offset %d is too large", ErrFormat, name, off)
	}
	return TensorInfo{
		Name:   name,
		Type:   typ,
		Dims:   dims,
		Offset: int64(off),
		Size:   int64(elems) / tr.blockSize * tr.typeSize,
	}, nil
}

// value reads one metadata value of type t; key is for messages.
func (c *cursor) value(t ValueType, depth int, key string) (Value, error) {
	if !t.valid() {
		return Value{}, fmt.Errorf("%w: metadata %q at offset %d has unknown value type %d", ErrFormat, key, c.off, uint32(t))
	}
	if t == ValueString {
		s, err := c.str(fmt.Sprintf("string value of %q", key))
		return Value{typ: t, v: s}, err
	}
	if t != ValueArray {
		b, err := c.take(valueSizes[t], fmt.Sprintf("%s value of %q", t, key))
		if err != nil {
			return Value{}, err
		}
		return Value{typ: t, v: scalarAt(t, b)}, nil
	}
	at := c.off
	et, err := c.u32(fmt.Sprintf("array element type of %q", key))
	if err != nil {
		return Value{}, err
	}
	elem := ValueType(et)
	if !elem.valid() {
		return Value{}, fmt.Errorf("%w: array %q at offset %d has unknown element type %d", ErrFormat, key, at, et)
	}
	if elem == ValueArray && depth+1 >= maxArrayDepth {
		return Value{}, fmt.Errorf("%w: array %q at offset %d nests more than %d levels deep", ErrFormat, key, at, maxArrayDepth)
	}
	n64, err := c.u64(fmt.Sprintf("array length of %q", key))
	if err != nil {
		return Value{}, err
	}
	if n64 > uint64(c.left()/elem.minSize()) {
		return Value{}, fmt.Errorf("%w: array %q at offset %d claims %d %s elements, more than the %d bytes left can hold", ErrFormat, key, at, n64, elem, c.left())
	}
	n := int(n64)
	v := Value{typ: ValueArray, elem: elem}
	switch elem {
	case ValueString:
		a := make([]string, n)
		for i := range a {
			if a[i], err = c.str("string"); err != nil {
				return Value{}, fmt.Errorf("%w (element %d of %q)", err, i, key)
			}
		}
		v.v = a
	case ValueArray:
		a := make([]Value, n)
		for i := range a {
			if a[i], err = c.value(ValueArray, depth+1, key); err != nil {
				return Value{}, err
			}
		}
		v.v = a
	default:
		b, err := c.take(n*valueSizes[elem], fmt.Sprintf("elements of %q", key))
		if err != nil {
			return Value{}, err
		}
		v.v = decodeArray(elem, b, n)
	}
	return v, nil
}

func scalarAt(t ValueType, b []byte) any {
	le := binary.LittleEndian
	switch t {
	case ValueUint8:
		return b[0]
	case ValueInt8:
		return int8(b[0])
	case ValueUint16:
		return le.Uint16(b)
	case ValueInt16:
		return int16(le.Uint16(b))
	case ValueUint32:
		return le.Uint32(b)
	case ValueInt32:
		return int32(le.Uint32(b))
	case ValueFloat32:
		return math.Float32frombits(le.Uint32(b))
	case ValueBool:
		return b[0] != 0
	case ValueUint64:
		return le.Uint64(b)
	case ValueInt64:
		return int64(le.Uint64(b))
	case ValueFloat64:
		return math.Float64frombits(le.Uint64(b))
	}
	return nil
}

func decodeArray(t ValueType, b []byte, n int) any {
	le := binary.LittleEndian
	switch t {
	case ValueUint8:
		return slices.Clone(b)
	case ValueInt8:
		return conv(b, n, 1, func(p []byte) int8 { return int8(p[0]) })
	case ValueUint16:
		return conv(b, n, 2, le.Uint16)
	case ValueInt16:
		return conv(b, n, 2, func(p []byte) int16 { return int16(le.Uint16(p)) })
	case ValueUint32:
		return conv(b, n, 4, le.Uint32)
	case ValueInt32:
		return conv(b, n, 4, func(p []byte) int32 { return int32(le.Uint32(p)) })
	case ValueFloat32:
		return conv(b, n, 4, func(p []byte) float32 { return math.Float32frombits(le.Uint32(p)) })
	case ValueBool:
		return conv(b, n, 1, func(p []byte) bool { return p[0] != 0 })
	case ValueUint64:
		return conv(b, n, 8, le.Uint64)
	case ValueInt64:
		return conv(b, n, 8, func(p []byte) int64 { return int64(le.Uint64(p)) })
	case ValueFloat64:
		return conv(b, n, 8, func(p []byte) float64 { return math.Float64frombits(le.Uint64(p)) })
	}
	return nil
}

// conv decodes n values of sz bytes each.
func conv[T any](b []byte, n, sz int, get func([]byte) T) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = get(b[i*sz:])
	}
	return out
}

// Version returns the file's GGUF version (2 or 3).
func (f *File) Version() uint32 { return f.version }

// Alignment returns the data alignment in bytes.
func (f *File) Alignment() int { return int(f.alignment) }

// DataOffset returns the absolute offset of the data section.
func (f *File) DataOffset() int64 { return f.dataStart }

// KV returns the metadata value for key.
func (f *File) KV(key string) (Value, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return Value{}, false
	}
	return f.kvs[i].Value, true
}

// KVs returns all metadata in file order.
func (f *File) KVs() []KV { return slices.Clone(f.kvs) }

// Architecture returns general.architecture ("llama", "qwen2", ...), or ""
// when it is missing or not a string.
func (f *File) Architecture() string {
	v, _ := f.KV("general.architecture")
	s, _ := v.String()
	return s
}

// Tensors returns the tensor infos in file order.
func (f *File) Tensors() []TensorInfo {
	out := slices.Clone(f.tensors)
	for i := range out {
		out[i].Dims = slices.Clone(out[i].Dims)
	}
	return out
}

// Tensor returns one tensor's info.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	i, ok := f.tIndex[name]
	if !ok {
		return TensorInfo{}, false
	}
	t := f.tensors[i]
	t.Dims = slices.Clone(t.Dims)
	return t, true
}

// Raw returns a zero-copy view of a tensor's bytes, or nil if there is no
// such tensor or the file is closed. The view is read-only and must not be
// used after Close.
func (f *File) Raw(name string) []byte {
	i, ok := f.tIndex[name]
	if !ok || f.data == nil {
		return nil
	}
	t := &f.tensors[i]
	return f.data[t.FileOffset : t.FileOffset+t.Size : t.FileOffset+t.Size]
}

// Float32 dequantizes a tensor into a new slice, row-major in Shape order.
func (f *File) Float32(name string) ([]float32, error) {
	t, err := f.readable(name)
	if err != nil {
		return nil, err
	}
	dst := make([]float32, t.Elements())
	return dst, f.dequant(t, dst)
}

// ReadFloat32Into dequantizes a tensor into dst, whose length must equal
// the tensor's element count.
func (f *File) ReadFloat32Into(name string, dst []float32) error {
	t, err := f.readable(name)
	if err != nil {
		return err
	}
	if int64(len(dst)) != t.Elements() {
		return fmt.Errorf("gguf: tensor %q has %d elements, destination holds %d", name, t.Elements(), len(dst))
	}
	return f.dequant(t, dst)
}

func (f *File) readable(name string) (*TensorInfo, error) {
	i, ok := f.tIndex[name]
	if !ok {
		return nil, fmt.Errorf("gguf: no tensor %q", name)
	}
	t := &f.tensors[i]
	if !t.Type.CanDequantize() {
		return nil, fmt.Errorf("gguf: tensor %q: %w: cannot dequantize %s", name, ErrUnsupportedType, t.Type)
	}
	if f.data == nil && t.Size > 0 {
		return nil, fmt.Errorf("gguf: tensor %q: file is closed", name)
	}
	return t, nil
}

func (f *File) dequant(t *TensorInfo, dst []float32) error {
	if f.mapped {
		advise(f.data, t.FileOffset, t.Size, adviceWillNeed)
	}
	if err := Dequantize(t.Type, f.data[t.FileOffset:t.FileOffset+t.Size], dst); err != nil {
		return fmt.Errorf("gguf: tensor %q: %w", t.Name, err)
	}
	return nil
}

// Release tells the kernel that a tensor's pages are no longer needed (see
// the package doc). Reading the tensor again later is still valid. It does
// nothing for in-memory files.
func (f *File) Release(name string) {
	i, ok := f.tIndex[name]
	if !ok || !f.mapped || f.data == nil {
		return
	}
	t := &f.tensors[i]
	advise(f.data, t.FileOffset, t.Size, adviceDontNeed)
}

// Close unmaps the file. Views returned by Raw become invalid.
func (f *File) Close() error {
	if f.mapped && f.data != nil {
		if err := unmap(f.data); err != nil {
			return fmt.Errorf("gguf: unmap %s: %w", f.path, err)
		}
	}
	f.data = nil
	return nil
}
