package kern

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
)

// The build embedded must be the build of csrc as it is: a changed kernel
// source without a rebuild (scripts/build-cuda) fails here.
func TestManifestMatchesSources(t *testing.T) {
	m, err := ReadManifest()
	if err != nil {
		t.Fatal(err)
	}
	got, err := SourcesHash(os.DirFS("csrc"))
	if err != nil {
		t.Fatal(err)
	}
	if !m.Built() {
		// No compiler was available for the last change: the manifest
		// says so, and must then carry no artifacts or kernels.
		if m.Cubin.File != "" || m.PTX.File != "" || len(m.Kernels) != 0 {
			t.Fatalf("manifest says %q but lists artifacts or kernels", m.Status)
		}
		return
	}
	if m.SourcesSHA256 != got {
		t.Fatalf("embedded build is of sources %s, csrc is %s: run scripts/build-cuda", m.SourcesSHA256, got)
	}
}

// SourcesHash must equal the shell pipeline of scripts/build-cuda; the
// expected value was computed with sha256sum over these two files.
func TestSourcesHashMatchesShell(t *testing.T) {
	fsys := fstest.MapFS{
		"b.cu":  {Data: []byte("b\n")},
		"a.cuh": {Data: []byte("a file\n")},
	}
	got, err := SourcesHash(fsys)
	if err != nil {
		t.Fatal(err)
	}
	const want = "d49d6f06a72fbd137eae2f7571be2fce7fe92d98f28f9b93413252fb8f01209a"
	if got != want {
		t.Fatalf("SourcesHash = %s, shell gives %s", got, want)
	}
	fsys["a.cuh"] = &fstest.MapFile{Data: []byte("a file!\n")}
	if again, _ := SourcesHash(fsys); again == got {
		t.Fatal("hash did not change with a source")
	}
}

func TestEmbeddedArtifacts(t *testing.T) {
	m, err := ReadManifest()
	if err != nil {
		t.Fatal(err)
	}
	if !m.Built() {
		t.Skip("manifest records no build: nothing embedded to check")
	}
	cubin, err := Cubin()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(cubin, []byte("\x7fELF")) {
		t.Fatalf("cubin does not start with an ELF header: % x", cubin[:8])
	}
	ptx, err := PTX()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(ptx, []byte(".target sm_90")) {
		t.Fatal("PTX does not target sm_90")
	}
	ks, err := ParsePTX(ptx)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(ks, func(a, b Kernel) int { return cmpStr(a.Name, b.Name) })
	man := slices.Clone(m.Kernels)
	slices.SortFunc(man, func(a, b Kernel) int { return cmpStr(a.Name, b.Name) })
	if len(ks) != len(man) {
		t.Fatalf("PTX has %d entries, manifest %d", len(ks), len(man))
	}
	for i := range ks {
		if ks[i].Name != man[i].Name || !slices.Equal(ks[i].Params, man[i].Params) {
			t.Fatalf("PTX entry %v, manifest %v", ks[i], man[i])
		}
	}
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Every kernel the decode step needs is in the build, with the parameter
// sizes the launchers in the tests pack.
func TestManifestHasDecodeKernels(t *testing.T) {
	m, err := ReadManifest()
	if err != nil {
		t.Fatal(err)
	}
	if !m.Built() {
		t.Skip("manifest records no build")
	}
	mv := []int{8, 4, 4, 8, 4, 8, 4, 8, 4}
	want := map[string][]int{
		"q82f_prescale":  {8, 8, 4, 8, 4, 8, 4},
		"rmsnorm":        {8, 4, 8, 8, 4, 4, 4, 4},
		"head_rmsnorm":   {8, 4, 8, 4, 4, 4},
		"rope":           {8, 4, 4, 4, 8, 4, 8},
		"kv_append":      {8, 4, 8, 4, 8, 8, 8, 8, 4, 4, 4},
		"rope_qk_append": {8, 4, 4, 4, 4, 4, 8, 4, 8, 8, 8, 8, 4, 8, 8, 4, 4},
		"attn_split":     {8, 4, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4},
		"attn_merge":     {8, 8, 4, 4, 4, 4},
		"attn_tiles":     {8, 4, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 8},
		"attn_tiles_h":   {8, 4, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 8},
		// attn_tiles' parameters, then (inv, mscale, rot, qw, kw, eps, one_plus)
		"attn_rope_tiles":   {8, 4, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 8, 8, 4, 4, 8, 8, 4, 4},
		"attn_rope_tiles_h": {8, 4, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 8, 8, 4, 4, 8, 8, 4, 4},
		"attn_mma_h_d64":    {8, 4, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 8},
		"attn_mma_h_d128":   {8, 4, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 8},
		"attn_mma_h_d128w4": {8, 4, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 8},
		"rope_qk_append_h":  {8, 4, 4, 4, 4, 4, 8, 4, 8, 8, 8, 8, 4, 8, 8, 4, 4},
		"silu_mul":          {8, 8, 4, 8, 4, 4},
		"add":               {8, 4, 8, 4, 4},
		"argmax":            {8, 4, 4, 8},
		"sample":            {8, 4, 4, 8, 8},
		"probe_read":        {8, 8, 8},
		"moe_route":         {8, 4, 4, 4, 4, 8, 8},
		"mv_moe_q8row":      {8, 4, 4, 8, 4, 4, 4, 4, 8, 4, 4, 4, 8, 4, 4, 8, 4},
		"mv_moe_q4tp":       {8, 4, 4, 8, 4, 4, 4, 4, 8, 4, 4, 4, 8, 4, 4, 8, 4},
		"mv_moe_f32":        {8, 4, 4, 8, 4, 4, 4, 4, 8, 4, 4, 4, 8, 4, 4, 8, 4},
		"mv_moe_f16":        {8, 4, 4, 8, 4, 4, 4, 4, 8, 4, 4, 4, 8, 4, 4, 8, 4},
		"mv_moe_bf16":       {8, 4, 4, 8, 4, 4, 4, 4, 8, 4, 4, 4, 8, 4, 4, 8, 4},
		"moe_combine":       {8, 4, 8, 4, 8, 4, 8, 8, 4, 8},
		"moe_router_f32":    {8, 4, 8, 4, 4, 8, 4, 4, 4, 4, 8, 4, 8, 8, 8, 4, 8, 8, 8},
		"mv_moe_dc_q4tp":    {8, 4, 8, 4, 4, 4, 4, 8, 4, 4, 4, 8, 4, 8, 8, 8},
		"mv_moe_dc_q8row":   {8, 4, 8, 4, 4, 4, 4, 8, 4, 4, 4, 8, 4, 8, 8, 8},
		"mv_moe_ff_q4tp":    {8, 8, 4, 8, 4, 4, 4, 4, 8, 4, 8, 4, 8, 4, 8, 8, 8, 8},
		"mv_moe_ff_q8row":   {8, 8, 4, 8, 4, 4, 4, 4, 8, 4, 8, 4, 8, 4, 8, 8, 8, 8},
		"moe_sort":          {8, 4, 4, 8, 8, 8, 4},
		"moe_gather_q":      {8, 8, 4, 4, 8, 8, 8, 8},
		"gemmq_moe_q8row":   {8, 8, 4, 4, 8, 8, 8, 4, 4},
		"gemmq_moe_q4tp":    {8, 8, 4, 4, 8, 8, 8, 4, 4},
		"gate_split":        {8, 4, 8, 4, 8, 4, 4, 4, 4},
		"gate_mul":          {8, 4, 8, 4, 4},
		"gemmq_actq":        {8, 4, 4, 8, 8, 4}, // (X, ldx, cols, XQ, D, perm)
		"gemmq_actq_pro":    {8, 4, 4, 8, 8, 4, 4, 8, 8, 4, 4},
		"gemmh_acth":        {8, 4, 4, 8, 4, 8, 8, 4, 4}, // (X, ldx, cols, XH, pro, U, nw, eps, one_plus)
		// (proj, ldp, grouped, nk, dk, nv, dv, w, K, state, stride, slot, out, ldo)
		"dn_conv":      {8, 4, 4, 4, 4, 4, 4, 8, 4, 8, 4, 8, 8, 4},
		"dn_conv_step": {8, 4, 4, 4, 4, 4, 4, 8, 4, 8, 4, 8, 8, 4}, // dn_conv's
		// (proj, ldp, grouped, nk, dk, nv, dv, K, state, stride, slot)
		"dn_conv_state": {8, 4, 4, 4, 4, 4, 4, 4, 8, 4, 8},
		// (conv, ldc, proj, ldp, grouped, nk, dk, nv, dv, A_log, dt_bias, nw, eps, state, stride, soff, slot, R, out, ldo)
		"dn_rule": {8, 4, 8, 4, 4, 4, 4, 4, 4, 8, 8, 8, 4, 8, 4, 4, 8, 4, 8, 4},
		// dn_rule's, then the scratch X
		"dn_chunk_prep":  {8, 4, 8, 4, 4, 4, 4, 4, 4, 8, 8, 8, 4, 8, 4, 4, 8, 4, 8, 4, 8},
		"dn_chunk_state": {8, 4, 8, 4, 4, 4, 4, 4, 4, 8, 8, 8, 4, 8, 4, 4, 8, 4, 8, 4, 8},
		"dn_gnorm":       {8, 4, 8, 4, 4, 4, 4, 4, 4, 8, 8, 8, 4, 8, 4, 4, 8, 4, 8, 4, 8},
	}
	for _, f := range []string{"f32", "f16", "bf16", "q8row", "q82f", "q4tp"} {
		want["embed_"+f] = []int{8, 4, 4, 8, 8, 4}
		if f == "q82f" {
			continue
		}
		want["gemm_"+f] = []int{8, 4, 4, 8, 4, 8, 4, 4, 8, 4}
		want["gemm_"+f+"_t64"] = want["gemm_"+f]
		if f == "f32" || f == "f16" || f == "bf16" {
			want["mm_"+f] = want["gemm_"+f] // the float32-exact product: gemm_*'s parameters
			want["mm_"+f+"_t16"] = want["gemm_"+f]
		}
		for r := 1; r <= 8; r++ {
			want["mv_"+f+"_r"+string(rune('0'+r))] = mv
			if f == "q8row" || f == "q4tp" {
				// (W, rows, cols, XQ, D, Y, ldy, T, bias, accumulate): gemmq.cu's tiles
				for _, tile := range []string{"", "_t64", "_d64", "_s16", "_s16h", "_s32", "_s32h", "_s64", "_s64h"} {
					want["gemmq_"+f+tile] = []int{8, 4, 4, 8, 8, 8, 4, 4, 8, 4}
				}
				for _, bm := range []string{"16", "32", "64"} {
					for _, ks := range []string{"1", "2", "4", "7", "8"} {
						// (W0, W1, W2, rows0..2, cols, XQ, D, Y, ldy, T, b0..2, accumulate)
						want["gemmq_"+f+"_w"+bm+"k"+ks] = []int{8, 8, 8, 4, 4, 4, 4, 8, 8, 8, 4, 4, 8, 8, 8, 4}
					}
				}
				want["gemmq_"+f+"_t64s"] = want["gemmq_"+f+"_w16k1"] // stacked above 64 rows: the wide tiles' parameters
				// (W0, W1, W2, rows0..2, cols, x, ldx, xoff, y, ldy, b0..2, accumulate, nw, eps, pro)
				want["mv_"+f+"_r"+string(rune('0'+r))] = []int{8, 8, 8, 4, 4, 4, 4, 8, 4, 4, 8, 4, 8, 8, 8, 4, 8, 4, 4}
			}
		}
	}
	for _, ks := range []string{"1", "2", "4", "8"} {
		want["gemmq_q4tp_w64k"+ks+"d"] = []int{8, 8, 8, 4, 4, 4, 4, 8, 8, 8, 4, 4, 8, 8, 8, 4}
	}
	for _, t := range GemmHTiles() {
		// (W0, W1, W2, rows0..2, cols, XH, Y, ldy, T, b0..2, accumulate, hout, ldh)
		want["gemmh_q4tp"+t.Suffix] = []int{8, 8, 8, 4, 4, 4, 4, 8, 8, 4, 4, 8, 8, 8, 4, 8, 4}
	}
	for name, ps := range want {
		k, ok := m.Kernel(name)
		if !ok {
			t.Errorf("kernel %s missing", name)
			continue
		}
		if !slices.Equal(k.Params, ps) {
			t.Errorf("kernel %s params %v, want %v", name, k.Params, ps)
		}
	}
	// The lab's variants (csrc/lab.cu) are package lab's to check.
	n := 0
	for _, k := range m.Kernels {
		if !strings.HasPrefix(k.Name, "lab_") {
			n++
		}
	}
	if n != len(want) {
		t.Errorf("manifest lists %d kernels besides lab_*, want %d", n, len(want))
	}
}

func TestParsePTX(t *testing.T) {
	src := `
.version 7.8
.target sm_90
.address_size 64

.visible .entry k1(
	.param .u64 k1_param_0,
	.param .u32 k1_param_1,
	.param .u64 .ptr .global .align 4 k1_param_1b,
	.param .f32 k1_param_2,
	.param .align 8 .b8 k1_param_3[32]
)
{
	ret;
}
.visible .entry k2()
{
	ret;
}
.visible .entry k3(
	.param .u16 k3_param_0
)
`
	ks, err := ParsePTX([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := []Kernel{{"k1", []int{8, 4, 8, 4, 32}}, {"k2", []int{}}, {"k3", []int{2}}}
	if len(ks) != len(want) {
		t.Fatalf("got %v", ks)
	}
	for i := range want {
		if ks[i].Name != want[i].Name || !slices.Equal(ks[i].Params, want[i].Params) {
			t.Fatalf("entry %d: got %v, want %v", i, ks[i], want[i])
		}
	}
	for _, bad := range []string{
		".visible .entry k(\n.param .u64 a,\n",   // unclosed
		".visible .entry k(\n.param a\n)\n",      // no type
		".visible .entry k(\n.param .b8 a[x]\n)", // bad count
		".visible .entry (\n)\n",                 // no name
	} {
		if _, err := ParsePTX([]byte(bad)); err == nil {
			t.Errorf("ParsePTX(%q) accepted", bad)
		}
	}
}

func FuzzParsePTX(f *testing.F) {
	f.Add([]byte(".visible .entry k(\n.param .u64 a,\n.param .align 4 .b8 s[12]\n)\n"))
	f.Add([]byte(".entry x()"))
	f.Add([]byte(".visible .entry k(\n.param .b8 a[99999999999]\n)"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ks, err := ParsePTX(b)
		if err != nil {
			return
		}
		for _, k := range ks {
			if k.Name == "" {
				t.Fatal("entry without a name accepted")
			}
			for _, p := range k.Params {
				if p <= 0 {
					t.Fatalf("parameter size %d", p)
				}
			}
		}
	})
}

func TestParseManifest(t *testing.T) {
	if _, err := ParseManifest([]byte(`{"status":"maybe"}`)); err == nil {
		t.Error("unknown status accepted")
	}
	if _, err := ParseManifest([]byte(`{`)); err == nil {
		t.Error("bad JSON accepted")
	}
	m, err := ParseManifest([]byte(`{"status":"no build"}`))
	if err != nil || m.Built() {
		t.Fatalf("no-build manifest: %v %v", m, err)
	}
}

// BuildDirEnv swaps in a build folder; a folder whose artifact does not
// match its manifest's hash is refused.
func TestBuildDirOverride(t *testing.T) {
	m, err := ReadManifest()
	if err != nil || !m.Built() {
		t.Skip("no embedded build to copy")
	}
	dir := t.TempDir()
	for _, f := range []string{"manifest.json", m.Cubin.File, m.PTX.File} {
		b, err := buildFS.ReadFile("build/" + f)
		if err != nil {
			t.Fatal(err)
		}
		if f == m.PTX.File {
			b = bytes.Clone(b)
			b[len(b)/2] ^= 0xff // corrupt the PTX only
		}
		if err := os.WriteFile(dir+"/"+f, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(BuildDirEnv, dir)
	if _, err := Cubin(); err != nil {
		t.Fatalf("cubin from the folder: %v", err)
	}
	if _, err := PTX(); err == nil {
		t.Fatal("a corrupted PTX was accepted")
	}
	t.Setenv(BuildDirEnv, t.TempDir())
	if _, err := ReadManifest(); err == nil {
		t.Fatal("an empty build folder was accepted")
	}
}
