package safetensors

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// TestReferenceWriterFiles reads the checkpoints in ../testdata/models,
// which the Python safetensors library wrote (see that directory's
// README), checks every tensor decodes to finite values, and checks that
// Encode, given the same tensors in offset order, reproduces each file
// byte for byte.
func TestReferenceWriterFiles(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("..", "testdata", "models", "*", "*.safetensors"))
	if len(files) == 0 {
		t.Skip("no reference checkpoints in ../testdata/models")
	}
	for _, path := range files {
		t.Run(filepath.Base(filepath.Dir(path))+"/"+filepath.Base(path), func(t *testing.T) {
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var infos []Info
			for _, name := range f.Tensors() {
				in, _ := f.Tensor(name)
				infos = append(infos, in)
				if !in.DType.Decodable() {
					continue
				}
				v, err := f.Float32(name)
				if err != nil {
					t.Fatal(err)
				}
				for i, x := range v {
					if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
						t.Fatalf("%s[%d] = %v", name, i, x)
					}
				}
			}
			sort.Slice(infos, func(a, b int) bool { return infos[a].Offset < infos[b].Offset })
			ws := make([]WriteTensor, len(infos))
			for i, in := range infos {
				ws[i] = WriteTensor{Name: in.Name, DType: in.DType, Shape: in.Shape, Data: f.Raw(in.Name)}
			}
			var buf bytes.Buffer
			if err := Encode(&buf, ws, f.Metadata()); err != nil {
				t.Fatal(err)
			}
			orig, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), orig) {
				n := 0
				for n < min(buf.Len(), len(orig)) && buf.Bytes()[n] == orig[n] {
					n++
				}
				t.Fatalf("re-encoded file differs from the reference writer's at byte %d of %d", n, len(orig))
			}
		})
	}
}
