package server

import (
	_ "embed"
	"net/http"
)

// chatPage is the chat UI served at /: one static file, no build step, no
// external resources.
//
//go:embed static/chat.html
var chatPage []byte

func (s *Server) page(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
	w.Write(chatPage)
}
