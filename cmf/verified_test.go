package cmf

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cortiq/cortiq/quant"
)

// openCounting opens path with opt and returns the model and how many data
// sections the open hashed.
func openCounting(t *testing.T, path string, opt OpenOptions) (*Model, int64, error) {
	t.Helper()
	before := dataHashes.Load()
	m, err := OpenWith(path, opt)
	return m, dataHashes.Load() - before, err
}

// TestOpenVerifiesOnce: the first open of a file hashes its weights, the
// second (same device, inode, size, mtime) does not, a changed mtime hashes
// again, and the cache lives under XDG_CACHE_HOME.
func TestOpenVerifiesOnce(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	p := filepath.Join(t.TempDir(), "m.cmf")
	write(t, p, testHeader(), randTensors(rand.New(rand.NewPCG(8, 1)), 5), WriteOptions{})
	for i, want := range []int64{1, 0, 0} {
		m, n, err := openCounting(t, p, OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m.Close()
		if n != want {
			t.Fatalf("open %d hashed %d data sections, want %d", i+1, n, want)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(cache, "cortiq", "verified"))
	if len(entries) != 1 {
		t.Fatalf("cache holds %d entries, want 1", len(entries))
	}
	// A new modification time is a new identity.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(p, later, later); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int64{1, 0} {
		m, n, err := openCounting(t, p, OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m.Close()
		if n != want {
			t.Fatalf("after touching, open %d hashed %d, want %d", i+1, n, want)
		}
	}
	// NoVerify hashes nothing, even for a file never seen.
	q := filepath.Join(t.TempDir(), "n.cmf")
	write(t, q, testHeader(), randTensors(rand.New(rand.NewPCG(8, 2)), 3), WriteOptions{})
	m, n, err := openCounting(t, q, OpenOptions{NoVerify: true})
	if err != nil || n != 0 {
		t.Fatalf("NoVerify: hashed %d, %v", n, err)
	}
	m.Close()
	// An explicit CacheDir is used instead.
	own := t.TempDir()
	for i, want := range []int64{1, 0} {
		m, n, err := openCounting(t, q, OpenOptions{CacheDir: own})
		if err != nil || n != want {
			t.Fatalf("CacheDir open %d: hashed %d, want %d (%v)", i+1, n, want, err)
		}
		m.Close()
	}
}

// TestOpenRefusesDamagedWeights: a flipped byte in a tensor or in the data
// section's padding makes Open fail, naming the file and the tensor or the
// data section; NoVerify opens it anyway; a file that verified is not
// trusted once its identity changes (rewriting it changes the mtime).
func TestOpenRefusesDamagedWeights(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	dir := t.TempDir()
	p := filepath.Join(dir, "m.cmf")
	write(t, p, testHeader(), randTensors(rand.New(rand.NewPCG(8, 3)), 6), WriteOptions{})
	m, err := OpenWith(p, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pre := *m.files[0].pre
	tt := m.Tensors[2]
	m.Close()
	good, _ := os.ReadFile(p)
	for _, c := range []struct {
		off  int64
		want string
	}{
		{int64(pre.DataOff) + tt.Offset + tt.Size/2, "tensor " + tt.Name},
		{int64(pre.DataOff+pre.DataN) - 1, "data"},
	} {
		b := append([]byte(nil), good...)
		b[c.off] ^= 4
		// The same name, rewritten: the old identity's cache entry must
		// not vouch for it (the mtime moves on).
		time.Sleep(10 * time.Millisecond)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		_, n, err := openCounting(t, p, OpenOptions{})
		if err == nil {
			t.Fatalf("flip at %d opened", c.off)
		}
		if n != 1 {
			t.Fatalf("flip at %d: hashed %d data sections", c.off, n)
		}
		if !errors.Is(err, ErrDamaged) || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) {
			t.Fatalf("flip at %d: error %q does not name %q in %s", c.off, err, c.want, p)
		}
		// Failures are not cached: the next open hashes (and fails) again.
		if _, n, err := openCounting(t, p, OpenOptions{}); err == nil || n != 1 {
			t.Fatalf("second open of a damaged file: hashed %d, %v", n, err)
		}
		m, err := OpenWith(p, OpenOptions{NoVerify: true})
		if err != nil {
			t.Fatalf("NoVerify: %v", err)
		}
		m.Close()
	}
}

// TestOpenCacheUnwritable: a cache that cannot be written is a warning:
// the open succeeds and the next one hashes again.
func TestOpenCacheUnwritable(t *testing.T) {
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "m.cmf")
	write(t, p, testHeader(), randTensors(rand.New(rand.NewPCG(8, 4)), 2), WriteOptions{})
	for i := range 2 {
		m, n, err := openCounting(t, p, OpenOptions{CacheDir: filepath.Join(blocker, "sub")})
		if err != nil {
			t.Fatalf("open %d with an unwritable cache: %v", i+1, err)
		}
		m.Close()
		if n != 1 {
			t.Fatalf("open %d hashed %d", i+1, n)
		}
	}
}

// TestOpenDirectory: a directory given as the model says so (it used to
// fail in mmap with "no such device"), and points a Hugging Face folder at
// convert.
func TestOpenDirectory(t *testing.T) {
	dir := t.TempDir()
	_, err := Open(dir)
	if err == nil || !strings.Contains(err.Error(), "is a directory, not a CMF model file") {
		t.Fatalf("directory: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "cortiq convert") {
		t.Fatalf("Hugging Face directory: %v", err)
	}
}

// BenchmarkOpenVerifyFirst is the first open of a 256 MiB file (the
// weight check on all cores; the cache in a temporary directory is
// cleared every iteration); BenchmarkVerify is the single-stream section
// hash of `cortiq verify` for comparison.
func BenchmarkOpenVerifyFirst(b *testing.B) {
	p := filepath.Join(b.TempDir(), "m.cmf")
	r := rand.New(rand.NewPCG(9, 9))
	var ts []tdata
	for i := range 16 {
		d := make([]byte, 16<<20)
		for j := 0; j < len(d); j += 8 {
			d[j] = byte(r.Uint32())
		}
		ts = append(ts, tdata{TensorSpec{Name: "w" + itoa(i), DType: quant.U8, Shape: []int{len(d)}}, d})
	}
	write(b, p, testHeader(), ts, WriteOptions{})
	cache := b.TempDir()
	b.SetBytes(256 << 20)
	for b.Loop() {
		os.RemoveAll(cache)
		m, err := OpenWith(p, OpenOptions{CacheDir: cache})
		if err != nil {
			b.Fatal(err)
		}
		m.Close()
	}
}
