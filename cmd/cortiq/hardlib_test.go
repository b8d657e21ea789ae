package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fixtureWithTemplate copies the qwen3_f32 fixture to a temporary directory
// with its chat template replaced, converts it and returns the CMF's path.
func fixtureWithTemplate(t *testing.T, template string) string {
	t.Helper()
	src := filepath.Join("..", "..", "testdata", "models", "qwen3_f32")
	dir := t.TempDir()
	for _, name := range []string{"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, name), string(b))
	}
	b, err := os.ReadFile(filepath.Join(src, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tc map[string]any
	if err := json.Unmarshal(b, &tc); err != nil {
		t.Fatal(err)
	}
	tc["chat_template"] = template
	b, _ = json.Marshal(tc)
	writeFile(t, filepath.Join(dir, "tokenizer_config.json"), string(b))
	p := filepath.Join(t.TempDir(), "m.cmf")
	if _, err := cli(t, "convert", dir, "-o", p, "--quant", "f32"); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRunHostileTemplate: issue 8's template, which made run spend 70 s and
// 11 GB, fails in well under a second with a message naming the template.
func TestRunHostileTemplate(t *testing.T) {
	p := fixtureWithTemplate(t, "{% for i in range(100000000) %}x{% endfor %}")
	t0 := time.Now()
	_, err := cli(t, "run", p, "hi", "-n", "1")
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("run took %v", d)
	}
	if err == nil || !strings.Contains(err.Error(), "chat template") || !strings.Contains(err.Error(), "range()") {
		t.Fatalf("run: %v", err)
	}
	// The output limit follows --ctx: 16 bytes a token.
	p = fixtureWithTemplate(t, "{% for i in range(300) %}xxxxxxxxxx{% endfor %}")
	if _, err := cli(t, "run", p, "hi", "-n", "1", "--ctx", "64"); err == nil || !strings.Contains(err.Error(), "output limit (1030 bytes: the conversation's 6 and 1024 more)") {
		t.Fatalf("run --ctx 64 with a 3000-byte template: %v", err)
	}
}

// TestDamagedWeightsRefused: a flipped byte in a tensor's bytes makes every
// command that opens the model fail, naming the tensor; --no-verify runs
// it anyway; verify still names it.
func TestDamagedWeightsRefused(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	p := convertFixture(t, "qwen3_f32", "f32")
	m, err := openCMF(p, true)
	if err != nil {
		t.Fatal(err)
	}
	tt, _ := m.Tensor("model.layers.0.mlp.down_proj.weight")
	abs, _ := m.AbsOffset(tt)
	m.Close()
	// Verified before the damage: the cache must not vouch for the new
	// bytes (rewriting the file gives it a new modification time).
	if _, err := cli(t, "inspect", p); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[abs+tt.Size/2] ^= 1
	time.Sleep(10 * time.Millisecond)
	writeFile(t, p, string(b))
	want := "tensor model.layers.0.mlp.down_proj.weight"
	cmds := [][]string{
		{"run", p, "--ids", "1,2", "-n", "1"},
		{"logits", p, "--ids", "1,2", "--json"},
		{"inspect", p},
		{"tokenize", p},
		{"perplexity", p, "--text", p},
		{"bench", p, "-p", "4", "-n", "2", "-r", "1", "--no-probe"},
	}
	for _, args := range cmds {
		if _, err := cli(t, args...); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "damaged") {
			t.Errorf("%s on damaged weights: %v", args[0], err)
		}
	}
	for _, args := range cmds[:3] {
		if _, err := cli(t, append(args, "--no-verify")...); err != nil {
			t.Errorf("%s --no-verify: %v", args[0], err)
		}
	}
	if out, err := cli(t, "verify", p); err == nil || !strings.Contains(out, want) {
		t.Errorf("verify: %v %s", err, out)
	}
}

// TestDirectoryAsModel: a directory given as the model says what is wrong.
func TestDirectoryAsModel(t *testing.T) {
	_, err := cli(t, "run", t.TempDir(), "hi")
	if err == nil || !strings.Contains(err.Error(), "is a directory, not a CMF model file") {
		t.Fatalf("run DIR: %v", err)
	}
	_, err = cli(t, "inspect", filepath.Join("..", "..", "testdata", "models", "qwen3_f32"))
	if err == nil || !strings.Contains(err.Error(), "cortiq convert") {
		t.Fatalf("inspect HF-DIR: %v", err)
	}
}

// TestConvertOutputDirectory: -o naming an existing directory fails before
// converting, and leaves nothing in it.
func TestConvertOutputDirectory(t *testing.T) {
	out := t.TempDir()
	_, err := cli(t, "convert", filepath.Join("..", "..", "testdata", "models", "qwen3_f32"), "-o", out)
	if err == nil || !strings.Contains(err.Error(), "is a directory; give a file name") {
		t.Fatalf("convert -o DIR: %v", err)
	}
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Fatalf("convert left %d entries in the directory", len(ents))
	}
}
