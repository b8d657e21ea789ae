package gguf

import "fmt"

// llama.cpp's convert_hf_to_gguf.py stores the Q and K projection weights
// of llama-family models (LlamaModel.permute) with the rows of each head
// reordered for ggml's interleaved ("normal") RoPE, which rotates pairs of
// adjacent rows, while Hugging Face's rotate_half rotates row i with row
// i + head_dim/2. In numpy terms the converter does
//
//	w.reshape(n_head, 2, head_dim/2, cols).swapaxes(1, 2).reshape(rows, cols)
//
// so within each head, HF row i·(head_dim/2) + j (i ∈ {0,1}) becomes GGUF
// row 2j + i. For K, n_head is the number of KV heads. Biases (cols = 1)
// are permuted the same way.

// UnpermuteQK restores Hugging Face row order in place for a rows×cols
// row-major Q or K weight (or bias, cols = 1) read from a llama-family
// GGUF, where nHeads is the number of attention heads for Q and of KV heads
// for K. It is the inverse of the converter's permute (and of PermuteQK).
func UnpermuteQK(w []float32, rows, cols, nHeads int) error {
	return permuteQK(w, rows, cols, nHeads, false)
}

// PermuteQK applies the converter's permute in place: Hugging Face row
// order to GGUF row order. It is the inverse of UnpermuteQK.
func PermuteQK(w []float32, rows, cols, nHeads int) error {
	return permuteQK(w, rows, cols, nHeads, true)
}

func permuteQK(w []float32, rows, cols, nHeads int, forward bool) error {
	switch {
	case rows <= 0 || cols <= 0 || nHeads <= 0:
		return fmt.Errorf("gguf: permute: rows %d, cols %d and heads %d must be positive", rows, cols, nHeads)
	case rows%(2*nHeads) != 0:
		return fmt.Errorf("gguf: permute: %d rows do not split into %d heads of even size", rows, nHeads)
	case len(w) != rows*cols:
		return fmt.Errorf("gguf: permute: %d values for %d×%d", len(w), rows, cols)
	}
	hd := rows / nHeads
	half := hd / 2
	tmp := make([]float32, hd*cols)
	for h := range nHeads {
		head := w[h*hd*cols : (h+1)*hd*cols]
		copy(tmp, head)
		for i := range 2 {
			for j := range half {
				hf, gg := i*half+j, 2*j+i // HF row, GGUF row within the head
				src, dst := gg, hf
				if forward {
					src, dst = hf, gg
				}
				copy(head[dst*cols:(dst+1)*cols], tmp[src*cols:(src+1)*cols])
			}
		}
	}
	return nil
}
