package cmf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/zeebo/xxh3"
)

// OpenOptions tune OpenWith. The zero value verifies the weights once per
// file identity, remembered in the user's cache directory.
type OpenOptions struct {
	// NoVerify skips hashing the data sections (the preamble, header and
	// directory are always checked).
	NoVerify bool
	// CacheDir is where verified file identities are remembered; "" means
	// os.UserCacheDir()/cortiq/verified (XDG_CACHE_HOME is honoured).
	CacheDir string
	// Progress, when set, is called with bytes hashed and bytes to hash
	// while data sections are verified.
	Progress func(done, total int64)
	// Context cancels verification; nil means context.Background().
	Context context.Context
}

// ErrDamaged reports weights whose bytes do not match their hashes; it
// wraps ErrCorrupt.
var ErrDamaged = fmt.Errorf("%w: weights do not match their hashes", ErrCorrupt)

// dataHashes counts the data sections hashed by OpenWith (tests read it
// to tell a cached open from one that hashed).
var dataHashes atomic.Int64

// Open maps the CMF file at path read-only (and, for a sharded model, the
// other files of its set from the same folder), checks the preamble,
// header and directory, and verifies the weights once per file identity:
// OpenWith with the zero OpenOptions.
func Open(path string) (*Model, error) { return OpenWith(path, OpenOptions{}) }

// OpenWith is Open with options. Each file's weights are checked (every
// tensor against its directory hash, on all cores, and the padding, which
// must be zero) unless opt.NoVerify or the cache records that a file with
// the same device, inode, size and modification time and the same expected
// data digest verified before; a success is recorded (failing to record it
// is a warning). A mismatch is an error matching ErrDamaged that names the
// file and the tensors whose bytes differ (or the data section, for
// padding).
func OpenWith(path string, opt OpenOptions) (*Model, error) {
	m, err := openModel(path)
	if err != nil || opt.NoVerify {
		return m, err
	}
	if err := m.verifyOnce(opt); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// verifyOnce hashes the data sections not already recorded as verified.
func (m *Model) verifyOnce(opt OpenOptions) error {
	ctx := opt.Context
	if ctx == nil {
		ctx = context.Background()
	}
	dir := opt.CacheDir
	if dir == "" {
		if d, err := os.UserCacheDir(); err == nil {
			dir = filepath.Join(d, "cortiq", "verified")
		}
	}
	keys := make([]string, len(m.files))
	var todo []int
	var total int64
	for i, f := range m.files {
		keys[i] = m.identity(i)
		if keys[i] != "" && dir != "" {
			if b, err := os.ReadFile(filepath.Join(dir, cacheName(keys[i]))); err == nil && string(b) == keys[i] {
				continue
			}
		}
		todo = append(todo, i)
		total += int64(f.pre.DataN)
	}
	var done int64
	for _, i := range todo {
		base := done
		var prog func(d, _ int64)
		if opt.Progress != nil {
			prog = func(d, _ int64) { opt.Progress(base+d, total) }
		}
		probs, err := m.checkWeights(ctx, i, prog)
		dataHashes.Add(1)
		if err != nil {
			return fmt.Errorf("cmf: verifying %s: %w", m.files[i].path, err)
		}
		if len(probs) > 0 {
			return damaged(m.files[i].path, probs)
		}
		done += int64(m.files[i].pre.DataN)
		if keys[i] == "" || dir == "" {
			continue
		}
		if err := writeCacheEntry(dir, keys[i]); err != nil {
			slog.Warn("cmf: could not record the verified file; it will be hashed again next time", "file", m.files[i].path, "err", err)
		}
	}
	return nil
}

// damaged builds the error of a failed verification.
func damaged(path string, probs []Problem) error {
	var secs []string
	for _, p := range probs {
		secs = append(secs, p.Section)
	}
	const show = 4
	more := ""
	if len(secs) > show {
		more = fmt.Sprintf(" and %d more", len(secs)-show)
		secs = secs[:show]
	}
	return fmt.Errorf("%w: %s: %s%s; the file is damaged (re-download or re-convert it; --no-verify runs it anyway)", ErrDamaged, path, strings.Join(secs, ", "), more)
}

// identity is the cache key of shard i: its device, inode, size and
// modification time with the digest its data section must have, or "" when
// the file cannot be identified.
func (m *Model) identity(i int) string {
	st := m.files[i].st
	if st == nil {
		return ""
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return fmt.Sprintf("cmf-verified v1 dev=%d ino=%d size=%d mtime=%d data=%s\n",
		uint64(sys.Dev), uint64(sys.Ino), st.Size(), st.ModTime().UnixNano(), m.Header.SectionHashes.Data[i])
}

func cacheName(key string) string { return fmt.Sprintf("%016x", xxh3.HashString(key)) }

// writeCacheEntry records key atomically (a temporary file renamed).
func writeCacheEntry(dir, key string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	_, werr := tmp.WriteString(key)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, cacheName(key))); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}
