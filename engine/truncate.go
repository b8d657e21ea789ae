package engine

import "fmt"

// Truncate keeps the first n cached tokens of the session and forgets the
// rest, so a new prompt that shares them can be fed from position n on
// (through Step). It is Prefill's prefix reuse without the forward pass.
func (s *Session) Truncate(n int) error {
	if n < 0 || n > len(s.ids) {
		return fmt.Errorf("engine: truncate to %d of %d cached tokens", n, len(s.ids))
	}
	if err := s.cache.Truncate(n); err != nil {
		return err
	}
	s.ids = s.ids[:n]
	return nil
}
