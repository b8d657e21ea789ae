package convert

import (
	"encoding/json"
	"testing"

	"github.com/cortiq/cortiq/model"
)

// FuzzArchFromHF feeds arbitrary config.json bytes through the mapping to
// cmf.Arch and, when that succeeds, through the tensor table: no panic, no
// runaway allocation (dimensions are bounded before any loop).
func FuzzArchFromHF(f *testing.F) {
	for _, a := range []string{"llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_moe"} {
		b, _ := json.Marshal(tinyConfig(a))
		f.Add(b)
	}
	f.Add([]byte(`{"model_type":"llama","num_hidden_layers":2147483647,"hidden_size":8,"num_attention_heads":1,"vocab_size":4}`))
	f.Add([]byte(`{"model_type":"qwen3_moe","num_experts":1e9,"num_experts_per_tok":1,"hidden_size":8,"num_attention_heads":1,"vocab_size":4,"num_hidden_layers":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var top hfConfig
		if json.Unmarshal(b, &top) != nil {
			return
		}
		a, err := archFromHF(top, nil)
		if err != nil {
			return
		}
		if ts, err := model.Tensors(&a); err == nil && len(ts) == 0 {
			t.Fatal("a valid architecture with no tensors")
		}
	})
}

func TestHugeMoERefused(t *testing.T) {
	b := []byte(`{"model_type":"qwen3_moe","num_experts":65536,"num_experts_per_tok":2,"moe_intermediate_size":8,"hidden_size":8,"num_attention_heads":1,"vocab_size":4,"num_hidden_layers":4096}`)
	var top hfConfig
	json.Unmarshal(b, &top)
	if _, err := archFromHF(top, nil); err == nil {
		t.Fatal("4096 layers of 65536 experts accepted")
	}
}
