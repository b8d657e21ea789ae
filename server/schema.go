package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// orderedObject is a JSON object with its keys in document order.
type orderedObject struct {
	keys []string
	vals map[string]json.RawMessage
}

func (o *orderedObject) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := t.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("expected an object")
	}
	o.vals = map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		k, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
		if _, dup := o.vals[k]; !dup {
			o.keys = append(o.keys, k)
		}
		o.vals[k] = v
	}
	return nil
}

// schemaKeywords are the keywords compileSchema understands or may ignore
// without producing output that breaks the schema.
var ignoredKeywords = map[string]bool{
	"title": true, "description": true, "$schema": true, "$id": true, "default": true, "examples": true,
	"required": true, "additionalProperties": true, "strict": true, "$comment": true,
}

// compileSchema turns a JSON Schema into a grammar. Objects produce every
// listed property in schema order (so "required" holds whatever it lists);
// keywords that would need more than this grammar can enforce (pattern,
// anyOf, $ref, minimum, ...) are refused with an error naming them rather
// than silently ignored.
func compileSchema(raw json.RawMessage, path string) (*gnode, error) {
	var o orderedObject
	if err := json.Unmarshal(raw, &o); err != nil {
		if t := strings.TrimSpace(string(raw)); t == "true" {
			return anyNode, nil
		}
		return nil, fmt.Errorf("%s: a schema must be an object", path)
	}
	var typ string
	if t, ok := o.vals["type"]; ok {
		if err := json.Unmarshal(t, &typ); err != nil {
			return nil, fmt.Errorf("%s: \"type\" must be one string (type unions are not supported)", path)
		}
	}
	seen := map[string]bool{"type": true}
	use := func(k string) (json.RawMessage, bool) { seen[k] = true; v, ok := o.vals[k]; return v, ok }
	intOf := func(k string, def int) (int, error) {
		v, ok := use(k)
		if !ok {
			return def, nil
		}
		var n int
		if err := json.Unmarshal(v, &n); err != nil || n < 0 {
			return 0, fmt.Errorf("%s: %q must be a non-negative integer", path, k)
		}
		return n, nil
	}
	var node *gnode
	if v, ok := use("enum"); ok {
		var vals []json.RawMessage
		if err := json.Unmarshal(v, &vals); err != nil || len(vals) == 0 || len(vals) > 64 {
			return nil, fmt.Errorf("%s: \"enum\" must be an array of 1 to 64 values", path)
		}
		node = &gnode{kind: kLiteral}
		for _, x := range vals {
			var c bytes.Buffer
			if err := json.Compact(&c, x); err != nil {
				return nil, fmt.Errorf("%s: enum: %w", path, err)
			}
			node.lits = append(node.lits, c.Bytes())
		}
	} else if v, ok := use("const"); ok {
		var c bytes.Buffer
		if err := json.Compact(&c, v); err != nil {
			return nil, fmt.Errorf("%s: const: %w", path, err)
		}
		node = &gnode{kind: kLiteral, lits: [][]byte{c.Bytes()}}
	} else {
		if typ == "" {
			switch {
			case o.vals["properties"] != nil:
				typ = "object"
			case o.vals["items"] != nil:
				typ = "array"
			}
		}
		switch typ {
		case "":
			node = anyNode
		case "object":
			props, hasProps := use("properties")
			if !hasProps {
				node = anyObjectNode
				if ap, ok := o.vals["additionalProperties"]; ok && strings.TrimSpace(string(ap)) == "false" {
					node = &gnode{kind: kObject}
				}
				break
			}
			var po orderedObject
			if err := json.Unmarshal(props, &po); err != nil {
				return nil, fmt.Errorf("%s: \"properties\" must be an object", path)
			}
			node = &gnode{kind: kObject}
			for _, k := range po.keys {
				child, err := compileSchema(po.vals[k], path+".properties."+k)
				if err != nil {
					return nil, err
				}
				key, _ := json.Marshal(k)
				node.props = append(node.props, gprop{key: &gnode{kind: kLiteral, lits: [][]byte{key}}, node: child})
			}
		case "array":
			node = &gnode{kind: kArray, items: anyNode, maxItems: -1}
			if it, ok := use("items"); ok {
				child, err := compileSchema(it, path+".items")
				if err != nil {
					return nil, err
				}
				node.items = child
			}
			var err error
			if node.minItems, err = intOf("minItems", 0); err != nil {
				return nil, err
			}
			if node.maxItems, err = intOf("maxItems", -1); err != nil {
				return nil, err
			}
		case "string":
			node = &gnode{kind: kString}
			var err error
			if node.minLen, err = intOf("minLength", 0); err != nil {
				return nil, err
			}
			if node.maxLen, err = intOf("maxLength", 0); err != nil {
				return nil, err
			}
		case "number":
			node = numberNode
		case "integer":
			node = &gnode{kind: kInteger}
		case "boolean":
			node = &gnode{kind: kLiteral, lits: [][]byte{[]byte("true"), []byte("false")}}
		case "null":
			node = &gnode{kind: kLiteral, lits: [][]byte{[]byte("null")}}
		default:
			return nil, fmt.Errorf("%s: unknown type %q", path, typ)
		}
	}
	for _, k := range o.keys {
		if !seen[k] && !ignoredKeywords[k] {
			return nil, fmt.Errorf("%s: schema keyword %q is not supported by constrained decoding", path, k)
		}
	}
	return node, nil
}

// toolCallGrammar is a forced call in the Qwen/Hermes format:
// <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>. With one
// function its parameters schema shapes ARGS; with several, NAME is one of
// them and ARGS any object.
func toolCallGrammar(tools []toolDef, only string) (*gnode, error) {
	lit := func(s string) *gnode { return &gnode{kind: kLiteral, lits: [][]byte{[]byte(s)}} }
	var names [][]byte
	var args *gnode = anyObjectNode
	for _, t := range tools {
		if only != "" && t.Function.Name != only {
			continue
		}
		b, _ := json.Marshal(t.Function.Name)
		names = append(names, b)
		if only != "" && len(t.Function.Parameters) > 0 && string(t.Function.Parameters) != "null" {
			n, err := compileSchema(t.Function.Parameters, "tools."+only+".parameters")
			if err != nil {
				return nil, err
			}
			args = n
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("tool_choice names function %q, which is not in tools", only)
	}
	if len(names) > 64 {
		return nil, fmt.Errorf("tool_choice required with %d tools: at most 64", len(names))
	}
	return &gnode{kind: kSeq, seq: []*gnode{
		lit("<tool_call>\n{\"name\": "),
		{kind: kLiteral, lits: names},
		lit(", \"arguments\": "),
		args,
		lit("}\n</tool_call>"),
	}}, nil
}
