package gguf_test

import (
	"bytes"
	"fmt"
	"log"

	"github.com/cortiq/cortiq/gguf"
)

func Example() {
	// Build a tiny file: metadata and a 2×32 Q8_0 weight (PyTorch shape).
	w := gguf.NewWriter()
	_ = w.AddKV("general.architecture", gguf.String("llama"))
	_ = w.AddKV("llama.block_count", gguf.Uint32(1))
	_ = w.AddKV("tokenizer.ggml.tokens", gguf.Strings([]string{"<s>", "</s>"}))
	vals := make([]float32, 64)
	for i := range vals {
		vals[i] = float32(i%8) / 4
	}
	if err := w.AddTensor("blk.0.ffn_up.weight", gguf.TypeQ8_0, []int{2, 32}, vals); err != nil {
		log.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		log.Fatal(err)
	}

	f, err := gguf.Parse(buf.Bytes()) // gguf.Open(path) maps a file instead
	if err != nil {
		log.Fatal(err)
	}
	blocks, _ := f.KV("llama.block_count")
	n, _ := blocks.Uint()
	toks, _ := f.KV("tokenizer.ggml.tokens")
	names, _ := toks.Strings()
	fmt.Println(f.Architecture(), n, names)
	for _, t := range f.Tensors() {
		x, err := f.Float32(t.Name)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s %s dims %v shape %v %.2f\n", t.Name, t.Type, t.Dims, t.Shape(), x[:8])
	}
	// Output:
	// llama 1 [<s> </s>]
	// blk.0.ffn_up.weight Q8_0 dims [32 2] shape [2 32] [0.00 0.25 0.50 0.74 1.01 1.25 1.50 1.75]
}
