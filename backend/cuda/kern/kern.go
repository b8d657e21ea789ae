// Package kern holds cortiq's CUDA kernels as built by scripts/build-cuda
// from csrc/*.cu: a cubin for sm_90a (the H200; sm_90 when built with
// nvcc 11.8), PTX for compute_90 that the driver compiles for other GPUs,
// and a manifest naming the compiler, the sha256 of the sources and every
// kernel with its parameter sizes. A test fails when the manifest's source
// hash differs from csrc, so a stale build cannot land.
package kern

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
)

//go:embed build
var buildFS embed.FS

// BuildDirEnv names an environment variable that, when set, points at a
// folder written by scripts/build-cuda to use instead of the embedded build
// (how scripts/gpu-check tests a build made on the GPU machine with test
// binaries compiled elsewhere).
const BuildDirEnv = "CORTIQ_CUDA_BUILD_DIR"

// build returns the build in use: the folder named by BuildDirEnv, or the
// embedded one.
func build() (fs.FS, string) {
	if dir := os.Getenv(BuildDirEnv); dir != "" {
		return os.DirFS(dir), dir
	}
	sub, _ := fs.Sub(buildFS, "build")
	return sub, "embedded"
}

// Manifest describes the embedded build (build/manifest.json).
type Manifest struct {
	Status        string   `json:"status"` // "built", or "no build"
	NVCC          string   `json:"nvcc"`
	NVCCBuild     string   `json:"nvcc_build"`
	Cubin         Artifact `json:"cubin"`
	PTX           Artifact `json:"ptx"`
	SourcesSHA256 string   `json:"sources_sha256"`
	Kernels       []Kernel `json:"kernels"`
}

// Artifact is one embedded output: its file, target and the sha256 of its
// uncompressed bytes.
type Artifact struct {
	File   string `json:"file"`
	Arch   string `json:"arch"`
	SHA256 string `json:"sha256"`
}

// Kernel is an entry point and the byte size of each parameter.
type Kernel struct {
	Name   string `json:"name"`
	Params []int  `json:"params"`
}

// Built reports whether the manifest describes a build.
func (m *Manifest) Built() bool { return m.Status == "built" }

// Kernel returns the named kernel's entry.
func (m *Manifest) Kernel(name string) (Kernel, bool) {
	i := slices.IndexFunc(m.Kernels, func(k Kernel) bool { return k.Name == name })
	if i < 0 {
		return Kernel{}, false
	}
	return m.Kernels[i], true
}

// ReadManifest parses the manifest of the build in use.
func ReadManifest() (*Manifest, error) {
	fsys, where := build()
	b, err := fs.ReadFile(fsys, "manifest.json")
	if err != nil {
		return nil, fmt.Errorf("kern: %s build: %w", where, err)
	}
	return ParseManifest(b)
}

// ParseManifest parses manifest JSON.
func ParseManifest(b []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("kern: manifest: %w", err)
	}
	if m.Status != "built" && m.Status != "no build" {
		return nil, fmt.Errorf("kern: manifest: unknown status %q", m.Status)
	}
	return &m, nil
}

// Cubin returns the embedded machine code, checked against the manifest.
func Cubin() ([]byte, error) { return artifact(func(m *Manifest) Artifact { return m.Cubin }) }

// PTX returns the embedded PTX text, checked against the manifest.
func PTX() ([]byte, error) { return artifact(func(m *Manifest) Artifact { return m.PTX }) }

func artifact(pick func(*Manifest) Artifact) ([]byte, error) {
	m, err := ReadManifest()
	if err != nil {
		return nil, err
	}
	if !m.Built() {
		return nil, fmt.Errorf("kern: no CUDA build is embedded (run scripts/build-cuda where nvcc is)")
	}
	a := pick(m)
	fsys, where := build()
	raw, err := fs.ReadFile(fsys, a.File)
	if err != nil {
		return nil, fmt.Errorf("kern: %s build: %w", where, err)
	}
	b := raw
	if strings.HasSuffix(a.File, ".gz") {
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("kern: %s: %w", a.File, err)
		}
		if b, err = io.ReadAll(zr); err != nil {
			return nil, fmt.Errorf("kern: %s: %w", a.File, err)
		}
	}
	if got := sha256Hex(b); got != a.SHA256 {
		return nil, fmt.Errorf("kern: %s: sha256 %s, manifest says %s", a.File, got, a.SHA256)
	}
	return b, nil
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// SourcesHash computes the hash scripts/build-cuda records for a source
// folder: the sha256 of the lines "<sha256 of file>  <name>\n" of every
// file in it, names in byte order.
func SourcesHash(fsys fs.FS) (string, error) {
	ents, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return "", fmt.Errorf("kern: %w", err)
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		if e.IsDir() {
			return "", fmt.Errorf("kern: csrc holds a folder %q (the build hashes files only)", e.Name())
		}
		names = append(names, e.Name())
	}
	slices.Sort(names)
	var list strings.Builder
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return "", fmt.Errorf("kern: %w", err)
		}
		fmt.Fprintf(&list, "%s  %s\n", sha256Hex(b), n)
	}
	return sha256Hex([]byte(list.String())), nil
}
