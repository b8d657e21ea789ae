package safetensors_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/cortiq/cortiq/safetensors"
)

// A converter streams a checkpoint one tensor at a time: decode into a
// reused buffer, use it, then release the tensor's pages.
func Example() {
	dir, _ := os.MkdirTemp("", "st")
	defer os.RemoveAll(dir)
	err := safetensors.Write(filepath.Join(dir, safetensors.SingleFile), []safetensors.WriteTensor{
		{Name: "model.norm.weight", DType: safetensors.BF16, Shape: []int{4}, Data: safetensors.BF16Bytes([]float32{1, 1, 1, 1})},
		{Name: "model.embed_tokens.weight", DType: safetensors.F32, Shape: []int{2, 4}, Data: safetensors.F32Bytes([]float32{0, 1, 2, 3, 4, 5, 6, 7})},
	}, map[string]string{"format": "pt"})
	if err != nil {
		log.Fatal(err)
	}

	f, err := safetensors.OpenDir(dir) // model.safetensors or a sharded index
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	var buf []float32
	for _, name := range f.Tensors() {
		info, _ := f.Tensor(name)
		buf = append(buf[:0], make([]float32, info.Elements())...)
		if err := f.ReadFloat32Into(name, buf); err != nil {
			log.Fatal(err)
		}
		fmt.Println(name, info.DType, info.Shape, buf)
		f.Release(name)
	}
	// Output:
	// model.embed_tokens.weight F32 [2 4] [0 1 2 3 4 5 6 7]
	// model.norm.weight BF16 [4] [1 1 1 1]
}
