package cmf

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"sync"

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

// checkWeights is the check at open: every tensor of file si against its
// directory hash, on all cores (largest tensors first), and the padding
// between and after them, which the format fixes at zero. Together these
// cover the same bytes as the section hash (with zero padding, as every
// writer produces) while spreading over the cores; only Verify computes
// the section hash itself.
func (m *Model) checkWeights(ctx context.Context, si int, progress func(done, total int64)) ([]Problem, error) {
	f := m.files[si]
	data := f.data[f.pre.DataOff : f.pre.DataOff+f.pre.DataN]
	_ = unix.Madvise(data, unix.MADV_SEQUENTIAL)
	defer unix.Madvise(data, unix.MADV_NORMAL)
	var idx []int
	for i := range m.Tensors {
		if m.Tensors[i].Shard == si {
			idx = append(idx, i)
		}
	}
	sort.Slice(idx, func(a, b int) bool { return m.Tensors[idx[a]].Offset < m.Tensors[idx[b]].Offset })
	var probs []Problem
	var pos int64
	checkPad := func(a, b int64) {
		for k, c := range data[a:b] {
			if c != 0 {
				probs = append(probs, Problem{f.path, "data", fmt.Sprintf("padding byte at offset %d of the data section is %#02x, not zero", a+int64(k), c)})
				return
			}
		}
	}
	for _, i := range idx {
		t := &m.Tensors[i]
		checkPad(pos, t.Offset)
		pos = t.Offset + t.Size
	}
	checkPad(pos, int64(len(data)))

	work := append([]int(nil), idx...)
	sort.SliceStable(work, func(a, b int) bool { return m.Tensors[work[a]].Size > m.Tensors[work[b]].Size })
	total := int64(len(data))
	var (
		mu   sync.Mutex
		done int64
		next int
		bad  []int
		werr error
	)
	report := func(n int64) {
		mu.Lock()
		defer mu.Unlock()
		done += n
		if progress != nil {
			progress(done, total)
		}
	}
	workers := min(runtime.GOMAXPROCS(0), max(len(work), 1))
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			const chunk = 16 << 20
			for {
				mu.Lock()
				if next == len(work) || werr != nil {
					mu.Unlock()
					return
				}
				i := work[next]
				next++
				mu.Unlock()
				t := &m.Tensors[i]
				b := data[t.Offset : t.Offset+t.Size]
				h := xxh3.New()
				for len(b) > 0 {
					if err := ctx.Err(); err != nil {
						mu.Lock()
						werr = err
						mu.Unlock()
						return
					}
					n := min(len(b), chunk)
					_, _ = h.Write(b[:n])
					b = b[n:]
					report(int64(n))
				}
				if h.Sum64() != t.Hash {
					mu.Lock()
					bad = append(bad, i)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if werr != nil {
		return probs, werr
	}
	sort.Ints(bad)
	var tp []Problem
	for _, i := range bad {
		t := &m.Tensors[i]
		tp = append(tp, Problem{f.path, "tensor " + t.Name, fmt.Sprintf("bytes do not match the directory's hash %016x", t.Hash)})
	}
	return append(tp, probs...), nil
}
