package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// apiError is an OpenAI-style error: it is written as
// {"error":{"message","type","param","code"}} with an HTTP status.
type apiError struct {
	status  int
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    any    `json:"code"`
}

func (e *apiError) Error() string { return e.Message }

func badRequest(param, format string, args ...any) *apiError {
	var p any
	if param != "" {
		p = param
	}
	return &apiError{status: http.StatusBadRequest, Message: fmt.Sprintf(format, args...), Type: "invalid_request_error", Param: p}
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.Type == "" {
		e.Type = "invalid_request_error"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	json.NewEncoder(w).Encode(struct {
		Error *apiError `json:"error"`
	}{e})
}

// decodeBody reads one JSON object into v and turns every way it can fail
// into a 400 or 413 naming the problem.
func decodeBody(r *http.Request, w http.ResponseWriter, limit int64, v any) *apiError {
	body := http.MaxBytesReader(w, r.Body, limit)
	dec := json.NewDecoder(body)
	err := dec.Decode(v)
	if err == nil {
		if dec.More() {
			return badRequest("", "the request body holds more than one JSON value")
		}
		return nil
	}
	var tooBig *http.MaxBytesError
	var typeErr *json.UnmarshalTypeError
	var synErr *json.SyntaxError
	var fieldErr *fieldError
	switch {
	case errors.As(err, &tooBig):
		return &apiError{status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("the request body is over the limit of %d bytes", tooBig.Limit), Type: "invalid_request_error"}
	case errors.As(err, &fieldErr):
		return badRequest(fieldErr.field, "%s", fieldErr.msg)
	case errors.As(err, &typeErr):
		field := strings.TrimPrefix(typeErr.Field, "sampling.")
		if field == "" {
			return badRequest("", "the request body must be a JSON object, not %s", typeErr.Value)
		}
		return badRequest(field, "field %q: expected %s, got a JSON %s", field, jsonKind(typeErr.Type.String()), typeErr.Value)
	case errors.As(err, &synErr):
		return badRequest("", "malformed JSON at byte %d: %v", synErr.Offset, err)
	case errors.Is(err, io.EOF):
		return badRequest("", "the request body is empty")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("", "malformed JSON: the request body is cut short")
	}
	return badRequest("", "could not parse the request body: %v", err)
}

func jsonKind(goType string) string {
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case strings.HasPrefix(goType, "map"), strings.HasPrefix(goType, "struct"), strings.Contains(goType, "."):
		return "an object"
	case goType == "string":
		return "a string"
	case goType == "bool":
		return "a boolean"
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"):
		return "an integer"
	case strings.HasPrefix(goType, "float"):
		return "a number"
	}
	return goType
}

// fieldError is returned by the custom unmarshalers for a value of a type
// the field does not take.
type fieldError struct{ field, msg string }

func (e *fieldError) Error() string { return e.msg }

// stopList is OpenAI's stop: a string or an array of strings.
type stopList []string

func (s *stopList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = stopList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return &fieldError{"stop", `field "stop": expected a string or an array of strings`}
	}
	*s = many
	return nil
}

// content is a message's content: a string, null, or an array of parts of
// which only text parts are understood.
type content string

func (c *content) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*c = ""
		return nil
	}
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*c = content(one)
		return nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return &fieldError{"messages", "message content: expected a string or an array of content parts"}
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return &fieldError{"messages", fmt.Sprintf("message content part of type %q is not supported (text only)", p.Type)}
		}
		sb.WriteString(p.Text)
	}
	*c = content(sb.String())
	return nil
}

// promptInput is the prompt of /v1/completions: a string, an array of one
// string, or an array of token ids.
type promptInput struct {
	text string
	ids  []int
}

func (p *promptInput) UnmarshalJSON(b []byte) error {
	if err := json.Unmarshal(b, &p.text); err == nil {
		return nil
	}
	var strs []string
	if err := json.Unmarshal(b, &strs); err == nil {
		if len(strs) != 1 {
			return &fieldError{"prompt", fmt.Sprintf("field \"prompt\": %d prompts in one request are not supported (give one; use n for several choices)", len(strs))}
		}
		p.text = strs[0]
		return nil
	}
	if err := json.Unmarshal(b, &p.ids); err == nil {
		if len(p.ids) == 0 {
			return &fieldError{"prompt", `field "prompt": empty token array`}
		}
		return nil
	}
	return &fieldError{"prompt", `field "prompt": expected a string or an array of token ids`}
}

// sampling holds the fields that /v1/chat/completions and /v1/completions
// share.
type sampling struct {
	Model            string   `json:"model"`
	MaxTokens        *int     `json:"max_tokens"`
	Temperature      *float64 `json:"temperature"`
	TopP             *float64 `json:"top_p"`
	TopK             *int     `json:"top_k"`
	MinP             *float64 `json:"min_p"`
	PresencePenalty  *float64 `json:"presence_penalty"`
	FrequencyPenalty *float64 `json:"frequency_penalty"`
	RepeatPenalty    *float64 `json:"repetition_penalty"`
	Seed             *int64   `json:"seed"`
	N                *int     `json:"n"`
	Stop             stopList `json:"stop"`
	Stream           bool     `json:"stream"`
	StreamOptions    *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	IgnoreEOS bool `json:"ignore_eos"`
}

type chatMessage struct {
	Role             string          `json:"role"`
	Content          content         `json:"content"`
	ReasoningContent string          `json:"reasoning_content"`
	Name             string          `json:"name"`
	ToolCallID       string          `json:"tool_call_id"`
	ToolCalls        []toolCallInput `json:"tool_calls"`
}

type toolCallInput struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type toolDef struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

type responseFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
		Strict bool            `json:"strict"`
	} `json:"json_schema"`
}

type chatRequest struct {
	sampling
	Messages            []chatMessage   `json:"messages"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Logprobs            bool            `json:"logprobs"`
	TopLogprobs         *int            `json:"top_logprobs"`
	Tools               []toolDef       `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ResponseFormat      *responseFormat `json:"response_format"`
	ChatTemplateKwargs  map[string]any  `json:"chat_template_kwargs"`
}

type completionRequest struct {
	sampling
	Prompt   *promptInput `json:"prompt"`
	Logprobs *int         `json:"logprobs"`
	Echo     bool         `json:"echo"`
	Suffix   string       `json:"suffix"`
}

// Responses.

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type toolCallOut struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type messageOut struct {
	Role             string        `json:"role,omitempty"`
	Content          *string       `json:"content,omitempty"`
	ReasoningContent string        `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCallOut `json:"tool_calls,omitempty"`
}

type topLogprob struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type tokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float32      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []topLogprob `json:"top_logprobs"`
}

type chatLogprobs struct {
	Content []tokenLogprob `json:"content"`
}

type chatChoice struct {
	Index        int           `json:"index"`
	Message      *messageOut   `json:"message,omitempty"`
	Delta        *messageOut   `json:"delta,omitempty"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type chatResponse struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint"`
	Choices           []chatChoice `json:"choices"`
	Usage             *usage       `json:"usage,omitempty"`
}

type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float32            `json:"token_logprobs"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

type completionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

type completionResponse struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	SystemFingerprint string             `json:"system_fingerprint"`
	Choices           []completionChoice `json:"choices"`
	Usage             *usage             `json:"usage,omitempty"`
}
