package server

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

var jsonDocs = []string{
	`{}`, `{"a":1}`, `{"a":[1,2,{"b":null}],"c":"x\"y\\u00e9\n"}`, `{"k": true, "l": false}`,
	`{"n":-0.5e+10,"m":0,"o":12.25E-3}`, `{"s":"héllo ☃ 𝄞"}`, `{"a":{"b":{"c":[]}}}`, `{"a" : [ ] }`,
}

var notJSON = []string{
	`{"a":01}`, `{"a":1,}`, `{a:1}`, `{"a":tru}`, `{"a":"\x"}`, `{"a":1}}`, `{"a":-}`, `{"a":1.}`, `{"a":.5}`,
	`{"a":"` + "\x01" + `"}`, `{"a":"` + "\xc0\xaf" + `"}`, `{"a":"` + "\xed\xa0\x80" + `"}`, `[1]`, ` {}`, `{"a":[1 2]}`,
}

// TestGrammarJSON: the any-object grammar accepts exactly the JSON objects
// (as encoding/json sees them) among valid and broken documents.
func TestGrammarJSON(t *testing.T) {
	for _, d := range jsonDocs {
		ok, complete := validPrefix(anyObjectNode, []byte(d))
		if !ok || !complete {
			t.Errorf("%q: ok %v complete %v", d, ok, complete)
		}
		for i := 0; i < len(d); i++ {
			if ok, complete := validPrefix(anyObjectNode, []byte(d[:i])); !ok || complete {
				t.Errorf("prefix %q of %q: ok %v complete %v", d[:i], d, ok, complete)
			}
		}
	}
	for _, d := range notJSON {
		if ok, complete := validPrefix(anyObjectNode, []byte(d)); ok && complete {
			t.Errorf("%q accepted", d)
		}
	}
	// Whitespace runs are capped, so a model cannot pad forever.
	if ok, _ := validPrefix(anyObjectNode, []byte(`{"a":    1}`)); ok {
		t.Error("a run of 4 spaces accepted")
	}
	// Numbers are capped at maxDigits digits.
	if ok, _ := validPrefix(anyObjectNode, []byte(`{"a":`+strings.Repeat("1", maxDigits+1))); ok {
		t.Error("an over-long number accepted")
	}
}

// TestGrammarSchema: a compiled schema accepts conforming documents and
// rejects those that break it, and refuses keywords it cannot enforce.
func TestGrammarSchema(t *testing.T) {
	schema := `{"type":"object","properties":{"name":{"type":"string","minLength":2,"maxLength":4},
		"kind":{"enum":["a","b",3]},"n":{"type":"integer"},"xs":{"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":2},
		"z":{"type":"null"},"any":{}},"required":["name"]}`
	root, err := compileSchema(json.RawMessage(schema), "schema")
	if err != nil {
		t.Fatal(err)
	}
	good := []string{
		`{"name":"ab","kind":"a","n":-3,"xs":[true],"z":null,"any":{"q":[1]}}`,
		`{"name": "abcd", "kind": 3, "n": 0, "xs": [false, true], "z": null, "any": "s"}`,
	}
	bad := []string{
		`{"name":"a","kind":"a","n":1,"xs":[true],"z":null,"any":1}`,            // too short
		`{"name":"abcde","kind":"a","n":1,"xs":[true],"z":null,"any":1}`,        // too long
		`{"name":"ab","kind":"c","n":1,"xs":[true],"z":null,"any":1}`,           // not in enum
		`{"name":"ab","kind":"a","n":1.5,"xs":[true],"z":null,"any":1}`,         // not an integer
		`{"name":"ab","kind":"a","n":1,"xs":[],"z":null,"any":1}`,               // minItems
		`{"name":"ab","kind":"a","n":1,"xs":[true,true,true],"z":null,"any":1}`, // maxItems
		`{"kind":"a","name":"ab","n":1,"xs":[true],"z":null,"any":1}`,           // order
		`{"name":"ab","kind":"a","n":1,"xs":[true],"z":null}`,                   // missing
	}
	for _, d := range good {
		if ok, complete := validPrefix(root, []byte(d)); !ok || !complete {
			t.Errorf("good %q: ok %v complete %v", d, ok, complete)
		}
	}
	for _, d := range bad {
		if ok, complete := validPrefix(root, []byte(d)); ok && complete {
			t.Errorf("bad %q accepted", d)
		}
	}
	for _, s := range []string{`{"type":"string","pattern":"x"}`, `{"anyOf":[{}]}`, `{"$ref":"#/x"}`, `{"type":["string","null"]}`, `{"type":"integer","minimum":3}`, `7`} {
		if _, err := compileSchema(json.RawMessage(s), "schema"); err == nil {
			t.Errorf("%s compiled", s)
		}
	}
	// A top-level number ends where the input ends.
	n, _ := compileSchema(json.RawMessage(`{"type":"number"}`), "s")
	if ok, complete := validPrefix(n, []byte("-12.5")); !ok || !complete {
		t.Error("top-level number")
	}
}

// TestToolCallGrammar: a forced call is the Qwen <tool_call> block that
// outParser parses back.
func TestToolCallGrammar(t *testing.T) {
	var tools []toolDef
	json.Unmarshal([]byte(`[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}},
		{"type":"function","function":{"name":"g"}}]`), &tools)
	one, err := toolCallGrammar(tools, "f")
	if err != nil {
		t.Fatal(err)
	}
	call := "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 5}}\n</tool_call>"
	if ok, complete := validPrefix(one, []byte(call)); !ok || !complete {
		t.Fatalf("call rejected: %v %v", ok, complete)
	}
	if ok, _ := validPrefix(one, []byte(strings.Replace(call, `"f"`, `"g"`, 1))); ok {
		t.Fatal("other function accepted")
	}
	any, _ := toolCallGrammar(tools, "")
	if ok, complete := validPrefix(any, []byte(strings.Replace(call, `"f"`, `"g"`, 1))); !ok || !complete {
		t.Fatal("required: g rejected")
	}
	if _, err := toolCallGrammar(tools, "h"); err == nil {
		t.Fatal("unknown function accepted")
	}
	p := newOutParser(false, false, true)
	d := p.push(call)
	if len(d.calls) != 1 || d.calls[0].Function.Name != "f" || d.calls[0].Function.Arguments != `{"x": 5}` || d.content != "" {
		t.Fatalf("parsed %+v", d)
	}
}

// TestConstraintMask: over a small vocabulary, the mask allows exactly the
// tokens whose bytes continue the grammar, and EOS only when complete.
func TestConstraintMask(t *testing.T) {
	words := []string{"{", "}", "\"", "a", "\"a\"", ":", "1", "12", "{\"", "x", " ", "\":", ",", "é"[:1], "é"[1:]}
	v := &vocab{size: len(words) + 1, tok: make([][]byte, len(words)+1), eos: []int32{int32(len(words))}}
	for id, w := range words {
		v.tok[id] = []byte(w)
		v.ids = append(v.ids, int32(id))
	}
	sortVocab(v)
	c := newGrammarConstraint(v, anyObjectNode)
	allowed := func() map[string]bool {
		l := make([]float32, v.size)
		c.mask(l)
		m := map[string]bool{}
		for id, x := range l {
			if x == 0 {
				if id == len(words) {
					m["EOS"] = true
				} else {
					m[words[id]] = true
				}
			}
		}
		return m
	}
	step := func(w string, want ...string) {
		t.Helper()
		got := allowed()
		if len(got) != len(want) {
			t.Fatalf("before %q: allowed %v, want %v", w, got, want)
		}
		for _, x := range want {
			if !got[x] {
				t.Fatalf("before %q: allowed %v, want %v", w, got, want)
			}
		}
		for id, x := range words {
			if x == w {
				c.accept(id)
				return
			}
		}
	}
	step("{\"", "{", "{\"")
	// Inside the key: any character, a closing quote, a lead byte (not a
	// lone continuation byte); "\"a\"" would put 'a' where ':' is due.
	step("a", "a", "\"", "x", " ", "\":", "é"[:1], ":", "1", "12", ",", "{", "}", "{\"")
	step("\":", "a", "\"", "x", " ", "\":", "é"[:1], ":", "1", "12", ",", "{", "}", "{\"")
	// A value is due: objects, strings, numbers, whitespace.
	step("12", "{", "\"", "\"a\"", "1", "12", " ", "{\"", "\":")
	step("}", "1", "12", "}", ",", " ")
	step("", "EOS")
}

// FuzzGrammarJSON: whatever bytes come, the recognizer does not panic, and
// what it accepts as a complete object encoding/json parses as one.
func FuzzGrammarJSON(f *testing.F) {
	for _, d := range append(jsonDocs, notJSON...) {
		f.Add([]byte(d))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ok, complete := validPrefix(anyObjectNode, b)
		if ok && complete {
			var v map[string]any
			if err := json.Unmarshal(b, &v); err != nil || !utf8.Valid(b) {
				t.Fatalf("accepted %q: %v", b, err)
			}
		}
		if json.Valid(b) && len(b) > 0 && b[0] == '{' && !strings.ContainsAny(string(b), " \t\r\n") && ok != complete {
			t.Fatalf("valid compact object %q: ok %v complete %v", b, ok, complete)
		}
	})
}

// FuzzOutParser: splitting the same text into pieces anywhere gives the
// same reasoning, content and tool calls as pushing it whole.
func FuzzOutParser(f *testing.F) {
	f.Add("<think>hmm</think>\n\nHello <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", uint8(3))
	f.Add("plain <tool_ text", uint8(1))
	f.Add("<think>cut off", uint8(2))
	f.Fuzz(func(t *testing.T, s string, cut uint8) {
		run := func(pieces []string) (string, string, []string) {
			p := newOutParser(true, false, true)
			var r, c strings.Builder
			var calls []string
			add := func(d delta) {
				r.WriteString(d.reasoning)
				c.WriteString(d.content)
				for _, x := range d.calls {
					calls = append(calls, x.Function.Name+x.Function.Arguments)
				}
			}
			for _, x := range pieces {
				add(p.push(x))
			}
			add(p.flush())
			return r.String(), c.String(), calls
		}
		r1, c1, k1 := run([]string{s})
		var pieces []string
		step := int(cut%7) + 1
		for i := 0; i < len(s); i += step {
			pieces = append(pieces, s[i:min(len(s), i+step)])
		}
		r2, c2, k2 := run(pieces)
		if r1 != r2 || c1 != c2 || strings.Join(k1, "|") != strings.Join(k2, "|") {
			t.Fatalf("whole: %q %q %v; pieces of %d: %q %q %v", r1, c1, k1, step, r2, c2, k2)
		}
	})
}

// TestOutParserThink: a leading think block becomes reasoning, the rest
// content; without think support the text stays content.
func TestOutParserThink(t *testing.T) {
	p := newOutParser(true, false, false)
	var r, c string
	for _, piece := range []string{"<thi", "nk>\nLet me ", "think.</th", "ink>\n\nThe answer", " is 4."} {
		d := p.push(piece)
		r += d.reasoning
		c += d.content
	}
	d := p.flush()
	r, c = r+d.reasoning, c+d.content
	if r != "\nLet me think." || c != "The answer is 4." {
		t.Fatalf("reasoning %q content %q", r, c)
	}
	// The prompt opened the block already (thinking templates that end the
	// generation prompt with <think>).
	p = newOutParser(true, true, false)
	d = p.push("plan</think>done")
	if d.reasoning != "plan" || d.content != "done" {
		t.Fatalf("%+v", d)
	}
	p = newOutParser(false, false, false)
	if d := p.push("<think>x</think>y"); d.content != "<think>x</think>y" {
		t.Fatalf("%+v", d)
	}
	// A malformed call stays visible as content.
	p = newOutParser(false, false, true)
	d = p.push("a<tool_call>not json</tool_call>")
	if d.content != "a<tool_call>not json</tool_call>" || len(d.calls) != 0 {
		t.Fatalf("%+v", d)
	}
}

// TestMaskFastPath: the mask with the in-string shortcut equals the plain
// walk at every step of random constrained generations over the real Qwen3
// vocabulary (json_object and a schema with bounded and free strings).
func TestMaskFastPath(t *testing.T) {
	v := qwen3Vocab(t)
	schema, err := compileSchema(json.RawMessage(`{"type":"object","properties":{"a":{"type":"string","maxLength":3},"b":{"type":"array","items":{"type":"string"}},"c":{}}}`), "s")
	if err != nil {
		t.Fatal(err)
	}
	fast, plain := make([]float32, v.size), make([]float32, v.size)
	rng := rand.New(rand.NewPCG(1, 2))
	inString := 0
	for run, root := range []*gnode{anyObjectNode, schema, anyObjectNode} {
		c := newGrammarConstraint(v, root)
		for step := 0; step < 12; step++ {
			if f := c.st.top; !c.st.done && f.n.kind == kString && f.st == 1 && f.n.maxLen == 0 {
				inString++
			}
			clear(fast)
			clear(plain)
			c.mask(fast)
			c.maskPlain(plain)
			var allowed []int
			for id := range fast {
				if (fast[id] == 0) != (plain[id] == 0) {
					t.Fatalf("run %d step %d: token %d (%q): fast %v plain %v", run, step, id, v.tok[id], fast[id], plain[id])
				}
				if fast[id] == 0 {
					allowed = append(allowed, id)
				}
			}
			if len(allowed) == 0 {
				t.Fatalf("run %d step %d: nothing allowed", run, step)
			}
			// Prefer short tokens now and then so strings open and close.
			id := allowed[rng.IntN(len(allowed))]
			if rng.IntN(2) == 0 {
				for _, x := range allowed {
					if len(v.tok[x]) == 1 && rng.IntN(4) == 0 {
						id = x
						break
					}
				}
			}
			if slices.Contains(v.eos, int32(id)) {
				break
			}
			c.accept(id)
		}
	}
	if inString == 0 {
		t.Fatal("the walk never reached the fast path")
	}
}
