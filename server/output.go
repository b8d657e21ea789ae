package server

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strings"
)

// outParser splits generated text, as it streams, into reasoning (a
// leading <think>…</think> block), content, and tool calls written as
// <tool_call>{"name": …, "arguments": …}</tool_call>. It holds back only
// what could still turn out to be a marker.
type outParser struct {
	think, tools bool
	state        int // 0 at the start (a think block may open), 1 inside it, 2 content, 3 inside a tool call
	buf          string
	calls        int
	sawContent   bool
	trim         bool // drop whitespace before the content that follows </think> or </tool_call>
}

const (
	thinkOpen  = "<think>"
	thinkClose = "</think>"
	callOpen   = "<tool_call>"
	callClose  = "</tool_call>"
)

type delta struct {
	reasoning string
	content   string
	calls     []toolCallOut
}

func (d *delta) empty() bool { return d.reasoning == "" && d.content == "" && len(d.calls) == 0 }

func newOutParser(think, startInThink, tools bool) *outParser {
	p := &outParser{think: think, tools: tools, state: 2}
	switch {
	case think && startInThink:
		p.state = 1
	case think:
		p.state = 0
	}
	return p
}

// partialSuffix is the length of the longest suffix of s that is a proper
// prefix of marker.
func partialSuffix(s, marker string) int {
	for n := min(len(s), len(marker)-1); n > 0; n-- {
		if strings.HasSuffix(s, marker[:n]) {
			return n
		}
	}
	return 0
}

func (p *outParser) push(s string) delta {
	p.buf += s
	var d delta
	for {
		switch p.state {
		case 0:
			t := strings.TrimLeft(p.buf, " \t\r\n")
			switch {
			case strings.HasPrefix(t, thinkOpen):
				p.buf, p.state = t[len(thinkOpen):], 1
				continue
			case strings.HasPrefix(thinkOpen, t):
				return d // could still be <think>
			}
			p.state = 2
		case 1:
			if i := strings.Index(p.buf, thinkClose); i >= 0 {
				d.reasoning += p.buf[:i]
				p.buf, p.state, p.trim = p.buf[i+len(thinkClose):], 2, true
				continue
			}
			k := partialSuffix(p.buf, thinkClose)
			d.reasoning += p.buf[:len(p.buf)-k]
			p.buf = p.buf[len(p.buf)-k:]
			return d
		case 2:
			if p.trim {
				p.buf = strings.TrimLeft(p.buf, " \t\r\n")
				if p.buf == "" {
					return d
				}
				p.trim = false
			}
			if !p.tools {
				d.content += p.buf
				p.buf = ""
				return d
			}
			if i := strings.Index(p.buf, callOpen); i >= 0 {
				p.emitContent(&d, p.buf[:i])
				p.buf, p.state = p.buf[i+len(callOpen):], 3
				continue
			}
			k := partialSuffix(p.buf, callOpen)
			text := p.buf[:len(p.buf)-k]
			if !p.sawContent && strings.TrimSpace(text) == "" {
				return d // whitespace before a possible call stays held
			}
			p.emitContent(&d, text)
			p.buf = p.buf[len(p.buf)-k:]
			return d
		case 3:
			i := strings.Index(p.buf, callClose)
			if i < 0 {
				return d
			}
			body := p.buf[:i]
			p.buf, p.state, p.trim = p.buf[i+len(callClose):], 2, true
			if c, ok := p.parseCall(body); ok {
				d.calls = append(d.calls, c)
			} else {
				p.emitContent(&d, callOpen+body+callClose)
			}
		}
	}
}

func (p *outParser) emitContent(d *delta, s string) {
	if s == "" {
		return
	}
	if !p.sawContent {
		if strings.TrimSpace(s) == "" && p.tools {
			return
		}
		p.sawContent = true
	}
	d.content += s
}

// flush returns whatever was held back at the end of generation.
func (p *outParser) flush() delta {
	var d delta
	switch p.state {
	case 0, 2:
		if p.tools && !p.sawContent && strings.TrimSpace(p.buf) == "" {
			break
		}
		d.content = p.buf
	case 1:
		d.reasoning = p.buf
	case 3:
		d.content = callOpen + p.buf
	}
	p.buf = ""
	return d
}

func (p *outParser) parseCall(body string) (toolCallOut, bool) {
	var v struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(body)), &v); err != nil || v.Name == "" {
		return toolCallOut{}, false
	}
	args := string(v.Arguments)
	if args == "" || args == "null" {
		args = "{}"
	}
	// Arguments given as a JSON string stay that string.
	var s string
	if json.Unmarshal(v.Arguments, &s) == nil {
		args = s
	}
	idx := p.calls
	p.calls++
	c := toolCallOut{Index: &idx, ID: "call_" + randomHex(12), Type: "function"}
	c.Function.Name = v.Name
	c.Function.Arguments = args
	return c, true
}

func randomHex(n int) string {
	b := make([]byte, n/2)
	rand.Read(b)
	return hex.EncodeToString(b)
}
