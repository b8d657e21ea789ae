package chat

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The golden files are rendered by tools/refgen/chatgolden.mjs with
// @huggingface/jinja (transformers.js); see chat/testdata/README.md.

type goldenTemplate struct {
	File     string         `json:"file"`
	BOSToken string         `json:"bos_token"`
	EOSToken string         `json:"eos_token"`
	Vars     map[string]any `json:"vars"`
}

type goldenCase struct {
	Name                string    `json:"name"`
	Messages            []Message `json:"messages"`
	AddGenerationPrompt bool      `json:"add_generation_prompt"`
	EnableThinking      *bool     `json:"enable_thinking"`
	Tools               bool      `json:"tools"`
	Now                 string    `json:"now"`
	DropVars            []string  `json:"drop_vars"`
	Templates           []string  `json:"templates"`
}

type goldenSpec struct {
	Templates map[string]goldenTemplate `json:"templates"`
	Tools     []json.RawMessage         `json:"tools"`
	Cases     []goldenCase              `json:"cases"`
}

type goldenErr struct {
	Raised  bool   `json:"raised"`
	Message string `json:"message"`
}

func loadSpec(t testing.TB) goldenSpec {
	t.Helper()
	b, err := os.ReadFile("testdata/golden/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var spec goldenSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatalf("cases.json: %v", err)
	}
	return spec
}

func (c goldenCase) options(spec goldenSpec, tmpl goldenTemplate) (Options, error) {
	now, err := time.Parse(time.RFC3339, "2024-07-26T00:00:00Z")
	if c.Now != "" {
		now, err = time.Parse(time.RFC3339, c.Now)
	}
	opts := Options{
		AddGenerationPrompt: c.AddGenerationPrompt,
		EnableThinking:      c.EnableThinking,
		BOSToken:            tmpl.BOSToken,
		EOSToken:            tmpl.EOSToken,
		Vars:                map[string]any{},
		Now:                 func() time.Time { return now },
	}
	for k, v := range tmpl.Vars {
		if !slices.Contains(c.DropVars, k) {
			opts.Vars[k] = v
		}
	}
	if c.Tools {
		for _, tl := range spec.Tools {
			opts.Tools = append(opts.Tools, tl)
		}
	}
	return opts, err
}

func TestGoldenRenders(t *testing.T) {
	spec := loadSpec(t)
	names := make([]string, 0, len(spec.Templates))
	for n := range spec.Templates {
		names = append(names, n)
	}
	slices.Sort(names)
	checked := 0
	for _, name := range names {
		gt := spec.Templates[name]
		src, err := os.ReadFile(filepath.Join("testdata", gt.File))
		if err != nil {
			t.Fatal(err)
		}
		tmpl, err := Compile(string(src))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, c := range spec.Cases {
			if len(c.Templates) > 0 && !slices.Contains(c.Templates, name) {
				continue
			}
			t.Run(name+"/"+c.Name, func(t *testing.T) {
				opts, err := c.options(spec, gt)
				if err != nil {
					t.Fatal(err)
				}
				got, rerr := tmpl.Render(c.Messages, opts)
				base := filepath.Join("testdata", "golden", name, c.Name)
				if want, err := os.ReadFile(base + ".txt"); err == nil {
					if rerr != nil {
						t.Fatalf("render failed: %v", rerr)
					}
					if got != string(want) {
						t.Fatalf("render differs from @huggingface/jinja\n%s", diffAt(got, string(want)))
					}
					return
				}
				eb, err := os.ReadFile(base + ".err")
				if err != nil {
					t.Fatalf("no golden file for this case: %v", err)
				}
				var want goldenErr
				if err := json.Unmarshal(eb, &want); err != nil {
					t.Fatal(err)
				}
				if rerr == nil {
					t.Fatalf("rendered %q, want the error %q", got, want.Message)
				}
				var te *TemplateError
				if want.Raised {
					if !errors.As(rerr, &te) || te.Message != want.Message {
						t.Fatalf("error %v, want raise_exception(%q)", rerr, want.Message)
					}
				} else if errors.As(rerr, &te) {
					t.Fatalf("error %v is a raise_exception, want an engine error like %q", rerr, want.Message)
				}
				t.Logf("error as expected: %v", rerr)
			})
			checked++
		}
	}
	if checked < 60 {
		t.Fatalf("only %d golden cases checked", checked)
	}
}

// diffAt shows where two renders first differ.
func diffAt(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	lo := max(0, i-80)
	return "first difference at byte " + itoa(i) + "\n--- got:\n" + got[lo:min(len(got), i+80)] +
		"\n--- want:\n" + want[lo:min(len(want), i+80)]
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// TestGoldenFilesComplete checks that every golden file belongs to a case,
// so a renamed case cannot leave a stale file that is never compared.
func TestGoldenFilesComplete(t *testing.T) {
	spec := loadSpec(t)
	want := map[string]bool{}
	for name := range spec.Templates {
		for _, c := range spec.Cases {
			if len(c.Templates) == 0 || slices.Contains(c.Templates, name) {
				want[name+"/"+c.Name] = true
			}
		}
	}
	files, err := filepath.Glob("testdata/golden/*/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		rel := strings.TrimPrefix(filepath.ToSlash(f), "testdata/golden/")
		key := strings.TrimSuffix(strings.TrimSuffix(rel, ".txt"), ".err")
		if !want[key] {
			t.Errorf("stale golden file %s", f)
		}
		delete(want, key)
	}
	for k := range want {
		t.Errorf("missing golden file for %s", k)
	}
}
