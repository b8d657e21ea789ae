package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

var fastPatterns = []string{patQwen2, patLlama3, patQwen35, patGPT2}

// splitCorpusAtoms are the building blocks of the generated corpus: every
// class boundary the patterns care about.
var splitCorpusAtoms = []string{
	"a", "Z", "hello", "World", "é", "e\u0301", "\u0301", "\u0903", "ß", "ſ", "İ", "ǅ", "ﬁ",
	"'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "'D", "'ſ", "'x", "'", "’s",
	"0", "7", "12", "123", "1234", "٣", "²", "Ⅻ", "½",
	" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u3000", "\u2009", "\u0085", "\v", "\f", "\u200b", "\u2028",
	".", ",", "!", "?", "(", ")", "{", "}", "<", ">", "/", "\\", "\"", "#", "$", "%", "&", "*", "-", "_", "=", "+", "|", "~", "`", "^", "@", ";", ":",
	"...", "->", "=>", "!=", "//", "/*", "*/", "<|im_start|>", "```",
	"中文", "日本語", "한국어", "Привет", "مرحبا", "עברית", "हिन्दी", "ไทย",
	"😀", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "\ufe0f", "\ufffd", "\x00", "\x7f",
}

func randomSplitString(r *rand.Rand) string {
	var b strings.Builder
	n := r.IntN(12)
	for i := 0; i < n; i++ {
		b.WriteString(splitCorpusAtoms[r.IntN(len(splitCorpusAtoms))])
	}
	return b.String()
}

func fastMatches(m *fastMatcher, s string) [][2]int {
	out, _ := m.findAll(s, nil)
	return out
}

func regexMatches(t testing.TB, pattern, s string) [][2]int {
	re, err := compileRegex(pattern)
	if err != nil {
		t.Fatal(err)
	}
	out, err := re.findAll(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func checkFastEqualsRegex(t *testing.T, pattern string, re *regexMatcher, m *fastMatcher, s string) {
	t.Helper()
	want, err := re.findAll(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := fastMatches(m, s)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pattern %q on %+q:\nfast  %v %q\nregex %v %q", pattern, s, got, spansText(s, got), want, spansText(s, want))
	}
}

func spansText(s string, sp [][2]int) []string {
	var out []string
	for _, p := range sp {
		out = append(out, s[p[0]:p[1]])
	}
	return out
}

func TestFastSplitEqualsRegexp2(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var corpus []string
	corpus = append(corpus, splitCorpusAtoms...)
	for _, a := range splitCorpusAtoms {
		for _, b := range splitCorpusAtoms {
			corpus = append(corpus, a+b)
		}
	}
	for i := 0; i < 20000; i++ {
		corpus = append(corpus, randomSplitString(r))
	}
	for _, pattern := range fastPatterns {
		re, err := compileRegex(pattern)
		if err != nil {
			t.Fatal(err)
		}
		m := fastMatcherFor(pattern)
		for _, s := range corpus {
			checkFastEqualsRegex(t, pattern, re, m, s)
		}
	}
}

func TestFastSplitExamples(t *testing.T) {
	m := fastMatcherFor(patQwen2)
	got := spansText("Hello, world's 123  end\n\n  x'ſx", fastMatches(m, "Hello, world's 123  end\n\n  x'ſx"))
	want := []string{"Hello", ",", " world", "'s", " ", "1", "2", "3", " ", " end", "\n\n", "  ", "x", "'ſ", "x"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	m = fastMatcherFor(patLlama3)
	got = spansText("a 12345 b", fastMatches(m, "a 12345 b"))
	want = []string{"a", " ", "123", "45", " b"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

func FuzzFastSplit(f *testing.F) {
	for _, s := range []string{"Hello, world's 123", "  \n\t x", "e\u0301'LL", "中文😀 !!\r\n"} {
		f.Add(s)
	}
	res := map[string]*regexMatcher{}
	for _, p := range fastPatterns {
		re, err := compileRegex(p)
		if err != nil {
			f.Fatal(err)
		}
		res[p] = re
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		for _, p := range fastPatterns {
			checkFastEqualsRegex(t, p, res[p], fastMatcherFor(p), s)
		}
	})
}
