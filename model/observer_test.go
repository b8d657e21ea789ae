package model_test

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
)

// recorder is a model.Observer that keeps copies of what it sees.
type recorder struct {
	order []string
	rows  map[string]int
	cols  map[string]int
	x     map[string][]float32
}

func (r *recorder) Observe(w string, x []float32, rows, cols int) {
	if len(x) != rows*cols {
		panic(fmt.Sprintf("%s: %d values for %d×%d", w, len(x), rows, cols))
	}
	r.order = append(r.order, w)
	r.rows[w] += rows
	r.cols[w] = cols
	r.x[w] = append(r.x[w], x...)
}

// TestObserver runs a tiny model in prefill steps smaller than the prompt
// with an observer: every linear weight is reported once per step with
// its input width, the rows add up to the prompt, the inputs are what the
// weights multiply (checked for layer 0's q_proj against RMSNorm of the
// embeddings, and for the head against the logits), and the logits do not
// change with or without the observer.
func TestObserver(t *testing.T) {
	for _, v := range []variant{variants[0], variants[1]} { // untied, tied
		t.Run(v.name, func(t *testing.T) {
			m, cm := tinyModel(t, v, quant.F32, opts(t, 2, 4))
			V, H := m.Arch.VocabSize, m.Arch.HiddenSize
			ids := prompt(10, V, 3)
			plain := forward(t, m, newCache(t, m, 16), ids, 0, model.AllLogits)
			rec := &recorder{rows: map[string]int{}, cols: map[string]int{}, x: map[string][]float32{}}
			m.SetObserver(rec)
			got := forward(t, m, newCache(t, m, 16), ids, 0, model.AllLogits)
			m.SetObserver(nil)
			if !slices.Equal(got, plain) {
				t.Fatal("the observer changed the logits")
			}
			head := "lm_head.weight"
			if m.Arch.TieWordEmbeddings {
				head = "model.embed_tokens.weight"
			}
			ref := newRefModel(t, cm)
			for _, w := range []string{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"} {
				for l := range m.Arch.NumLayers {
					name := fmt.Sprintf("model.layers.%d.%s.weight", l, w)
					tt, _, err := cm.TensorData(name)
					if err != nil {
						t.Fatal(err)
					}
					if rec.rows[name] != len(ids) || rec.cols[name] != tt.Shape[1] {
						t.Fatalf("%s: %d rows of %d columns observed, want %d of %d", name, rec.rows[name], rec.cols[name], len(ids), tt.Shape[1])
					}
				}
			}
			if rec.rows[head] != len(ids) {
				t.Fatalf("head %s: %d rows observed", head, rec.rows[head])
			}
			if n := (len(ids) + 3) / 4; len(rec.order) != (7*m.Arch.NumLayers+1)*n {
				t.Fatalf("%d observations, want %d steps × %d weights", len(rec.order), n, 7*m.Arch.NumLayers+1)
			}
			// Layer 0's attention input is RMSNorm(embedding) exactly.
			emb, norm := ref.w("model.embed_tokens.weight"), ref.w("model.layers.0.input_layernorm.weight")
			x := rec.x["model.layers.0.self_attn.q_proj.weight"]
			for p, id := range ids {
				want := ref.rmsnorm(emb[id*H:(id+1)*H], norm)
				for i, wv := range want {
					if math.Abs(float64(x[p*H+i])-wv) > 1e-5*(1+math.Abs(wv)) {
						t.Fatalf("q_proj input at position %d, column %d: %v, want %v", p, i, x[p*H+i], wv)
					}
				}
			}
			// The head's input times the head gives the logits.
			hw, hx := ref.w(head), rec.x[head]
			for p := range ids {
				for j := range V {
					var s float64
					for i := range H {
						s += hw[j*H+i] * float64(hx[p*H+i])
					}
					if d := math.Abs(s - float64(got[p*V+j])); d > 1e-4*(1+math.Abs(s)) {
						t.Fatalf("head input at position %d gives logit %d = %v, Forward %v", p, j, s, got[p*V+j])
					}
				}
			}
			if !strings.HasPrefix(rec.order[0], "model.layers.0.self_attn.q_proj") {
				t.Fatalf("first observation %s", rec.order[0])
			}
		})
	}
}

// TestObserverLastLogits checks that a LastLogits Forward reports the
// head's input for the last position only.
func TestObserverLastLogits(t *testing.T) {
	m, _ := tinyModel(t, variants[0], quant.F32, opts(t, 1, 0))
	rec := &recorder{rows: map[string]int{}, cols: map[string]int{}, x: map[string][]float32{}}
	m.SetObserver(rec)
	forward(t, m, newCache(t, m, 16), prompt(6, m.Arch.VocabSize, 4), 0, model.LastLogits)
	if rec.rows["lm_head.weight"] != 1 || rec.rows["model.layers.0.mlp.down_proj.weight"] != 6 {
		t.Fatalf("head rows %d, down_proj rows %d", rec.rows["lm_head.weight"], rec.rows["model.layers.0.mlp.down_proj.weight"])
	}
}
