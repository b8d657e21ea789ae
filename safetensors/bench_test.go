package safetensors

import (
	"math/rand/v2"
	"path/filepath"
	"testing"
)

func BenchmarkFloat32(b *testing.B) {
	const n = 1 << 20
	r := rand.New(rand.NewPCG(1, 1))
	v := randFloats(r, n)
	path := filepath.Join(b.TempDir(), "bench.safetensors")
	err := Write(path, []WriteTensor{
		{Name: "F32", DType: F32, Shape: []int{n}, Data: F32Bytes(v)},
		{Name: "F16", DType: F16, Shape: []int{n}, Data: F16Bytes(v)},
		{Name: "BF16", DType: BF16, Shape: []int{n}, Data: BF16Bytes(v)},
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	dst := make([]float32, n)
	for _, name := range []string{"F32", "F16", "BF16"} {
		b.Run(name, func(b *testing.B) {
			in, _ := f.Tensor(name)
			b.SetBytes(in.Size)
			for b.Loop() {
				if err := f.ReadFloat32Into(name, dst); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e6, "Melem/s")
		})
	}
}
