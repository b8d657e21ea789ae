// Package chat renders conversations into prompts with the Jinja chat
// templates that models ship (tokenizer_config.json "chat_template", GGUF
// "tokenizer.chat_template"), the way Hugging Face transformers'
// apply_chat_template does.
//
// The Jinja engine is github.com/ardanlabs/jinja. This package supplies the
// template context (messages, tools, add_generation_prompt, enable_thinking,
// bos_token, eos_token and extra variables) and replaces the pieces where the
// engine's behaviour differs from transformers (Jinja2 with trim_blocks and
// lstrip_blocks):
//
//   - Whitespace control. The engine's trim_blocks/lstrip_blocks look past
//     an adjacent expression tag to the next text and trim it, so
//     "{% for m in messages %}{{ m }}\n{% endfor %}" loses its newlines.
//     Compile applies Jinja2's rules itself and hands the engine a template
//     whose literal text is all inside {{ "..." }} expressions (see
//     prepareSource); {% raw %} and the "+" markers work as in Jinja2.
//   - raise_exception returns a *TemplateError carrying the template's
//     message, so callers can tell a template refusing the conversation from
//     an engine failure.
//   - strftime_now formats the time from Options.Now (deterministic in tests)
//     with the C-locale strftime directives Python supports.
//   - tojson is transformers' own filter: json.dumps with ensure_ascii=False,
//     Python's separators and float formatting, insertion-ordered keys and
//     the indent, separators, sort_keys and ensure_ascii arguments (the
//     engine's indent form sorts keys and HTML-escapes). The engine resolves
//     filters from its built-in table before the template's variables, so
//     Compile renames the filter in filter position to a variable that the
//     renderer binds to this implementation.
//   - Bounds. A template cannot run away: every output (literal text and
//     {{ }} expressions) goes through a counting call, range() is checked
//     before its list is made, and the rendering has a deadline (see
//     Limits); a template stopped by them returns a *LimitError naming the
//     chat template as the cause.
//
// Values reach the template with the key order they were given in (JSON
// object order for tools and tool-call arguments), as Python dicts and
// JavaScript objects do; the engine's own FromGoValue would sort them.
package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ardanlabs/jinja"
)

// Message is one conversation turn, with the fields of the OpenAI chat
// format that chat templates read.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// ReasoningContent is the model's thinking for an assistant turn
	// (DeepSeek/Qwen "reasoning_content").
	ReasoningContent string     `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID links a "tool" message to the call it answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	Name       string `json:"name,omitempty"`
}

// ToolCall is a function call made by the assistant.
type ToolCall struct {
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"` // "function" when empty
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function and carries its arguments as JSON text,
// as in the OpenAI API. When Arguments is a JSON object the template sees a
// mapping (keys in their original order), which is what templates that
// iterate arguments|items or apply tojson expect; any other text reaches the
// template as a string.
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Options are the template variables besides the messages.
type Options struct {
	// AddGenerationPrompt appends the header that starts the assistant's
	// reply.
	AddGenerationPrompt bool
	// EnableThinking sets enable_thinking; nil leaves it undefined, which
	// templates treat as their default.
	EnableThinking *bool
	// Tools are the tool definitions (OpenAI format). Each element is
	// converted through encoding/json, so structs, maps and json.RawMessage
	// all work; json.RawMessage keeps its key order. Empty means tools is
	// none, as transformers passes it.
	Tools []any
	// BOSToken and EOSToken are bos_token and eos_token.
	BOSToken, EOSToken string
	// Vars are extra template variables (date_string, custom_tools, ...),
	// converted like Tools. A jinja.Value is passed through unchanged.
	// Names that Options already sets are rejected.
	Vars map[string]any
	// Now is the clock for strftime_now; nil means time.Now.
	Now func() time.Time
	// Limits bound the rendering (output size, range() items, wall time);
	// the zero value is the defaults.
	Limits Limits
}

// TemplateError is returned when the template itself raises, through
// raise_exception, typically because the conversation has a shape the model
// does not support.
type TemplateError struct {
	Message string
}

func (e *TemplateError) Error() string {
	return "template raised an exception: " + e.Message
}

// Template is a compiled chat template. It is safe for concurrent use.
type Template struct {
	tmpl *jinja.Template
}

// Compile parses a chat template.
func Compile(source string) (t *Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("chat: parse template: jinja engine panicked: %v", r)
		}
	}()
	tmpl, err := jinja.Compile(prepareSource(source))
	if err != nil {
		return nil, fmt.Errorf("chat: parse template: %w", err)
	}
	return &Template{tmpl: tmpl}, nil
}

// Render compiles template and renders messages with it. Use Compile once
// and Template.Render when rendering repeatedly.
func Render(template string, messages []Message, opts Options) (string, error) {
	t, err := Compile(template)
	if err != nil {
		return "", err
	}
	return t.Render(messages, opts)
}

// reserved are the variables Render sets itself.
var reserved = map[string]bool{
	"messages": true, "add_generation_prompt": true, "tools": true, "enable_thinking": true,
	"bos_token": true, "eos_token": true, "raise_exception": true, "strftime_now": true,
	tojsonName: true, emitName: true, rangeName: true,
}

// Render renders the conversation within opts.Limits. A rendering stopped
// by a limit returns an error matching ErrLimit (a *LimitError).
func (t *Template) Render(messages []Message, opts Options) (string, error) {
	data, err := context(messages, opts)
	if err != nil {
		return "", err
	}
	b := newBudget(opts.Limits)
	b.input = inputBytes(messages, opts.Tools)
	data[emitName] = jinja.NewCallable(emitName, b.emit)
	data[rangeName] = jinja.NewCallable("range", b.rangeFn)
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			if p := recover(); p != nil {
				r = result{err: fmt.Errorf("chat: render: jinja engine panicked: %v", p)}
			}
			done <- r
		}()
		r.out, r.err = t.tmpl.RenderValues(data)
	}()
	timer := time.NewTimer(b.lim.Timeout)
	defer timer.Stop()
	var r result
	select {
	case r = <-done:
	case <-timer.C:
		// The evaluation stops at its next checkpoint; its result is
		// dropped (done is buffered).
		b.stopped.Store(true)
		return "", fmt.Errorf("chat: render: %w", b.timeErr())
	}
	if r.err != nil {
		return "", fmt.Errorf("chat: render: %w", r.err)
	}
	return r.out, nil
}

// context builds the template variables.
func context(messages []Message, opts Options) (map[string]jinja.Value, error) {
	data := make(map[string]jinja.Value, 10+len(opts.Vars))
	for k, v := range opts.Vars {
		if reserved[k] {
			return nil, fmt.Errorf("chat: variable %q is set by Options or the renderer; it cannot be overridden", k)
		}
		val, err := toValue(v)
		if err != nil {
			return nil, fmt.Errorf("chat: variable %q: %w", k, err)
		}
		data[k] = val
	}
	msgs := make([]jinja.Value, len(messages))
	for i, m := range messages {
		msgs[i] = messageValue(m)
	}
	data["messages"] = jinja.NewList(msgs)
	data["add_generation_prompt"] = jinja.NewBool(opts.AddGenerationPrompt)
	if opts.EnableThinking != nil {
		data["enable_thinking"] = jinja.NewBool(*opts.EnableThinking)
	}
	tools := jinja.None()
	if len(opts.Tools) > 0 {
		items := make([]jinja.Value, len(opts.Tools))
		for i, tl := range opts.Tools {
			v, err := toValue(tl)
			if err != nil {
				return nil, fmt.Errorf("chat: tool %d: %w", i, err)
			}
			items[i] = v
		}
		tools = jinja.NewList(items)
	}
	data["tools"] = tools
	data["bos_token"] = jinja.NewString(opts.BOSToken)
	data["eos_token"] = jinja.NewString(opts.EOSToken)
	data["raise_exception"] = jinja.NewCallable("raise_exception", raiseException)
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	data["strftime_now"] = jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 || !args[0].IsString() {
			return jinja.Undefined(), errors.New("strftime_now: expected one format string")
		}
		return jinja.NewString(strftime(now(), args[0].AsString())), nil
	})
	data[tojsonName] = jinja.NewCallable("tojson", tojsonFilter)
	return data, nil
}

func raiseException(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	msg := ""
	if len(args) > 0 {
		if args[0].IsString() {
			msg = args[0].AsString()
		} else {
			msg = args[0].String()
		}
	}
	return jinja.Undefined(), &TemplateError{Message: msg}
}

// messageValue converts a Message into the mapping templates read. Optional
// fields are left out when empty, as in the OpenAI JSON a Python caller
// would pass, because templates test them with "is defined" or "in".
func messageValue(m Message) jinja.Value {
	v := jinja.NewDict()
	d := v.AsDict()
	d.Set("role", jinja.NewString(m.Role))
	d.Set("content", jinja.NewString(m.Content))
	if m.ReasoningContent != "" {
		d.Set("reasoning_content", jinja.NewString(m.ReasoningContent))
	}
	if len(m.ToolCalls) > 0 {
		calls := make([]jinja.Value, len(m.ToolCalls))
		for i, tc := range m.ToolCalls {
			cv := jinja.NewDict()
			c := cv.AsDict()
			if tc.ID != "" {
				c.Set("id", jinja.NewString(tc.ID))
			}
			typ := tc.Type
			if typ == "" {
				typ = "function"
			}
			c.Set("type", jinja.NewString(typ))
			fv := jinja.NewDict()
			f := fv.AsDict()
			f.Set("name", jinja.NewString(tc.Function.Name))
			f.Set("arguments", argumentsValue(tc.Function.Arguments))
			c.Set("function", fv)
			calls[i] = cv
		}
		d.Set("tool_calls", jinja.NewList(calls))
	}
	if m.ToolCallID != "" {
		d.Set("tool_call_id", jinja.NewString(m.ToolCallID))
	}
	if m.Name != "" {
		d.Set("name", jinja.NewString(m.Name))
	}
	return v
}

// argumentsValue returns a mapping for JSON-object arguments and the string
// itself otherwise.
func argumentsValue(args string) jinja.Value {
	if v, err := jsonValue([]byte(args)); err == nil && v.IsDict() {
		return v
	}
	return jinja.NewString(args)
}

// toValue converts a Go value to a template value through encoding/json,
// keeping object key order.
func toValue(v any) (jinja.Value, error) {
	switch x := v.(type) {
	case jinja.Value:
		return x, nil
	case nil:
		return jinja.None(), nil
	case string:
		return jinja.NewString(x), nil
	case bool:
		return jinja.NewBool(x), nil
	case int:
		return jinja.NewInt(int64(x)), nil
	case int64:
		return jinja.NewInt(x), nil
	case float64: // through JSON, 1.0 would turn into the integer 1
		return jinja.NewFloat(x), nil
	case float32:
		return jinja.NewFloat(float64(x)), nil
	case json.RawMessage:
		return jsonValue(x)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return jinja.Undefined(), err
	}
	return jsonValue(b)
}
