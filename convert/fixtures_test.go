package convert

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/quant"
	"github.com/cortiq/cortiq/safetensors"
)

// TestConvertFixtures converts every reference fixture (tiny models saved by
// transformers, see testdata/models/README.md) and checks that each source
// tensor survives exactly under its canonical name (f32 stays f32, bf16
// stays bf16), including fused experts split per expert.
func TestConvertFixtures(t *testing.T) {
	dirs, _ := filepath.Glob("../testdata/models/*/config.json")
	if len(dirs) < 9 {
		t.Fatalf("found %d fixtures, want the 9 of testdata/models", len(dirs))
	}
	for _, cfgPath := range dirs {
		dir := filepath.Dir(cfgPath)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			st, err := safetensors.OpenDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			d := quant.F32
			if strings.Contains(filepath.Base(dir), "bf16") {
				d = quant.BF16
			}
			out := filepath.Join(t.TempDir(), "m.cmf")
			if _, err := FromHF(context.Background(), dir, out, Options{Quant: d}); err != nil {
				t.Fatal(err)
			}
			mdl, err := cmf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer mdl.Close()
			m := mdl
			if m.Header.TokenizerConfig == nil || m.Header.TokenizerConfig.ChatTemplate == "" {
				t.Fatal("tokenizer or chat template lost")
			}
			checked := 0
			for _, name := range st.Tensors() {
				cn := canonical(name)
				if cn == "" {
					continue
				}
				src, err := st.Float32(name)
				if err != nil {
					t.Fatal(err)
				}
				info, _ := st.Tensor(name)
				if m := reFusedGU.FindStringSubmatch(cn); m != nil {
					checked += checkFused(t, mdl, src, info.Shape, m[1], true)
					continue
				}
				if m := reFusedDown.FindStringSubmatch(cn); m != nil {
					checked += checkFused(t, mdl, src, info.Shape, m[1], false)
					continue
				}
				tt, b, err := m.TensorData(cn)
				if err != nil {
					if cn == "lm_head.weight" && m.Header.Arch.TieWordEmbeddings {
						continue
					}
					t.Fatal(err)
				}
				got, err := quant.Decode(tt.DType, b, tt.Shape)
				if err != nil {
					t.Fatal(err)
				}
				for i := range src {
					if got[i] != src[i] {
						t.Fatalf("%s[%d]: %v, source %v", cn, i, got[i], src[i])
					}
				}
				checked++
			}
			if checked < 10 {
				t.Fatalf("only %d tensors checked", checked)
			}
			_ = os.Remove(out)
		})
	}
}

// checkFused compares each expert's slice of a fused tensor with the
// per-expert tensor the converter wrote.
func checkFused(t *testing.T, m *cmf.Model, src []float32, shape []int, prefix string, gateUp bool) int {
	E, R, C := shape[0], shape[1], shape[2]
	n := 0
	for e := 0; e < E; e++ {
		parts := []struct {
			name   string
			r0, r1 int
		}{{"down_proj", 0, R}}
		if gateUp {
			parts = []struct {
				name   string
				r0, r1 int
			}{{"gate_proj", 0, R / 2}, {"up_proj", R / 2, R}}
		}
		for _, p := range parts {
			name := prefix + "." + strconv.Itoa(e) + "." + p.name + ".weight"
			tt, b, err := m.TensorData(name)
			if err != nil {
				t.Fatal(err)
			}
			got, err := quant.Decode(tt.DType, b, tt.Shape)
			if err != nil {
				t.Fatal(err)
			}
			want := src[(e*R+p.r0)*C : (e*R+p.r1)*C]
			if len(got) != len(want) {
				t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%s[%d]: %v, fused source %v", name, i, got[i], want[i])
				}
			}
			n++
		}
	}
	return n
}
