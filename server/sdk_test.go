package server

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"
)

func userChat(text string, maxTok int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:       "qwen3-tiny",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)},
		MaxTokens:   openai.Int(maxTok),
		Temperature: openai.Float(0),
	}
}

// TestSDKChat: the official SDK gets the same greedy reply streamed and
// whole, with usage in both (stream_options.include_usage).
func TestSDKChat(t *testing.T) {
	_, ts := startServer(t, Config{Parallel: 2})
	c := client(ts)
	ctx := context.Background()
	p := userChat("Tell me a story", 12)
	whole, err := c.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(whole.Choices) != 1 || whole.Object != "chat.completion" || whole.Model != "qwen3-tiny" {
		t.Fatalf("response %+v", whole)
	}
	ch := whole.Choices[0]
	if ch.FinishReason != "length" && ch.FinishReason != "stop" {
		t.Fatalf("finish_reason %q", ch.FinishReason)
	}
	if whole.Usage.CompletionTokens < 1 || whole.Usage.CompletionTokens > 12 || whole.Usage.PromptTokens < 5 ||
		whole.Usage.TotalTokens != whole.Usage.PromptTokens+whole.Usage.CompletionTokens {
		t.Fatalf("usage %+v", whole.Usage)
	}
	text := ch.Message.Content + ch.Message.JSON.ExtraFields["reasoning_content"].Raw()
	if text == "" {
		t.Fatal("empty reply")
	}

	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	st := c.Chat.Completions.NewStreaming(ctx, p)
	var acc openai.ChatCompletionAccumulator
	chunks, sawUsage := 0, false
	for st.Next() {
		chunk := st.Current()
		acc.AddChunk(chunk)
		chunks++
		if chunk.Usage.TotalTokens > 0 {
			sawUsage = true
			if len(chunk.Choices) != 0 || chunk.Usage.CompletionTokens != whole.Usage.CompletionTokens {
				t.Fatalf("usage chunk %+v", chunk)
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if !sawUsage || chunks < 3 {
		t.Fatalf("%d chunks, usage seen %v", chunks, sawUsage)
	}
	if got := acc.Choices[0].Message.Content; got != ch.Message.Content || acc.Choices[0].FinishReason != ch.FinishReason {
		t.Fatalf("streamed %q (%s), whole %q (%s)", got, acc.Choices[0].FinishReason, ch.Message.Content, ch.FinishReason)
	}
	// The second request with the same prompt reused the cached prefix.
	if whole2, err := c.Chat.Completions.New(ctx, p); err != nil || whole2.Usage.PromptTokensDetails.CachedTokens != whole.Usage.PromptTokens-1 {
		t.Fatalf("cached tokens: %v %+v", err, whole2)
	}
}

// TestSDKCompletions: text completions streamed and not, n choices, stop.
func TestSDKCompletions(t *testing.T) {
	_, ts := startServer(t, Config{Parallel: 4})
	c := client(ts)
	ctx := context.Background()
	p := openai.CompletionNewParams{
		Model:       "qwen3-tiny",
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("The quick brown fox")},
		MaxTokens:   openai.Int(10),
		Temperature: openai.Float(0),
		N:           openai.Int(2),
	}
	r, err := c.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Choices) != 2 || r.Choices[0].Text == "" || r.Choices[0].Text != r.Choices[1].Text {
		t.Fatalf("greedy n=2: %+v", r.Choices)
	}
	if r.Usage.CompletionTokens < 2 || r.Usage.CompletionTokens > 20 {
		t.Fatalf("usage %+v", r.Usage)
	}
	st := c.Completions.NewStreaming(ctx, p)
	got := map[int64]string{}
	finish := map[int64]string{}
	for st.Next() {
		for _, ch := range st.Current().Choices {
			got[ch.Index] += ch.Text
			if ch.FinishReason != "" {
				finish[ch.Index] = string(ch.FinishReason)
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if got[int64(i)] != r.Choices[i].Text || finish[int64(i)] != string(r.Choices[i].FinishReason) {
			t.Fatalf("choice %d streamed %q (%s), whole %q (%s)", i, got[int64(i)], finish[int64(i)], r.Choices[i].Text, r.Choices[i].FinishReason)
		}
	}
	// A stop string taken from the greedy text cuts the reply before it.
	full := r.Choices[0].Text
	if runes := []rune(full); len(runes) >= 4 {
		stop := string(runes[2:4])
		p.N = openai.Int(1)
		p.Stop = openai.CompletionNewParamsStopUnion{OfString: openai.String(stop)}
		r2, err := c.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		want := full[:strings.Index(full, stop)]
		if r2.Choices[0].Text != want || r2.Choices[0].FinishReason != "stop" {
			t.Fatalf("stop %q: got %q (%s), want %q", stop, r2.Choices[0].Text, r2.Choices[0].FinishReason, want)
		}
	}
}

// TestSDKLogprobs: logprobs of the greedy tokens are the best of their
// top_logprobs, sorted, and probabilities that sum to at most 1.
func TestSDKLogprobs(t *testing.T) {
	_, ts := startServer(t, Config{Parallel: 1})
	c := client(ts)
	p := userChat("Hi", 6)
	p.Logprobs = openai.Bool(true)
	p.TopLogprobs = openai.Int(3)
	r, err := c.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	lp := r.Choices[0].Logprobs.Content
	if len(lp) != int(r.Usage.CompletionTokens) || len(lp) == 0 {
		t.Fatalf("%d logprobs for %d tokens", len(lp), r.Usage.CompletionTokens)
	}
	for _, tok := range lp {
		if len(tok.TopLogprobs) != 3 || tok.Logprob > 0 {
			t.Fatalf("token %+v", tok)
		}
		if tok.TopLogprobs[0].Token != tok.Token || math.Abs(tok.TopLogprobs[0].Logprob-tok.Logprob) > 1e-6 {
			t.Fatalf("greedy token %q (%v) is not the best of %+v", tok.Token, tok.Logprob, tok.TopLogprobs)
		}
		sum := 0.0
		for k, x := range tok.TopLogprobs {
			if k > 0 && x.Logprob > tok.TopLogprobs[k-1].Logprob {
				t.Fatal("top_logprobs not sorted")
			}
			sum += math.Exp(x.Logprob)
		}
		if sum > 1+1e-5 {
			t.Fatalf("top probabilities sum to %v", sum)
		}
		if string(bytesOf(tok.Bytes)) != tok.Token && !strings.ContainsRune(tok.Token, '\uFFFD') {
			t.Fatalf("bytes %v vs token %q", tok.Bytes, tok.Token)
		}
	}
	// Streaming carries the same logprobs, one token per chunk.
	st := c.Chat.Completions.NewStreaming(context.Background(), p)
	var streamed []openai.ChatCompletionTokenLogprob
	for st.Next() {
		for _, ch := range st.Current().Choices {
			streamed = append(streamed, ch.Logprobs.Content...)
		}
	}
	if st.Err() != nil || len(streamed) != len(lp) {
		t.Fatalf("streamed %d logprobs (%v), whole %d", len(streamed), st.Err(), len(lp))
	}
	for i := range lp {
		if streamed[i].Token != lp[i].Token || streamed[i].Logprob != lp[i].Logprob {
			t.Fatalf("token %d: streamed %+v whole %+v", i, streamed[i], lp[i])
		}
	}
}

func bytesOf(v []int64) []byte {
	b := make([]byte, len(v))
	for i, x := range v {
		b[i] = byte(x)
	}
	return b
}

var weatherSchema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"city":  map[string]any{"type": "string", "maxLength": 12},
		"unit":  map[string]any{"enum": []string{"celsius", "fahrenheit"}},
		"days":  map[string]any{"type": "integer"},
		"rain":  map[string]any{"type": "boolean"},
		"temps": map[string]any{"type": "array", "items": map[string]any{"type": "number"}, "maxItems": 3},
	},
	"required": []string{"city", "unit", "days", "rain", "temps"},
}

// checkWeather checks that s parses and holds every field of weatherSchema
// with its type.
func checkWeather(t *testing.T, s string) {
	t.Helper()
	var v struct {
		City  *string    `json:"city"`
		Unit  *string    `json:"unit"`
		Days  *int       `json:"days"`
		Rain  *bool      `json:"rain"`
		Temps *[]float64 `json:"temps"`
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("output %q does not parse: %v", s, err)
	}
	if v.City == nil || v.Unit == nil || v.Days == nil || v.Rain == nil || v.Temps == nil {
		t.Fatalf("output %q lacks a field", s)
	}
	if *v.Unit != "celsius" && *v.Unit != "fahrenheit" || len([]rune(*v.City)) > 12 || len(*v.Temps) > 3 {
		t.Fatalf("output %q breaks the schema", s)
	}
}

// TestSDKJSONSchema: constrained decoding makes a random-weight model emit
// JSON that parses and fits the schema, sampled at temperature 1.
func TestSDKJSONSchema(t *testing.T) {
	_, ts := startServer(t, Config{Parallel: 4})
	c := client(ts)
	for seed := int64(1); seed <= 4; seed++ {
		p := userChat("Weather as JSON", 200)
		p.Temperature = openai.Float(1)
		p.Seed = openai.Int(seed)
		p.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "weather", Schema: weatherSchema, Strict: openai.Bool(true)}}}
		r, err := c.Chat.Completions.New(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		if r.Choices[0].FinishReason != "stop" {
			t.Fatalf("seed %d: finish %s after %q", seed, r.Choices[0].FinishReason, r.Choices[0].Message.Content)
		}
		t.Logf("seed %d: %s", seed, r.Choices[0].Message.Content)
		checkWeather(t, r.Choices[0].Message.Content)
	}
	// json_object: any object, also streamed.
	p := userChat("JSON please", 300)
	p.Temperature = openai.Float(0.7)
	p.Seed = openai.Int(3)
	p.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}}
	st := c.Chat.Completions.NewStreaming(context.Background(), p)
	var acc openai.ChatCompletionAccumulator
	for st.Next() {
		acc.AddChunk(st.Current())
	}
	if st.Err() != nil {
		t.Fatal(st.Err())
	}
	out := acc.Choices[0].Message.Content
	ok, complete := validPrefix(anyObjectNode, []byte(out))
	if !ok || !strings.HasPrefix(out, "{") {
		t.Fatalf("json_object output %q is not a JSON object prefix", out)
	}
	if acc.Choices[0].FinishReason == "stop" {
		var v map[string]any
		if !complete || json.Unmarshal([]byte(out), &v) != nil {
			t.Fatalf("json_object output %q stopped but does not parse", out)
		}
	}
}

// weatherTool is small: the fixture's tiny vocabulary spends about one
// token per character of the tool description in the prompt.
var weatherTool = openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
	Name: "weather",
	Parameters: shared.FunctionParameters{
		"type":       "object",
		"properties": map[string]any{"city": map[string]any{"type": "string", "maxLength": 6}, "days": map[string]any{"type": "integer"}},
	},
})

// TestSDKToolCalls: a forced tool choice yields a parsed call whose
// arguments fit the function's parameters, whole and streamed (deltas put
// together by the SDK's accumulator).
func TestSDKToolCalls(t *testing.T) {
	_, ts := startServer(t, Config{Parallel: 2})
	c := client(ts)
	p := userChat("Weather?", 1)
	p.MaxTokens = openai.ChatCompletionNewParams{}.MaxTokens // up to the context
	p.Temperature = openai.Float(0.8)
	p.Seed = openai.Int(7)
	p.Tools = []openai.ChatCompletionToolUnionParam{weatherTool}
	p.ToolChoice = openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "weather"})
	r, err := c.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	ch := r.Choices[0]
	if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 {
		t.Fatalf("finish %s, calls %+v, content %q", ch.FinishReason, ch.Message.ToolCalls, ch.Message.Content)
	}
	call := ch.Message.ToolCalls[0]
	t.Logf("call %s(%s)", call.Function.Name, call.Function.Arguments)
	if call.Function.Name != "weather" || call.ID == "" || call.Type != "function" {
		t.Fatalf("call %+v", call)
	}
	var args struct {
		City *string `json:"city"`
		Days *int    `json:"days"`
	}
	if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil || args.City == nil || args.Days == nil || len([]rune(*args.City)) > 6 {
		t.Fatalf("arguments %q: %v", call.Function.Arguments, err)
	}

	st := c.Chat.Completions.NewStreaming(context.Background(), p)
	var acc openai.ChatCompletionAccumulator
	finished := false
	for st.Next() {
		acc.AddChunk(st.Current())
		if tc, ok := acc.JustFinishedToolCall(); ok {
			finished = true
			if tc.Name != "weather" || tc.Arguments != call.Function.Arguments {
				t.Fatalf("streamed call %+v, whole %+v", tc, call.Function)
			}
		}
	}
	if st.Err() != nil {
		t.Fatal(st.Err())
	}
	calls := acc.Choices[0].Message.ToolCalls
	if len(calls) != 1 || calls[0].Function.Arguments != call.Function.Arguments || acc.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("streamed calls %+v finish %s", calls, acc.Choices[0].FinishReason)
	}
	_ = finished // JustFinishedToolCall fires only when a later chunk follows the call
}

// TestSDKReasoningAndToolCalls: a reply that thinks, talks and calls a
// tool (the model is made to write it; tool_choice auto) comes back as
// reasoning_content, content and a parsed tool call, whole and streamed.
func TestSDKReasoningAndToolCalls(t *testing.T) {
	reply := "<think>\nI should call it.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
	_, ts := startServer(t, Config{Parallel: 1, forceText: reply})
	c := client(ts)
	p := userChat("Weather?", 1)
	p.MaxTokens = openai.ChatCompletionNewParams{}.MaxTokens
	p.Tools = []openai.ChatCompletionToolUnionParam{weatherTool}
	r, err := c.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	m := r.Choices[0].Message
	reasoning := ""
	json.Unmarshal([]byte(m.JSON.ExtraFields["reasoning_content"].Raw()), &reasoning)
	if reasoning != "\nI should call it.\n" || m.Content != "Let me check.\n" || r.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("reasoning %q content %q finish %s", reasoning, m.Content, r.Choices[0].FinishReason)
	}
	if len(m.ToolCalls) != 1 || m.ToolCalls[0].Function.Name != "weather" || m.ToolCalls[0].Function.Arguments != `{"city": "Paris"}` {
		t.Fatalf("calls %+v", m.ToolCalls)
	}
	st := c.Chat.Completions.NewStreaming(context.Background(), p)
	var acc openai.ChatCompletionAccumulator
	streamedReasoning := ""
	for st.Next() {
		ch := st.Current()
		acc.AddChunk(ch)
		for _, x := range ch.Choices {
			var part string
			json.Unmarshal([]byte(x.Delta.JSON.ExtraFields["reasoning_content"].Raw()), &part)
			streamedReasoning += part
		}
	}
	if st.Err() != nil {
		t.Fatal(st.Err())
	}
	sm := acc.Choices[0].Message
	if streamedReasoning != reasoning || sm.Content != m.Content || len(sm.ToolCalls) != 1 ||
		sm.ToolCalls[0].Function.Arguments != m.ToolCalls[0].Function.Arguments || acc.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("streamed reasoning %q content %q calls %+v finish %s", streamedReasoning, sm.Content, sm.ToolCalls, acc.Choices[0].FinishReason)
	}
}
