package cmf

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

var updateSeeds = flag.Bool("update-seeds", false, "rewrite testdata/fuzz/FuzzDecode seed files")

// FuzzDecode feeds arbitrary bytes through the preamble, header and
// directory parsers and the bounds checks (hash checks off, so mutations
// reach the structure). It must never panic or read out of range.
func FuzzDecode(f *testing.F) {
	for _, b := range seedFiles(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeSingle(b, false)
		if err != nil {
			return
		}
		for i := range m.Tensors {
			_ = m.Data(&m.Tensors[i]) // must be in range
		}
	})
}

// FuzzDirectory fuzzes the binary tensor directory parser alone, seeded
// with the directories of valid files (small inputs mutate much faster).
func FuzzDirectory(f *testing.F) {
	for _, b := range seedFiles(f) {
		pre, err := parsePreamble(b, int64(len(b)), true)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[pre.DirOff:pre.DirOff+pre.DirN], 1)
	}
	f.Fuzz(func(t *testing.T, b []byte, shards int) {
		ts, byName, err := parseDirectory(b, max(1, shards%8))
		if err != nil {
			return
		}
		if len(ts) != len(byName) {
			t.Fatalf("%d tensors, %d names", len(ts), len(byName))
		}
		// A parsed directory marshals to bytes that parse to the same
		// entries (not necessarily the same bytes: entries may carry
		// trailing bytes of a newer minor version).
		ts2, _, err := parseDirectory(marshalDirectory(ts), max(1, shards%8))
		if err != nil || len(ts2) != len(ts) {
			t.Fatalf("re-parse: %v", err)
		}
		for i := range ts {
			a, b := ts[i], ts2[i]
			if a.Name != b.Name || a.DType != b.DType || a.Offset != b.Offset || a.Size != b.Size || a.Hash != b.Hash || !equalInts(a.Shape, b.Shape) {
				t.Fatalf("entry %d changed: %+v vs %+v", i, a, b)
			}
		}
	})
}

// FuzzHeader fuzzes the JSON header parser and the architecture checks.
func FuzzHeader(f *testing.F) {
	for _, b := range seedFiles(f) {
		pre, _ := parsePreamble(b, int64(len(b)), true)
		f.Add(b[pre.HeaderOff : pre.HeaderOff+pre.HeaderN])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHeader(b)
		if err != nil {
			return
		}
		_ = h.Arch.Validate()
	})
}

// seedFiles writes small valid models and returns their bytes; with
// -update-seeds it also stores them in the Go fuzz corpus format.
func seedFiles(tb testing.TB) [][]byte {
	dir := tb.TempDir()
	var out [][]byte
	for i, n := range []int{0, 1, 5} {
		p := filepath.Join(dir, fmt.Sprintf("s%d.cmf", i))
		write(tb, p, testHeader(), randTensors(rand.New(rand.NewPCG(uint64(i), 9)), n), WriteOptions{})
		b, err := os.ReadFile(p)
		if err != nil {
			tb.Fatal(err)
		}
		// Keep seeds small: the data section is mostly padding.
		out = append(out, b)
	}
	if *updateSeeds {
		put := func(target string, i int, vals ...string) {
			cd := filepath.Join("testdata", "fuzz", target)
			os.MkdirAll(cd, 0o755)
			s := "go test fuzz v1\n"
			for _, v := range vals {
				s += v + "\n"
			}
			if err := os.WriteFile(filepath.Join(cd, fmt.Sprintf("seed%d", i)), []byte(s), 0o644); err != nil {
				tb.Fatal(err)
			}
		}
		for i, b := range out {
			pre, _ := parsePreamble(b, int64(len(b)), true)
			put("FuzzDirectory", i, fmt.Sprintf("[]byte(%q)", b[pre.DirOff:pre.DirOff+pre.DirN]), "int(1)")
			put("FuzzHeader", i, fmt.Sprintf("[]byte(%q)", b[pre.HeaderOff:pre.HeaderOff+pre.HeaderN]))
		}
		put("FuzzDecode", 0, fmt.Sprintf("[]byte(%q)", out[1]))
	}
	return out
}

// TestDecodeMatchesOpen checks the fuzzed path agrees with Open on valid files.
func TestDecodeMatchesOpen(t *testing.T) {
	for _, b := range seedFiles(t) {
		m, err := decodeSingle(b, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Tensors) > 0 && len(m.Data(&m.Tensors[0])) != int(m.Tensors[0].Size) {
			t.Fatal("data view size")
		}
	}
}
