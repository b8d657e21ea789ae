package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cortiq/cortiq/backend"
	"github.com/cortiq/cortiq/backend/cpu"
	"github.com/cortiq/cortiq/chat"
	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/model"
	"github.com/cortiq/cortiq/sample"
	"github.com/cortiq/cortiq/tokenizer"
)

// Options tune Open.
type Options struct {
	Threads int // CPU workers (0: all cores)
	Batch   int // prefill positions per step (0: model default)
	// Device runs the model; nil starts a CPU device of Threads workers,
	// which Close stops. A device given here is the caller's to close,
	// unless OwnDevice hands it to the engine (closed by Close, also when
	// Open fails).
	Device    backend.Device
	OwnDevice bool
	// NoVerify skips hashing the weights at open (see cmf.OpenOptions);
	// by default they are verified once per file identity.
	NoVerify bool
	// Hybrid models (snapshots.go): a snapshot of the linear-attention
	// state every SnapshotInterval prefill tokens (0: 256, < 0: only at
	// the end of prompts and replies), kept in an LRU of SnapshotBudget
	// bytes (0: 1 GiB).
	SnapshotInterval int
	SnapshotBudget   int64
}

// Engine is an open model with its tokenizer and chat template.
type Engine struct {
	File  *cmf.Model
	Model *model.Model
	Tok   *tokenizer.Tokenizer // nil when the file carries no tokenizer
	EOS   []int32
	tmpl  *chat.Template

	dev    backend.Device
	ownDev bool
	snaps  snapStore
}

// Open maps a CMF file and builds the runnable model and tokenizer.
func Open(path string, opt Options) (*Engine, error) {
	f, err := cmf.OpenWith(path, cmf.OpenOptions{NoVerify: opt.NoVerify})
	if err != nil {
		if opt.OwnDevice && opt.Device != nil {
			opt.Device.Close()
		}
		return nil, err
	}
	dev, own := opt.Device, opt.OwnDevice
	if dev == nil {
		dev, own = cpu.New(opt.Threads), true
	}
	m, err := model.Load(f, model.LoadOptions{Device: dev, Batch: opt.Batch})
	if err != nil {
		if own {
			dev.Close()
		}
		f.Close()
		return nil, err
	}
	e := &Engine{File: f, Model: m, dev: dev, ownDev: own}
	e.snaps.interval, e.snaps.budget = opt.SnapshotInterval, opt.SnapshotBudget
	if e.snaps.interval == 0 {
		e.snaps.interval = DefaultSnapshotInterval
	}
	if e.snaps.budget <= 0 {
		e.snaps.budget = DefaultSnapshotBudget
	}
	if tc := f.Header.TokenizerConfig; tc != nil {
		if e.Tok, err = LoadTokenizer(f); err != nil {
			e.Close()
			return nil, err
		}
		for _, id := range tc.EOSTokenIDs {
			e.EOS = append(e.EOS, int32(id))
		}
		if tc.ChatTemplate != "" {
			if e.tmpl, err = chat.Compile(tc.ChatTemplate); err != nil {
				slog.Warn("the model's chat template does not compile; prompts are used raw", "err", err)
			}
		}
	}
	if len(e.EOS) == 0 {
		for _, id := range f.Header.Arch.EOSTokenIDs {
			e.EOS = append(e.EOS, int32(id))
		}
	}
	return e, nil
}

// Close releases the model and its mapping.
func (e *Engine) Close() {
	if e.Model != nil {
		e.Model.Close()
	}
	if e.ownDev {
		e.dev.Close()
		e.ownDev = false
	}
	if e.File != nil {
		e.File.Close()
	}
}

// HasTemplate reports whether the model carries a usable chat template.
func (e *Engine) HasTemplate() bool { return e.tmpl != nil }

// RenderChat renders messages with the model's chat template. Unless the
// caller sets opt.Limits.MaxBytes (chat.BytesPerToken × the context it
// will use), what the template adds to the conversation is bounded by
// chat.BytesPerToken × the model's trained context; a template stopped by
// a limit returns an error matching chat.ErrLimit that names the template.
func (e *Engine) RenderChat(msgs []chat.Message, opt chat.Options) (string, error) {
	if e.tmpl == nil {
		return "", errors.New("engine: the model has no chat template")
	}
	if tc := e.File.Header.TokenizerConfig; tc != nil {
		if opt.BOSToken == "" {
			opt.BOSToken = tc.BOSToken
		}
		if opt.EOSToken == "" {
			opt.EOSToken = tc.EOSToken
		}
	}
	if opt.Limits.MaxBytes <= 0 {
		if mp := e.File.Header.Arch.MaxPositionEmbeddings; mp > 0 {
			opt.Limits.MaxBytes = chat.BytesPerToken * max(mp, 4096)
		}
	}
	out, err := e.tmpl.Render(msgs, opt)
	if err != nil {
		return "", fmt.Errorf("engine: the model's chat template: %w", err)
	}
	return out, nil
}

// Encode tokenizes text; special tokens written in the text are parsed
// (chat templates emit them), and BOS is added as the tokenizer says unless
// the text already starts with it.
func (e *Engine) Encode(text string, parseSpecial bool) ([]int, error) {
	if e.Tok == nil {
		return nil, errors.New("engine: the model carries no tokenizer; pass token ids")
	}
	ids, err := e.Tok.EncodeChecked(text, true, parseSpecial)
	if err != nil {
		return nil, err
	}
	// Templates that write BOS themselves must not get a second one.
	if bos := e.Tok.SpecialIDs().BOS; bos >= 0 && len(ids) > 1 && ids[0] == bos && ids[1] == bos {
		ids = ids[1:]
	}
	return ids, nil
}

// Session is one conversation: a KV cache and the tokens in it.
type Session struct {
	e     *Engine
	cache *model.Cache
	ids   []int
	marks []int // hybrid models: extra snapshot positions of the next Prefill
}

// NewSession allocates a cache for ctxLen tokens.
func (e *Engine) NewSession(ctxLen int) (*Session, error) {
	c, err := e.Model.NewCache(ctxLen)
	if err != nil {
		return nil, err
	}
	return &Session{e: e, cache: c}, nil
}

// Cache exposes the session's cache (size reporting).
func (s *Session) Cache() *model.Cache { return s.cache }

// Tokens returns the tokens currently in the cache.
func (s *Session) Tokens() []int { return s.ids }

// Close drops a hybrid session's snapshots from the engine's store and
// returns the session's state to the device; the session must not be used
// after.
func (s *Session) Close() {
	if s.e.Model.HasState() {
		s.e.snaps.drop(s, -1)
	}
	s.cache.Close()
}

// Reset empties the session (and drops a hybrid session's snapshots:
// its positions are about to be rewritten).
func (s *Session) Reset() {
	if s.e.Model.HasState() {
		s.e.snaps.drop(s, -1)
	}
	s.cache.Reset()
	s.ids = s.ids[:0]
}

// GenOptions tune Generate.
type GenOptions struct {
	MaxTokens int // 0: until a stop or the context is full
	Sample    sample.Params
	Stop      []string
	IgnoreEOS bool
	// OnText receives text as it becomes final (stop strings held back,
	// UTF-8 whole). Returning an error stops generation with it.
	OnText func(string) error
	// OnToken receives each sampled token (after the stop checks).
	OnToken func(sample.Result) error
}

// GenResult reports a generation.
type GenResult struct {
	IDs          []int // generated ids (the stopping EOS included)
	Text         string
	Reason       string // eos, stop, length, context
	PromptTokens int
	CachedTokens int // prompt tokens found in the cache already
	PrefillTime  time.Duration
	DecodeTime   time.Duration
	Decoded      int // tokens produced by decode steps
}

// PrefillRate is prompt tokens processed per second.
func (r *GenResult) PrefillRate() float64 {
	return float64(r.PromptTokens-r.CachedTokens) / max(r.PrefillTime.Seconds(), 1e-9)
}

// DecodeRate is generated tokens per second of decoding.
func (r *GenResult) DecodeRate() float64 {
	return float64(r.Decoded) / max(r.DecodeTime.Seconds(), 1e-9)
}

// Prefill makes the cache hold exactly prompt and returns the logits of
// its last position, reusing the longest common prefix already cached.
func (s *Session) Prefill(prompt []int) ([]float32, int, error) {
	if len(prompt) == 0 {
		return nil, 0, errors.New("engine: empty prompt")
	}
	if len(prompt) > s.cache.Cap() {
		return nil, 0, fmt.Errorf("engine: prompt of %d tokens does not fit the %d-token context (raise --ctx)", len(prompt), s.cache.Cap())
	}
	keep := 0
	for keep < len(s.ids) && keep < len(prompt)-1 && s.ids[keep] == prompt[keep] {
		keep++
	}
	if s.e.Model.HasState() {
		// Hybrid: resume from a snapshot inside the common prefix.
		return s.prefillState(prompt, keep)
	}
	if err := s.cache.Truncate(keep); err != nil {
		return nil, 0, err
	}
	s.ids = append(s.ids[:keep], prompt[keep:]...)
	logits, err := s.e.Model.Forward(s.cache, prompt[keep:], keep, model.LastLogits)
	if err != nil {
		s.ids = s.ids[:s.cache.Len()]
		return nil, keep, err
	}
	return logits, keep, nil
}

// Generate prefills prompt (reusing the cached prefix) and samples until a
// stop condition.
func (s *Session) Generate(ctx context.Context, prompt []int, opt GenOptions) (*GenResult, error) {
	res := &GenResult{PromptTokens: len(prompt)}
	t0 := time.Now()
	logits, keep, err := s.Prefill(prompt)
	if err != nil {
		return nil, err
	}
	res.CachedTokens = keep
	res.PrefillTime = time.Since(t0)
	if s.e.Model.HasState() {
		// The end of the reply is the next turn's most likely resume point.
		defer func() {
			if err := s.e.snaps.take(s); err != nil {
				slog.Warn("snapshot at the end of a reply failed", "err", err)
			}
		}()
	}
	sm, err := sample.New(opt.Sample)
	if err != nil {
		return nil, err
	}
	for _, id := range prompt {
		sm.Accept(int32(id))
	}
	eos := s.e.EOS
	if opt.IgnoreEOS {
		eos = nil
	}
	stop := sample.NewStopChecker(eos, opt.Stop)
	var dec *tokenizer.Decoder
	if s.e.Tok != nil {
		dec = tokenizer.NewDecoder(s.e.Tok)
	}
	var text []byte
	emit := func(t string) error {
		if t == "" {
			return nil
		}
		text = append(text, t...)
		if opt.OnText != nil {
			return opt.OnText(t)
		}
		return nil
	}
	t1 := time.Now()
	defer func() { res.DecodeTime = time.Since(t1); res.Text = string(text) }()
	// Plain greedy decoding: after the prompt's logits, the model picks
	// each next token itself (on a GPU only the id crosses PCIe).
	greedy, next := opt.Sample.PlainGreedy(), -1
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		var r sample.Result
		if next >= 0 {
			r.Token = int32(next)
		} else if r, err = sm.Sample(logits); err != nil {
			return res, fmt.Errorf("engine: sampling at position %d: %w", s.cache.Len(), err)
		}
		sm.Accept(r.Token)
		tok := int(r.Token)
		res.IDs = append(res.IDs, tok)
		piece := ""
		if dec != nil {
			piece = dec.Push(tok)
		}
		out, why := stop.Push(r.Token, piece)
		if err := emit(out); err != nil {
			return res, err
		}
		if opt.OnToken != nil {
			if err := opt.OnToken(r); err != nil {
				return res, err
			}
		}
		switch why {
		case sample.StoppedEOS:
			res.Reason = "eos"
			return res, nil
		case sample.StoppedString:
			res.Reason = "stop"
			return res, nil
		}
		if opt.MaxTokens > 0 && len(res.IDs) >= opt.MaxTokens {
			res.Reason = "length"
			break
		}
		if s.cache.Len() >= s.cache.Cap() {
			res.Reason = "context"
			slog.Warn("generation stopped: the context is full", "ctx", s.cache.Cap())
			break
		}
		pos := s.cache.Len()
		if greedy {
			next, err = s.e.Model.ForwardGreedy(s.cache, []int{tok}, pos)
		} else {
			logits, err = s.e.Model.Forward(s.cache, []int{tok}, pos, model.LastLogits)
		}
		if err != nil {
			return res, err
		}
		s.ids = append(s.ids, tok)
		res.Decoded++
	}
	if dec != nil {
		if err := emit(stop.Flush() + dec.Flush()); err != nil {
			return res, err
		}
	} else if err := emit(stop.Flush()); err != nil {
		return res, err
	}
	return res, nil
}

// Step appends tokens[i] to sessions[i] and runs them through the model
// in one batched step (each weight read once for all sequences), returning
// the logits of each session's last new position (valid until that
// session's next step). Sessions must be distinct and of this engine.
func (e *Engine) Step(sessions []*Session, tokens [][]int) ([][]float32, error) {
	caches, err := e.caches(sessions)
	if err != nil {
		return nil, err
	}
	logits, err := e.Model.ForwardMulti(caches, tokens)
	e.track(sessions, tokens)
	return logits, err
}

// StepNext is Step that also returns each session's greedy next token in
// next[i] (argmax of its last logits, ties to the lowest id, as
// sample.Greedy), and brings logits to the host only for the sessions with
// want[i] (want nil: none; logits[i] is nil for the others). A step whose
// sessions all decode greedily without log-probabilities passes nil: on a
// GPU only the ids leave the device (model.ForwardMultiNext).
func (e *Engine) StepNext(sessions []*Session, tokens [][]int, want []bool, next []int) ([][]float32, error) {
	caches, err := e.caches(sessions)
	if err != nil {
		return nil, err
	}
	logits, err := e.Model.ForwardMultiNext(caches, tokens, want, next)
	e.track(sessions, tokens)
	return logits, err
}

func (e *Engine) caches(sessions []*Session) ([]*model.Cache, error) {
	caches := make([]*model.Cache, len(sessions))
	for i, s := range sessions {
		if s.e != e {
			return nil, fmt.Errorf("engine: session %d belongs to another engine", i)
		}
		caches[i] = s.cache
	}
	return caches, nil
}

// track keeps each session's ids equal to what its cache holds after a
// step of tokens.
func (e *Engine) track(sessions []*Session, tokens [][]int) {
	for i, s := range sessions {
		if n := s.cache.Len(); n == len(s.ids)+len(tokens[i]) {
			s.ids = append(s.ids, tokens[i]...)
		} else {
			s.ids = s.ids[:min(n, len(s.ids))]
		}
	}
}
