package gguf

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// numpyPermute is llama.cpp's permute written as the index map of
// w.reshape(n_head, 2, hd/2, cols).swapaxes(1, 2).reshape(rows, cols):
// out[h, j, i, c] = in[h, i, j, c].
func numpyPermute(w []float32, rows, cols, nHead int) []float32 {
	half := rows / nHead / 2
	out := make([]float32, len(w))
	for h := range nHead {
		for j := range half {
			for i := range 2 {
				for c := range cols {
					out[((h*half+j)*2+i)*cols+c] = w[((h*2+i)*half+j)*cols+c]
				}
			}
		}
	}
	return out
}

func TestPermuteHandChecked(t *testing.T) {
	// Two heads of four rows: within a head HF rows (0, 1 | 2, 3) pair as
	// (0, 2) and (1, 3), which the converter stores adjacently.
	w := []float32{0, 1, 2, 3, 4, 5, 6, 7}
	if err := PermuteQK(w, 8, 1, 2); err != nil {
		t.Fatal(err)
	}
	if want := []float32{0, 2, 1, 3, 4, 6, 5, 7}; !slices.Equal(w, want) {
		t.Fatalf("PermuteQK = %v, want %v", w, want)
	}
	// One head of six rows, two columns: GGUF rows are HF rows 0,3,1,4,2,5.
	g := []float32{0, 0.5, 3, 3.5, 1, 1.5, 4, 4.5, 2, 2.5, 5, 5.5}
	if err := UnpermuteQK(g, 6, 2, 1); err != nil {
		t.Fatal(err)
	}
	if want := []float32{0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5}; !slices.Equal(g, want) {
		t.Fatalf("UnpermuteQK = %v, want %v", g, want)
	}
}

func TestPermuteMatchesNumpyAndInverts(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, c := range []struct{ rows, cols, heads int }{
		{8, 3, 1}, {8, 3, 2}, {8, 3, 4}, {64, 16, 8}, {32, 16, 2}, {128, 1, 4},
	} {
		w := randFloats(r, c.rows*c.cols)
		p := slices.Clone(w)
		if err := PermuteQK(p, c.rows, c.cols, c.heads); err != nil {
			t.Fatal(err)
		}
		if want := numpyPermute(w, c.rows, c.cols, c.heads); !slices.Equal(p, want) {
			t.Fatalf("%+v: PermuteQK differs from the numpy formula", c)
		}
		if err := UnpermuteQK(p, c.rows, c.cols, c.heads); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(p, w) {
			t.Fatalf("%+v: unpermute∘permute is not the identity", c)
		}
		u := slices.Clone(w)
		_ = UnpermuteQK(u, c.rows, c.cols, c.heads)
		_ = PermuteQK(u, c.rows, c.cols, c.heads)
		if !slices.Equal(u, w) {
			t.Fatalf("%+v: permute∘unpermute is not the identity", c)
		}
	}
}

func TestPermuteErrors(t *testing.T) {
	for _, c := range []struct{ n, rows, cols, heads int }{
		{6, 6, 1, 2}, // heads of 3 rows cannot pair up
		{8, 8, 1, 0},
		{7, 8, 1, 2},
		{0, 0, 1, 1},
	} {
		if err := UnpermuteQK(make([]float32, c.n), c.rows, c.cols, c.heads); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
