package model_test

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
)

// FuzzLoadArch mutates the architecture of a valid file (the header is
// untrusted input): Load must return an error or a model whose Forward
// runs without panicking.
func FuzzLoadArch(f *testing.F) {
	dir := filepath.Join(f.TempDir(), "hf")
	writeHF(f, dir, variants[9].cfg, 1) // qwen3, head_dim 32, tied
	fuzzModel := convertHF(f, dir, quant.F32)
	fuzzArch := fuzzModel.Header.Arch
	f.Add(0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, uint8(0), false, false, false)
	f.Add(64, 4, 2, 32, 1, 1e-6, 1e6, 1.0, 2.0, uint8(1), true, true, false)
	f.Add(64, 4, 4, 16, 2, 1e-6, 1e4, 0.5, 4.0, uint8(3), false, true, true)
	f.Add(32, 2, 1, 32, 2, math.NaN(), 1.0, 0.3, 0.0, uint8(4), true, false, true)
	f.Add(64, 8, 2, 8, 2, -1.0, math.Inf(1), 1.0, -1.0, uint8(5), false, true, false)
	f.Fuzz(func(t *testing.T, hidden, heads, kv, headDim, layers int, eps, theta, prf, factor float64, rope uint8, tied, qkNorm, bias bool) {
		a := fuzzArch
		a.LayerTypes = append([]string(nil), fuzzArch.LayerTypes...)
		set := func(dst *int, v int) {
			if v != 0 {
				*dst = v
			}
		}
		set(&a.HiddenSize, hidden)
		set(&a.NumAttentionHeads, heads)
		set(&a.NumKVHeads, kv)
		set(&a.HeadDim, headDim)
		if layers != 0 {
			a.NumLayers = layers
			if layers > 0 && layers < 64 {
				a.LayerTypes = make([]string, layers)
				for i := range a.LayerTypes {
					a.LayerTypes[i] = "full_attention"
				}
			}
		}
		if eps != 0 {
			a.RMSNormEps = eps
		}
		if theta != 0 {
			a.RopeTheta = theta
		}
		if prf != 0 {
			a.PartialRotaryFactor = prf
		}
		types := []string{"", "linear", "dynamic", "yarn", "llama3", "longrope", "default", "bogus"}
		if t := types[int(rope)%len(types)]; t != "" {
			a.RopeScaling = &cmf.RopeScaling{Type: t, Factor: factor, LowFreqFactor: 1, HighFreqFactor: factor, OriginalMaxPositionEmbeddings: 16}
		}
		a.TieWordEmbeddings, a.QKNorm, a.AttentionBias = tied, qkNorm, bias
		if a.Validate() != nil {
			return // cmf.Open refuses these before Load sees them
		}
		saved := fuzzModel.Header.Arch
		fuzzModel.Header.Arch = a
		defer func() { fuzzModel.Header.Arch = saved }()
		m, err := model.Load(fuzzModel, opts(t, 2, 2))
		if err != nil {
			return
		}
		defer m.Close()
		c, err := m.NewCache(4)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Forward(c, []int{1, 2, 3}, 0, model.AllLogits); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Forward(c, []int{4}, 3, model.LastLogits); err != nil {
			t.Fatal(err)
		}
	})
}
