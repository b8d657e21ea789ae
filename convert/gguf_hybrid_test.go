package convert

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/gguf"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/safetensors"
	"github.com/cortiq/cortiq/tokenizer"
)

// hybridGGUFOpts selects how writeHybridGGUF lays a file out.
type hybridGGUFOpts struct {
	typ        gguf.Type // storage of matrices (vectors, norms, conv and router stay F32)
	legacy     bool      // qwen3next: in_proj_qkvz kept whole as ssm_in (early GGUFs)
	fuseGateUp bool      // experts as ffn_gate_up_exps (--fuse-gate-up-exps)
	// edit, when set, may change or drop (return false) a GGUF tensor.
	edit func(name string, shape []int, v []float32) bool
	// dropKV names a metadata key (without the arch prefix) to leave out.
	dropKV string
	// tok adds the tokenizer metadata.
	tok func(*gguf.Writer)
}

// writeHybridGGUF writes the model in vals (canonical Hugging Face names,
// arch as FromHF saw it) the way llama.cpp's convert_hf_to_gguf.py does for
// qwen3next / qwen35 / qwen35moe. The forward transformations are written
// here from the converter's Python (Qwen3NextModel.modify_tensors,
// _LinearAttentionVReorderBase, Qwen2MoeModel expert stacking,
// _Qwen35MtpMixin), not by inverting the importer.
func writeHybridGGUF(t testing.TB, path, ga string, a cmf.Arch, vals map[string][]float32, o hybridGGUFOpts) {
	t.Helper()
	w := gguf.NewWriter()
	kv := func(k string, v gguf.Value) {
		if k == ga+"."+o.dropKV {
			return
		}
		if err := w.AddKV(k, v); err != nil {
			t.Fatal(err)
		}
	}
	u32 := func(x int) gguf.Value { return gguf.Uint32(uint32(x)) }
	L, nmtp := a.NumLayers, 0
	if a.MTP != nil {
		nmtp = a.MTP.NumLayers
	}
	H, hd := a.HiddenSize, a.HeadDim
	nk, nv, dk, dv, K := a.LinearNumKeyHeads, a.LinearNumValueHeads, a.LinearKeyHeadDim, a.LinearValueHeadDim, a.LinearConvKernelDim
	r, kd, vd := nv/nk, nk*dk, nv*dv
	for l, lt := range a.LayerTypes {
		if (lt == "full_attention") != ((l+1)%4 == 0) {
			t.Fatalf("layer types %v are not full_attention_interval 4", a.LayerTypes)
		}
	}

	kv("general.architecture", gguf.String(ga))
	kv(ga+".block_count", u32(L+nmtp))
	if nmtp > 0 {
		kv(ga+".nextn_predict_layers", u32(nmtp))
	}
	kv(ga+".context_length", u32(a.MaxPositionEmbeddings))
	kv(ga+".embedding_length", u32(H))
	if a.IntermediateSize > 0 {
		kv(ga+".feed_forward_length", u32(a.IntermediateSize))
	}
	kv(ga+".attention.head_count", u32(a.NumAttentionHeads))
	kv(ga+".attention.head_count_kv", u32(a.NumKVHeads))
	kv(ga+".attention.key_length", u32(hd))
	kv(ga+".attention.value_length", u32(hd))
	kv(ga+".attention.layer_norm_rms_epsilon", gguf.Float32(float32(a.RMSNormEps)))
	kv(ga+".rope.freq_base", gguf.Float32(float32(a.RopeTheta)))
	kv(ga+".rope.dimension_count", u32(int(float64(hd)*a.PartialRotaryFactor)))
	if rs := a.RopeScaling; rs != nil && len(rs.MRopeSection) > 0 {
		var secs []int32
		for _, s := range rs.MRopeSection {
			secs = append(secs, int32(s))
		}
		for len(secs) < 4 {
			secs = append(secs, 0)
		}
		kv(ga+".rope.dimension_sections", gguf.Int32s(secs))
	}
	kv(ga+".ssm.conv_kernel", u32(K))
	kv(ga+".ssm.state_size", u32(dk))
	kv(ga+".ssm.group_count", u32(nk))
	kv(ga+".ssm.time_step_rank", u32(nv))
	kv(ga+".ssm.inner_size", u32(vd))
	kv(ga+".full_attention_interval", u32(4))
	if m := a.MoE; m != nil {
		kv(ga+".expert_count", u32(m.NumExperts))
		kv(ga+".expert_used_count", u32(m.NumExpertsPerTok))
		kv(ga+".expert_feed_forward_length", u32(m.MoEIntermediateSize))
		if m.SharedExpertIntermediateSize > 0 {
			kv(ga+".expert_shared_feed_forward_length", u32(m.SharedExpertIntermediateSize))
		}
	}

	if o.tok != nil {
		o.tok(w)
	}
	put := func(name string, shape []int, v []float32) {
		if o.edit != nil && !o.edit(name, shape, v) {
			return
		}
		typ := o.typ
		// The converter keeps vectors, norms, the conv kernel and routers in F32.
		if len(shape) == 1 || strings.HasSuffix(name, "norm.weight") || strings.Contains(name, "ssm_conv1d") || strings.Contains(name, "ffn_gate_inp") {
			typ = gguf.TypeF32
		}
		if err := w.AddTensor(name, typ, shape, v); err != nil {
			t.Fatal(err)
		}
	}
	plusOne := func(v []float32) []float32 { // data_torch + 1, in float32
		out := make([]float32, len(v))
		for i, x := range v {
			out[i] = x + 1
		}
		return out
	}
	// tile is _reorder_v_heads: view [nk, r, blk] → permute to [r, nk, blk].
	tile := func(v []float32, blk int) []float32 {
		if ga == "qwen3next" || nk == nv {
			return slices.Clone(v)
		}
		out := make([]float32, len(v))
		for g := 0; g < nk; g++ {
			for i := 0; i < r; i++ {
				copy(out[(i*nk+g)*blk:(i*nk+g+1)*blk], v[(g*r+i)*blk:(g*r+i+1)*blk])
			}
		}
		return out
	}

	want, err := model.Tensors(&a)
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, model.MTPTensors(&a)...)
	type stack struct {
		shape []int
		data  [][]float32
	}
	stacks := map[string]*stack{}
	var stackOrder []string
	addExpert := func(key string, rows, cols int, v []float32) {
		s := stacks[key]
		if s == nil {
			s = &stack{shape: []int{0, rows, cols}}
			stacks[key] = s
			stackOrder = append(stackOrder, key)
		}
		s.data = append(s.data, v)
	}
	for _, ts := range want {
		n, v := ts.Name, vals[ts.Name]
		if v == nil {
			t.Fatalf("no values for %s", n)
		}
		switch n {
		case "model.embed_tokens.weight":
			put("token_embd.weight", ts.Shape, v)
			continue
		case "lm_head.weight":
			put("output.weight", ts.Shape, v)
			continue
		case "model.norm.weight":
			put("output_norm.weight", ts.Shape, plusOne(v))
			continue
		}
		if rest, ok := strings.CutPrefix(n, "mtp."); ok && !strings.HasPrefix(rest, "layers.") {
			// _Qwen35MtpMixin: mtp.fc → eh_proj, norms → enorm/hnorm/shared_head.norm,
			// written for every MTP block; "+1" then applies as to every norm.
			for b := L; b < L+nmtp; b++ {
				p := fmt.Sprintf("blk.%d.nextn.", b)
				switch rest {
				case "fc.weight":
					put(p+"eh_proj.weight", ts.Shape, v)
				case "pre_fc_norm_embedding.weight":
					put(p+"enorm.weight", ts.Shape, plusOne(v))
				case "pre_fc_norm_hidden.weight":
					put(p+"hnorm.weight", ts.Shape, plusOne(v))
				case "norm.weight":
					put(p+"shared_head_norm.weight", ts.Shape, plusOne(v))
				default:
					t.Fatalf("unexpected %s", n)
				}
			}
			continue
		}
		var bid int
		var suffix string
		if rest, ok := strings.CutPrefix(n, "mtp.layers."); ok {
			var i int
			fmt.Sscanf(rest, "%d.", &i)
			bid, suffix = L+i, rest[strings.IndexByte(rest, '.')+1:]
		} else {
			rest := strings.TrimPrefix(n, "model.layers.")
			fmt.Sscanf(rest, "%d.", &bid)
			suffix = rest[strings.IndexByte(rest, '.')+1:]
		}
		p := fmt.Sprintf("blk.%d.", bid)
		if strings.Contains(suffix, "mlp.experts.") {
			var e int
			var kind string
			fmt.Sscanf(strings.TrimPrefix(suffix, "mlp.experts."), "%d.%s", &e, &kind)
			kind = strings.TrimSuffix(kind, "_proj.weight")
			if o.fuseGateUp && kind != "down" {
				// gate and up of an expert are concatenated along dim 1.
				if kind == "gate" {
					up := vals[strings.Replace(n, "gate_proj", "up_proj", 1)]
					addExpert(p+"ffn_gate_up_exps.weight", 2*ts.Shape[0], ts.Shape[1], slices.Concat(v, up))
				}
				continue
			}
			addExpert(p+"ffn_"+kind+"_exps.weight", ts.Shape[0], ts.Shape[1], v)
			continue
		}
		simple := map[string]string{
			"self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
			"self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
			"linear_attn.norm.weight": "ssm_norm.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
			"mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
			"mlp.shared_expert.up_proj.weight":   "ffn_up_shexp.weight",
			"mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
			"mlp.shared_expert_gate.weight":      "ffn_gate_inp_shexp.weight",
			"mlp.gate_proj.weight":               "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
			"mlp.down_proj.weight": "ffn_down.weight", "linear_attn.in_proj_ba.weight": "ssm_ba.weight",
		}
		norms := map[string]string{
			"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
			"self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
		}
		if g, ok := simple[suffix]; ok {
			put(p+g, ts.Shape, v)
			continue
		}
		if g, ok := norms[suffix]; ok {
			put(p+g, ts.Shape, plusOne(v))
			continue
		}
		switch suffix {
		case "linear_attn.in_proj_qkvz.weight":
			if o.legacy {
				put(p+"ssm_in.weight", ts.Shape, v)
				continue
			}
			// view rows as [nk, dk+dk+r·dv+r·dv]; split; flatten each part.
			per := 2*dk + 2*r*dv
			var q, k, vv, z []float32
			for g := 0; g < nk; g++ {
				grp := v[g*per*H : (g+1)*per*H]
				q = append(q, grp[:dk*H]...)
				k = append(k, grp[dk*H:2*dk*H]...)
				vv = append(vv, grp[2*dk*H:(2*dk+r*dv)*H]...)
				z = append(z, grp[(2*dk+r*dv)*H:]...)
			}
			put(p+"attn_qkv.weight", []int{2*kd + vd, H}, slices.Concat(q, k, vv))
			put(p+"attn_gate.weight", []int{vd, H}, z)
		case "linear_attn.in_proj_qkv.weight":
			off := 2 * kd * H
			put(p+"attn_qkv.weight", ts.Shape, slices.Concat(v[:off], tile(v[off:], dv*H)))
		case "linear_attn.in_proj_z.weight":
			put(p+"attn_gate.weight", ts.Shape, tile(v, dv*H))
		case "linear_attn.in_proj_b.weight":
			put(p+"ssm_beta.weight", ts.Shape, tile(v, H))
		case "linear_attn.in_proj_a.weight":
			put(p+"ssm_alpha.weight", ts.Shape, tile(v, H))
		case "linear_attn.conv1d.weight": // squeeze [C,1,K] → [C,K]
			off := 2 * kd * K
			put(p+"ssm_conv1d.weight", []int{ts.Shape[0], ts.Shape[2]}, slices.Concat(v[:off], tile(v[off:], dv*K)))
		case "linear_attn.A_log": // −exp(A_log) in float32
			a := tile(v, 1)
			for i, x := range a {
				a[i] = -float32(math.Exp(float64(x)))
			}
			put(p+"ssm_a", ts.Shape, a)
		case "linear_attn.dt_bias": // renamed dt_proj.bias → ssm_dt.bias
			put(p+"ssm_dt.bias", ts.Shape, tile(v, 1))
		case "linear_attn.out_proj.weight": // columns tiled, per row
			out := make([]float32, 0, len(v))
			for row := 0; row < H; row++ {
				out = append(out, tile(v[row*vd:(row+1)*vd], dv)...)
			}
			put(p+"ssm_out.weight", ts.Shape, out)
		default:
			t.Fatalf("no GGUF name for %s", n)
		}
	}
	for _, key := range stackOrder {
		s := stacks[key]
		s.shape[0] = len(s.data)
		put(key, s.shape, slices.Concat(s.data...))
	}
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
}

// hybridTol is the largest difference the GGUF round trip may leave in a
// tensor's element (hf is the Hugging Face value).
func hybridTol(name string, hf float32, typ gguf.Type, shape []int, amax float32) float32 {
	switch {
	case typ != gguf.TypeF32 && len(shape) >= 2:
		return amax / 100 // Q8_0: error ≤ block absmax/254; F16 far less
	case strings.HasSuffix(name, "A_log"):
		// log(−(−exp(x))) in f32: ~6e-8 absolute plus half an ulp of x.
		return 2.5e-7 * max(1, abs32(hf))
	case strings.HasSuffix(name, "layernorm.weight"), strings.HasSuffix(name, "q_norm.weight"),
		strings.HasSuffix(name, "k_norm.weight"), name == "model.norm.weight", name == "mtp.norm.weight",
		strings.HasPrefix(name, "mtp.pre_fc_norm_"):
		// (w+1) rounded to f32, minus 1: half an ulp of w+1.
		s := hf + 1
		return abs32(math.Nextafter32(s, float32(math.Inf(1)))-s) / 2
	}
	return 0
}

// compareHybridCMF checks that two CMF files hold the same tensors (names,
// shapes, values within hybridTol) and the same architecture.
func compareHybridCMF(t *testing.T, hfPath, ggufPath string, typ gguf.Type) {
	t.Helper()
	hm, err := cmf.Open(hfPath)
	if err != nil {
		t.Fatal(err)
	}
	defer hm.Close()
	gm, err := cmf.Open(ggufPath)
	if err != nil {
		t.Fatal(err)
	}
	defer gm.Close()
	blobless := func(ts []cmf.Tensor) int {
		n := 0
		for _, x := range ts {
			if x.DType != quant.U8 {
				n++
			}
		}
		return n
	}
	if blobless(gm.Tensors) != blobless(hm.Tensors) {
		var hn, gn []string
		for _, x := range hm.Tensors {
			hn = append(hn, x.Name)
		}
		for _, x := range gm.Tensors {
			gn = append(gn, x.Name)
		}
		t.Fatalf("GGUF import has %d tensors, HF conversion %d:\n%v\n%v", len(gm.Tensors), len(hm.Tensors), gn, hn)
	}
	changed := 0
	var worstNorm, worstALog float64 // largest |Δ| of a "+1" norm, and |Δ|/max(1,|x|) of A_log
	for _, ht := range hm.Tensors {
		if ht.DType == quant.U8 { // tokenizer blob
			continue
		}
		a, ab, _ := hm.TensorData(ht.Name)
		g, gb, err := gm.TensorData(ht.Name)
		if err != nil {
			t.Fatalf("%s: %v", ht.Name, err)
		}
		if !slices.Equal(a.Shape, g.Shape) {
			t.Fatalf("%s: shape %v from GGUF, %v from HF", ht.Name, g.Shape, a.Shape)
		}
		x, err := quant.Decode(a.DType, ab, a.Shape)
		if err != nil {
			t.Fatal(err)
		}
		y, err := quant.Decode(g.DType, gb, g.Shape)
		if err != nil {
			t.Fatal(err)
		}
		var amax float32
		for _, v := range x {
			amax = max(amax, abs32(v))
		}
		for i := range x {
			if d := abs32(x[i] - y[i]); d > hybridTol(ht.Name, x[i], typ, a.Shape, amax) {
				t.Fatalf("%s[%d]: HF %v, GGUF %v (diff %g)", ht.Name, i, x[i], y[i], d)
			}
			if x[i] != y[i] {
				changed++
				if strings.HasSuffix(ht.Name, "A_log") {
					worstALog = max(worstALog, float64(abs32(x[i]-y[i])/max(1, abs32(x[i]))))
				} else if strings.Contains(ht.Name, "norm") {
					worstNorm = max(worstNorm, float64(abs32(x[i]-y[i])))
				}
			}
		}
	}
	t.Logf("%d tensors compared, %d elements differ within tolerance; worst norm |Δ| %.3g, worst A_log |Δ|/max(1,|x|) %.3g",
		len(hm.Tensors), changed, worstNorm, worstALog)

	ha, ga := hm.Header.Arch, gm.Header.Arch
	// Token ids come from the tokenizer on the GGUF side; the rest must agree.
	ha.BOSTokenID, ga.BOSTokenID, ha.EOSTokenIDs, ga.EOSTokenIDs, ha.Extra, ga.Extra = nil, nil, nil, nil, nil, nil
	if !reflect.DeepEqual(ha, ga) {
		hj, _ := json.Marshal(ha)
		gj, _ := json.Marshal(ga)
		t.Fatalf("arch differs:\nHF   %s\nGGUF %s", hj, gj)
	}
}

// hfSide converts an HF directory and returns the CMF path and its arch.
func hfSide(t *testing.T, dir, out string) cmf.Arch {
	t.Helper()
	res, err := FromHF(context.Background(), dir, out, Options{Quant: quant.F32})
	if err != nil {
		t.Fatal(err)
	}
	return res.Header.Arch
}

func qwen35DenseConfig() map[string]any {
	cfg := tinyConfig("qwen3_5_moe")
	tc := cfg["text_config"].(map[string]any)
	tc["model_type"] = "qwen3_5_text"
	for _, k := range []string{"num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"} {
		delete(tc, k)
	}
	tc["tie_word_embeddings"] = true
	cfg["model_type"] = "qwen3_5"
	return cfg
}

func TestConvertGGUFHybrid(t *testing.T) {
	for _, c := range []struct {
		name, ga string
		cfg      map[string]any
		vlm      bool // fused experts under model.language_model.
		o        hybridGGUFOpts
	}{
		{"qwen3next", "qwen3next", tinyConfig("qwen3_next"), false, hybridGGUFOpts{typ: gguf.TypeF32}},
		{"qwen3next_legacy_ssm_in", "qwen3next", tinyConfig("qwen3_next"), false, hybridGGUFOpts{typ: gguf.TypeF32, legacy: true}},
		{"qwen3next_fused_gate_up_f16", "qwen3next", tinyConfig("qwen3_next"), false, hybridGGUFOpts{typ: gguf.TypeF16, fuseGateUp: true}},
		{"qwen35", "qwen35", qwen35DenseConfig(), false, hybridGGUFOpts{typ: gguf.TypeF32}},
		{"qwen35moe", "qwen35moe", tinyConfig("qwen3_5_moe"), true, hybridGGUFOpts{typ: gguf.TypeF32}},
		{"qwen35moe_q8_0", "qwen35moe", tinyConfig("qwen3_5_moe"), true, hybridGGUFOpts{typ: gguf.TypeQ8_0}},
		{"qwen35moe_fused_gate_up", "qwen35moe", tinyConfig("qwen3_5_moe"), true, hybridGGUFOpts{typ: gguf.TypeF32, fuseGateUp: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			hfDir := filepath.Join(dir, "hf")
			vals := writeHF(t, hfDir, c.cfg, safetensors.F32, c.vlm, true)
			ho, gp, gO := filepath.Join(dir, "hf.cmf"), filepath.Join(dir, "m.gguf"), filepath.Join(dir, "gguf.cmf")
			arch := hfSide(t, hfDir, ho)
			if arch.MTP == nil || arch.LinearNumValueHeads == arch.LinearNumKeyHeads {
				t.Fatalf("fixture should have MTP and nv ≠ nk: %+v", arch)
			}
			writeHybridGGUF(t, gp, c.ga, arch, vals, c.o)
			if _, err := Run(context.Background(), gp, gO, Options{Quant: quant.F32}); err != nil {
				t.Fatal(err)
			}
			compareHybridCMF(t, ho, gO, c.o.typ)
		})
	}
}

// TestConvertGGUFHybridNoMTP: a GGUF without nextn blocks imports as the
// checkpoint without mtp.* tensors.
func TestConvertGGUFHybridNoMTP(t *testing.T) {
	dir := t.TempDir()
	hfDir := filepath.Join(dir, "hf")
	vals := writeHF(t, hfDir, tinyConfig("qwen3_5_moe"), safetensors.F32, true, false)
	ho, gp, gO := filepath.Join(dir, "hf.cmf"), filepath.Join(dir, "m.gguf"), filepath.Join(dir, "gguf.cmf")
	arch := hfSide(t, hfDir, ho)
	if arch.MTP != nil {
		t.Fatal("unexpected MTP")
	}
	writeHybridGGUF(t, gp, "qwen35moe", arch, vals, hybridGGUFOpts{typ: gguf.TypeF32})
	if _, err := FromGGUF(context.Background(), gp, gO, Options{Quant: quant.F32}); err != nil {
		t.Fatal(err)
	}
	compareHybridCMF(t, ho, gO, gguf.TypeF32)
}

// fixtureVals reads a committed HF fixture's tensors under canonical names,
// fused experts split per expert, as FromHF sees them.
func fixtureVals(t *testing.T, dir string) map[string][]float32 {
	t.Helper()
	st, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	vals := map[string][]float32{}
	for _, name := range st.Tensors() {
		cn := canonical(name)
		if cn == "" {
			continue
		}
		v, err := st.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		info, _ := st.Tensor(name)
		gu, dn := reFusedGU.FindStringSubmatch(cn), reFusedDown.FindStringSubmatch(cn)
		if gu == nil && dn == nil {
			vals[cn] = v
			continue
		}
		E, R, C := info.Shape[0], info.Shape[1], info.Shape[2]
		for e := 0; e < E; e++ {
			x := v[e*R*C : (e+1)*R*C]
			if gu != nil {
				vals[fmt.Sprintf("%s.%d.gate_proj.weight", gu[1], e)] = x[:R/2*C]
				vals[fmt.Sprintf("%s.%d.up_proj.weight", gu[1], e)] = x[R/2*C:]
			} else {
				vals[fmt.Sprintf("%s.%d.down_proj.weight", dn[1], e)] = x
			}
		}
	}
	return vals
}

// fixtureVocab lays out a fixture's tokenizer.json as llama.cpp's
// converter writes a gpt2/qwen2 vocabulary (ids past the tokenizer padded
// with [PADn] UNUSED entries), with its chat template and eos.
func fixtureVocab(t *testing.T, dir string, vocab int) ([]byte, func(*gguf.Writer)) {
	t.Helper()
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Added []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
		Model struct {
			Vocab  map[string]int    `json:"vocab"`
			Merges []json.RawMessage `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(tj, &doc); err != nil {
		t.Fatal(err)
	}
	tokens, types := make([]string, vocab), make([]int32, vocab)
	for i := range tokens {
		tokens[i], types[i] = fmt.Sprintf("[PAD%d]", i), 5
	}
	for s, id := range doc.Model.Vocab {
		tokens[id], types[id] = s, 1
	}
	for _, a := range doc.Added {
		tokens[a.ID], types[a.ID] = a.Content, 4
		if a.Special {
			types[a.ID] = 3
		}
	}
	var merges []string
	for _, m := range doc.Model.Merges {
		var s string
		if json.Unmarshal(m, &s) == nil {
			merges = append(merges, s)
			continue
		}
		var p []string
		if err := json.Unmarshal(m, &p); err != nil || len(p) != 2 {
			t.Fatalf("merge %s", m)
		}
		merges = append(merges, p[0]+" "+p[1])
	}
	var cfg struct {
		ChatTemplate string `json:"chat_template"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil || json.Unmarshal(b, &cfg) != nil {
		t.Fatalf("tokenizer_config.json: %v", err)
	}
	return tj, func(w *gguf.Writer) {
		for k, v := range map[string]gguf.Value{
			"tokenizer.ggml.model": gguf.String("gpt2"), "tokenizer.ggml.pre": gguf.String("qwen2"),
			"tokenizer.ggml.tokens": gguf.Strings(tokens), "tokenizer.ggml.merges": gguf.Strings(merges),
			"tokenizer.ggml.token_type": gguf.Int32s(types), "tokenizer.ggml.eos_token_id": gguf.Uint32(493),
			"tokenizer.ggml.padding_token_id": gguf.Uint32(491), "tokenizer.ggml.add_bos_token": gguf.Bool(false),
			"tokenizer.chat_template": gguf.String(cfg.ChatTemplate),
		} {
			if err := w.AddKV(k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestConvertGGUFHybridFixtures converts the committed transformers
// fixtures twice: from their safetensors, and through a GGUF written from
// those safetensors as llama.cpp would.
func TestConvertGGUFHybridFixtures(t *testing.T) {
	for _, c := range []struct{ dir, ga string }{
		{"qwen3_next_f32", "qwen3next"}, {"qwen3_5_f32", "qwen35"}, {"qwen3_5_moe_f32", "qwen35moe"},
	} {
		t.Run(c.dir, func(t *testing.T) {
			src := filepath.Join("..", "testdata", "models", c.dir)
			if _, err := os.Stat(filepath.Join(src, "config.json")); err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			ho, gp, gO := filepath.Join(dir, "hf.cmf"), filepath.Join(dir, "m.gguf"), filepath.Join(dir, "gguf.cmf")
			arch := hfSide(t, src, ho)
			tj, tok := fixtureVocab(t, src, arch.VocabSize)
			writeHybridGGUF(t, gp, c.ga, arch, fixtureVals(t, src), hybridGGUFOpts{typ: gguf.TypeF32, tok: tok})
			if _, err := FromGGUF(context.Background(), gp, gO, Options{Quant: quant.F32}); err != nil {
				t.Fatal(err)
			}
			compareHybridCMF(t, ho, gO, gguf.TypeF32)

			// The GGUF vocabulary tokenizes like tokenizer.json and keeps the template.
			hm, _ := cmf.Open(ho)
			defer hm.Close()
			gm, _ := cmf.Open(gO)
			defer gm.Close()
			if gm.Header.TokenizerConfig.ChatTemplate != hm.Header.TokenizerConfig.ChatTemplate || !slices.Contains(gm.Header.TokenizerConfig.EOSTokenIDs, 493) {
				t.Fatalf("tokenizer config %+v", gm.Header.TokenizerConfig)
			}
			gt, err := engine.LoadTokenizer(gm)
			if err != nil {
				t.Fatal(err)
			}
			ht, err := tokenizer.FromHFJSON(tj, tokenizer.Config{})
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range []string{"Hello, world! It's 2026.", "<|im_start|>user\nhi<|im_end|>\n", "  spaces\tand\nlines  ", "<think>x</think> ok"} {
				if a, b := ht.Encode(s, false, true), gt.Encode(s, false, true); !slices.Equal(a, b) {
					t.Fatalf("%q: tokenizer.json %v, GGUF %v", s, a, b)
				}
			}

			// The imported model runs and computes transformers' prompt
			// logits (within 1e-4 of their RMS).
			ref, err := safetensors.Open(filepath.Join(src, "reference.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			want, err := ref.Float32("logits")
			if err != nil {
				t.Fatal(err)
			}
			raw := ref.Raw("prompt_ids")
			ids := make([]int, len(raw)/4)
			for i := range ids {
				ids[i] = int(int32(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24))
			}
			e, err := engine.Open(gO, engine.Options{Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			c, err := e.Model.NewCache(len(ids))
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.Model.Forward(c, ids, 0, model.AllLogits)
			if err != nil {
				t.Fatal(err)
			}
			var ss, worst float64
			for i, w := range want {
				ss += float64(w) * float64(w)
				worst = math.Max(worst, math.Abs(float64(got[i]-w)))
			}
			if rel := worst / math.Sqrt(ss/float64(len(want))); rel > 1e-4 {
				t.Fatalf("GGUF-imported model's prompt logits differ from transformers' by %.3g of their RMS", rel)
			}
		})
	}
}

// TestConvertGGUFHybridErrors: damaged hybrid GGUFs fail with an error
// naming the problem.
func TestConvertGGUFHybridErrors(t *testing.T) {
	dir := t.TempDir()
	hfDir := filepath.Join(dir, "hf")
	cfg := tinyConfig("qwen3_next")
	vals := writeHF(t, hfDir, cfg, safetensors.F32, false, true)
	arch := hfSide(t, hfDir, filepath.Join(dir, "hf.cmf"))
	for _, c := range []struct {
		name string
		o    hybridGGUFOpts
		want string
	}{
		{"no_group_count", hybridGGUFOpts{dropKV: "ssm.group_count"}, "ssm.group_count"},
		{"no_experts", hybridGGUFOpts{dropKV: "expert_count"}, "expert_count"},
		{"block_count_too_big", hybridGGUFOpts{edit: func(n string, _ []int, _ []float32) bool {
			return !strings.HasPrefix(n, "blk.4.") // the MTP block's tensors gone: block_count overstates
		}}, "block_count"},
		{"no_attn_gate", hybridGGUFOpts{edit: func(n string, _ []int, _ []float32) bool { return n != "blk.0.attn_gate.weight" }}, "attn_gate"},
		{"positive_ssm_a", hybridGGUFOpts{edit: func(n string, _ []int, v []float32) bool {
			if n == "blk.1.ssm_a" {
				v[2] = 0.5
			}
			return true
		}}, "ssm_a[2]"},
		{"no_conv", hybridGGUFOpts{edit: func(n string, _ []int, _ []float32) bool { return n != "blk.2.ssm_conv1d.weight" }}, "conv1d"},
		{"stray_tensor", hybridGGUFOpts{edit: func(n string, _ []int, _ []float32) bool {
			return !strings.HasPrefix(n, "blk.3.attn_q.") // a full layer without q: missing tensor
		}}, "q_proj"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.o.typ = gguf.TypeF32
			gp := filepath.Join(t.TempDir(), "m.gguf")
			writeHybridGGUF(t, gp, "qwen3next", arch, vals, c.o)
			_, err := FromGGUF(context.Background(), gp, filepath.Join(t.TempDir(), "x.cmf"), Options{Quant: quant.F32})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one mentioning %q", err, c.want)
			}
		})
	}
}

// TestUntileRows checks the value-head reorder against a direct
// evaluation of the converter's index map on labelled rows.
func TestUntileRows(t *testing.T) {
	for _, c := range []struct{ nk, nv, hd, cols int }{{2, 4, 3, 2}, {3, 6, 1, 1}, {1, 3, 2, 5}, {4, 4, 2, 1}} {
		d := hybridDims{nk: c.nk, nv: c.nv, r: c.nv / c.nk}
		blk := c.hd * c.cols
		// GGUF slot s holds HF head (s % nk)·r + s / nk (slot i·nk+g ← head g·r+i).
		tiled := make([]float32, c.nv*blk)
		for s := 0; s < c.nv; s++ {
			h := (s%c.nk)*d.r + s/c.nk
			for j := 0; j < blk; j++ {
				tiled[s*blk+j] = float32(h*1000 + j)
			}
		}
		got := make([]float32, len(tiled))
		d.untileRows(got, tiled, c.hd, c.cols)
		for h := 0; h < c.nv; h++ {
			for j := 0; j < blk; j++ {
				if got[h*blk+j] != float32(h*1000+j) {
					t.Fatalf("%+v: head %d elem %d = %v", c, h, j, got[h*blk+j])
				}
			}
		}
	}
}

// FuzzGGUFHybrid feeds mutated hybrid GGUF files to FromGGUF: it must
// return (an error or a model), never panic. The seeds are whole files
// (~58 KB), so run it with a short -fuzzminimizetime (e.g. 2s): the default
// minute of minimizing per new input starves the search.
func FuzzGGUFHybrid(f *testing.F) {
	dir := f.TempDir()
	// Small seeds keep the fuzzer fast: 16-wide, 2 experts, 1 key / 2 value heads.
	small := func(c map[string]any) map[string]any {
		tc := c
		if x, ok := c["text_config"].(map[string]any); ok {
			tc = x
		}
		for k, v := range map[string]any{"hidden_size": 16, "intermediate_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
			"head_dim": 8, "vocab_size": 8, "num_experts": 2, "moe_intermediate_size": 8, "shared_expert_intermediate_size": 8,
			"linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8} {
			tc[k] = v
		}
		return c
	}
	for _, c := range []struct {
		ga  string
		cfg map[string]any
	}{{"qwen3next", small(tinyConfig("qwen3_next"))}, {"qwen35moe", small(tinyConfig("qwen3_5_moe"))}} {
		var top hfConfig
		b, _ := json.Marshal(c.cfg)
		json.Unmarshal(b, &top)
		arch, err := archFromHF(top, nil)
		if err != nil {
			f.Fatal(err)
		}
		arch.MTP = &cmf.MTP{NumLayers: 1}
		want, _ := model.Tensors(&arch)
		vals := map[string][]float32{}
		for i, w := range append(want, model.MTPTensors(&arch)...) {
			n := 1
			for _, d := range w.Shape {
				n *= d
			}
			v := make([]float32, n)
			for j := range v {
				v[j] = float32((i*31+j*7)%97)/97 - 0.5
			}
			vals[w.Name] = v
		}
		gp := filepath.Join(dir, c.ga+".gguf")
		writeHybridGGUF(f, gp, c.ga, arch, vals, hybridGGUFOpts{typ: gguf.TypeF32})
		b, err = os.ReadFile(gp)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d := t.TempDir()
		p := filepath.Join(d, "m.gguf")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		FromGGUF(context.Background(), p, filepath.Join(d, "m.cmf"), Options{Quant: quant.F32})
	})
}
