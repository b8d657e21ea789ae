package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// Serve answers on ln until ctx ends, then shuts down: new requests get
// 503 and the listener closes; requests in flight (streams included) get
// grace to finish, after which they are cancelled cleanly (a stream ends
// with an error event and [DONE]). It returns nil after a clean shutdown.
func Serve(ctx context.Context, ln net.Listener, s *Server, grace time.Duration) error {
	hs := &http.Server{Handler: s, ReadHeaderTimeout: 30 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		s.Close()
		return err
	case <-ctx.Done():
	}
	s.log.Info("shutting down: no new requests; waiting for the ones in flight", "grace", grace)
	s.Drain()
	gctx, cancel := context.WithTimeout(context.Background(), grace)
	err := hs.Shutdown(gctx)
	cancel()
	if err != nil {
		s.log.Warn("grace period over: cancelling the requests still running")
		s.CancelAll()
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := hs.Shutdown(cctx); err != nil {
			hs.Close()
		}
		cancel()
	}
	s.Close()
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	s.log.Info("shut down")
	return nil
}
