// Command mkhf writes a Hugging Face checkpoint of a published shape with
// random bf16 weights (sharded safetensors + index + config), to measure
// conversion time and memory on multi-GB inputs without a download:
//
//	go run ./tools/mkhf -shape llama1b -o /tmp/llama1b-hf
package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/cortiq/cortiq/half"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/safetensors"
	"github.com/cortiq/cortiq/synth"
)

func main() {
	shape := flag.String("shape", "llama1b", "synth shape")
	out := flag.String("o", "", "output directory")
	shardBytes := flag.Int64("shard", 1<<30, "bytes per safetensors shard")
	flag.Parse()
	if *out == "" {
		log.Fatal("-o is required")
	}
	a, err := synth.Arch(*shape, "")
	if err != nil {
		log.Fatal(err)
	}
	ts, err := model.Tensors(&a)
	if err != nil {
		log.Fatal(err)
	}
	os.MkdirAll(*out, 0o755)
	cfg := map[string]any{"model_type": a.ArchName, "hidden_size": a.HiddenSize, "intermediate_size": a.IntermediateSize,
		"num_hidden_layers": a.NumLayers, "num_attention_heads": a.NumAttentionHeads, "num_key_value_heads": a.NumKVHeads,
		"head_dim": a.HeadDim, "vocab_size": a.VocabSize, "rms_norm_eps": a.RMSNormEps, "rope_theta": a.RopeTheta,
		"max_position_embeddings": a.MaxPositionEmbeddings, "tie_word_embeddings": a.TieWordEmbeddings, "hidden_act": "silu",
		"torch_dtype": "bfloat16"}
	if rs := a.RopeScaling; rs != nil {
		cfg["rope_scaling"] = map[string]any{"rope_type": rs.Type, "factor": rs.Factor, "low_freq_factor": rs.LowFreqFactor,
			"high_freq_factor": rs.HighFreqFactor, "original_max_position_embeddings": rs.OriginalMaxPositionEmbeddings}
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	os.WriteFile(filepath.Join(*out, "config.json"), b, 0o644)
	r := rand.New(rand.NewPCG(1, 2))
	weightMap := map[string]string{}
	var batch []safetensors.WriteTensor
	var size, total int64
	shard := 0
	flush := func() {
		if len(batch) == 0 {
			return
		}
		shard++
		name := fmt.Sprintf("model-%05d.safetensors", shard)
		if err := safetensors.Write(filepath.Join(*out, name), batch, map[string]string{"format": "pt"}); err != nil {
			log.Fatal(err)
		}
		for _, t := range batch {
			weightMap[t.Name] = name
		}
		batch, size = nil, 0
	}
	for _, t := range ts {
		n := 1
		for _, d := range t.Shape {
			n *= d
		}
		data := make([]byte, 2*n)
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint16(data[2*i:], half.F32ToBF16(float32(r.NormFloat64()*0.02)))
		}
		if size+int64(len(data)) > *shardBytes {
			flush()
		}
		batch = append(batch, safetensors.WriteTensor{Name: t.Name, DType: safetensors.BF16, Shape: t.Shape, Data: data})
		size += int64(len(data))
		total += int64(len(data))
	}
	flush()
	idx, _ := json.MarshalIndent(map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap}, "", "  ")
	os.WriteFile(filepath.Join(*out, "model.safetensors.index.json"), idx, 0o644)
	fmt.Printf("wrote %s: %d tensors, %.2f GB in %d shards\n", *out, len(ts), float64(total)/1e9, shard)
}
