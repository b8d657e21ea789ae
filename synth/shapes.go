// Package synth writes models of real published shapes with random weights
// straight into CMF, so speed can be measured on real shapes without
// downloading anything. Weights are generated already encoded (no float32
// copy of the model), in chunks, at disk speed.
package synth

import (
	"fmt"
	"sort"

	"github.com/cortiq/cortiq/cmf"
)

func ptr[T any](v T) *T { return &v }

func layers(n, interval int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "full_attention"
		if interval > 0 && (i+1)%interval != 0 {
			out[i] = "linear_attention"
		}
	}
	return out
}

func llama(h, l, nh, nkv, ffn, vocab int, tied bool, scaling *cmf.RopeScaling) cmf.Arch {
	return cmf.Arch{ArchName: "llama", HiddenSize: h, IntermediateSize: ffn, NumLayers: l, NumAttentionHeads: nh, NumKVHeads: nkv,
		HeadDim: h / nh, VocabSize: vocab, LayerTypes: layers(l, 0), RMSNormEps: 1e-5, NormStyle: "standard", RopeTheta: 500000,
		RopeScaling: scaling, TieWordEmbeddings: tied, PartialRotaryFactor: 1, MaxPositionEmbeddings: 131072, HiddenAct: "silu",
		BOSTokenID: ptr(0), EOSTokenIDs: []int{1}}
}

func qwen3(h, l, nh, nkv, hd, ffn int, tied bool) cmf.Arch {
	return cmf.Arch{ArchName: "qwen3", HiddenSize: h, IntermediateSize: ffn, NumLayers: l, NumAttentionHeads: nh, NumKVHeads: nkv,
		HeadDim: hd, VocabSize: 151936, LayerTypes: layers(l, 0), RMSNormEps: 1e-6, NormStyle: "standard", RopeTheta: 1e6,
		TieWordEmbeddings: tied, PartialRotaryFactor: 1, MaxPositionEmbeddings: 40960, HiddenAct: "silu", QKNorm: true, EOSTokenIDs: []int{1}}
}

var llama3Scaling = &cmf.RopeScaling{Type: "llama3", Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}

// Shapes maps a shape name to its architecture (published configs).
var Shapes = map[string]func() cmf.Arch{
	// Llama-3.2-1B: tied embeddings, llama3 RoPE scaling.
	"llama1b": func() cmf.Arch { return llama(2048, 16, 32, 8, 8192, 128256, true, llama3Scaling) },
	// Llama-3.2-3B.
	"llama3b": func() cmf.Arch { return llama(3072, 28, 24, 8, 8192, 128256, true, llama3Scaling) },
	// Llama-3.1-8B.
	"llama8b": func() cmf.Arch {
		return llama(4096, 32, 32, 8, 14336, 128256, false, &cmf.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192})
	},
	"qwen2_7b": func() cmf.Arch {
		a := qwen3(3584, 28, 28, 4, 128, 18944, false)
		a.ArchName, a.QKNorm, a.AttentionBias, a.VocabSize, a.MaxPositionEmbeddings = "qwen2", false, true, 152064, 32768
		return a
	},
	"qwen3_0_6b":         func() cmf.Arch { return qwen3(1024, 28, 16, 8, 128, 3072, true) },
	"qwen3_4b":           func() cmf.Arch { return qwen3(2560, 36, 32, 8, 128, 9728, true) },
	"qwen3_8b":           func() cmf.Arch { return qwen3(4096, 36, 32, 8, 128, 12288, false) },
	"qwen3_30b_a3b":      qwen3MoE30B,
	"qwen3_next_80b_a3b": qwen3Next80B,
	"qwen3_5_35b_a3b":    qwen35MoE35B,
	// Tiny shapes for tests, one per architecture family.
	"tiny_llama": func() cmf.Arch { return llama(64, 2, 4, 2, 96, 300, false, llama3Scaling) },
	"tiny_qwen3": func() cmf.Arch { a := qwen3(64, 2, 4, 2, 32, 128, true); a.VocabSize = 300; return a },
	"tiny_qwen3_moe": func() cmf.Arch {
		a := qwen3MoE30B()
		a.HiddenSize, a.NumLayers, a.LayerTypes, a.NumAttentionHeads, a.NumKVHeads, a.HeadDim, a.VocabSize = 64, 2, layers(2, 0), 4, 2, 16, 300
		a.MoE.NumExperts, a.MoE.NumExpertsPerTok, a.MoE.MoEIntermediateSize = 4, 2, 32
		return a
	},
	"tiny_qwen3_next": tinyNext,
	"tiny_qwen3_5": func() cmf.Arch {
		a := tinyNext()
		a.ArchName, a.MoE, a.IntermediateSize, a.LinearCore.Projection = "qwen3_5", nil, 96, "split"
		return a
	},
	"tiny_qwen3_5_moe": func() cmf.Arch {
		a := tinyNext()
		a.ArchName, a.LinearCore.Projection, a.IntermediateSize = "qwen3_5_moe", "split", 0
		return a
	},
	// Small shapes for CPU speed checks (not published models): the
	// 30B-A3B / 80B-A3B structure scaled down so that the experts (0.6 GB
	// in q8_row) are far larger than the caches while one token reads
	// ~0.1 GB.
	"qwen3_moe_cpu": func() cmf.Arch {
		a := qwen3MoE30B()
		a.HiddenSize, a.NumLayers, a.LayerTypes, a.NumAttentionHeads, a.NumKVHeads, a.HeadDim, a.VocabSize = 1024, 8, layers(8, 0), 16, 4, 64, 8192
		a.MoE.NumExperts, a.MoE.NumExpertsPerTok, a.MoE.MoEIntermediateSize = 32, 4, 768
		return a
	},
	"qwen3_next_cpu": func() cmf.Arch {
		a := qwen3Next80B()
		a.HiddenSize, a.NumLayers, a.LayerTypes, a.NumAttentionHeads, a.NumKVHeads, a.HeadDim, a.VocabSize = 1024, 8, layers(8, 4), 8, 2, 128, 8192
		a.MoE.NumExperts, a.MoE.NumExpertsPerTok, a.MoE.MoEIntermediateSize, a.MoE.SharedExpertIntermediateSize = 32, 4, 512, 512
		a.LinearNumKeyHeads, a.LinearNumValueHeads, a.LinearKeyHeadDim, a.LinearValueHeadDim = 4, 8, 128, 128
		return a
	},
}

func tinyNext() cmf.Arch {
	a := qwen3Next80B()
	a.HiddenSize, a.NumLayers, a.LayerTypes, a.NumAttentionHeads, a.NumKVHeads, a.HeadDim, a.VocabSize = 64, 4, layers(4, 4), 4, 2, 32, 300
	a.MoE.NumExperts, a.MoE.NumExpertsPerTok, a.MoE.MoEIntermediateSize, a.MoE.SharedExpertIntermediateSize = 4, 2, 32, 32
	a.LinearNumKeyHeads, a.LinearNumValueHeads, a.LinearKeyHeadDim, a.LinearValueHeadDim = 2, 4, 16, 16
	return a
}

func qwen3MoE30B() cmf.Arch {
	a := qwen3(2048, 48, 32, 4, 128, 6144, false)
	a.ArchName = "qwen3_moe"
	a.MoE = &cmf.MoE{NumExperts: 128, NumExpertsPerTok: 8, MoEIntermediateSize: 768, NormTopKProb: true, DecoderSparseStep: 1}
	return a
}

func qwen3Next80B() cmf.Arch {
	a := qwen3(2048, 48, 16, 2, 256, 5120, false)
	a.ArchName, a.RopeTheta, a.PartialRotaryFactor, a.NormStyle, a.AttnOutputGate = "qwen3_next", 1e7, 0.25, "one_plus", true
	a.LayerTypes, a.MaxPositionEmbeddings = layers(48, 4), 262144
	a.MoE = &cmf.MoE{NumExperts: 512, NumExpertsPerTok: 10, MoEIntermediateSize: 512, SharedExpertIntermediateSize: 512, NormTopKProb: true, DecoderSparseStep: 1}
	a.LinearCore = &cmf.LinearCore{Kind: "gated_deltanet", Projection: "qkvz_grouped"}
	a.LinearConvKernelDim, a.LinearNumKeyHeads, a.LinearNumValueHeads, a.LinearKeyHeadDim, a.LinearValueHeadDim = 4, 16, 32, 128, 128
	a.MTP = &cmf.MTP{NumLayers: 1}
	return a
}

func qwen35MoE35B() cmf.Arch {
	a := qwen3Next80B()
	a.ArchName, a.NumLayers, a.LayerTypes, a.VocabSize = "qwen3_5_moe", 40, layers(40, 4), 248320
	a.MoE.NumExperts, a.MoE.NumExpertsPerTok = 256, 8
	a.LinearCore.Projection = "split"
	a.RopeScaling = &cmf.RopeScaling{Type: "default", MRopeSection: []int{11, 11, 10}, MRopeInterleaved: true}
	return a
}

// ShapeNames lists the shapes, sorted.
func ShapeNames() []string {
	var out []string
	for k := range Shapes {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Arch returns the architecture of a shape, optionally checking that it is
// of the given architecture family.
func Arch(shape, arch string) (cmf.Arch, error) {
	f, ok := Shapes[shape]
	if !ok {
		return cmf.Arch{}, fmt.Errorf("synth: unknown shape %q (known: %v)", shape, ShapeNames())
	}
	a := f()
	if arch != "" && arch != a.ArchName {
		var fits []string
		for _, n := range ShapeNames() {
			if Shapes[n]().ArchName == arch {
				fits = append(fits, n)
			}
		}
		if len(fits) == 0 {
			return a, fmt.Errorf("synth: no shape of architecture %q", arch)
		}
		return a, fmt.Errorf("synth: shape %q is %s, not %s (shapes of %s: %v)", shape, a.ArchName, arch, arch, fits)
	}
	return a, a.Validate()
}
