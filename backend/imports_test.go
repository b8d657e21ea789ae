package backend_test

import (
	"go/build"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const mod = "github.com/cortiq/cortiq/"

// TestImportRules holds the layering of gpu-design.md §2: the boundary
// imports only quant and rope; architectures import the boundary, never a backend
// or the CPU kernels; the low layers never import the backends.
func TestImportRules(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(file))
	imports := func(pkg string) []string {
		p, err := build.ImportDir(filepath.Join(root, pkg), 0)
		if err != nil {
			t.Fatalf("%s: %v", pkg, err)
		}
		var own []string
		for _, i := range p.Imports {
			if strings.HasPrefix(i, mod) {
				own = append(own, strings.TrimPrefix(i, mod))
			}
		}
		return own
	}
	if got := imports("backend"); !slices.Equal(got, []string{"quant", "rope"}) {
		t.Errorf("backend imports %v, want only quant and rope", got)
	}
	for _, i := range imports("model") {
		if i == "kernels" || strings.HasPrefix(i, "backend/") {
			t.Errorf("model imports %s: architectures are written against backend only", i)
		}
	}
	for _, low := range []string{"quant", "half", "cmf", "kernels", "rope"} {
		for _, i := range imports(low) {
			if strings.HasPrefix(i, "backend") || i == "model" {
				t.Errorf("%s imports %s", low, i)
			}
		}
	}
}
