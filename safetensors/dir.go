package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// SingleFile and IndexFile are the names transformers uses for a
// checkpoint in one file and for the index of a sharded one.
const (
	SingleFile = "model.safetensors"
	IndexFile  = "model.safetensors.index.json"
)

// maxIndexLen bounds the index JSON read into memory.
const maxIndexLen = 64 << 20

// OpenDir opens the checkpoint in dir: the shards named by
// model.safetensors.index.json when it exists, else model.safetensors.
// Failing both, a lone *.safetensors.index.json or a lone *.safetensors
// file is used. The result is one merged view over all shards.
func OpenDir(dir string) (*File, error) {
	if p := filepath.Join(dir, IndexFile); exists(p) {
		return OpenIndex(p)
	}
	if p := filepath.Join(dir, SingleFile); exists(p) {
		return Open(p)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*.safetensors.index.json")); len(m) == 1 {
		return OpenIndex(m[0])
	}
	m, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	switch len(m) {
	case 1:
		return Open(m[0])
	case 0:
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("safetensors: %w", err)
		}
		return nil, fmt.Errorf("safetensors: %s holds no %s, %s or other .safetensors file", dir, IndexFile, SingleFile)
	default:
		return nil, fmt.Errorf("safetensors: %s holds %d .safetensors files but no %s to say how they fit together", dir, len(m), IndexFile)
	}
}

func exists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// index is the sharded-checkpoint index written by transformers.
type index struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

// OpenIndex opens the shards listed in a safetensors index file (weight_map
// from tensor name to shard file, relative to the index's directory) as one
// merged view. It is an error for a listed file to be missing, for a shard
// to lack a tensor the index assigns to it, or for a tensor to appear in
// two shards. Tensors present in a shard but absent from weight_map are
// included, as transformers loads them too.
func OpenIndex(path string) (*File, error) {
	raw, err := readLimited(path, maxIndexLen)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	var idx index
	if err := json.Unmarshal(raw, &idx); err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w: %v", path, ErrFormat, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("safetensors: %s: %w: no weight_map entries", path, ErrFormat)
	}
	dir := filepath.Dir(path)
	byFile := map[string][]string{}
	for name, file := range idx.WeightMap {
		if !filepath.IsLocal(file) || strings.ContainsRune(file, '\\') {
			return nil, fmt.Errorf("safetensors: %s: %w: weight_map file %q for %q is not a plain relative path", path, ErrFormat, file, name)
		}
		byFile[file] = append(byFile[file], name)
	}
	files := slices.Sorted(maps.Keys(byFile))

	f := &File{entries: map[string]entry{}, meta: map[string]string{}}
	fail := func(err error) (*File, error) {
		_ = f.Close()
		return nil, err
	}
	for _, file := range files {
		p := filepath.Join(dir, file)
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			return fail(fmt.Errorf("safetensors: %s: weight_map names %s, which is missing", path, file))
		}
		s, infos, meta, err := openShard(p)
		if err != nil {
			return fail(err)
		}
		f.shards = append(f.shards, s)
		for k, v := range meta {
			if _, ok := f.meta[k]; !ok {
				f.meta[k] = v
			}
		}
		for _, in := range infos {
			if prev, dup := f.entries[in.Name]; dup {
				return fail(fmt.Errorf("safetensors: tensor %q is in both %s and %s", in.Name, prev.info.Path, p))
			}
			f.entries[in.Name] = entry{in, s}
		}
		for _, name := range byFile[file] {
			if e, ok := f.entries[name]; !ok || e.shard != s {
				return fail(fmt.Errorf("safetensors: %s: weight_map puts %q in %s, which has no such tensor", path, name, file))
			}
		}
	}
	f.finish()
	return f, nil
}

func readLimited(path string, limit int64) ([]byte, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	b, err := io.ReadAll(io.LimitReader(fd, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is more than %d bytes", path, limit)
	}
	return b, nil
}
