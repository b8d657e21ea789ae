package chat

import (
	"strings"
	"unicode"
)

// prepareSource rewrites a chat template into an equivalent one for the
// engine that leaves the engine nothing to get wrong about whitespace and
// tojson:
//
//  1. Whitespace control is applied here, the way Jinja2 (and so
//     transformers) applies it with trim_blocks=True, lstrip_blocks=True and
//     keep_trailing_newline=False: "-" markers strip all whitespace on their
//     side, "+" markers opt out of the block defaults, a block or comment tag
//     eats one newline after it and the indentation before it when it starts
//     its line, "\r\n" and "\r" become "\n", and one trailing newline of the
//     template is dropped. {% raw %} blocks are handled here too. Every
//     piece of literal text is then emitted as a {{ "string" }} expression,
//     so the engine's own trimming (which skips over expression tags to the
//     nearest text and then trims the wrong text: `{% for %}{{ x }}\n{%
//     endfor %}` loses its newline) never sees a text segment. Comments
//     are dropped.
//  2. Every output, literal text and {{ }} expressions alike, becomes a
//     call of the renderer's counting function (see Limits).
//  3. Filters listed in filterRenames ("| tojson") are renamed in filter
//     position, outside string literals, to the variables the renderer binds.
//
// Newlines removed from the source reappear inside empty comments, so the
// line numbers in the engine's error messages still match the original
// template. If the source has an unclosed tag it is returned with only the
// newline normalisation, for the engine to report.
func prepareSource(src string) string {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	segs, ok := splitSource(src)
	if !ok {
		return src
	}
	texts := trimTexts(segs)
	var b strings.Builder
	b.Grow(len(src) + len(src)/4)
	for i, s := range segs {
		switch s.kind {
		case segText:
			t := texts[i]
			if t != "" {
				b.WriteString("{{ " + emitName + "(")
				writeLiteral(&b, t)
				b.WriteString(") }}")
			}
			writeNewlines(&b, strings.Count(s.text, "\n")-strings.Count(t, "\n"))
		case segComment:
			writeNewlines(&b, strings.Count(s.text, "\n"))
		case segExpr:
			// Output goes through the renderer's counting function (see
			// Limits).
			b.WriteString("{{ " + emitName + "((")
			b.WriteString(renameInCode(s.text, filterRenames))
			b.WriteString(")) }}")
		case segStmt:
			if s.raw != 0 {
				writeNewlines(&b, strings.Count(s.text, "\n"))
				continue
			}
			b.WriteString("{%")
			b.WriteString(renameInCode(s.text, filterRenames))
			b.WriteString("%}")
		}
	}
	return b.String()
}

type segKind int

const (
	segText segKind = iota
	segComment
	segExpr
	segStmt
)

// seg is one piece of the template. For tags, text is the content between
// the delimiters and whitespace-control markers, and left/right hold the
// markers ('-', '+' or 0).
type seg struct {
	kind        segKind
	text        string
	left, right byte
	raw         int // 1: {% raw %} tag, 2: {% endraw %} tag
}

// splitSource splits src into text and tags. Tags end at their closer
// outside quoted strings (as in the engine's scanner and Jinja2's lexer);
// the body of {% raw %} is text up to the next {% endraw %}. It reports
// false for an unclosed tag.
func splitSource(src string) ([]seg, bool) {
	var segs []seg
	i, textStart := 0, 0
	for i < len(src) {
		if src[i] != '{' || i+1 >= len(src) {
			i++
			continue
		}
		var kind segKind
		var closer string
		switch src[i+1] {
		case '{':
			kind, closer = segExpr, "}}"
		case '%':
			kind, closer = segStmt, "%}"
		case '#':
			kind, closer = segComment, "#}"
		default:
			i++
			continue
		}
		if i > textStart {
			segs = append(segs, seg{kind: segText, text: src[textStart:i]})
		}
		j := i + 2
		s := seg{kind: kind}
		if j < len(src) && (src[j] == '-' || src[j] == '+') {
			s.left = src[j]
			j++
		}
		end := tagEnd(src, j, closer)
		if end < 0 {
			return nil, false
		}
		content := src[j : end-2]
		if n := len(content); n > 0 && (content[n-1] == '-' || content[n-1] == '+') {
			s.right = content[n-1]
			content = content[:n-1]
		}
		s.text = content
		i, textStart = end, end
		if kind == segStmt && stmtKeyword(content) == "raw" {
			s.raw = 1
			segs = append(segs, s)
			// Jinja2 does not tokenise inside raw: the body runs to the
			// first {% endraw %}, quotes or not.
			body, endTag, after, ok := findEndraw(src, i)
			if !ok {
				return nil, false
			}
			if body != "" {
				segs = append(segs, seg{kind: segText, text: body})
			}
			segs = append(segs, endTag)
			i, textStart = after, after
			continue
		}
		segs = append(segs, s)
	}
	if textStart < len(src) {
		segs = append(segs, seg{kind: segText, text: src[textStart:]})
	}
	return segs, true
}

// findEndraw finds the first {% endraw %} tag (with optional markers) at or
// after i. It returns the raw body, the tag, and the index after the tag.
func findEndraw(src string, i int) (body string, tag seg, after int, ok bool) {
	for k := i; k+1 < len(src); k++ {
		if src[k] != '{' || src[k+1] != '%' {
			continue
		}
		j := k + 2
		t := seg{kind: segStmt, raw: 2}
		if j < len(src) && (src[j] == '-' || src[j] == '+') {
			t.left = src[j]
			j++
		}
		w := j
		for w < len(src) && isSpace(src[w]) {
			w++
		}
		if !strings.HasPrefix(src[w:], "endraw") {
			continue
		}
		w += len("endraw")
		for w < len(src) && isSpace(src[w]) {
			w++
		}
		if w < len(src) && (src[w] == '-' || src[w] == '+') {
			t.right = src[w]
			w++
		}
		if !strings.HasPrefix(src[w:], "%}") {
			continue
		}
		t.text = src[j:w]
		if t.right != 0 {
			t.text = src[j : w-1]
		}
		return src[i:k], t, w + 2, true
	}
	return "", seg{}, 0, false
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// trimTexts applies Jinja2's whitespace control to every text segment and
// returns the texts to emit (indexed like segs; tags get "").
func trimTexts(segs []seg) []string {
	out := make([]string, len(segs))
	for i, s := range segs {
		if s.kind != segText {
			continue
		}
		t := s.text
		// Left side: what the previous tag's closer consumes.
		lineStart := i == 0
		if i > 0 {
			p := segs[i-1]
			switch {
			case p.right == '-':
				trimmed := strings.TrimLeftFunc(t, pySpace)
				lineStart = len(trimmed) < len(t) && t[len(t)-len(trimmed)-1] == '\n'
				t = trimmed
			case p.right == '+' || p.kind == segExpr || p.raw == 1:
				// no trim_blocks
			default: // block or comment: trim_blocks
				if strings.HasPrefix(t, "\n") {
					t = t[1:]
					lineStart = true
				}
			}
		}
		// Right side: the next tag's opener.
		if i+1 < len(segs) {
			n := segs[i+1]
			switch {
			case n.left == '-':
				t = strings.TrimRightFunc(t, pySpace)
			case n.left == '+' || n.kind == segExpr:
				// no lstrip_blocks
			default: // block or comment: lstrip_blocks
				l := strings.LastIndexByte(t, '\n') + 1
				if (l > 0 || lineStart) && l < len(t) && strings.TrimLeftFunc(t[l:], pySpaceNotNewline) == "" {
					t = t[:l]
				}
			}
		}
		out[i] = t
	}
	return out
}

// pySpace reports whether Python's str.isspace holds for r: Go's
// unicode.IsSpace plus the separators U+001C..U+001F.
func pySpace(r rune) bool { return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f }

func pySpaceNotNewline(r rune) bool { return r != '\n' && pySpace(r) }

// writeLiteral writes s as a double-quoted string literal that the engine's
// tokenizer reads back exactly: only backslash and the quote are escaped
// (newlines and other bytes are taken verbatim inside a literal).
func writeLiteral(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\', '"':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}

// writeNewlines writes n newlines inside an empty comment (nothing for
// n <= 0), keeping the line count of the source.
func writeNewlines(b *strings.Builder, n int) {
	if n <= 0 {
		return
	}
	b.WriteString("{#")
	b.WriteString(strings.Repeat("\n", n))
	b.WriteString("#}")
}

// tojsonName is the variable the renderer binds to its tojson filter.
const tojsonName = "__cortiq_tojson"

// filterRenames maps built-in filter names of the engine to the variables
// that replace them.
var filterRenames = map[string]string{"tojson": tojsonName}

// tagEnd returns the index just past the closer of a tag whose content
// starts at i, skipping quoted strings the way the engine's scanner does,
// or -1 if the tag is not closed.
func tagEnd(src string, i int, closer string) int {
	for i < len(src) {
		c := src[i]
		if closer != "#}" && (c == '\'' || c == '"') {
			i++
			for i < len(src) && src[i] != c {
				if src[i] == '\\' && i+1 < len(src) {
					i++
				}
				i++
			}
			i++
			continue
		}
		if c == closer[0] && i+1 < len(src) && src[i+1] == closer[1] {
			return i + 2
		}
		i++
	}
	return -1
}

// stmtKeyword returns the first word of a statement tag's content.
func stmtKeyword(s string) string {
	s = strings.TrimLeft(s, " \t\r\n")
	k := 0
	for k < len(s) && isIdent(s[k]) {
		k++
	}
	return s[:k]
}

func isIdent(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// renameInCode renames identifiers that follow a '|' outside string
// literals in one tag's content.
func renameInCode(code string, renames map[string]string) string {
	if !strings.Contains(code, "|") {
		return code
	}
	var b strings.Builder
	i := 0
	for i < len(code) {
		c := code[i]
		switch {
		case c == '\'' || c == '"':
			k := i + 1
			for k < len(code) && code[k] != c {
				if code[k] == '\\' && k+1 < len(code) {
					k++
				}
				k++
			}
			k = min(k+1, len(code))
			b.WriteString(code[i:k])
			i = k
		case c == '|':
			k := i + 1
			for k < len(code) && isSpace(code[k]) {
				k++
			}
			e := k
			for e < len(code) && isIdent(code[e]) {
				e++
			}
			b.WriteString(code[i:k])
			if to, ok := renames[code[k:e]]; ok {
				b.WriteString(to)
			} else {
				b.WriteString(code[k:e])
			}
			i = e
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String()
}
