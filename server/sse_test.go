package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestSSEWriter: send writes exactly "data: " + json.Marshal(v) + "\n\n"
// per event (the reused buffer and encoder change no byte, HTML-escaping
// included) and flushes nothing; flush sends what was written, once;
// done ends the stream and flushes.
func TestSSEWriter(t *testing.T) {
	rec := httptest.NewRecorder()
	sse := &sseWriter{w: rec, rc: http.NewResponseController(rec)}
	fr := "stop"
	vals := []any{
		completionResponse{ID: "cmpl-1", Object: "text_completion", Model: "m", Choices: []completionChoice{{Text: "a <b> & \u2028 \"q\"\n"}}},
		chatResponse{ID: "c", Object: "chat.completion.chunk", Choices: []chatChoice{{Index: 1, Delta: &messageOut{ReasoningContent: "\x01\t"}, FinishReason: &fr}}},
		completionResponse{Choices: []completionChoice{}},
	}
	var want strings.Builder
	for _, v := range vals {
		sse.send(v)
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		want.WriteString("data: " + string(b) + "\n\n")
	}
	if rec.Flushed {
		t.Fatal("send flushed")
	}
	if got := rec.Body.String(); got != want.String() {
		t.Fatalf("events:\n%q\nwant\n%q", got, want.String())
	}
	sse.flush()
	if !rec.Flushed {
		t.Fatal("flush did not flush")
	}
	rec.Flushed = false
	sse.flush()
	if rec.Flushed {
		t.Fatal("a flush with nothing written flushed again")
	}
	sse.done()
	if !rec.Flushed || !strings.HasSuffix(rec.Body.String(), "\n\ndata: [DONE]\n\n") {
		t.Fatalf("done: flushed %v, body ends %q", rec.Flushed, rec.Body.String()[max(0, rec.Body.Len()-30):])
	}
}
