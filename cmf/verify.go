package cmf

import (
	"context"
	"fmt"
	"sort"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

// Problem is one failed check of Verify.
type Problem struct {
	File    string
	Section string // "data" or "tensor NAME"
	Detail  string
}

func (p Problem) String() string { return fmt.Sprintf("%s: %s: %s", p.File, p.Section, p.Detail) }

// Verify recomputes the hash of every data section and every tensor (the
// header and directory hashes are checked by Open) and returns what does
// not match. progress, if not nil, is called with bytes done and total.
func (m *Model) Verify(ctx context.Context, progress func(done, total int64)) ([]Problem, error) {
	var total, done int64
	for _, f := range m.files {
		total += int64(f.pre.DataN)
	}
	var probs []Problem
	for si, f := range m.files {
		base := done
		var prog func(d, _ int64)
		if progress != nil {
			prog = func(d, _ int64) { progress(base+d, total) }
		}
		p, err := m.verifyShard(ctx, si, prog)
		probs = append(probs, p...)
		if err != nil {
			return probs, err
		}
		done += int64(f.pre.DataN)
	}
	return probs, nil
}

// verifyShard hashes the data section of file si and each of its tensors;
// progress gets the bytes done and the section's size.
func (m *Model) verifyShard(ctx context.Context, si int, progress func(done, total int64)) ([]Problem, error) {
	f := m.files[si]
	total := int64(f.pre.DataN)
	var done int64
	var probs []Problem
	var idx []int
	for i := range m.Tensors {
		if m.Tensors[i].Shard == si {
			idx = append(idx, i)
		}
	}
	sort.Slice(idx, func(a, b int) bool { return m.Tensors[idx[a]].Offset < m.Tensors[idx[b]].Offset })
	data := f.data[f.pre.DataOff : f.pre.DataOff+f.pre.DataN]
	_ = unix.Madvise(data, unix.MADV_SEQUENTIAL)
	sec := xxh3.New()
	feed := func(b []byte) error {
		const chunk = 16 << 20
		for len(b) > 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(len(b), chunk)
			_, _ = sec.Write(b[:n])
			b = b[n:]
			done += int64(n)
			if progress != nil {
				progress(done, total)
			}
		}
		return nil
	}
	var pos int64
	for _, i := range idx {
		t := &m.Tensors[i]
		if err := feed(data[pos:t.Offset]); err != nil {
			return probs, err
		}
		b := data[t.Offset : t.Offset+t.Size]
		if h := xxh3.Hash(b); h != t.Hash {
			probs = append(probs, Problem{f.path, "tensor " + t.Name, fmt.Sprintf("hash %016x, directory says %016x", h, t.Hash)})
		}
		if err := feed(b); err != nil {
			return probs, err
		}
		pos = t.Offset + t.Size
	}
	if err := feed(data[pos:]); err != nil {
		return probs, err
	}
	if got, want := fmt.Sprintf("%016x", sec.Sum64()), m.Header.SectionHashes.Data[si]; got != want {
		probs = append(probs, Problem{f.path, "data", fmt.Sprintf("section hash %s, header says %s", got, want)})
	}
	_ = unix.Madvise(data, unix.MADV_NORMAL)
	return probs, nil
}

// sectionHash hashes the data section of file si in chunks (the fast check
// at open: one pass, no per-tensor hashes) and reports whether it matches
// the header's digest.
func (m *Model) sectionHash(ctx context.Context, si int, progress func(done, total int64)) (bool, error) {
	f := m.files[si]
	data := f.data[f.pre.DataOff : f.pre.DataOff+f.pre.DataN]
	_ = unix.Madvise(data, unix.MADV_SEQUENTIAL)
	defer unix.Madvise(data, unix.MADV_NORMAL)
	sec := xxh3.New()
	const chunk = 16 << 20
	total := int64(len(data))
	for done := int64(0); done < total; {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		n := min(total-done, chunk)
		_, _ = sec.Write(data[done : done+n])
		done += n
		if progress != nil {
			progress(done, total)
		}
	}
	return fmt.Sprintf("%016x", sec.Sum64()) == m.Header.SectionHashes.Data[si], nil
}
