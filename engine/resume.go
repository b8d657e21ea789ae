package engine

// Resume positions the session for prompt without running the model, for
// a caller that feeds the rest through Step (the server's scheduler): the
// cache keeps the longest prefix of prompt it can reuse, at most
// len(prompt)-1 tokens (the last prompt token must run to give logits),
// and Resume returns its length. It is Prefill's reuse without the forward
// pass: a plain cache is truncated to the common prefix; a hybrid model's
// recurrent state cannot be cut back, so it resumes from the cache when it
// holds exactly the common prefix, else from the longest snapshot (its own
// or another session's) within the prompt, else from the start.
func (s *Session) Resume(prompt []int) (int, error) {
	keep := 0
	for keep < len(s.ids) && keep < len(prompt)-1 && s.ids[keep] == prompt[keep] {
		keep++
	}
	if s.e.Model.HasState() {
		at, err := s.e.snaps.resume(s, prompt, keep)
		if err != nil {
			s.ids = s.ids[:0]
			return 0, err
		}
		s.ids = append(s.ids[:0], prompt[:at]...)
		return at, nil
	}
	if err := s.cache.Truncate(keep); err != nil {
		return 0, err
	}
	s.ids = s.ids[:keep]
	return keep, nil
}

// SnapshotInterval is, for a hybrid model, the spacing in tokens of the
// state snapshots Prefill takes (a caller prefilling through Step ends its
// chunks there and calls Snapshot); 0 for models without such state.
func (s *Session) SnapshotInterval() int {
	if !s.e.Model.HasState() {
		return 0
	}
	return s.e.snaps.interval
}
