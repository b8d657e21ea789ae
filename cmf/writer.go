package cmf

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/zeebo/xxh3"

	"github.com/cortiq/cortiq/quant"
)

// TensorSpec declares a tensor before its bytes are written.
type TensorSpec struct {
	Name  string
	DType quant.DType
	Shape []int
}

// WriteOptions tune Create.
type WriteOptions struct {
	// ShardBytes, if > 0, starts a new shard file whenever the next tensor
	// would push a shard's data section past this many bytes. A tensor
	// larger than the limit gets a shard of its own.
	ShardBytes int64
}

// Writer streams a CMF file (or a set of shard files) to disk: the tensor
// list is declared up front, then each tensor's bytes are written in that
// order and hashed on the way. Nothing is visible at the final path until
// Close renames the finished temporary files; Abort removes them.
type Writer struct {
	hdr     Header
	tensors []Tensor
	shards  []*shardOut
	cur     int   // index of the tensor being written, or next to begin
	open    bool  // a tensor has begun and not ended
	written int64 // bytes of the current tensor so far
	th      *xxh3.Hasher
	err     error // sticky
	done    bool
}

type shardOut struct {
	final, tmp string
	f          *os.File
	pre        preamble
	hdrBytes   int // length of the placeholder header
	dataHash   *xxh3.Hasher
	pos        int64 // bytes written into the data section so far
}

// Create starts writing the model at path. The header's Shard and
// SectionHashes fields are filled in by the writer.
func Create(path string, hdr *Header, specs []TensorSpec, opt WriteOptions) (*Writer, error) {
	if err := hdr.Arch.Validate(); err != nil {
		return nil, err
	}
	w := &Writer{hdr: *hdr, th: xxh3.New()}
	w.hdr.Format, w.hdr.Version = "cmf", VersionMajor
	if w.hdr.Skills == nil {
		w.hdr.Skills = []Skill{}
	}
	seen := make(map[string]bool, len(specs))
	var shardData []int64 = []int64{0}
	for _, s := range specs {
		if s.Name == "" || len(s.Name) > maxNameLen || seen[s.Name] {
			return nil, fmt.Errorf("cmf: tensor name %q is empty, too long or repeated", s.Name)
		}
		seen[s.Name] = true
		if len(s.Shape) > maxDims {
			return nil, fmt.Errorf("cmf: tensor %q has %d dimensions (max %d)", s.Name, len(s.Shape), maxDims)
		}
		size, err := quant.ExpectedBytes(s.DType, s.Shape)
		if err != nil {
			return nil, fmt.Errorf("cmf: tensor %q: %w", s.Name, err)
		}
		sh := len(shardData) - 1
		off := alignUp(shardData[sh], TensorAlign)
		if opt.ShardBytes > 0 && off > 0 && off+size > opt.ShardBytes {
			shardData = append(shardData, 0)
			sh, off = sh+1, 0
		}
		shardData[sh] = off + size
		w.tensors = append(w.tensors, Tensor{Name: s.Name, DType: s.DType, Shape: append([]int(nil), s.Shape...), Shard: sh, Offset: off, Size: size})
	}
	n := len(shardData)
	if n > 1<<16-1 {
		return nil, fmt.Errorf("cmf: %d shards is too many", n)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	names := shardNames(path, n)
	w.hdr.SectionHashes = &SectionHashes{Algo: "xxh3-64", Data: make([]string, n)}
	for i := range w.hdr.SectionHashes.Data {
		w.hdr.SectionHashes.Data[i] = strings.Repeat("0", 16)
	}
	if n > 1 {
		base := make([]string, n)
		for i, p := range names {
			base[i] = filepath.Base(p)
		}
		w.hdr.Shard = &Shard{Count: n, SetID: hex.EncodeToString(id[:]), Files: base}
	} else {
		w.hdr.Shard = nil
	}
	dir := marshalDirectory(w.tensors)
	for i := 0; i < n; i++ {
		so, err := w.startShard(names[i], i, dir, shardData[i])
		if err != nil {
			w.Abort()
			return nil, err
		}
		w.shards = append(w.shards, so)
	}
	return w, nil
}

// shardNames returns the output file names: path itself, or for n > 1
// "base-00001-of-0000n.cmf" beside it.
func shardNames(path string, n int) []string {
	if n == 1 {
		return []string{path}
	}
	ext := filepath.Ext(path)
	stem := strings.TrimSuffix(path, ext)
	if ext == "" {
		ext = ".cmf"
	}
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%05d-of-%05d%s", stem, i+1, n, ext)
	}
	return out
}

func (w *Writer) headerFor(i int) ([]byte, error) {
	h := w.hdr
	if h.Shard != nil {
		s := *h.Shard
		s.Index = i
		h.Shard = &s
	}
	return json.MarshalIndent(&h, "", " ")
}

func (w *Writer) startShard(final string, i int, dir []byte, dataN int64) (*shardOut, error) {
	hb, err := w.headerFor(i)
	if err != nil {
		return nil, fmt.Errorf("cmf: header: %w", err)
	}
	f, err := createTemp(final)
	if err != nil {
		return nil, fmt.Errorf("cmf: %w", err)
	}
	so := &shardOut{final: final, tmp: f.Name(), f: f, dataHash: xxh3.New()}
	so.hdrBytes = len(hb)
	p := &so.pre
	p.Major, p.Minor, p.HashAlgo = VersionMajor, VersionMinor, HashXXH3
	p.HeaderOff, p.HeaderN = PreambleSize, uint64(len(hb))
	p.DirOff, p.DirN = p.HeaderOff+p.HeaderN, uint64(len(dir))
	p.DataOff = uint64(alignUp(int64(p.DirOff+p.DirN), DataAlign))
	p.DataN = uint64(alignUp(dataN, FileEndAlign))
	buf := make([]byte, p.DataOff)
	copy(buf, p.marshal())
	copy(buf[p.HeaderOff:], hb)
	copy(buf[p.DirOff:], dir)
	if _, err := f.Write(buf); err != nil {
		f.Close()
		os.Remove(so.tmp)
		return nil, fmt.Errorf("cmf: write %s: %w", final, err)
	}
	return so, nil
}

// createTemp creates a new file beside final with mode 0644 (less the
// umask, as for any file the user creates; os.CreateTemp would make it
// 0600 and the renamed model unreadable to other users).
func createTemp(final string) (*os.File, error) {
	for i := 0; ; i++ {
		var r [6]byte
		_, _ = rand.Read(r[:])
		name := filepath.Join(filepath.Dir(final), "."+filepath.Base(final)+".tmp-"+hex.EncodeToString(r[:]))
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil || !os.IsExist(err) || i > 100 {
			return f, err
		}
	}
}

// Tensors returns the directory in write order, with shard and offset assigned.
func (w *Writer) Tensors() []Tensor { return w.tensors }

// Begin starts the next tensor, which must be the one named.
func (w *Writer) Begin(name string) error {
	if w.err != nil {
		return w.err
	}
	if w.open {
		return w.fail(fmt.Errorf("cmf: Begin(%q) while tensor %q is still open", name, w.tensors[w.cur].Name))
	}
	if w.cur >= len(w.tensors) {
		return w.fail(fmt.Errorf("cmf: Begin(%q): all %d declared tensors are written", name, len(w.tensors)))
	}
	t := &w.tensors[w.cur]
	if t.Name != name {
		return w.fail(fmt.Errorf("cmf: tensors must be written in declared order: got %q, want %q", name, t.Name))
	}
	so := w.shards[t.Shard]
	if pad := t.Offset - so.pos; pad > 0 {
		if err := so.write(make([]byte, pad)); err != nil {
			return w.fail(err)
		}
	}
	w.open, w.written = true, 0
	w.th.Reset()
	return nil
}

// Write appends bytes to the open tensor.
func (w *Writer) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if !w.open {
		return 0, w.fail(errors.New("cmf: Write without Begin"))
	}
	t := &w.tensors[w.cur]
	if w.written+int64(len(p)) > t.Size {
		return 0, w.fail(fmt.Errorf("cmf: tensor %q: %d bytes written, declared size is %d", t.Name, w.written+int64(len(p)), t.Size))
	}
	if err := w.shards[t.Shard].write(p); err != nil {
		return 0, w.fail(err)
	}
	_, _ = w.th.Write(p)
	w.written += int64(len(p))
	return len(p), nil
}

// End finishes the open tensor; its size must be exactly as declared.
func (w *Writer) End() error {
	if w.err != nil {
		return w.err
	}
	if !w.open {
		return w.fail(errors.New("cmf: End without Begin"))
	}
	t := &w.tensors[w.cur]
	if w.written != t.Size {
		return w.fail(fmt.Errorf("cmf: tensor %q: wrote %d bytes, declared size is %d", t.Name, w.written, t.Size))
	}
	t.Hash = w.th.Sum64()
	w.open = false
	w.cur++
	return nil
}

// WriteZeros appends n zero bytes to the open tensor without writing them:
// the file gets a hole (sparse on most file systems). The hashes still
// cover the zeros. Synthetic and test models use it.
func (w *Writer) WriteZeros(n int64) error {
	if w.err != nil {
		return w.err
	}
	if !w.open {
		return w.fail(errors.New("cmf: WriteZeros without Begin"))
	}
	t := &w.tensors[w.cur]
	if n < 0 || w.written+n > t.Size {
		return w.fail(fmt.Errorf("cmf: tensor %q: %d bytes written, declared size is %d", t.Name, w.written+n, t.Size))
	}
	so := w.shards[t.Shard]
	if _, err := so.f.Seek(n, io.SeekCurrent); err != nil {
		return w.fail(fmt.Errorf("cmf: %w", err))
	}
	zero := make([]byte, min(n, 1<<20))
	for left := n; left > 0; {
		k := min(left, int64(len(zero)))
		_, _ = w.th.Write(zero[:k])
		_, _ = so.dataHash.Write(zero[:k])
		left -= k
	}
	so.pos += n
	w.written += n
	return nil
}

// WriteTensor writes a whole tensor: Begin, Write, End.
func (w *Writer) WriteTensor(name string, data []byte) error {
	if err := w.Begin(name); err != nil {
		return err
	}
	if _, err := w.Write(data); err != nil {
		return err
	}
	return w.End()
}

func (so *shardOut) write(p []byte) error {
	if _, err := so.f.Write(p); err != nil {
		return fmt.Errorf("cmf: write %s: %w", so.final, err)
	}
	_, _ = so.dataHash.Write(p)
	so.pos += int64(len(p))
	return nil
}

func (w *Writer) fail(err error) error {
	if w.err == nil {
		w.err = err
	}
	return err
}

// Close pads the data sections, writes the final header and directory
// (now with hashes), syncs and renames each file into place. On error the
// temporary files are removed and nothing appears at the final paths.
func (w *Writer) Close() error {
	if w.done {
		return w.err
	}
	if w.err == nil && (w.open || w.cur != len(w.tensors)) {
		w.fail(fmt.Errorf("cmf: Close after %d of %d tensors", w.cur, len(w.tensors)))
	}
	if w.err != nil {
		w.Abort()
		return w.err
	}
	for i, so := range w.shards {
		if pad := int64(so.pre.DataN) - so.pos; pad > 0 {
			if err := so.write(make([]byte, pad)); err != nil {
				w.fail(err)
				w.Abort()
				return w.err
			}
		}
		w.hdr.SectionHashes.Data[i] = fmt.Sprintf("%016x", so.dataHash.Sum64())
	}
	dir := marshalDirectory(w.tensors)
	for i, so := range w.shards {
		hb, err := w.headerFor(i)
		if err == nil && len(hb) != so.hdrBytes {
			err = fmt.Errorf("cmf: header changed size while writing (%d → %d)", so.hdrBytes, len(hb))
		}
		if err == nil {
			so.pre.HeaderHash = xxh3.Hash(hb)
			so.pre.DirHash = xxh3.Hash(dir)
			if _, err = so.f.WriteAt(so.pre.marshal(), 0); err == nil {
				if _, err = so.f.WriteAt(hb, int64(so.pre.HeaderOff)); err == nil {
					_, err = so.f.WriteAt(dir, int64(so.pre.DirOff))
				}
			}
		}
		if err == nil {
			err = so.f.Truncate(int64(so.pre.DataOff + so.pre.DataN))
		}
		if err == nil {
			err = so.f.Sync()
		}
		if cerr := so.f.Close(); err == nil {
			err = cerr
		}
		so.f = nil
		if err != nil {
			w.fail(fmt.Errorf("cmf: finish %s: %w", so.final, err))
			w.Abort()
			return w.err
		}
	}
	for k, so := range w.shards {
		if err := os.Rename(so.tmp, so.final); err != nil {
			// Take back the shards already in place: a set is whole or absent.
			for _, prev := range w.shards[:k] {
				os.Remove(prev.final)
			}
			w.fail(fmt.Errorf("cmf: %w", err))
			w.Abort()
			return w.err
		}
		so.tmp = ""
	}
	if d, err := os.Open(filepath.Dir(w.shards[0].final)); err == nil {
		_ = d.Sync() // make the renames durable
		d.Close()
	}
	w.done = true
	return nil
}

// Abort discards everything written; safe to call more than once and after
// a failed Close.
func (w *Writer) Abort() {
	for _, so := range w.shards {
		if so.f != nil {
			so.f.Close()
			so.f = nil
		}
		if so.tmp != "" {
			os.Remove(so.tmp)
			so.tmp = ""
		}
	}
	if w.err == nil {
		w.err = errors.New("cmf: write aborted")
	}
	w.done = true
}

// Files returns the final paths of the files this writer produces.
func (w *Writer) Files() []string {
	out := make([]string, len(w.shards))
	for i, so := range w.shards {
		out[i] = so.final
	}
	return out
}
