package tokenizer

// TokenBytes returns the bytes that id contributes to decoded text, for
// byte-level vocabularies (where a token may hold part of a UTF-8
// character). ok is false for vocabularies without a byte-level decoder and
// for unknown ids; callers then fall back to Decode of the single id.
func (t *Tokenizer) TokenBytes(id int) (b []byte, ok bool) {
	if t.decOff == nil || id < 0 || id >= len(t.idToToken) || !t.hasID[id] {
		return nil, false
	}
	return t.decBytes[t.decOff[id]:t.decOff[id+1]], true
}
