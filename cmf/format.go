// Package cmf reads and writes CMF, cortiq's model container: a fixed
// preamble, a JSON header, a binary tensor directory, and a weights section
// that starts on a 64 KiB boundary with every tensor 256-byte aligned, so
// the file can be memory-mapped and its tensor bytes handed to a kernel or
// an accelerator as they are. docs/cmf.md is the normative specification.
package cmf

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"

	"github.com/zeebo/xxh3"

	"github.com/cortiq/cortiq/quant"
)

// Magic opens every CMF file (PNG-style: a high byte and CR LF / ^Z / LF
// catch transfers that mangle binary data).
var Magic = [8]byte{0x89, 'C', 'M', 'F', '\r', '\n', 0x1a, '\n'}

// Version of the format this package writes. Readers accept any minor
// version of their major version; a higher major is refused.
const (
	VersionMajor = 1
	VersionMinor = 0
)

// Alignment rules.
const (
	DataAlign    = 64 << 10 // the weights section starts at a multiple of this
	TensorAlign  = 256      // every tensor's offset within the section
	FileEndAlign = 4096     // the section's length (and so the file) is padded to this
	PreambleSize = 128
)

// HashXXH3 is the only section hash algorithm of version 1.0.
const HashXXH3 = 1

const (
	maxDirBytes = 1 << 30
	maxNameLen  = 4096
	maxDims     = 8
	maxTensors  = 1 << 22
)

// preamble is the fixed 128-byte start of a CMF file (little-endian):
//
//	0   magic [8]
//	8   u16 version major, u16 version minor
//	12  u8 hash algorithm (1 = xxh3-64), 3 bytes zero
//	16  u64 header offset, u64 header length
//	32  u64 directory offset, u64 directory length
//	48  u64 data offset, u64 data length
//	64  u64 header hash, u64 directory hash
//	80  40 bytes zero (reserved)
//	120 u64 preamble hash: xxh3-64 of bytes [0, 120)
type preamble struct {
	Major, Minor       uint16
	HashAlgo           uint8
	HeaderOff, HeaderN uint64
	DirOff, DirN       uint64
	DataOff, DataN     uint64
	HeaderHash         uint64
	DirHash            uint64
}

func (p *preamble) marshal() []byte {
	b := make([]byte, PreambleSize)
	copy(b, Magic[:])
	le := binary.LittleEndian
	le.PutUint16(b[8:], p.Major)
	le.PutUint16(b[10:], p.Minor)
	b[12] = p.HashAlgo
	le.PutUint64(b[16:], p.HeaderOff)
	le.PutUint64(b[24:], p.HeaderN)
	le.PutUint64(b[32:], p.DirOff)
	le.PutUint64(b[40:], p.DirN)
	le.PutUint64(b[48:], p.DataOff)
	le.PutUint64(b[56:], p.DataN)
	le.PutUint64(b[64:], p.HeaderHash)
	le.PutUint64(b[72:], p.DirHash)
	le.PutUint64(b[120:], xxh3.Hash(b[:120]))
	return b
}

// parsePreamble checks the fixed fields against the file size.
func parsePreamble(b []byte, size int64, checkHash bool) (*preamble, error) {
	if len(b) < PreambleSize || size < PreambleSize {
		return nil, fmt.Errorf("%w: file is %d bytes, shorter than the %d-byte preamble", ErrCorrupt, size, PreambleSize)
	}
	if [8]byte(b[:8]) != Magic {
		return nil, fmt.Errorf("%w: bad magic %q (not a CMF file)", ErrCorrupt, b[:8])
	}
	le := binary.LittleEndian
	if h := xxh3.Hash(b[:120]); checkHash && h != le.Uint64(b[120:]) {
		return nil, fmt.Errorf("%w: preamble hash %016x, stored %016x (preamble damaged)", ErrCorrupt, h, le.Uint64(b[120:]))
	}
	p := &preamble{
		Major: le.Uint16(b[8:]), Minor: le.Uint16(b[10:]), HashAlgo: b[12],
		HeaderOff: le.Uint64(b[16:]), HeaderN: le.Uint64(b[24:]),
		DirOff: le.Uint64(b[32:]), DirN: le.Uint64(b[40:]),
		DataOff: le.Uint64(b[48:]), DataN: le.Uint64(b[56:]),
		HeaderHash: le.Uint64(b[64:]), DirHash: le.Uint64(b[72:]),
	}
	if p.Major != VersionMajor {
		if p.Major > VersionMajor {
			return nil, fmt.Errorf("cmf: file is format version %d.%d; this build reads version %d.x: upgrade cortiq", p.Major, p.Minor, VersionMajor)
		}
		return nil, fmt.Errorf("%w: format version %d.%d is not valid", ErrCorrupt, p.Major, p.Minor)
	}
	if p.HashAlgo != HashXXH3 {
		return nil, fmt.Errorf("%w: unknown section hash algorithm %d", ErrCorrupt, p.HashAlgo)
	}
	us := uint64(size)
	type sec struct {
		name     string
		off, n   uint64
		maxBytes uint64
	}
	secs := []sec{{"header", p.HeaderOff, p.HeaderN, maxHeaderBytes}, {"directory", p.DirOff, p.DirN, maxDirBytes}, {"data", p.DataOff, p.DataN, us}}
	for _, s := range secs {
		if s.n > s.maxBytes || s.off > us || s.n > us-s.off {
			return nil, fmt.Errorf("%w: %s section [%d, +%d) lies outside the %d-byte file (truncated?)", ErrCorrupt, s.name, s.off, s.n, size)
		}
		if s.off < PreambleSize {
			return nil, fmt.Errorf("%w: %s section at %d overlaps the preamble", ErrCorrupt, s.name, s.off)
		}
	}
	if p.HeaderOff+p.HeaderN > p.DirOff || p.DirOff+p.DirN > p.DataOff {
		return nil, fmt.Errorf("%w: sections out of order or overlapping (header %d+%d, directory %d+%d, data %d)", ErrCorrupt, p.HeaderOff, p.HeaderN, p.DirOff, p.DirN, p.DataOff)
	}
	if p.DataOff%DataAlign != 0 {
		return nil, fmt.Errorf("%w: data section at %d is not %d-aligned", ErrCorrupt, p.DataOff, DataAlign)
	}
	if p.DataN%FileEndAlign != 0 {
		return nil, fmt.Errorf("%w: data section length %d is not a multiple of %d", ErrCorrupt, p.DataN, FileEndAlign)
	}
	if p.DataOff+p.DataN != us {
		return nil, fmt.Errorf("%w: the file is %d bytes but its data section ends at %d (truncated or trailing bytes)", ErrCorrupt, size, p.DataOff+p.DataN)
	}
	for _, z := range append(b[13:16:16], b[80:120]...) {
		if z != 0 {
			return nil, fmt.Errorf("%w: reserved preamble bytes are not zero", ErrCorrupt)
		}
	}
	return p, nil
}

// Tensor is one entry of the tensor directory.
type Tensor struct {
	Name   string
	DType  quant.DType
	Shape  []int
	Shard  int    // index of the file holding the bytes
	Offset int64  // within that file's data section, a multiple of TensorAlign
	Size   int64  // bytes
	Hash   uint64 // xxh3-64 of the bytes
}

// Directory entry (little-endian), version 1.0:
//
//	u32 entry length in bytes (this field included; readers skip bytes they do not know)
//	u16 name length, name (UTF-8)
//	u8 dtype, u8 number of dims, u16 shard index
//	u64 dims[ndims] (row-major, slowest first)
//	u64 offset, u64 size, u64 hash
//
// The directory is a u32 entry count followed by the entries.
func entrySize(t *Tensor) int { return 4 + 2 + len(t.Name) + 4 + 8*len(t.Shape) + 24 }

func marshalDirectory(ts []Tensor) []byte {
	n := 4
	for i := range ts {
		n += entrySize(&ts[i])
	}
	b := make([]byte, 0, n)
	le := binary.LittleEndian
	b = le.AppendUint32(b, uint32(len(ts)))
	for i := range ts {
		t := &ts[i]
		b = le.AppendUint32(b, uint32(entrySize(t)))
		b = le.AppendUint16(b, uint16(len(t.Name)))
		b = append(b, t.Name...)
		b = append(b, byte(t.DType), byte(len(t.Shape)))
		b = le.AppendUint16(b, uint16(t.Shard))
		for _, d := range t.Shape {
			b = le.AppendUint64(b, uint64(d))
		}
		b = le.AppendUint64(b, uint64(t.Offset))
		b = le.AppendUint64(b, uint64(t.Size))
		b = le.AppendUint64(b, t.Hash)
	}
	return b
}

// parseDirectory decodes and checks the entries that do not need the data
// section (names, shapes, sizes); bounds are checked per shard by the reader.
func parseDirectory(b []byte, shards int) ([]Tensor, map[string]int, error) {
	le := binary.LittleEndian
	if len(b) < 4 {
		return nil, nil, fmt.Errorf("%w: directory is %d bytes", ErrCorrupt, len(b))
	}
	count := le.Uint32(b)
	const minEntry = 4 + 2 + 1 + 4 + 24
	if count > maxTensors || uint64(count)*minEntry > uint64(len(b)-4) {
		return nil, nil, fmt.Errorf("%w: directory claims %d tensors in %d bytes", ErrCorrupt, count, len(b))
	}
	ts := make([]Tensor, 0, count)
	byName := make(map[string]int, count)
	p := 4
	for i := 0; i < int(count); i++ {
		if len(b)-p < 4 {
			return nil, nil, fmt.Errorf("%w: directory entry %d truncated", ErrCorrupt, i)
		}
		elen := int(le.Uint32(b[p:]))
		if elen < minEntry || elen > len(b)-p {
			return nil, nil, fmt.Errorf("%w: directory entry %d has length %d (%d bytes left)", ErrCorrupt, i, elen, len(b)-p)
		}
		e := b[p : p+elen]
		p += elen
		nl := int(le.Uint16(e[4:]))
		if nl == 0 || nl > maxNameLen || 6+nl+4 > elen {
			return nil, nil, fmt.Errorf("%w: directory entry %d: name length %d", ErrCorrupt, i, nl)
		}
		name := string(e[6 : 6+nl])
		if !utf8.ValidString(name) {
			return nil, nil, fmt.Errorf("%w: directory entry %d: name is not UTF-8", ErrCorrupt, i)
		}
		q := 6 + nl
		t := Tensor{Name: name, DType: quant.DType(e[q]), Shard: int(le.Uint16(e[q+2:]))}
		nd := int(e[q+1])
		q += 4
		if nd > maxDims || q+8*nd+24 > elen {
			return nil, nil, fmt.Errorf("%w: tensor %q: %d dimensions in a %d-byte entry", ErrCorrupt, name, nd, elen)
		}
		t.Shape = make([]int, nd)
		for j := range t.Shape {
			d := le.Uint64(e[q:])
			if d > quant.MaxElements {
				return nil, nil, fmt.Errorf("%w: tensor %q: dimension %d is absurd", ErrCorrupt, name, d)
			}
			t.Shape[j] = int(d)
			q += 8
		}
		off, size := le.Uint64(e[q:]), le.Uint64(e[q+8:])
		t.Hash = le.Uint64(e[q+16:])
		if off > 1<<62 || size > 1<<62 {
			return nil, nil, fmt.Errorf("%w: tensor %q: offset %d / size %d out of range", ErrCorrupt, name, off, size)
		}
		t.Offset, t.Size = int64(off), int64(size)
		if t.Offset%TensorAlign != 0 {
			return nil, nil, fmt.Errorf("%w: tensor %q: offset %d is not %d-aligned", ErrCorrupt, name, t.Offset, TensorAlign)
		}
		if t.Shard >= shards {
			return nil, nil, fmt.Errorf("%w: tensor %q: shard %d of %d", ErrCorrupt, name, t.Shard, shards)
		}
		if t.DType.Known() {
			want, err := quant.ExpectedBytes(t.DType, t.Shape)
			if err != nil {
				return nil, nil, fmt.Errorf("%w: tensor %q: %v", ErrCorrupt, name, err)
			}
			if want != t.Size {
				return nil, nil, fmt.Errorf("%w: tensor %q: %s %v needs %d bytes, directory says %d", ErrCorrupt, name, t.DType, t.Shape, want, t.Size)
			}
		}
		if _, dup := byName[name]; dup {
			return nil, nil, fmt.Errorf("%w: tensor %q listed twice", ErrCorrupt, name)
		}
		byName[name] = len(ts)
		ts = append(ts, t)
	}
	if p != len(b) {
		return nil, nil, fmt.Errorf("%w: %d stray bytes after the directory", ErrCorrupt, len(b)-p)
	}
	return ts, byName, nil
}

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }
