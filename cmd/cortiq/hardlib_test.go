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
	if _, err := cli(t, "run", p, "hi", "-n", "1", "--ctx", "64"); err == nil || !strings.Contains(err.Error(), "output limit (1024 bytes)") {
		t.Fatalf("run --ctx 64 with a 3000-byte template: %v", err)
	}
}
