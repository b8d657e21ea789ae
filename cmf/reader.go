package cmf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

// Model is an open CMF model: the header, the tensor directory and a
// read-only mapping of every shard file. Opening reads and checks the
// preamble, header and directory only; tensor bytes are paged in on use, so
// the cost of Open does not grow with the size of the weights.
type Model struct {
	Header  Header
	Tensors []Tensor // directory order
	Path    string   // the file that was opened (the primary mapping)

	byName  map[string]int
	primary int // shard index of Path
	files   []*mapped
}

type mapped struct {
	path string
	data []byte // whole file, read-only
	pre  *preamble
	st   os.FileInfo // of the mapped file, for its identity (nil in decodeSingle)
}

// openModel maps the CMF file at path read-only and, for a sharded model,
// the other files of its set from the same folder, checking everything but
// the data sections' hashes.
func openModel(path string) (*Model, error) {
	first, hdr, hb, dirb, err := openOne(path)
	if err != nil {
		return nil, err
	}
	m := &Model{Header: *hdr, Path: path}
	shards := 1
	if s := hdr.Shard; s != nil {
		if s.Count < 1 || s.Count > 1<<16-1 || s.Index < 0 || s.Index >= s.Count || len(s.Files) != s.Count {
			first.unmap()
			return nil, fmt.Errorf("%w: %s: shard %d of %d with %d file names", ErrCorrupt, path, s.Index, s.Count, len(s.Files))
		}
		shards = s.Count
		m.primary = s.Index
	}
	if h := hdr.SectionHashes; h == nil || h.Algo != "xxh3-64" || len(h.Data) != shards {
		first.unmap()
		return nil, fmt.Errorf("%w: %s: section_hashes missing or not one xxh3-64 digest per shard", ErrCorrupt, path)
	}
	m.files = make([]*mapped, shards)
	m.files[m.primary] = first
	m.Tensors, m.byName, err = parseDirectory(dirb, shards)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := m.Header.Arch.Validate(); err != nil {
		m.Close()
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	dirHash := first.pre.DirHash
	for i := 0; i < shards; i++ {
		if i == m.primary {
			continue
		}
		p := filepath.Join(filepath.Dir(path), filepath.Base(hdr.Shard.Files[i]))
		f, h2, _, _, err := openOne(p)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("cmf: shard %d of %s: %w", i+1, path, err)
		}
		m.files[i] = f
		if h2.Shard == nil || h2.Shard.SetID != hdr.Shard.SetID || h2.Shard.Index != i || f.pre.DirHash != dirHash {
			m.Close()
			return nil, fmt.Errorf("%w: %s is not shard %d of the set of %s", ErrCorrupt, p, i+1, path)
		}
	}
	_ = hb
	if err := m.checkBounds(); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// openOne maps one file and checks its preamble, header hash and directory hash.
func openOne(path string) (*mapped, *Header, []byte, []byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("cmf: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("cmf: %w", err)
	}
	if st.IsDir() {
		hint := "give the .cmf file"
		if _, err := os.Stat(filepath.Join(path, "config.json")); err == nil {
			hint = "it looks like a Hugging Face model: convert it first with `cortiq convert " + path + " -o model.cmf`"
		}
		return nil, nil, nil, nil, fmt.Errorf("cmf: %s is a directory, not a CMF model file (%s)", path, hint)
	}
	if !st.Mode().IsRegular() {
		return nil, nil, nil, nil, fmt.Errorf("cmf: %s is not a regular file (a CMF model is a file that can be memory-mapped)", path)
	}
	size := st.Size()
	if size < PreambleSize {
		return nil, nil, nil, nil, fmt.Errorf("%w: %s is %d bytes, shorter than the %d-byte preamble", ErrCorrupt, path, size, PreambleSize)
	}
	if size > 1<<50 {
		return nil, nil, nil, nil, fmt.Errorf("%w: %s: size %d is absurd", ErrCorrupt, path, size)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("cmf: mmap %s: %w", path, err)
	}
	mp, hdr, hb, dirb, err := decodeFile(data, path, true)
	if err != nil {
		_ = unix.Munmap(data)
		return nil, nil, nil, nil, err
	}
	mp.st = st
	return mp, hdr, hb, dirb, nil
}

// decodeFile checks a file's preamble and (if checkHashes) its header and
// directory hashes, and parses the header.
func decodeFile(data []byte, path string, checkHashes bool) (*mapped, *Header, []byte, []byte, error) {
	pre, err := parsePreamble(data, int64(len(data)), checkHashes)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	mp := &mapped{path: path, data: data, pre: pre}
	hb := data[pre.HeaderOff : pre.HeaderOff+pre.HeaderN]
	dirb := data[pre.DirOff : pre.DirOff+pre.DirN]
	if checkHashes {
		if h := xxh3.Hash(hb); h != pre.HeaderHash {
			return nil, nil, nil, nil, fmt.Errorf("%w: %s: header section hash %016x, preamble says %016x", ErrCorrupt, path, h, pre.HeaderHash)
		}
		if h := xxh3.Hash(dirb); h != pre.DirHash {
			return nil, nil, nil, nil, fmt.Errorf("%w: %s: directory section hash %016x, preamble says %016x", ErrCorrupt, path, h, pre.DirHash)
		}
	}
	hdr, err := parseHeader(hb)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if hdr.Version != VersionMajor {
		return nil, nil, nil, nil, fmt.Errorf("%w: %s: header version %d, preamble %d", ErrCorrupt, path, hdr.Version, pre.Major)
	}
	return mp, hdr, hb, dirb, nil
}

// decodeSingle builds a Model over the bytes of one unsharded file without
// mapping anything; the fuzz test drives the parser through it.
func decodeSingle(data []byte, checkHashes bool) (*Model, error) {
	mp, hdr, _, dirb, err := decodeFile(data, "mem", checkHashes)
	if err != nil {
		return nil, err
	}
	if hdr.Shard != nil && hdr.Shard.Count != 1 {
		return nil, fmt.Errorf("%w: sharded", ErrCorrupt)
	}
	if h := hdr.SectionHashes; h == nil || len(h.Data) != 1 {
		return nil, fmt.Errorf("%w: section_hashes", ErrCorrupt)
	}
	m := &Model{Header: *hdr, files: []*mapped{mp}}
	if m.Tensors, m.byName, err = parseDirectory(dirb, 1); err != nil {
		return nil, err
	}
	if err := m.Header.Arch.Validate(); err != nil {
		return nil, err
	}
	return m, m.checkBounds()
}

// checkBounds verifies every tensor lies inside its shard's data section
// and that no two tensors of a shard overlap.
func (m *Model) checkBounds() error {
	byShard := make([][]int, len(m.files))
	for i := range m.Tensors {
		t := &m.Tensors[i]
		dn := int64(m.files[t.Shard].pre.DataN)
		if t.Offset > dn || t.Size > dn-t.Offset {
			return fmt.Errorf("%w: %s: tensor %q [%d, +%d) lies outside the %d-byte data section", ErrCorrupt, m.files[t.Shard].path, t.Name, t.Offset, t.Size, dn)
		}
		byShard[t.Shard] = append(byShard[t.Shard], i)
	}
	for _, idx := range byShard {
		sort.Slice(idx, func(a, b int) bool { return m.Tensors[idx[a]].Offset < m.Tensors[idx[b]].Offset })
		for k := 1; k < len(idx); k++ {
			a, b := &m.Tensors[idx[k-1]], &m.Tensors[idx[k]]
			if a.Offset+a.Size > b.Offset {
				return fmt.Errorf("%w: tensors %q and %q overlap", ErrCorrupt, a.Name, b.Name)
			}
		}
	}
	return nil
}

func (mp *mapped) unmap() {
	if mp != nil && mp.data != nil {
		_ = unix.Munmap(mp.data)
		mp.data = nil
	}
}

// Close unmaps the files. Slices returned by Data become invalid.
func (m *Model) Close() error {
	for _, f := range m.files {
		f.unmap()
	}
	m.files = nil
	return nil
}

// Tensor looks a tensor up by name.
func (m *Model) Tensor(name string) (*Tensor, bool) {
	i, ok := m.byName[name]
	if !ok {
		return nil, false
	}
	return &m.Tensors[i], true
}

// ErrNotFound reports a tensor name that is not in the directory.
var ErrNotFound = errors.New("cmf: no such tensor")

// Data returns the bytes of a tensor, a read-only view into the mapping.
func (m *Model) Data(t *Tensor) []byte {
	f := m.files[t.Shard]
	off := int64(f.pre.DataOff) + t.Offset
	return f.data[off : off+t.Size : off+t.Size]
}

// TensorData looks a tensor up and returns it with its bytes.
func (m *Model) TensorData(name string) (*Tensor, []byte, error) {
	t, ok := m.Tensor(name)
	if !ok {
		return nil, nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return t, m.Data(t), nil
}

// AbsOffset returns the tensor's offset within the primary mapping
// (PrimaryBytes), or false when its bytes live in another shard file.
func (m *Model) AbsOffset(t *Tensor) (int64, bool) {
	if t.Shard != m.primary {
		return 0, false
	}
	return int64(m.files[m.primary].pre.DataOff) + t.Offset, true
}

// PrimaryBytes is the whole mapping of the opened file.
func (m *Model) PrimaryBytes() []byte { return m.files[m.primary].data }

// Shards returns the number of files of the model.
func (m *Model) Shards() int { return len(m.files) }

// ShardPath returns the path of shard i.
func (m *Model) ShardPath(i int) string { return m.files[i].path }

// Madvise hints the kernel about how a tensor will be read, e.g.
// unix.MADV_WILLNEED before first use or unix.MADV_SEQUENTIAL for a scan.
func (m *Model) Madvise(t *Tensor, advice int) error {
	f := m.files[t.Shard]
	off := int64(f.pre.DataOff) + t.Offset
	start := off &^ (int64(os.Getpagesize()) - 1)
	if t.Size == 0 {
		return nil
	}
	if err := unix.Madvise(f.data[start:off+t.Size], advice); err != nil {
		return fmt.Errorf("cmf: madvise %q: %w", t.Name, err)
	}
	return nil
}

// SectionInfo describes one section of one file for inspect output.
type SectionInfo struct {
	File   string
	Name   string // header, directory, data
	Offset int64
	Size   int64
	Hash   string
}

// Sections lists the sections of every file of the model.
func (m *Model) Sections() []SectionInfo {
	var out []SectionInfo
	for i, f := range m.files {
		p := f.pre
		out = append(out,
			SectionInfo{f.path, "header", int64(p.HeaderOff), int64(p.HeaderN), fmt.Sprintf("%016x", p.HeaderHash)},
			SectionInfo{f.path, "directory", int64(p.DirOff), int64(p.DirN), fmt.Sprintf("%016x", p.DirHash)},
			SectionInfo{f.path, "data", int64(p.DataOff), int64(p.DataN), m.Header.SectionHashes.Data[i]})
	}
	return out
}
