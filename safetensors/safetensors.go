// Package safetensors reads (and, for fixtures, writes) Hugging Face
// safetensors checkpoints without loading them into memory.
//
// A file is an 8-byte little-endian header length N, a JSON header of N
// bytes, and a data section. The header maps each tensor name to its dtype,
// shape and data_offsets [begin, end), relative to the first byte after the
// header; an optional "__metadata__" entry maps strings to strings.
//
// Open maps the file read-only and validates the whole header before
// returning: header length against the file size, JSON syntax, UTF-8,
// duplicate names, known dtypes, offsets in bounds, byte sizes equal to
// dtype size × product(shape), and no two tensors overlapping. Tensors are
// then read one at a time: Raw is a zero-copy view of the mapping, Float32
// and ReadFloat32Into decode F32/F16/BF16, and Release drops a tensor's
// pages so that a streaming converter's resident memory stays near one
// tensor. OpenDir does the same for a directory holding model.safetensors
// or a sharded checkpoint with model.safetensors.index.json.
//
// Gaps between tensors and trailing bytes after the last one are tolerated
// (the reference implementation is stricter); they are never read.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"sort"
	"unicode/utf8"
)

// MaxHeaderLen bounds the JSON header (the reference implementation uses
// the same 100 MB limit).
const MaxHeaderLen = 100_000_000

// maxElements bounds one tensor's element count so that size arithmetic on
// untrusted shapes cannot overflow (2^56 elements of 64 bits fit a uint64).
const maxElements = 1 << 56

// ErrFormat is wrapped by every error about malformed input.
var ErrFormat = errors.New("malformed safetensors file")

// ErrUnsupportedDType is wrapped by errors from decoding a tensor whose
// dtype has no float32 decoder here.
var ErrUnsupportedDType = errors.New("dtype not supported for decoding")

// Info describes one tensor.
type Info struct {
	Name  string
	DType DType
	// Shape is row-major, as in PyTorch; empty for a scalar.
	Shape []int
	// Offset is the absolute byte offset of the tensor's data in Path.
	Offset int64
	// Size is the data size in bytes.
	Size int64
	// Path is the file that holds the tensor (one of the shards for a
	// sharded checkpoint).
	Path string
}

// Elements returns the number of elements (1 for a scalar).
func (i Info) Elements() int64 {
	n := int64(1)
	for _, d := range i.Shape {
		n *= int64(d)
	}
	return n
}

// shard is one mapped (or in-memory) file.
type shard struct {
	path   string
	data   []byte
	mapped bool
}

type entry struct {
	info  Info
	shard *shard
}

// File is an opened checkpoint: one file, or the merged view of a sharded
// checkpoint. Its methods may be called concurrently, except Close.
type File struct {
	shards  []*shard
	entries map[string]entry
	names   []string
	meta    map[string]string
}

// Open maps the safetensors file at path and validates its header.
func Open(path string) (*File, error) {
	s, infos, meta, err := openShard(path)
	if err != nil {
		return nil, err
	}
	f := &File{shards: []*shard{s}, entries: make(map[string]entry, len(infos)), meta: meta}
	for _, in := range infos {
		f.entries[in.Name] = entry{in, s}
	}
	f.finish()
	return f, nil
}

// Parse validates data as a whole safetensors file held in memory. The
// returned File refers to data, which must not change while it is in use.
func Parse(data []byte) (*File, error) {
	infos, meta, err := parse(data, "")
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	s := &shard{data: data}
	f := &File{shards: []*shard{s}, entries: make(map[string]entry, len(infos)), meta: meta}
	for _, in := range infos {
		f.entries[in.Name] = entry{in, s}
	}
	f.finish()
	return f, nil
}

func openShard(path string) (*shard, []Info, map[string]string, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("safetensors: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("safetensors: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, nil, nil, fmt.Errorf("safetensors: %s: not a regular file: %w", path, ErrFormat)
	}
	data, mapped, err := mapFile(fd, st.Size())
	if err != nil {
		return nil, nil, nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	infos, meta, err := parse(data, path)
	if err != nil {
		if mapped {
			_ = unmap(data)
		}
		return nil, nil, nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	if mapped && len(infos) > 0 {
		// Tensors are read front to back within each tensor: ask for
		// aggressive read-ahead and early reclaim of the data section.
		start := infos[0].Offset // infos are sorted by offset
		advise(data, start, int64(len(data))-start, adviceSequential)
	}
	return &shard{path: path, data: data, mapped: mapped}, infos, meta, nil
}

// rawInfo is one tensor's JSON entry; pointers tell a missing field from a
// zero one.
type rawInfo struct {
	DType       *string   `json:"dtype"`
	Shape       *[]uint64 `json:"shape"`
	DataOffsets *[]uint64 `json:"data_offsets"`
}

// parse validates a whole file image and returns its tensors (sorted by
// offset) and metadata. path only fills Info.Path.
func parse(data []byte, path string) ([]Info, map[string]string, error) {
	if len(data) < 8 {
		return nil, nil, fmt.Errorf("%w: file is %d bytes, too short for the 8-byte header length", ErrFormat, len(data))
	}
	n := binary.LittleEndian.Uint64(data)
	switch {
	case n == 0:
		return nil, nil, fmt.Errorf("%w: header length is 0", ErrFormat)
	case n > uint64(len(data)-8):
		return nil, nil, fmt.Errorf("%w: header length %d runs past the end of the file (%d bytes after the length)", ErrFormat, n, len(data)-8)
	case n > MaxHeaderLen:
		return nil, nil, fmt.Errorf("%w: header length %d exceeds the %d-byte limit", ErrFormat, n, MaxHeaderLen)
	}
	hdr := data[8 : 8+n]
	dataStart := 8 + int64(n)
	dataLen := uint64(int64(len(data)) - dataStart)
	if hdr[0] != '{' {
		return nil, nil, fmt.Errorf("%w: header does not start with '{' (got %q)", ErrFormat, hdr[0])
	}
	if !utf8.Valid(hdr) {
		return nil, nil, fmt.Errorf("%w: header is not valid UTF-8", ErrFormat)
	}

	dec := json.NewDecoder(bytes.NewReader(hdr))
	if _, err := dec.Token(); err != nil { // the '{' checked above
		return nil, nil, fmt.Errorf("%w: header JSON: %v", ErrFormat, err)
	}
	var (
		infos []Info
		meta  map[string]string
		seen  = map[string]bool{}
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, fmt.Errorf("%w: header JSON: %v", ErrFormat, err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, nil, fmt.Errorf("%w: header JSON: unexpected %v", ErrFormat, tok)
		}
		if seen[name] {
			return nil, nil, fmt.Errorf("%w: header lists %q twice", ErrFormat, name)
		}
		seen[name] = true
		if name == "__metadata__" {
			if err := dec.Decode(&meta); err != nil {
				return nil, nil, fmt.Errorf("%w: __metadata__ must map strings to strings: %v", ErrFormat, err)
			}
			continue
		}
		var ri rawInfo
		if err := dec.Decode(&ri); err != nil {
			return nil, nil, fmt.Errorf("%w: tensor %q: invalid entry: %v", ErrFormat, name, err)
		}
		in, err := checkInfo(name, &ri, dataLen)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: tensor %q: %v", ErrFormat, name, err)
		}
		in.Offset += dataStart
		in.Path = path
		infos = append(infos, in)
	}
	if _, err := dec.Token(); err != nil { // closing '}'
		return nil, nil, fmt.Errorf("%w: header JSON: %v", ErrFormat, err)
	}
	// Only whitespace padding may follow the object.
	if len(bytes.TrimLeft(hdr[dec.InputOffset():], " \t\r\n")) != 0 {
		return nil, nil, fmt.Errorf("%w: unexpected bytes after the header JSON object", ErrFormat)
	}

	sort.Slice(infos, func(a, b int) bool {
		if infos[a].Offset != infos[b].Offset {
			return infos[a].Offset < infos[b].Offset
		}
		return infos[a].Size < infos[b].Size
	})
	var prev *Info
	for i := range infos {
		in := &infos[i]
		if in.Size == 0 {
			continue
		}
		if prev != nil && in.Offset < prev.Offset+prev.Size {
			return nil, nil, fmt.Errorf("%w: tensors %q and %q overlap", ErrFormat, prev.Name, in.Name)
		}
		prev = in
	}
	return infos, meta, nil
}

// checkInfo validates one header entry against a data section of dataLen
// bytes; Offset is returned relative to the data section.
func checkInfo(name string, ri *rawInfo, dataLen uint64) (Info, error) {
	if name == "" {
		return Info{}, errors.New("empty tensor name")
	}
	if ri.DType == nil || ri.Shape == nil || ri.DataOffsets == nil {
		return Info{}, errors.New("entry needs dtype, shape and data_offsets")
	}
	dt := DType(*ri.DType)
	if !dt.Known() {
		return Info{}, fmt.Errorf("unknown dtype %q", *ri.DType)
	}
	off := *ri.DataOffsets
	if len(off) != 2 {
		return Info{}, fmt.Errorf("data_offsets has %d values, want 2", len(off))
	}
	begin, end := off[0], off[1]
	if begin > end {
		return Info{}, fmt.Errorf("data_offsets [%d, %d) end before they begin", begin, end)
	}
	if end > dataLen {
		return Info{}, fmt.Errorf("data_offsets [%d, %d) run past the %d-byte data section", begin, end, dataLen)
	}
	shape := make([]int, len(*ri.Shape))
	elems := uint64(1)
	for i, d := range *ri.Shape {
		if d != 0 && elems > maxElements/d {
			return Info{}, fmt.Errorf("shape %v has too many elements", *ri.Shape)
		}
		if d > math.MaxInt {
			return Info{}, fmt.Errorf("dimension %d does not fit an int", d)
		}
		elems *= d
		shape[i] = int(d)
	}
	want, err := dt.byteSize(elems)
	if err != nil {
		return Info{}, err
	}
	if want != end-begin {
		return Info{}, fmt.Errorf("%s shape %v needs %d bytes but data_offsets [%d, %d) hold %d", dt, shape, want, begin, end, end-begin)
	}
	return Info{Name: name, DType: dt, Shape: shape, Offset: int64(begin), Size: int64(want)}, nil
}

func (f *File) finish() {
	f.names = slices.Sorted(maps.Keys(f.entries))
	if f.meta == nil {
		f.meta = map[string]string{}
	}
}

// Tensors returns the tensor names in sorted order.
func (f *File) Tensors() []string { return slices.Clone(f.names) }

// Len returns the number of tensors.
func (f *File) Len() int { return len(f.names) }

// Tensor returns a tensor's description.
func (f *File) Tensor(name string) (Info, bool) {
	e, ok := f.entries[name]
	if !ok {
		return Info{}, false
	}
	e.info.Shape = slices.Clone(e.info.Shape)
	return e.info, true
}

// Metadata returns the "__metadata__" strings (merged over shards, the
// first shard in file-name order winning). The map is a copy.
func (f *File) Metadata() map[string]string { return maps.Clone(f.meta) }

// Raw returns a zero-copy view of a tensor's bytes, or nil if there is no
// such tensor or the file is closed. The view is read-only and must not be
// used after Close.
func (f *File) Raw(name string) []byte {
	e, ok := f.entries[name]
	if !ok || e.shard.data == nil {
		return nil
	}
	return e.shard.data[e.info.Offset : e.info.Offset+e.info.Size : e.info.Offset+e.info.Size]
}

// Float32 decodes an F32, F16 or BF16 tensor into a new row-major slice.
func (f *File) Float32(name string) ([]float32, error) {
	e, err := f.decodable(name)
	if err != nil {
		return nil, err
	}
	dst := make([]float32, e.info.Elements())
	if err := f.decode(e, dst); err != nil {
		return nil, err
	}
	return dst, nil
}

// ReadFloat32Into decodes an F32, F16 or BF16 tensor into dst, whose length
// must equal the tensor's element count.
func (f *File) ReadFloat32Into(name string, dst []float32) error {
	e, err := f.decodable(name)
	if err != nil {
		return err
	}
	if n := e.info.Elements(); int64(len(dst)) != n {
		return fmt.Errorf("safetensors: tensor %q has %d elements, destination holds %d", name, n, len(dst))
	}
	return f.decode(e, dst)
}

func (f *File) decodable(name string) (entry, error) {
	e, ok := f.entries[name]
	if !ok {
		return entry{}, fmt.Errorf("safetensors: no tensor %q", name)
	}
	if e.shard.data == nil && e.info.Size > 0 {
		return entry{}, fmt.Errorf("safetensors: tensor %q: file is closed", name)
	}
	if !e.info.DType.Decodable() {
		return entry{}, fmt.Errorf("safetensors: tensor %q: %w: %s (only F32, F16 and BF16 decode to float32)", name, ErrUnsupportedDType, e.info.DType)
	}
	return e, nil
}

func (f *File) decode(e entry, dst []float32) error {
	raw := e.shard.data[e.info.Offset : e.info.Offset+e.info.Size]
	if e.shard.mapped {
		advise(e.shard.data, e.info.Offset, e.info.Size, adviceWillNeed)
	}
	switch e.info.DType {
	case F32:
		decodeF32(dst, raw)
	case F16:
		decodeF16(dst, raw)
	case BF16:
		decodeBF16(dst, raw)
	}
	return nil
}

// Release tells the kernel that a tensor's pages are no longer needed, so
// a converter reading tensors one by one keeps resident memory near one
// tensor. Reading the tensor again later is still valid (the pages are read
// back from the file). Pages shared with neighbouring tensors are dropped
// too, which only costs a re-read. It does nothing for in-memory files.
func (f *File) Release(name string) {
	e, ok := f.entries[name]
	if !ok || !e.shard.mapped || e.shard.data == nil {
		return
	}
	advise(e.shard.data, e.info.Offset, e.info.Size, adviceDontNeed)
}

// Close unmaps every file. Views returned by Raw become invalid.
func (f *File) Close() error {
	var errs []error
	for _, s := range f.shards {
		if s.mapped && s.data != nil {
			if err := unmap(s.data); err != nil {
				errs = append(errs, fmt.Errorf("safetensors: unmap %s: %w", s.path, err))
			}
		}
		s.data = nil
	}
	return errors.Join(errs...)
}
