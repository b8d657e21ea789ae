package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// tinyHFJSON returns a small byte-level BPE tokenizer.json: the 256
// byte-level runes (ids 0..255 in byte order), a few merges, and the given
// extra top-level fields (raw JSON) replacing the defaults.
func tinyHFJSON(t testing.TB, pairMerges bool, extra map[string]string) []byte {
	t.Helper()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(byteToRune[b])] = b
	}
	merges := [][2]string{{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"o", "r"}, {"Ġw", "or"}, {"l", "d"}, {"Ġwor", "ld"}, {"Ġ", "Ġ"}}
	for _, m := range merges {
		vocab[m[0]+m[1]] = len(vocab)
	}
	vocab["whole"] = len(vocab) // reachable only with ignore_merges
	var mj []any
	for _, m := range merges {
		if pairMerges {
			mj = append(mj, []string{m[0], m[1]})
		} else {
			mj = append(mj, m[0]+" "+m[1])
		}
	}
	model := map[string]any{"type": "BPE", "vocab": vocab, "merges": mj, "ignore_merges": false}
	mb, err := json.Marshal(model)
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{
		"version":        `"1.0"`,
		"added_tokens":   `[]`,
		"normalizer":     `null`,
		"pre_tokenizer":  `{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}`,
		"post_processor": `{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":false,"use_regex":true}`,
		"decoder":        `{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true}`,
		"model":          string(mb),
	}
	for k, v := range extra {
		fields[k] = v
	}
	var b strings.Builder
	b.WriteString("{")
	first := true
	for _, k := range []string{"version", "added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder", "model"} {
		if !first {
			b.WriteString(",")
		}
		first = false
		fmt.Fprintf(&b, "%q:%s", k, fields[k])
	}
	b.WriteString("}")
	return []byte(b.String())
}

func mustHF(t testing.TB, js []byte, cfg Config) *Tokenizer {
	t.Helper()
	tok, err := FromHFJSON(js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func tokStrings(tok *Tokenizer, ids []int) []string {
	var out []string
	for _, id := range ids {
		s, _ := tok.TokenString(id)
		out = append(out, s)
	}
	return out
}

func TestTinyBPE(t *testing.T) {
	for _, pairs := range []bool{false, true} {
		tok := mustHF(t, tinyHFJSON(t, pairs, nil), Config{})
		ids := tok.Encode("hello world  x", true, true)
		got := tokStrings(tok, ids)
		want := []string{"hello", "Ġworld", "Ġ", "Ġ", "x"}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("pairs=%v: %q, want %q", pairs, got, want)
		}
		if d := tok.Decode(ids); d != "hello world  x" {
			t.Errorf("decode %q", d)
		}
	}
}

func TestIgnoreMergesAndPrefixSpace(t *testing.T) {
	js := tinyHFJSON(t, false, nil)
	js = []byte(strings.Replace(string(js), `"ignore_merges":false`, `"ignore_merges":true`, 1))
	tok := mustHF(t, js, Config{})
	if got := tokStrings(tok, tok.Encode("whole", false, false)); fmt.Sprint(got) != "[whole]" {
		t.Errorf("ignore_merges: %q", got)
	}
	tok = mustHF(t, tinyHFJSON(t, false, nil), Config{})
	if got := tokStrings(tok, tok.Encode("whole", false, false)); fmt.Sprint(got) != "[w h o l e]" {
		t.Errorf("without ignore_merges: %q", got)
	}
	tok = mustHF(t, tinyHFJSON(t, false, map[string]string{
		"pre_tokenizer": `{"type":"ByteLevel","add_prefix_space":true,"use_regex":true}`,
		"decoder":       `{"type":"ByteLevel"}`,
	}), Config{})
	if got := tokStrings(tok, tok.Encode("world", false, false)); fmt.Sprint(got) != "[Ġworld]" {
		t.Errorf("add_prefix_space: %q", got)
	}
}

func TestTemplateAndConfig(t *testing.T) {
	extra := map[string]string{
		"added_tokens": `[{"id":300,"content":"<|bos|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
			{"id":301,"content":"<|eos|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}]`,
		"post_processor": `{"type":"Sequence","processors":[{"type":"ByteLevel"},{"type":"TemplateProcessing",
			"single":[{"SpecialToken":{"id":"<|bos|>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
			"pair":[],"special_tokens":{"<|bos|>":{"id":"<|bos|>","ids":[300],"tokens":["<|bos|>"]}}}]}`,
	}
	tok := mustHF(t, tinyHFJSON(t, false, extra), Config{EOS: "<|eos|>"})
	if got := tok.Encode("hello", true, true); fmt.Sprint(got) != fmt.Sprint([]int{300, tok.Encode("hello", false, true)[0]}) {
		t.Errorf("template: %v", got)
	}
	if sp := tok.SpecialIDs(); sp.BOS != 300 || sp.EOS != 301 {
		t.Errorf("special ids %+v", sp)
	}
	yes, no := true, false
	tok = mustHF(t, tinyHFJSON(t, false, extra), Config{BOS: "<|bos|>", EOS: "<|eos|>", AddBOS: &no, AddEOS: &yes})
	if got := tok.Encode("hello", true, true); len(got) != 2 || got[1] != 301 {
		t.Errorf("AddEOS override: %v", got)
	}
	if got := tok.Encode("<|bos|>hello", false, true); got[0] != 300 {
		t.Errorf("special parsing: %v", got)
	}
	if got := tok.Encode("<|bos|>hello", false, false); got[0] == 300 {
		t.Errorf("special not parsed expected: %v", got)
	}
	if d := tok.DecodeWith([]int{300, 301}, DecodeOptions{SkipSpecial: true}); d != "" {
		t.Errorf("skip special: %q", d)
	}
	if id, ok := tok.ID("<|eos|>"); !ok || id != 301 {
		t.Errorf("ID: %d %v", id, ok)
	}
	if _, ok := tok.ID("nope"); ok {
		t.Error("ID of unknown token")
	}
}

func TestParseHFConfig(t *testing.T) {
	cfg, err := ParseHFConfig([]byte(`{"bos_token":{"content":"<s>","lstrip":false},"eos_token":"</s>","pad_token":null,
		"add_bos_token":true,"add_eos_token":false,"tokenizer_class":"LlamaTokenizer"}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BOS != "<s>" || cfg.EOS != "</s>" || cfg.PAD != "" || cfg.AddBOS == nil || !*cfg.AddBOS || cfg.AddEOS == nil || *cfg.AddEOS {
		t.Errorf("%+v", cfg)
	}
	cfg, err = ParseHFConfig([]byte(`{"add_bos_token":false,"tokenizer_class":"Qwen2Tokenizer"}`))
	if err != nil || cfg.AddBOS != nil {
		t.Errorf("Qwen2: %+v %v", cfg, err)
	}
	if _, err := ParseHFConfig([]byte(`{"bos_token":5}`)); err == nil {
		t.Error("numeric bos_token accepted")
	}
}

// TestAddedTokenFlags follows HF's added_vocabulary tests.
func TestAddedTokenFlags(t *testing.T) {
	mk := func(tokens ...AddedToken) *addedVocab { return newAddedVocab(tokens, strings.ToLower) }
	show := func(ps []piece) string {
		var parts []string
		for _, p := range ps {
			if p.id >= 0 {
				parts = append(parts, fmt.Sprintf("%q=%d", p.text, p.id))
			} else {
				parts = append(parts, fmt.Sprintf("%q", p.text))
			}
		}
		return strings.Join(parts, " ")
	}
	a := mk(AddedToken{ID: 0, Content: "<mask>", SingleWord: true})
	got := show(a.split("<mask> My name <mask> A<mask> <mask>ony <mask>", a.raw, true, true, nil))
	want := `"<mask>"=0 " My name " "<mask>"=0 " A<mask> <mask>ony " "<mask>"=0`
	if got != want {
		t.Errorf("single_word:\n got %s\nwant %s", got, want)
	}
	a = mk(AddedToken{ID: 0, Content: "<mask>", SingleWord: true, LStrip: true, RStrip: true})
	got = show(a.split("Hi <mask> there\t<mask>\t<mask>\u2000", a.raw, true, true, nil))
	want = `"Hi" " <mask> "=0 "there" "\t<mask>\t"=0 "<mask>\u2000"=0`
	if got != want {
		t.Errorf("lstrip/rstrip:\n got %s\nwant %s", got, want)
	}
	// Leftmost-longest, and special tokens left alone without parseSpecial
	// (the search resumes after them).
	a = mk(AddedToken{ID: 1, Content: "<a>"}, AddedToken{ID: 2, Content: "<a><b>", Special: true}, AddedToken{ID: 3, Content: "<b>"})
	if got := show(a.split("x<a><b>y", a.raw, true, true, nil)); got != `"x" "<a><b>"=2 "y"` {
		t.Errorf("longest: %s", got)
	}
	if got := show(a.split("x<a><b>y", a.raw, false, true, nil)); got != `"x<a><b>y"` {
		t.Errorf("special skipped: %s", got)
	}
}

func TestNormalizedAddedToken(t *testing.T) {
	extra := map[string]string{
		"normalizer":   `{"type":"Lowercase"}`,
		"added_tokens": `[{"id":400,"content":"YES","normalized":true,"special":false}]`,
	}
	tok := mustHF(t, tinyHFJSON(t, false, extra), Config{})
	if got := tok.Encode("aYesb", false, false); fmt.Sprint(got) != fmt.Sprint([]int{int('a'), 400, int('b')}) {
		t.Errorf("normalized added token: %v", got)
	}
}

func TestSplitBehaviors(t *testing.T) {
	// The examples of HF's SplitDelimiterBehavior documentation.
	want := map[splitBehavior]string{
		splitRemoved:            "[the final countdown]",
		splitIsolated:           "[the - final - - countdown]",
		splitMergedWithPrevious: "[the- final- - countdown]",
		splitMergedWithNext:     "[the -final - -countdown]",
		splitContiguous:         "[the - final -- countdown]",
	}
	s := "the-final--countdown"
	for b, w := range want {
		spans, _, err := splitSpans(s, literalMatcher{"-"}, b, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		var parts []string
		for _, sp := range spans {
			parts = append(parts, s[sp.lo:sp.hi])
		}
		if fmt.Sprint(parts) != w {
			t.Errorf("behavior %d: %q, want %s", b, parts, w)
		}
	}
	// invert: the matches become the parts that are kept apart.
	spans, _, _ := splitSpans("a1b22", runeClassMatcher{isNumber}, splitRemoved, true, nil)
	var parts []string
	for _, sp := range spans {
		parts = append(parts, "a1b22"[sp.lo:sp.hi])
	}
	if fmt.Sprint(parts) != "[1 2 2]" {
		t.Errorf("invert: %q", parts)
	}
}

func TestSPStyleHFJSONDecoders(t *testing.T) {
	// Metaspace pre-tokenizer and decoder, Strip and Replace decoders.
	vocab := map[string]int{"▁": 0, "a": 1, "b": 2, "▁a": 3, "▁b": 4, "<0x41>": 5}
	vb, _ := json.Marshal(vocab)
	js := fmt.Sprintf(`{"added_tokens":[],"normalizer":null,
		"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true},
		"post_processor":null,
		"decoder":{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true},
		"model":{"type":"BPE","vocab":%s,"merges":["▁ a","▁ b"],"byte_fallback":true}}`, vb)
	tok := mustHF(t, []byte(js), Config{})
	// "a b" -> "▁a▁b" -> pieces "▁a", "▁b" (split MergedWithNext).
	ids := tok.Encode("a b", false, false)
	if fmt.Sprint(ids) != "[3 4]" {
		t.Errorf("metaspace encode: %v", ids)
	}
	if d := tok.Decode(ids); d != "a b" {
		t.Errorf("metaspace round trip: %v %q", ids, d)
	}
	if d := tok.Decode([]int{5, 3}); d != "<0x41> a" {
		t.Errorf("metaspace decode: %q", d)
	}
	// A byte run that is not valid UTF-8 becomes one U+FFFD per byte, the
	// valid 'A' included (HF ByteFallback).
	dec := sequenceDec{byteFallbackDec{}, fuseDec{}, stripDec{content: ' ', start: 1, stop: 1}}
	if got := strings.Join(dec.decodeChain([]string{" ", "<0x41>", "<0xC3>", "b", " "}), ""); got != "\uFFFD\uFFFDb" {
		t.Errorf("byte fallback chain: %q", got)
	}
}

func TestHFJSONErrors(t *testing.T) {
	bad := map[string]string{
		"not json":         `{`,
		"no model":         `{"model":null}`,
		"wordpiece":        `{"model":{"type":"WordPiece","vocab":{}}}`,
		"bad merge":        `{"model":{"type":"BPE","vocab":{"a":0},"merges":["a"]}}`,
		"merge not vocab":  `{"model":{"type":"BPE","vocab":{"a":0},"merges":["a b"]}}`,
		"negative id":      `{"model":{"type":"BPE","vocab":{"a":-1},"merges":[]}}`,
		"huge id":          `{"model":{"type":"BPE","vocab":{"a":99999999},"merges":[]}}`,
		"bad regex":        `{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(("},"behavior":"Isolated"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`,
		"bad behavior":     `{"pre_tokenizer":{"type":"Split","pattern":{"String":"x"},"behavior":"Nope"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`,
		"unknown norm":     `{"normalizer":{"type":"NFKC"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`,
		"template unknown": `{"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"x"}}],"special_tokens":{}},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`,
		"added no id":      `{"added_tokens":[{"content":"x"}],"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`,
		"dropout":          `{"model":{"type":"BPE","vocab":{"a":0},"merges":[],"dropout":0.1}}`,
	}
	for name, js := range bad {
		if _, err := FromHFJSON([]byte(js), Config{}); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
