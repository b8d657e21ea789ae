package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// jsonValue decodes one JSON document into a template value. Objects keep
// their key order (a repeated key keeps its first position and last value,
// as in Python and JavaScript); numbers without a fraction or exponent that
// fit in int64 become integers, the rest floats.
func jsonValue(data []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeJSON(dec)
	if err != nil {
		return jinja.Undefined(), fmt.Errorf("json: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return jinja.Undefined(), errors.New("json: data after the top-level value")
	}
	return v, nil
}

func decodeJSON(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			v := jinja.NewDict()
			d := v.AsDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				key, ok := kt.(string)
				if !ok {
					return jinja.Undefined(), fmt.Errorf("object key is %T", kt)
				}
				val, err := decodeJSON(dec)
				if err != nil {
					return jinja.Undefined(), err
				}
				d.Set(key, val)
			}
			if _, err := dec.Token(); err != nil { // '}'
				return jinja.Undefined(), err
			}
			return v, nil
		case '[':
			var items []jinja.Value
			for dec.More() {
				val, err := decodeJSON(dec)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, val)
			}
			if _, err := dec.Token(); err != nil { // ']'
				return jinja.Undefined(), err
			}
			return jinja.NewList(items), nil
		}
		return jinja.Undefined(), fmt.Errorf("unexpected %v", t)
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		s := string(t)
		if !strings.ContainsAny(s, ".eE") {
			if i, err := t.Int64(); err == nil {
				return jinja.NewInt(i), nil
			}
		}
		f, err := t.Float64()
		if err != nil {
			return jinja.Undefined(), fmt.Errorf("number %s: %w", s, err)
		}
		return jinja.NewFloat(f), nil
	case bool:
		return jinja.NewBool(t), nil
	case nil:
		return jinja.None(), nil
	}
	return jinja.Undefined(), fmt.Errorf("unexpected token %T", tok)
}

// tojsonOptions are the arguments of transformers' tojson filter, which is
// json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False).
type tojsonOptions struct {
	ensureASCII bool
	indent      string // "" with hasIndent false: single line
	hasIndent   bool
	itemSep     string
	keySep      string
	sortKeys    bool
}

// tojsonFilter implements the tojson filter. Positional arguments follow
// the Python signature (ensure_ascii, indent, separators, sort_keys); keyword
// arguments are the usual way templates call it.
func tojsonFilter(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("tojson: no value")
	}
	named := []string{"ensure_ascii", "indent", "separators", "sort_keys"}
	params := map[string]jinja.Value{}
	for i, a := range args[1:] {
		if i >= len(named) {
			return jinja.Undefined(), fmt.Errorf("tojson: too many arguments (%d)", len(args)-1)
		}
		params[named[i]] = a
	}
	for k, v := range kwargs {
		if !slices.Contains(named, k) {
			return jinja.Undefined(), fmt.Errorf("tojson: unexpected argument %q", k)
		}
		params[k] = v
	}
	var o tojsonOptions
	if v, ok := params["ensure_ascii"]; ok {
		o.ensureASCII = v.IsTruthy()
	}
	if v, ok := params["sort_keys"]; ok {
		o.sortKeys = v.IsTruthy()
	}
	if v, ok := params["indent"]; ok && !v.IsNone() && !v.IsUndefined() {
		switch {
		case v.IsInt():
			o.hasIndent, o.indent = true, strings.Repeat(" ", int(max(0, min(v.AsInt(), 64))))
		case v.IsString():
			o.hasIndent, o.indent = true, v.AsString()
		default:
			return jinja.Undefined(), fmt.Errorf("tojson: indent must be an integer or a string, not %s", v.String())
		}
	}
	o.itemSep, o.keySep = ", ", ": "
	if o.hasIndent {
		o.itemSep = ","
	}
	if v, ok := params["separators"]; ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Items[0].IsString() || !v.AsList().Items[1].IsString() {
			return jinja.Undefined(), errors.New("tojson: separators must be two strings")
		}
		o.itemSep, o.keySep = v.AsList().Items[0].AsString(), v.AsList().Items[1].AsString()
	}
	var b strings.Builder
	if err := encodePython(&b, args[0], &o, 0); err != nil {
		return jinja.Undefined(), fmt.Errorf("tojson: %w", err)
	}
	return jinja.NewString(b.String()), nil
}

// encodePython writes v as Python's json.dumps would.
func encodePython(b *strings.Builder, v jinja.Value, o *tojsonOptions, depth int) error {
	if depth > 1000 {
		return errors.New("value nested too deeply")
	}
	newline := func(level int) {
		if o.hasIndent {
			b.WriteByte('\n')
			for range level {
				b.WriteString(o.indent)
			}
		}
	}
	switch {
	case v.IsNone() || v.IsUndefined():
		b.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		b.WriteString(pythonFloat(v.AsFloat()))
	case v.IsString():
		writeJSONString(b, v.AsString(), o.ensureASCII)
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			newline(depth + 1)
			if err := encodePython(b, it, o, depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		if d.Len() == 0 {
			b.WriteString("{}")
			return nil
		}
		keys := d.Keys
		if o.sortKeys {
			keys = slices.Clone(keys)
			slices.Sort(keys)
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			newline(depth + 1)
			writeJSONString(b, k, o.ensureASCII)
			b.WriteString(o.keySep)
			val, _ := d.Get(k)
			if err := encodePython(b, val, o, depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte('}')
	default:
		return fmt.Errorf("object %s is not JSON serializable", v.String())
	}
	return nil
}

// pythonFloat formats f like Python's float repr, which json.dumps uses:
// shortest round-trip digits, positional for exponents in [-4, 16) with a
// ".0" on integral values, scientific otherwise ("1e-05", "1e+16"); NaN and
// the infinities as json.dumps writes them.
func pythonFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	sci := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(sci[strings.IndexByte(sci, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return sci // Go writes at least two exponent digits, like Python
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

// writeJSONString writes s as a JSON string the way Python's json module
// does: \" \\ \n \r \t \b \f short escapes, other control characters as
// \u00XX, everything else verbatim, or, with ensureASCII, every non-ASCII
// character (and DEL) as \uXXXX with surrogate pairs above the BMP. Invalid
// UTF-8 becomes U+FFFD.
func writeJSONString(b *strings.Builder, s string, ensureASCII bool) {
	const hex = "0123456789abcdef"
	u4 := func(r rune) {
		b.WriteString(`\u`)
		b.WriteByte(hex[r>>12&0xf])
		b.WriteByte(hex[r>>8&0xf])
		b.WriteByte(hex[r>>4&0xf])
		b.WriteByte(hex[r&0xf])
	}
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20:
				u4(r)
			case ensureASCII && r >= 0x7f:
				if r > 0xffff {
					r -= 0x10000
					u4(0xd800 + (r>>10)&0x3ff)
					u4(0xdc00 + r&0x3ff)
				} else {
					u4(r)
				}
			default:
				b.WriteRune(r) // utf8.RuneError for invalid bytes
			}
		}
	}
	b.WriteByte('"')
}
