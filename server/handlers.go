package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/cortiq/cortiq/chat"
	"github.com/cortiq/cortiq/sample"
)

// plan is a validated generation request.
type plan struct {
	chat         bool
	prompt       []int
	max          int
	n            int
	params       sample.Params
	stops        []string
	ignoreEOS    bool
	stream       bool
	includeUsage bool
	logprobs     bool // chat: logprobs; completions: logprobs given
	cons         func() constraint
	think        bool // split <think> into reasoning_content
	thinkStart   bool // the prompt already opened the think block
	tools        bool // parse <tool_call> blocks
}

// samplingPlan validates the shared fields against the prompt and context.
func (s *Server) samplingPlan(sp *sampling, p *plan, maxTok *int, defMax int) *apiError {
	ctx := s.cfg.Ctx
	if len(p.prompt) == 0 {
		return badRequest("prompt", "the prompt is empty")
	}
	if len(p.prompt) >= ctx {
		return badRequest("messages", "the prompt is %d tokens; it does not fit the %d-token context with room for one new token", len(p.prompt), ctx)
	}
	room := ctx - len(p.prompt)
	switch {
	case maxTok == nil:
		p.max = room
		if defMax > 0 {
			p.max = min(defMax, room)
		}
	case *maxTok < 1:
		return badRequest("max_tokens", "max_tokens %d: must be at least 1", *maxTok)
	case *maxTok > room:
		return badRequest("max_tokens", "max_tokens %d is beyond the context: the prompt is %d tokens and the context %d, so at most %d can be generated", *maxTok, len(p.prompt), ctx, room)
	default:
		p.max = *maxTok
	}
	p.n = 1
	if sp.N != nil {
		if *sp.N < 1 || *sp.N > 16 {
			return badRequest("n", "n %d: must be between 1 and 16", *sp.N)
		}
		p.n = *sp.N
	}
	f := func(v *float64, def float32, name string, lo, hi float64) (float32, *apiError) {
		if v == nil {
			return def, nil
		}
		if math.IsNaN(*v) || *v < lo || *v > hi {
			return 0, badRequest(name, "%s %v: must be between %v and %v", name, *v, lo, hi)
		}
		return float32(*v), nil
	}
	var e *apiError
	pr := &p.params
	if pr.Temperature, e = f(sp.Temperature, 1, "temperature", 0, 2); e != nil {
		return e
	}
	if pr.TopP, e = f(sp.TopP, 1, "top_p", 0, 1); e != nil {
		return e
	}
	if pr.MinP, e = f(sp.MinP, 0, "min_p", 0, 1); e != nil {
		return e
	}
	if pr.PresencePenalty, e = f(sp.PresencePenalty, 0, "presence_penalty", -2, 2); e != nil {
		return e
	}
	if pr.FrequencyPenalty, e = f(sp.FrequencyPenalty, 0, "frequency_penalty", -2, 2); e != nil {
		return e
	}
	if pr.RepeatPenalty, e = f(sp.RepeatPenalty, 1, "repetition_penalty", 0, 10); e != nil {
		return e
	}
	if sp.TopK != nil {
		if *sp.TopK < 0 {
			return badRequest("top_k", "top_k %d: must be ≥ 0", *sp.TopK)
		}
		pr.TopK = *sp.TopK
	}
	if sp.Seed != nil {
		pr.Seed = uint64(*sp.Seed)
	} else {
		pr.Seed = uint64(time.Now().UnixNano())
	}
	if len(sp.Stop) > 4 {
		return badRequest("stop", "at most 4 stop sequences, got %d", len(sp.Stop))
	}
	for _, st := range sp.Stop {
		if st == "" {
			return badRequest("stop", "an empty stop sequence")
		}
	}
	p.stops = sp.Stop
	p.ignoreEOS = sp.IgnoreEOS
	p.stream = sp.Stream
	p.includeUsage = sp.StreamOptions != nil && sp.StreamOptions.IncludeUsage
	if _, err := sample.New(p.params); err != nil {
		return badRequest("", "%v", err)
	}
	return nil
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request, b *backend) {
	var req chatRequest
	if e := decodeBody(r, w, s.cfg.MaxBody, &req); e != nil {
		writeError(w, e)
		return
	}
	if e := s.checkModel(req.Model); e != nil {
		writeError(w, e)
		return
	}
	if len(req.Messages) == 0 {
		writeError(w, badRequest("messages", "messages must hold at least one message"))
		return
	}
	if !b.e.HasTemplate() {
		writeError(w, badRequest("messages", "the model carries no chat template; use /v1/completions"))
		return
	}
	var msgs []chat.Message
	for i, m := range req.Messages {
		switch m.Role {
		case "system", "developer", "user", "assistant", "tool":
		default:
			writeError(w, badRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d]: unknown role %q", i, m.Role))
			return
		}
		role := m.Role
		if role == "developer" {
			role = "system"
		}
		cm := chat.Message{Role: role, Content: string(m.Content), ReasoningContent: m.ReasoningContent, Name: m.Name, ToolCallID: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			cm.ToolCalls = append(cm.ToolCalls, chat.ToolCall{ID: tc.ID, Type: tc.Type, Function: chat.FunctionCall{Name: tc.Function.Name, Arguments: tc.Function.Arguments}})
		}
		msgs = append(msgs, cm)
	}
	p := &plan{chat: true, think: b.think, logprobs: req.Logprobs}
	opt := chat.Options{AddGenerationPrompt: true}
	if v, ok := req.ChatTemplateKwargs["enable_thinking"].(bool); ok {
		opt.EnableThinking = &v
	}
	// tool_choice: "none", "auto" (default), "required", or a named function.
	choice, forced := "auto", ""
	if len(req.ToolChoice) > 0 && string(req.ToolChoice) != "null" {
		var named struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if err := json.Unmarshal(req.ToolChoice, &choice); err != nil {
			if err := json.Unmarshal(req.ToolChoice, &named); err != nil || named.Function.Name == "" {
				writeError(w, badRequest("tool_choice", `tool_choice: expected "none", "auto", "required" or {"type":"function","function":{"name":...}}`))
				return
			}
			choice, forced = "function", named.Function.Name
		}
		switch choice {
		case "none", "auto", "required", "function":
		default:
			writeError(w, badRequest("tool_choice", "tool_choice %q: expected none, auto or required", choice))
			return
		}
	}
	if len(req.Tools) > 0 && choice != "none" {
		for i, t := range req.Tools {
			if t.Type != "" && t.Type != "function" || t.Function.Name == "" {
				writeError(w, badRequest(fmt.Sprintf("tools[%d]", i), "tools[%d]: expected a function with a name", i))
				return
			}
			var v any
			raw, _ := json.Marshal(t)
			json.Unmarshal(raw, &v)
			opt.Tools = append(opt.Tools, v)
		}
		p.tools = true
	} else if choice == "required" || choice == "function" {
		writeError(w, badRequest("tool_choice", "tool_choice %s needs tools", choice))
		return
	}
	text, err := b.e.RenderChat(msgs, opt)
	if err != nil {
		writeError(w, badRequest("messages", "the chat template failed: %v", err))
		return
	}
	p.thinkStart = strings.HasSuffix(strings.TrimRight(text, "\n"), thinkOpen)
	if p.prompt, err = b.e.Encode(text, true); err != nil {
		writeError(w, badRequest("messages", "%v", err))
		return
	}
	maxTok := req.MaxCompletionTokens
	if maxTok == nil {
		maxTok = req.MaxTokens
	}
	if e := s.samplingPlan(&req.sampling, p, maxTok, 0); e != nil {
		writeError(w, e)
		return
	}
	if req.Logprobs || req.TopLogprobs != nil {
		p.params.LogProbs = true
		if req.TopLogprobs != nil {
			if *req.TopLogprobs < 0 || *req.TopLogprobs > 20 {
				writeError(w, badRequest("top_logprobs", "top_logprobs %d: must be between 0 and 20", *req.TopLogprobs))
				return
			}
			if !req.Logprobs {
				writeError(w, badRequest("top_logprobs", "top_logprobs needs logprobs: true"))
				return
			}
			p.params.TopLogProbs = *req.TopLogprobs
		}
	}
	var root *gnode
	if rf := req.ResponseFormat; rf != nil {
		switch rf.Type {
		case "", "text":
		case "json_object":
			root = anyObjectNode
		case "json_schema":
			if rf.JSONSchema == nil || len(rf.JSONSchema.Schema) == 0 {
				writeError(w, badRequest("response_format.json_schema", "response_format json_schema needs json_schema.schema"))
				return
			}
			if root, err = compileSchema(rf.JSONSchema.Schema, "schema"); err != nil {
				writeError(w, badRequest("response_format.json_schema.schema", "%v", err))
				return
			}
		default:
			writeError(w, badRequest("response_format.type", "response_format type %q: expected text, json_object or json_schema", rf.Type))
			return
		}
		if root != nil {
			p.think = false
		}
	}
	if choice == "required" || choice == "function" {
		if root != nil {
			writeError(w, badRequest("response_format", "response_format and a forced tool_choice cannot be combined"))
			return
		}
		if root, err = toolCallGrammar(req.Tools, forced); err != nil {
			writeError(w, badRequest("tool_choice", "%v", err))
			return
		}
		p.think = false
	}
	if root != nil {
		v := b.vocab
		p.cons = func() constraint { return newGrammarConstraint(v.get(), root) }
	}
	s.run(w, r, b, p)
}

func (s *Server) completion(w http.ResponseWriter, r *http.Request, b *backend) {
	var req completionRequest
	if e := decodeBody(r, w, s.cfg.MaxBody, &req); e != nil {
		writeError(w, e)
		return
	}
	if e := s.checkModel(req.Model); e != nil {
		writeError(w, e)
		return
	}
	if req.Prompt == nil {
		writeError(w, badRequest("prompt", "prompt is required"))
		return
	}
	if req.Echo {
		writeError(w, badRequest("echo", "echo is not supported"))
		return
	}
	if req.Suffix != "" {
		writeError(w, badRequest("suffix", "suffix is not supported"))
		return
	}
	p := &plan{}
	if req.Prompt.ids != nil {
		for _, id := range req.Prompt.ids {
			if id < 0 || id >= b.vocabSize {
				writeError(w, badRequest("prompt", "token id %d is outside the %d-token vocabulary", id, b.vocabSize))
				return
			}
		}
		p.prompt = req.Prompt.ids
	} else {
		var err error
		if p.prompt, err = b.e.Encode(req.Prompt.text, true); err != nil {
			writeError(w, badRequest("prompt", "%v", err))
			return
		}
	}
	if e := s.samplingPlan(&req.sampling, p, req.MaxTokens, 16); e != nil {
		if e.Param == "messages" {
			e.Param = "prompt"
		}
		writeError(w, e)
		return
	}
	if req.Logprobs != nil {
		if *req.Logprobs < 0 || *req.Logprobs > 20 {
			writeError(w, badRequest("logprobs", "logprobs %d: must be between 0 and 20", *req.Logprobs))
			return
		}
		p.logprobs = true
		p.params.LogProbs = true
		p.params.TopLogProbs = *req.Logprobs
	}
	s.run(w, r, b, p)
}

// choiceOut accumulates one choice.
type choiceOut struct {
	parser    *outParser
	text      strings.Builder
	reasoning strings.Builder
	calls     []toolCallOut
	toks      []tokenInfo
	reason    string
	done      bool
	last      event
}

func finishReason(reason string, calls int) string {
	if calls > 0 {
		return "tool_calls"
	}
	if reason == "length" {
		return "length"
	}
	return "stop"
}

// run queues the plan's n jobs and answers, streamed or whole.
func (s *Server) run(w http.ResponseWriter, r *http.Request, b *backend, p *plan) {
	if s.cfg.forceText != "" && p.cons == nil && b.e.Tok != nil {
		ids := b.e.Tok.Encode(s.cfg.forceText, false, true)
		p.cons = func() constraint { return &forcedTokens{ids: ids, eos: b.e.EOS} }
	}
	ctx, cancel := s.jobContext(r)
	defer cancel()
	jobs := make([]*job, p.n)
	for i := range jobs {
		params := p.params
		params.Seed += uint64(i)
		j := &job{ctx: ctx, prompt: p.prompt, max: p.max, params: params, stops: p.stops, ignoreEOS: p.ignoreEOS, log: reqLog(r).With("choice", i), id: w.Header().Get("X-Request-Id")}
		if p.cons != nil {
			j.cons = p.cons()
		}
		jobs[i] = j
	}
	if e := s.submit(b, jobs); e != nil {
		if e.status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		writeError(w, e)
		return
	}
	// The jobs' events, tagged with the choice index: one job's channel is
	// read directly; several are fanned into one channel.
	type tagged struct {
		i  int
		ev event
	}
	var all chan tagged
	if len(jobs) > 1 {
		all = make(chan tagged, 16)
		for i, j := range jobs {
			go func() {
				for {
					select {
					case ev := <-j.events:
						select {
						case all <- tagged{i, ev}:
						case <-ctx.Done():
							return
						}
						if ev.done {
							return
						}
					case <-ctx.Done():
						return
					}
				}
			}()
		}
	}
	// poll returns the next event if one is ready; wait blocks for it (ok
	// false: the request's context ended first).
	poll := func() (tagged, bool) {
		if all == nil {
			select {
			case ev := <-jobs[0].events:
				return tagged{0, ev}, true
			default:
				return tagged{}, false
			}
		}
		select {
		case t := <-all:
			return t, true
		default:
			return tagged{}, false
		}
	}
	wait := func() (tagged, bool) {
		if all == nil {
			select {
			case ev := <-jobs[0].events:
				return tagged{0, ev}, true
			case <-ctx.Done():
				return tagged{}, false
			}
		}
		select {
		case t := <-all:
			return t, true
		case <-ctx.Done():
			return tagged{}, false
		}
	}
	id := "cmpl-" + randomHex(24)
	if p.chat {
		id = "chatcmpl-" + randomHex(24)
	}
	created := time.Now().Unix()
	choices := make([]*choiceOut, p.n)
	for i := range choices {
		choices[i] = &choiceOut{parser: newOutParser(p.think, p.thinkStart, p.tools)}
	}
	sse := &sseWriter{w: w, rc: http.NewResponseController(w)}
	if p.stream {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("X-Accel-Buffering", "no")
		w.WriteHeader(http.StatusOK)
		if p.chat {
			for i := range choices {
				empty := ""
				sse.send(s.chatChunk(id, created, i, &messageOut{Role: "assistant", Content: &empty}, nil, nil))
			}
		}
	}
	pending := p.n
	var use usage
	for pending > 0 {
		// Chunks are written as their events come and flushed once no
		// further event is ready: a stream that fell behind by several
		// tokens catches up in one write to the connection.
		t, ok := poll()
		if !ok {
			sse.flush()
			t, ok = wait()
		}
		if !ok {
			if r.Context().Err() == nil && p.stream {
				// Cancelled by the server (shutdown grace over): end cleanly.
				sse.error(&apiError{status: http.StatusServiceUnavailable, Message: "the server is shutting down; the response was cut short", Type: "server_error"})
				sse.done()
			} else if r.Context().Err() == nil {
				writeError(w, &apiError{status: http.StatusServiceUnavailable, Message: "the server is shutting down", Type: "server_error"})
			}
			reqLog(r).Info("request ended before its completion", "reason", context.Cause(ctx))
			return
		}
		c, ev := choices[t.i], t.ev
		if ev.done {
			pending--
			c.done, c.reason, c.last = true, ev.reason, ev
			if ev.reason == "error" || ev.reason == "cancelled" {
				e := &apiError{status: http.StatusInternalServerError, Message: fmt.Sprintf("generation failed: %v", ev.err), Type: "server_error"}
				if ev.reason == "cancelled" {
					e = &apiError{status: http.StatusServiceUnavailable, Message: "the request was cancelled: the server is shutting down", Type: "server_error"}
				}
				if p.stream {
					sse.error(e)
					sse.done()
				} else {
					writeError(w, e)
				}
				return
			}
			use.PromptTokens = ev.promptTokens
			use.PromptTokensDetails.CachedTokens = max(use.PromptTokensDetails.CachedTokens, ev.cachedTokens)
			use.CompletionTokens += ev.completionTokens
			d := c.parser.flush()
			s.emit(sse, p, id, created, t.i, c, d, nil, true)
			continue
		}
		var d delta
		if ev.text != "" {
			if p.chat {
				d = c.parser.push(ev.text)
			} else {
				d.content = ev.text
			}
		}
		var tok *tokenInfo
		if ev.hasTok {
			tok = &ev.token
		}
		s.emit(sse, p, id, created, t.i, c, d, tok, false)
	}
	use.TotalTokens = use.PromptTokens + use.CompletionTokens
	reqLog(r).Info("generated", "choices", p.n, "prompt_tokens", use.PromptTokens, "cached_tokens", use.PromptTokensDetails.CachedTokens,
		"completion_tokens", use.CompletionTokens, "finish", choices[0].reason, "stream", p.stream, "constrained", p.cons != nil)
	if p.stream {
		if p.includeUsage {
			if p.chat {
				sse.send(chatResponse{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.cfg.ModelName, SystemFingerprint: fingerprint, Choices: []chatChoice{}, Usage: &use})
			} else {
				sse.send(completionResponse{ID: id, Object: "text_completion", Created: created, Model: s.cfg.ModelName, SystemFingerprint: fingerprint, Choices: []completionChoice{}, Usage: &use})
			}
		}
		sse.done()
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	if p.chat {
		resp := chatResponse{ID: id, Object: "chat.completion", Created: created, Model: s.cfg.ModelName, SystemFingerprint: fingerprint, Usage: &use}
		for i, c := range choices {
			m := &messageOut{Role: "assistant", ReasoningContent: c.reasoning.String(), ToolCalls: c.calls}
			if txt := c.text.String(); txt != "" || len(c.calls) == 0 {
				m.Content = &txt
			}
			for k := range m.ToolCalls {
				m.ToolCalls[k].Index = nil
			}
			fr := finishReason(c.reason, len(c.calls))
			ch := chatChoice{Index: i, Message: m, FinishReason: &fr}
			if p.logprobs {
				ch.Logprobs = s.chatLogprobs(b, c.toks)
			}
			resp.Choices = append(resp.Choices, ch)
		}
		enc.Encode(resp)
		return
	}
	resp := completionResponse{ID: id, Object: "text_completion", Created: created, Model: s.cfg.ModelName, SystemFingerprint: fingerprint, Usage: &use}
	for i, c := range choices {
		fr := finishReason(c.reason, 0)
		ch := completionChoice{Index: i, Text: c.text.String(), FinishReason: &fr}
		if p.logprobs {
			ch.Logprobs = s.completionLogprobs(b, c.toks, 0)
		}
		resp.Choices = append(resp.Choices, ch)
	}
	enc.Encode(resp)
}

const fingerprint = "cortiq"

// emit records a delta of choice i and, when streaming, sends it.
func (s *Server) emit(sse *sseWriter, p *plan, id string, created int64, i int, c *choiceOut, d delta, tok *tokenInfo, final bool) {
	off := c.text.Len()
	c.text.WriteString(d.content)
	c.reasoning.WriteString(d.reasoning)
	c.calls = append(c.calls, d.calls...)
	if tok != nil && p.logprobs && !p.stream {
		c.toks = append(c.toks, *tok) // for the whole response's logprobs
	}
	if !p.stream {
		return
	}
	b := s.b.Load()
	var fr *string
	if final {
		x := finishReason(c.reason, len(c.calls))
		fr = &x
	}
	if d.empty() && tok == nil && !final {
		return
	}
	if p.chat {
		var lp *chatLogprobs
		if p.logprobs && tok != nil {
			lp = s.chatLogprobs(b, []tokenInfo{*tok})
		}
		if d.empty() && lp == nil && !final {
			return
		}
		m := &messageOut{ReasoningContent: d.reasoning, ToolCalls: d.calls}
		if d.content != "" {
			m.Content = &d.content
		}
		sse.send(s.chatChunk(id, created, i, m, lp, fr))
		return
	}
	ch := completionChoice{Index: i, Text: d.content, FinishReason: fr}
	if p.logprobs && tok != nil {
		ch.Logprobs = s.completionLogprobs(b, []tokenInfo{*tok}, off)
	}
	if d.empty() && ch.Logprobs == nil && !final {
		return
	}
	sse.send(completionResponse{ID: id, Object: "text_completion", Created: created, Model: s.cfg.ModelName, SystemFingerprint: fingerprint, Choices: []completionChoice{ch}})
}

func (s *Server) chatChunk(id string, created int64, i int, m *messageOut, lp *chatLogprobs, fr *string) chatResponse {
	return chatResponse{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.cfg.ModelName, SystemFingerprint: fingerprint,
		Choices: []chatChoice{{Index: i, Delta: m, Logprobs: lp, FinishReason: fr}}}
}

// tokenText is a token's bytes and their text (lossy when the token holds
// part of a UTF-8 character).
func (b *backend) tokenText(id int32) (string, []int) {
	var raw []byte
	if b.e.Tok != nil {
		if tb, ok := b.e.Tok.TokenBytes(int(id)); ok {
			raw = tb
		} else {
			raw = []byte(b.e.Tok.Decode([]int{int(id)}))
		}
	}
	ints := make([]int, len(raw))
	for k, x := range raw {
		ints[k] = int(x)
	}
	return strings.ToValidUTF8(string(raw), "\uFFFD"), ints
}

func (s *Server) chatLogprobs(b *backend, toks []tokenInfo) *chatLogprobs {
	lp := &chatLogprobs{Content: []tokenLogprob{}}
	for _, t := range toks {
		str, raw := b.tokenText(t.id)
		e := tokenLogprob{Token: str, Logprob: t.logprob, Bytes: raw, TopLogprobs: []topLogprob{}}
		for _, x := range t.top {
			ts, tr := b.tokenText(x.Token)
			e.TopLogprobs = append(e.TopLogprobs, topLogprob{Token: ts, Logprob: x.LogProb, Bytes: tr})
		}
		lp.Content = append(lp.Content, e)
	}
	return lp
}

func (s *Server) completionLogprobs(b *backend, toks []tokenInfo, off int) *completionLogprobs {
	lp := &completionLogprobs{Tokens: []string{}, TokenLogprobs: []float32{}, TopLogprobs: []map[string]float32{}, TextOffset: []int{}}
	for _, t := range toks {
		str, _ := b.tokenText(t.id)
		lp.Tokens = append(lp.Tokens, str)
		lp.TokenLogprobs = append(lp.TokenLogprobs, t.logprob)
		top := map[string]float32{}
		for _, x := range t.top {
			ts, _ := b.tokenText(x.Token)
			if _, dup := top[ts]; !dup {
				top[ts] = x.LogProb
			}
		}
		lp.TopLogprobs = append(lp.TopLogprobs, top)
		lp.TextOffset = append(lp.TextOffset, off)
		off += len(str)
	}
	return lp
}

// sseWriter writes server-sent events; flush (and done) send what was
// written to the client.
type sseWriter struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	buf    bytes.Buffer // one event, reused
	enc    *json.Encoder
	failed bool
	dirty  bool // written since the last flush
}

// send writes v as one event (not flushed).
func (s *sseWriter) send(v any) {
	if s.failed {
		return
	}
	if s.enc == nil {
		s.enc = json.NewEncoder(&s.buf)
	}
	s.buf.Reset()
	s.buf.WriteString("data: ")
	// Encode writes what json.Marshal gives, then a newline.
	if err := s.enc.Encode(v); err != nil {
		s.failed = true
		return
	}
	s.buf.WriteByte('\n')
	if _, err := s.w.Write(s.buf.Bytes()); err != nil {
		s.failed = true
		return
	}
	s.dirty = true
}

// flush sends the events written since the last flush.
func (s *sseWriter) flush() {
	if s.failed || !s.dirty {
		return
	}
	s.dirty = false
	s.rc.Flush()
}

func (s *sseWriter) error(e *apiError) {
	if e.Type == "" {
		e.Type = "server_error"
	}
	s.send(struct {
		Error *apiError `json:"error"`
	}{e})
}

// done writes the end of the stream and flushes.
func (s *sseWriter) done() {
	if s.failed {
		return
	}
	fmt.Fprint(s.w, "data: [DONE]\n\n")
	s.dirty = true
	s.flush()
}
