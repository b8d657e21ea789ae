package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cortiq/cortiq/engine"
	"github.com/cortiq/cortiq/sample"
	"github.com/cortiq/cortiq/tokenizer"
)

var (
	errQueueFull = errors.New("server: the wait queue is full")
	errClosed    = errors.New("server: shutting down")
)

// job is one sequence to generate: a prompt, its limits and sampling, and
// the channel its tokens go to. The scheduler owns the fields below events.
type job struct {
	ctx       context.Context
	prompt    []int
	max       int // tokens to generate at most (> 0)
	params    sample.Params
	stops     []string
	ignoreEOS bool
	cons      constraint // nil: unconstrained
	events    chan event // buffered for max+2 events: the scheduler never blocks
	enqueued  time.Time
	log       *slog.Logger // carries the request id
	id        string       // the request id

	sm      *sample.Sampler
	stop    *sample.StopChecker
	dec     *tokenizer.Decoder
	gen     int
	cached  int
	lastTok time.Time
	first   bool
}

func (j *job) logger() *slog.Logger {
	if j.log != nil {
		return j.log
	}
	return slog.Default()
}

// event is one step of a job's output: a sampled token with the text that
// became final, or the end.
type event struct {
	text   string
	token  tokenInfo // when hasTok
	hasTok bool
	done   bool
	// Set on the final event.
	reason           string // stop, length, cancelled, error
	err              error
	promptTokens     int
	cachedTokens     int
	completionTokens int
}

type tokenInfo struct {
	id      int32
	logprob float32
	top     []sample.TokenLogProb
}

// slot is one sequence of the running batch: a session (KV cache) kept
// between requests for prefix reuse, and the job it serves.
type slot struct {
	s       *engine.Session
	j       *job
	pending []int  // prompt tokens still to prefill
	next    [1]int // the sampled token to feed at the next step
	used    int64  // admission counter of the last job (LRU among equals)
}

// schedConfig sizes the scheduler.
type schedConfig struct {
	Parallel     int // slots
	Ctx          int // tokens per slot
	Queue        int // waiting jobs at most
	PrefillChunk int // prompt tokens per sequence per step
	PrefillSeqs  int // prefilling sequences per step
	stepDelay    time.Duration
	onToken      func(id string, at time.Time) // Config.onToken
	onStep       func(stepInfo)                // Config.onStep
	admitAt      int                           // Config.admitAt
}

// stepInfo is what the scheduler tells Config.onStep after each step.
type stepInfo struct {
	start  time.Time     // the engine step began
	engine time.Duration // the engine step took
	rows   int           // sequences in the step
	decode int           // of them, decoding rows (one token, past the first)
}

// scheduler runs continuous batching: every step is one batched engine
// step (StepNext, or Step when every row samples: see step) over the
// decoding slots (one token each) plus prompt chunks of a few prefilling
// slots; jobs join and leave at step boundaries.
type scheduler struct {
	e     *engine.Engine
	cfg   schedConfig
	m     *metrics
	slots []*slot

	mu     sync.Mutex
	queue  []*job
	closed bool
	admits int64

	wake chan struct{}
	quit chan struct{}
	done chan struct{}

	// The loop's per-step buffers: the step's sessions, tokens and slots
	// (batch); which rows want logits, the ids (step); the rows to sample
	// and what was drawn for each row (draw).
	seqs       []*engine.Session
	toks       [][]int
	rows, pre  []*slot
	want       []bool
	next       []int
	todo       []int
	drawn      []drawn
	idSteps    atomic.Int64 // steps that ran the ids path (tests)
	mixedSteps atomic.Int64 // of them, steps that also brought logits back

	// Events for the jobs' streams are collected in out during a loop
	// iteration and handed to the publisher goroutine (pub) right before
	// the next engine step, so that waking the streams' goroutines runs
	// beside the step instead of between steps. One goroutine sends them
	// all, in order: a job's events keep their order.
	out     []outEvent
	pub     chan []outEvent
	spare   chan []outEvent // the publisher's emptied batches, reused
	pubDone chan struct{}
}

// outEvent is an event on its way to a job's stream; a token's carries
// the time it was made (for Config.onToken).
type outEvent struct {
	j  *job
	ev event
	at time.Time
}

func newScheduler(e *engine.Engine, cfg schedConfig, m *metrics) (*scheduler, error) {
	s := &scheduler{e: e, cfg: cfg, m: m, wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
		pub: make(chan []outEvent, 4), spare: make(chan []outEvent, 4), pubDone: make(chan struct{})}
	for i := 0; i < cfg.Parallel; i++ {
		ss, err := e.NewSession(cfg.Ctx)
		if err != nil {
			return nil, fmt.Errorf("server: slot %d: %w", i, err)
		}
		s.slots = append(s.slots, &slot{s: ss})
	}
	m.kvCapacity.Set(float64(cfg.Parallel * cfg.Ctx))
	go s.publish()
	go s.run()
	return s, nil
}

// send queues ev for j's stream (sent by flush).
func (s *scheduler) send(j *job, ev event) { s.out = append(s.out, outEvent{j: j, ev: ev}) }

// flush hands the queued events to the publisher.
func (s *scheduler) flush() {
	if len(s.out) == 0 {
		return
	}
	s.pub <- s.out
	select {
	case b := <-s.spare:
		s.out = b[:0]
	default:
		s.out = nil
	}
}

// publish sends the scheduler's events to the jobs' channels (each
// buffered for all of its job's events: a send never blocks).
func (s *scheduler) publish() {
	defer close(s.pubDone)
	for b := range s.pub {
		for i, o := range b {
			if o.ev.hasTok && s.cfg.onToken != nil {
				s.cfg.onToken(o.j.id, o.at) // tests, off the loop
			}
			o.j.events <- o.ev
			b[i] = outEvent{}
		}
		select {
		case s.spare <- b:
		default:
		}
	}
}

// submit queues j; a full queue or a closing scheduler is an error.
func (s *scheduler) submit(j *job) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	if len(s.queue) >= s.cfg.Queue {
		return errQueueFull
	}
	j.enqueued = time.Now()
	j.events = make(chan event, j.max+2)
	s.queue = append(s.queue, j)
	s.m.waiting.Set(float64(len(s.queue)))
	s.poke()
	return nil
}

// poke wakes the loop (a job arrived or a client left).
func (s *scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// close fails the waiting jobs, cancels the running ones and stops the loop.
func (s *scheduler) close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.quit)
	}
	s.mu.Unlock()
	<-s.done
}

func (s *scheduler) run() {
	defer close(s.done)
	defer func() {
		s.flush()
		close(s.pub)
		<-s.pubDone
	}()
	for {
		select {
		case <-s.quit:
			s.shutdown()
			return
		default:
		}
		s.reap()
		s.admit()
		seqs, toks, rows := s.batch()
		s.flush() // the last step's tokens go out while this one runs
		if len(rows) == 0 {
			s.gauges()
			select {
			case <-s.wake:
			case <-s.quit:
			}
			continue
		}
		t0 := time.Now()
		logits, err := s.step(seqs, toks, rows)
		t1 := time.Now()
		dt := t1.Sub(t0)
		if err != nil {
			slog.Error("batched step failed", "err", err, "sequences", len(rows))
			for _, sl := range rows {
				sl.j.logger().Error("the request's step failed", "err", err)
				sl.s.Reset()
				s.finish(sl, "error", err)
			}
			continue
		}
		dec := s.account(rows, toks, dt)
		s.draw(rows, logits)
		for i, sl := range rows {
			if iv := sl.s.SnapshotInterval(); iv > 0 && !sl.j.first {
				// Hybrid prefill: snapshot the state at interval boundaries
				// and at the end of the prompt, for prefix reuse.
				if n := sl.s.Cache().Len(); n%iv == 0 || len(sl.pending) == 0 {
					if err := sl.s.Snapshot(); err != nil {
						sl.j.logger().Warn("state snapshot failed", "err", err)
					}
				}
			}
			if len(sl.pending) > 0 {
				continue // prompt not finished: no token yet
			}
			if logits[i] == nil {
				s.emitNext(sl, sample.Result{Token: int32(s.next[i])}, t1)
				continue
			}
			if d := s.drawn[i]; d.err != nil {
				s.finish(sl, "error", fmt.Errorf("server: sampling: %w", d.err))
			} else {
				s.emitNext(sl, d.r, t1)
			}
		}
		s.gauges()
		if s.cfg.onStep != nil {
			s.cfg.onStep(stepInfo{start: t0, engine: dt, rows: len(rows), decode: dec})
		}
		if s.cfg.stepDelay > 0 {
			s.flush() // tests: the step's tokens go out before the pause
			time.Sleep(s.cfg.stepDelay)
		}
	}
}

// reap ends jobs whose client has gone, freeing their slots at once.
func (s *scheduler) reap() {
	for _, sl := range s.slots {
		if sl.j != nil && sl.j.ctx.Err() != nil {
			s.finish(sl, "cancelled", sl.j.ctx.Err())
		}
	}
}

// admit moves waiting jobs into free slots, each into the free slot whose
// cached tokens share the longest prefix with its prompt.
func (s *scheduler) admit() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) < s.cfg.admitAt && !s.busy() {
		return // tests: start a wave together
	}
	q := s.queue[:0]
	for _, j := range s.queue {
		if j.ctx.Err() != nil {
			s.send(j, event{done: true, reason: "cancelled", err: j.ctx.Err(), promptTokens: len(j.prompt)})
			continue
		}
		best, bestKeep := (*slot)(nil), -1
		for _, sl := range s.slots {
			if sl.j != nil {
				continue
			}
			keep := commonPrefix(sl.s.Tokens(), j.prompt)
			if keep > bestKeep || (keep == bestKeep && sl.used < best.used) {
				best, bestKeep = sl, keep
			}
		}
		if best == nil {
			q = append(q, j)
			continue
		}
		if err := s.start(best, j); err != nil {
			s.send(j, event{done: true, reason: "error", err: err, promptTokens: len(j.prompt)})
		}
	}
	clear(s.queue[len(q):])
	s.queue = q
	s.m.waiting.Set(float64(len(s.queue)))
}

// busy reports whether some slot runs a job.
func (s *scheduler) busy() bool {
	for _, sl := range s.slots {
		if sl.j != nil {
			return true
		}
	}
	return false
}

// commonPrefix is the reusable cached prefix: at most len(prompt)-1 tokens,
// since the last prompt token must run to give the first logits.
func commonPrefix(cached, prompt []int) int {
	n := 0
	for n < len(cached) && n < len(prompt)-1 && cached[n] == prompt[n] {
		n++
	}
	return n
}

func (s *scheduler) start(sl *slot, j *job) error {
	keep, err := sl.s.Resume(j.prompt)
	if err != nil {
		return err
	}
	sm, err := sample.New(j.params)
	if err != nil {
		return err
	}
	for _, id := range j.prompt {
		sm.Accept(int32(id))
	}
	eos := s.e.EOS
	if j.ignoreEOS {
		eos = nil
	}
	j.sm, j.stop, j.cached = sm, sample.NewStopChecker(eos, j.stops), keep
	if s.e.Tok != nil {
		j.dec = tokenizer.NewDecoder(s.e.Tok)
	}
	s.admits++
	sl.j, sl.pending, sl.used = j, j.prompt[keep:], s.admits
	s.m.promptTokens.Add(float64(len(j.prompt)))
	if keep > 0 {
		s.m.prefixHits.Inc()
		s.m.prefixHitTokens.Add(float64(keep))
	}
	j.logger().Debug("admitted", "prompt", len(j.prompt), "cached", keep, "queued", time.Since(j.enqueued).Round(time.Microsecond))
	return nil
}

// batch assembles one step: a token for each decoding slot and a prompt
// chunk for at most PrefillSeqs prefilling slots (oldest admission first),
// so a long prompt is spread over several steps and decoding goes on.
func (s *scheduler) batch() ([]*engine.Session, [][]int, []*slot) {
	clear(s.seqs)
	clear(s.toks)
	clear(s.rows)
	clear(s.pre)
	seqs, toks, rows, pre := s.seqs[:0], s.toks[:0], s.rows[:0], s.pre[:0]
	for _, sl := range s.slots {
		switch {
		case sl.j == nil:
		case len(sl.pending) == 0:
			seqs, toks, rows = append(seqs, sl.s), append(toks, sl.next[:]), append(rows, sl)
		default:
			pre = append(pre, sl)
		}
	}
	for len(pre) > 0 && len(pre) > s.cfg.PrefillSeqs {
		// Keep the earliest admitted.
		latest := 0
		for i, sl := range pre {
			if sl.used > pre[latest].used {
				latest = i
			}
		}
		pre = append(pre[:latest], pre[latest+1:]...)
	}
	for _, sl := range pre {
		n := min(len(sl.pending), s.cfg.PrefillChunk)
		if iv := sl.s.SnapshotInterval(); iv > 0 {
			// Hybrid: end chunks on the snapshot interval, as Prefill does.
			pos := sl.s.Cache().Len()
			n = min(n, (pos/iv+1)*iv-pos)
		}
		seqs, toks, rows = append(seqs, sl.s), append(toks, sl.pending[:n]), append(rows, sl)
		sl.pending = sl.pending[n:]
	}
	s.seqs, s.toks, s.rows, s.pre = seqs, toks, rows, pre
	return seqs, toks, rows
}

// step runs one batched step. Rows whose token is the plain argmax of the
// logits (greedy, no penalty, no log-probabilities, no constraint) and
// rows still prefilling take the ids-only path (engine.StepNext: on a GPU
// only their ids leave the device); the logits come to the host for the
// other rows only. A step with no such row runs engine.Step. logits[i] is
// nil where the id in s.next[i] is the row's token.
func (s *scheduler) step(seqs []*engine.Session, toks [][]int, rows []*slot) ([][]float32, error) {
	s.want, s.next = s.want[:0], s.next[:0]
	ids, logits := false, false
	for _, sl := range rows {
		w := len(sl.pending) == 0 && !sl.j.greedy()
		s.want, s.next = append(s.want, w), append(s.next, -1)
		ids, logits = ids || !w, logits || w
	}
	if !ids {
		return s.e.Step(seqs, toks)
	}
	s.idSteps.Add(1)
	if logits {
		s.mixedSteps.Add(1)
	}
	return s.e.StepNext(seqs, toks, s.want, s.next)
}

// drawn is a row's sampled token, or why there is none.
type drawn struct {
	r   sample.Result
	err error
}

// greedy reports whether the job's every token is the argmax of the raw
// logits, so that the device may pick it (sample.Params.PlainGreedy and no
// constraint masking the logits).
func (j *job) greedy() bool { return j.cons == nil && j.params.PlainGreedy() }

// draw samples the next token of every row that has logits and no prompt
// left (constraint mask, then the job's sampler) into s.drawn. Each row's
// work is a pass or more over the vocabulary in Go (128k entries for
// Llama 3), so rows are drawn in parallel, each job's sampler and
// constraint touched by one goroutine: results do not depend on it.
func (s *scheduler) draw(rows []*slot, logits [][]float32) {
	s.drawn = slices.Grow(s.drawn[:0], len(rows))[:len(rows)]
	clear(s.drawn)
	s.todo = s.todo[:0]
	for i, sl := range rows {
		if len(sl.pending) == 0 && logits[i] != nil {
			s.todo = append(s.todo, i)
		}
	}
	one := func(i int) {
		j := rows[i].j
		if j.cons != nil {
			j.cons.mask(logits[i])
		}
		s.drawn[i].r, s.drawn[i].err = j.sm.Sample(logits[i])
	}
	workers := min(runtime.GOMAXPROCS(0), len(s.todo))
	if workers <= 1 {
		for _, i := range s.todo {
			one(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for k := next.Add(1) - 1; k < int64(len(s.todo)); k = next.Add(1) - 1 {
				one(s.todo[k])
			}
		})
	}
	wg.Wait()
}

// emitNext streams a slot's next token and either queues it for the next
// step or ends the job.
func (s *scheduler) emitNext(sl *slot, r sample.Result, now time.Time) {
	j := sl.j
	j.sm.Accept(r.Token)
	if j.cons != nil {
		j.cons.accept(int(r.Token))
	}
	if !j.first {
		j.first = true
		s.m.ttft.Observe(now.Sub(j.enqueued).Seconds())
	} else {
		s.m.itl.Observe(now.Sub(j.lastTok).Seconds())
	}
	j.lastTok = now
	j.gen++
	s.m.completionTokens.Inc()
	tok := int(r.Token)
	piece := ""
	if j.dec != nil {
		piece = j.dec.Push(tok)
	}
	out, why := j.stop.Push(r.Token, piece)
	info := tokenInfo{id: r.Token, logprob: r.LogProb}
	if len(r.TopLogProbs) > 0 {
		info.top = append([]sample.TokenLogProb(nil), r.TopLogProbs...)
	}
	s.out = append(s.out, outEvent{j: j, ev: event{text: out, token: info, hasTok: true}, at: now})
	switch {
	case why != sample.NotStopped:
		s.finish(sl, "stop", nil)
	case j.gen >= j.max || sl.s.Cache().Len() >= sl.s.Cache().Cap():
		tail := j.stop.Flush()
		if j.dec != nil {
			tail += j.dec.Flush()
		}
		if tail != "" {
			s.send(j, event{text: tail})
		}
		s.finish(sl, "length", nil)
	default:
		sl.next[0] = tok
	}
}

// finish ends the slot's job with a final event and frees the slot (its
// session keeps the cached tokens for prefix reuse; a hybrid model's
// session also snapshots its state there, as Generate does after a reply).
func (s *scheduler) finish(sl *slot, reason string, err error) {
	j := sl.j
	if (reason == "stop" || reason == "length") && s.e.Model.HasState() {
		if err := sl.s.Snapshot(); err != nil {
			j.logger().Warn("state snapshot failed", "err", err)
		}
	}
	s.send(j, event{done: true, reason: reason, err: err, promptTokens: len(j.prompt), cachedTokens: j.cached, completionTokens: j.gen})
	sl.j, sl.pending = nil, nil
	j.logger().Debug("finished; slot freed", "reason", reason, "prompt", len(j.prompt), "cached", j.cached, "generated", j.gen)
}

// account records the step's throughput and returns its decoding rows.
func (s *scheduler) account(rows []*slot, toks [][]int, dt time.Duration) int {
	pre, dec := 0, 0
	for i, sl := range rows {
		if len(toks[i]) == 1 && sl.j.first {
			dec++
		} else {
			pre += len(toks[i])
		}
	}
	sec := max(dt.Seconds(), 1e-9)
	s.m.prefilled.Add(float64(pre))
	if pre > 0 {
		s.m.prefillRate.Set(float64(pre) / sec)
	}
	if dec > 0 {
		s.m.decodeRate.Set(float64(dec) / sec)
	}
	s.m.steps.Inc()
	s.m.stepRows.Observe(float64(len(rows)))
	return dec
}

func (s *scheduler) gauges() {
	busy, held := 0, 0
	for _, sl := range s.slots {
		if sl.j != nil {
			busy++
		}
		held += len(sl.s.Tokens())
	}
	s.m.running.Set(float64(busy))
	s.m.kvUsed.Set(float64(held))
}

// shutdown fails whatever is left when the loop stops.
func (s *scheduler) shutdown() {
	s.mu.Lock()
	for _, j := range s.queue {
		s.send(j, event{done: true, reason: "cancelled", err: errClosed, promptTokens: len(j.prompt)})
	}
	s.queue = nil
	s.mu.Unlock()
	for _, sl := range s.slots {
		if sl.j != nil {
			s.finish(sl, "cancelled", errClosed)
		}
	}
	s.gauges()
	for _, sl := range s.slots {
		sl.s.Close()
	}
	s.m.waiting.Set(0)
}
