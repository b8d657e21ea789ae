package chat

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ardanlabs/jinja"
)

func render(t *testing.T, src string, msgs []Message, opts Options) string {
	t.Helper()
	out, err := Render(src, msgs, opts)
	if err != nil {
		t.Fatalf("Render(%q): %v", src, err)
	}
	return out
}

func TestTojsonMatchesPythonJSONDumps(t *testing.T) {
	// Expected strings are what Python's json.dumps(x, ensure_ascii=False,
	// ...) returns for the same value (transformers' tojson).
	val := func(js string) jinja.Value {
		v, err := jsonValue([]byte(js))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	kw := func(pairs ...any) map[string]jinja.Value {
		m := map[string]jinja.Value{}
		for i := 0; i < len(pairs); i += 2 {
			v, err := toValue(pairs[i+1])
			if err != nil {
				t.Fatal(err)
			}
			m[pairs[i].(string)] = v
		}
		return m
	}
	for _, tc := range []struct {
		in     string
		kwargs map[string]jinja.Value
		want   string
	}{
		{`{"b": 1, "a": [true, false, null]}`, nil, `{"b": 1, "a": [true, false, null]}`},
		{`[1.0, 0.1, 1e16, 1e-5, 123456789.0, 1.5e300, -0.0, 2.5e-4, 1e15]`, nil,
			`[1.0, 0.1, 1e+16, 1e-05, 123456789.0, 1.5e+300, -0.0, 0.00025, 1000000000000000.0]`},
		{`9007199254740993`, nil, `9007199254740993`},
		{`"é😀 <&> \u2028 \u0001 \u007f \"q\" \\ \n\t\b\f\r"`, nil, `"é😀 <&> ` + "\u2028" + ` \u0001 ` + "\x7f" + ` \"q\" \\ \n\t\b\f\r"`},
		{`"é😀\u007f"`, kw("ensure_ascii", true), `"\u00e9\ud83d\ude00\u007f"`},
		{`{"a": [1, {}], "b": [], "c": {"d": "x"}}`, kw("indent", 2),
			"{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": [],\n  \"c\": {\n    \"d\": \"x\"\n  }\n}"},
		{`[1, 2]`, kw("indent", 0), "[\n1,\n2\n]"},
		{`{"b": 1, "a": 2}`, kw("sort_keys", true), `{"a": 2, "b": 1}`},
		{`{"a": [1, 2]}`, kw("separators", []any{",", ":"}), `{"a":[1,2]}`},
		{`{"a": 1}`, kw("indent", "\t"), "{\n\t\"a\": 1\n}"},
	} {
		got, err := tojsonFilter([]jinja.Value{val(tc.in)}, tc.kwargs)
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		if got.AsString() != tc.want {
			t.Errorf("tojson(%s, %v)\n got %q\nwant %q", tc.in, tc.kwargs, got.AsString(), tc.want)
		}
	}
	if _, err := tojsonFilter([]jinja.Value{jinja.NewInt(1)}, kw("bogus", 1)); err == nil {
		t.Error("unknown tojson argument accepted")
	}
	if _, err := tojsonFilter([]jinja.Value{jinja.NewCallable("f", nil)}, nil); err == nil {
		t.Error("tojson of a function must fail")
	}
}

func TestTojsonThroughTemplates(t *testing.T) {
	opts := Options{Vars: map[string]any{"x": json.RawMessage(`{"z": 1, "a": "<b>"}`)}}
	for src, want := range map[string]string{
		`{{ x | tojson }}`:                            `{"z": 1, "a": "<b>"}`,
		`{{ x|tojson(indent=1) }}`:                    "{\n \"z\": 1,\n \"a\": \"<b>\"\n}",
		`{% set s = x | tojson %}{{ s }}`:             `{"z": 1, "a": "<b>"}`,
		`{{ "x | tojson" }}`:                          `x | tojson`,
		`{{ 'it' }}{# x|tojson #}`:                    `it`,
		`{{ x.z|string }} | tojson`:                   `1 | tojson`,
		`{{ [x.a] | tojson(separators=[",", ":"]) }}`: `["<b>"]`,
	} {
		if got := render(t, src, nil, opts); got != want {
			t.Errorf("%s\n got %q\nwant %q", src, got, want)
		}
	}
}

func TestRenameInCode(t *testing.T) {
	r := map[string]string{"tojson": "T"}
	for in, want := range map[string]string{
		` a|tojson `:                    ` a|T `,
		` a | tojson(indent=4) | safe `: ` a | T(indent=4) | safe `,
		` set y = a |  tojson `:         ` set y = a |  T `,
		` a | tojsonx ~ tojson `:        ` a | tojsonx ~ tojson `,
		` "|tojson}}" ~ a|tojson `:      ` "|tojson}}" ~ a|T `,
		` 'a\'|tojson' `:                ` 'a\'|tojson' `,
		" a\n|\ntojson ":                " a\n|\nT ",
	} {
		if got := renameInCode(in, r); got != want {
			t.Errorf("renameInCode(%q)\n got %q\nwant %q", in, got, want)
		}
	}
}

func TestStrftime(t *testing.T) {
	wed := time.Date(2025, 3, 5, 14, 7, 9, 123456000, time.UTC)
	sun := time.Date(2024, 12, 29, 0, 30, 0, 0, time.FixedZone("X", -5*3600-1800))
	for _, tc := range []struct {
		t         time.Time
		fmt, want string
	}{
		{wed, "%d %b %Y", "05 Mar 2025"},
		{wed, "%A %B %-d, %-m/%-H", "Wednesday March 5, 3/14"},
		{wed, "%I:%M:%S %p", "02:07:09 PM"},
		{wed, "%j %y %e %f", "064 25  5 123456"},
		{wed, "%c|%x|%X", "Wed Mar  5 14:07:09 2025|03/05/25|14:07:09"},
		{wed, "%u %w %a %z %Z", "3 3 Wed +0000 UTC"},
		{wed, "100%% %Q %-Q %", "100% %Q %-Q %"},
		{sun, "%u %w %I %p %z %Z %-j", "7 0 12 AM -0530 X 364"},
	} {
		if got := strftime(tc.t, tc.fmt); got != tc.want {
			t.Errorf("strftime(%q) = %q want %q", tc.fmt, got, tc.want)
		}
	}
	fixed := func() time.Time { return wed }
	if got := render(t, `{{ strftime_now("%d %B %Y") }}`, nil, Options{Now: fixed}); got != "05 March 2025" {
		t.Errorf("strftime_now = %q", got)
	}
}

func TestMessageShape(t *testing.T) {
	msgs := []Message{
		{Role: "user", Content: "hi"},
		{Role: "assistant", ReasoningContent: "think", ToolCalls: []ToolCall{
			{ID: "c1", Function: FunctionCall{Name: "f", Arguments: `{"b": 1, "a": [true, null, 1.5]}`}},
			{Type: "custom", Function: FunctionCall{Name: "g", Arguments: `not json`}},
			{Function: FunctionCall{Name: "h", Arguments: `[1, 2]`}},
		}},
		{Role: "tool", Content: "42", ToolCallID: "c1", Name: "f"},
	}
	src := `{% for m in messages %}{{ m | tojson }}
{% endfor %}`
	want := `{"role": "user", "content": "hi"}
{"role": "assistant", "content": "", "reasoning_content": "think", "tool_calls": [` +
		`{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": [true, null, 1.5]}}}, ` +
		`{"type": "custom", "function": {"name": "g", "arguments": "not json"}}, ` +
		`{"type": "function", "function": {"name": "h", "arguments": "[1, 2]"}}]}
{"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"}
`
	if got := render(t, src, msgs, Options{}); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// Optional fields are undefined when empty, as templates test them.
	got := render(t, `{{ messages[0].reasoning_content is defined }} {{ 'tool_calls' in messages[0] }}`, msgs[:1], Options{})
	if got != "False False" {
		t.Errorf("empty optional fields must be absent: %q", got)
	}
}

func TestOptionsVariables(t *testing.T) {
	yes, no := true, false
	src := `{{ add_generation_prompt }}|{{ enable_thinking is defined }}|{{ enable_thinking }}|{{ tools is none }}|{{ bos_token }}|{{ eos_token }}|{{ extra }}`
	if got := render(t, src, nil, Options{}); got != "False|False||True|||" {
		t.Errorf("defaults: %q", got)
	}
	got := render(t, src, nil, Options{AddGenerationPrompt: true, EnableThinking: &no, BOSToken: "<s>", EOSToken: "</s>",
		Tools: []any{map[string]any{"x": 1}}, Vars: map[string]any{"extra": 7}})
	if got != "True|True|False|False|<s>|</s>|7" {
		t.Errorf("set: %q", got)
	}
	if got := render(t, `{{ [f, g] | tojson }}`, nil, Options{Vars: map[string]any{"f": 1.0, "g": float32(0.5)}}); got != "[1.0, 0.5]" {
		t.Errorf("float vars: %q", got)
	}
	if got := render(t, `{{ enable_thinking }}`, nil, Options{EnableThinking: &yes}); got != "True" {
		t.Errorf("enable_thinking true: %q", got)
	}

	// Tool key order: RawMessage as written, structs in field order, maps
	// sorted (encoding/json sorts map keys).
	type fn struct {
		Zeta  string `json:"zeta"`
		Alpha int    `json:"alpha"`
	}
	got = render(t, `{% for t in tools %}{{ t | tojson }};{% endfor %}`, nil, Options{Tools: []any{
		json.RawMessage(`{"z": 1, "a": 2}`), fn{"s", 3}, map[string]any{"z": 1, "a": 2}}})
	if want := `{"z": 1, "a": 2};{"zeta": "s", "alpha": 3};{"a": 2, "z": 1};`; got != want {
		t.Errorf("tool order:\n got %s\nwant %s", got, want)
	}
	// A jinja.Value passes through, e.g. a custom function.
	shout := jinja.NewCallable("shout", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		return jinja.NewString(strings.ToUpper(args[0].AsString())), nil
	})
	if got := render(t, `{{ shout("hi") }}`, nil, Options{Vars: map[string]any{"shout": shout}}); got != "HI" {
		t.Errorf("callable var: %q", got)
	}
}

func TestErrors(t *testing.T) {
	for src, wantSub := range map[string]string{
		`{% if x %}never closed`:     "chat: parse template",
		`{% frobnicate %}`:           `unknown statement "frobnicate"`,
		"line1\n{{ unclosed":         "unclosed expression tag at line 2",
		`{% for %}{% endfor %}`:      "chat: parse template",
		`{% endif %}`:                "chat: parse template",
		"{% set x = 1 %}\n{{ 1 + }}": "line 2",
	} {
		_, err := Compile(src)
		if err == nil || !strings.Contains(err.Error(), wantSub) {
			t.Errorf("Compile(%q) = %v, want an error containing %q", src, err, wantSub)
		}
	}

	_, err := Render(`{{ raise_exception("Conversation roles must alternate") }}`, nil, Options{})
	var te *TemplateError
	if !errors.As(err, &te) || te.Message != "Conversation roles must alternate" {
		t.Errorf("raise_exception: %v", err)
	}
	if !strings.Contains(err.Error(), "chat: render: template raised an exception: Conversation roles must alternate") {
		t.Errorf("raise_exception message: %v", err)
	}

	_, err = Render(`{{ x | nosuchfilter }}`, nil, Options{})
	if err == nil || !strings.Contains(err.Error(), `unknown filter "nosuchfilter"`) || errors.As(err, &te) {
		t.Errorf("unknown filter: %v", err)
	}
	if _, err := Render(`x`, nil, Options{Vars: map[string]any{"messages": 1}}); err == nil {
		t.Error("overriding messages through Vars must fail")
	}
	if _, err := Render(`x`, nil, Options{Tools: []any{make(chan int)}}); err == nil || !strings.Contains(err.Error(), "chat: tool 0") {
		t.Errorf("unmarshalable tool: %v", err)
	}
	if _, err := Render(`x`, nil, Options{Vars: map[string]any{"v": json.RawMessage(`{"a":`)}}); err == nil {
		t.Error("invalid JSON variable accepted")
	}
	// The engine panics on a negative string repeat; Render turns that into
	// an error.
	if _, err := Render(`{{ 'x' * -1 }}`, nil, Options{}); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Errorf("engine panic not converted to an error: %v", err)
	}
}

func TestConcurrentRender(t *testing.T) {
	src, err := os.ReadFile("testdata/qwen3.jinja")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := Compile(string(src))
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "user", Content: "hi"}}
	want, _ := tmpl.Render(msgs, Options{AddGenerationPrompt: true})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if got, err := tmpl.Render(msgs, Options{AddGenerationPrompt: true}); err != nil || got != want {
					t.Errorf("concurrent render differs: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

var fuzzTemplates = []string{"qwen3.jinja", "qwen3.5.jinja", "llama3.2.jinja", "llama3.1-lenml.jinja"}

// FuzzRender renders the real templates with arbitrary message contents,
// reasoning and tool-call arguments: no panic (the engine is guarded by a
// recover that would turn one into a "panicked" error, which fails here).
func FuzzRender(f *testing.F) {
	var compiled []*Template
	for _, name := range fuzzTemplates {
		src, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		tmpl, err := Compile(string(src))
		if err != nil {
			f.Fatal(err)
		}
		compiled = append(compiled, tmpl)
	}
	f.Add("Hello", "<think>\nhm\n</think>\n\nHi", "", `{"a": 1}`, "<tool_response>x</tool_response>", uint8(0))
	f.Add("", "", "reason", "not json", "", uint8(7))
	f.Add("{{ x }}{% if %}", "</think>", "\n", `{"a": {"b": [1, 2.5e300, null]}}`, "\x00\xff", uint8(3))
	f.Fuzz(func(t *testing.T, user, assistant, reasoning, args, tool string, flags uint8) {
		msgs := []Message{
			{Role: "system", Content: user},
			{Role: "user", Content: user},
			{Role: "assistant", Content: assistant, ReasoningContent: reasoning},
			{Role: "user", Content: tool},
		}
		if flags&1 != 0 {
			msgs = append(msgs,
				Message{Role: "assistant", Content: assistant, ToolCalls: []ToolCall{{ID: "1", Function: FunctionCall{Name: user, Arguments: args}}}},
				Message{Role: "tool", Content: tool, ToolCallID: "1"})
		}
		thinking := flags&2 != 0
		opts := Options{AddGenerationPrompt: flags&4 != 0, EnableThinking: &thinking,
			Vars: map[string]any{"date_string": "1 Jan 2025"}}
		if flags&8 != 0 {
			opts.Tools = []any{json.RawMessage(`{"type": "function", "function": {"name": "f", "parameters": {}}}`)}
		}
		for _, tmpl := range compiled {
			out, err := tmpl.Render(msgs, opts)
			if err != nil && strings.Contains(err.Error(), "panicked") {
				t.Fatal(err)
			}
			if err == nil && !strings.Contains(out, assistant) && strings.TrimSpace(assistant) != "" && !strings.Contains(assistant, "</think>") {
				// Every template here prints the assistant content
				// (possibly trimmed or split at </think>).
				if !strings.Contains(out, strings.TrimSpace(assistant)) {
					t.Fatalf("assistant content %q missing from render", assistant)
				}
			}
		}
	})
}

// FuzzCompile treats the template source itself as untrusted (it comes from
// model files): Compile and Render must return, not panic. Sources that
// call range() or multiply strings are skipped: the engine materialises
// range(n) and 'x' * n eagerly, so a fuzzed huge n only measures memory.
func FuzzCompile(f *testing.F) {
	for _, name := range fuzzTemplates {
		src, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(src))
	}
	f.Add(`{{ messages[::-1][0].content | tojson(indent=2) }}`)
	f.Add(`{% for m in messages %}{{ loop.index }}{{ m.role.upper() }}{% endfor %}`)
	f.Add(`{% for i in range(100000000) %}x{% endfor %}`)
	f.Fuzz(func(t *testing.T, src string) {
		// range() is bounded by Limits now; string repetition ("x" * n)
		// still allocates what it is asked for, so it stays out.
		if strings.Contains(src, "*") || len(src) > 1<<16 {
			t.Skip()
		}
		tmpl, err := Compile(src)
		if err != nil {
			if strings.Contains(err.Error(), "panicked") {
				t.Fatal(err)
			}
			return
		}
		_, err = tmpl.Render([]Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "yo"}},
			Options{AddGenerationPrompt: true, Tools: []any{json.RawMessage(`{"a": [1]}`)}})
		if err != nil && strings.Contains(err.Error(), "panicked") {
			t.Fatal(err)
		}
	})
}

func BenchmarkRenderQwen3(b *testing.B) {
	src, err := os.ReadFile("testdata/qwen3.jinja")
	if err != nil {
		b.Fatal(err)
	}
	tmpl, err := Compile(string(src))
	if err != nil {
		b.Fatal(err)
	}
	spec := loadSpec(b)
	var c goldenCase
	for _, gc := range spec.Cases {
		if gc.Name == "tools_parallel_calls" {
			c = gc
		}
	}
	opts, _ := c.options(spec, goldenTemplate{})
	out, err := tmpl.Render(c.Messages, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(out)))
	for b.Loop() {
		if _, err := tmpl.Render(c.Messages, opts); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCompileQwen3(b *testing.B) {
	src, err := os.ReadFile("testdata/qwen3.jinja")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		if _, err := Compile(string(src)); err != nil {
			b.Fatal(err)
		}
	}
}
