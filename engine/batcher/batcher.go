// Package batcher shares one engine context among many decoders
// (continuous batching): each decoder gets a Slot, an engine.Context over
// its own block of sequences, and one goroutine merges the batches the
// slots submit into one Decode per tick. Slots join and leave between
// ticks; a tick waits a moment for the other busy slots so that their rows
// ride in the same pass.
//
// A slot's batch is checked on its own before it joins a tick, so a bad
// batch fails only its slot. Logits of a slot's rows are copied out after
// the tick, before the next one overwrites them. An aborted slot cannot
// stop a pass the others share: it is withdrawn before the tick starts, or
// its positions are removed after it. A pass whose slots are all aborted
// stops at once.
package batcher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dragon-rag/dragon/engine"
)

// Options size an Executor.
type Options struct {
	// Slots is the most decoders that share the context.
	Slots int
	// SeqsPerSlot is the sequences each slot holds (a decoder's passages).
	SeqsPerSlot int
	// Context is each sequence's positions, the merged batch's size limit
	// and the compute threads (MaxSeqs is Slots × SeqsPerSlot).
	Context engine.ContextOptions
	// Gather is how long a tick waits for the other busy slots' batches
	// after the first one arrives (0: 2 ms; negative: never waits).
	Gather time.Duration
	// OnTick, when set, learns each tick's rows and slots.
	OnTick func(rows, slots int)
}

// Executor runs the merged decodes.
type Executor struct {
	c     engine.Context
	opts  Options
	vocab int

	mu    sync.Mutex // the context: one decode or sequence operation at a time
	queue chan *job
	busy  atomic.Int32 // slots in use (Acquire … Release)
	quit  chan struct{}
	done  chan struct{}

	slots []*Slot
	// Free slots are handed out lowest first, so that the busy ones hold
	// neighbouring sequence ids (see tick).
	freeMu sync.Mutex
	free   []bool        // by slot index
	freed  chan struct{} // a token per Release, for Acquire to look again
}

// New creates the shared context of m and starts the executor.
func New(m engine.Model, opts Options) (*Executor, error) {
	if opts.Slots < 1 || opts.SeqsPerSlot < 1 {
		return nil, fmt.Errorf("batcher: %w: %d slots of %d sequences", engine.ErrInvalidInput, opts.Slots, opts.SeqsPerSlot)
	}
	if opts.Gather == 0 {
		opts.Gather = 2 * time.Millisecond
	}
	copts := opts.Context
	copts.MaxSeqs = opts.Slots * opts.SeqsPerSlot
	c, err := m.NewContext(copts)
	if err != nil {
		return nil, fmt.Errorf("batcher: %w", err)
	}
	opts.Context = c.Options()
	e := &Executor{
		c: c, opts: opts, vocab: c.VocabSize(),
		queue: make(chan *job, opts.Slots), quit: make(chan struct{}), done: make(chan struct{}),
		free: make([]bool, opts.Slots), freed: make(chan struct{}, opts.Slots),
	}
	for i := range opts.Slots {
		s := &Slot{e: e, base: i * opts.SeqsPerSlot, n: opts.SeqsPerSlot}
		e.slots = append(e.slots, s)
		e.free[i] = true
	}
	go e.run()
	return e, nil
}

// Slots is the number of slots.
func (e *Executor) Slots() int { return len(e.slots) }

// Slot is slot i (for decoders made once and kept).
func (e *Executor) Slot(i int) *Slot { return e.slots[i] }

// Close stops the executor and frees the context; slots fail afterwards.
func (e *Executor) Close() error {
	select {
	case <-e.quit:
		return nil
	default:
	}
	close(e.quit)
	<-e.done
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.c.Close()
}

// job is one slot's batch.
type job struct {
	slot    *Slot
	batch   engine.Batch // sequence ids already mapped into the slot's block
	ctx     context.Context
	aborted atomic.Bool
	done    chan error
	logits  [][]float32 // copied rows, by the batch's row; nil where not asked

	watchMu sync.Mutex
	onAbort func() // set by the tick that runs the job
}

// abort marks the job aborted and tells the tick running it, if any.
func (j *job) abort() {
	if !j.aborted.CompareAndSwap(false, true) {
		return
	}
	j.watchMu.Lock()
	f := j.onAbort
	j.watchMu.Unlock()
	if f != nil {
		f()
	}
}

// watch runs f when j is aborted, at once if it already is (nil: stop
// watching); f may be called twice when an abort races the watch, so it
// must be idempotent.
func (j *job) watch(f func()) {
	j.watchMu.Lock()
	j.onAbort = f
	j.watchMu.Unlock()
	if f != nil && j.aborted.Load() {
		f()
	}
}

func (e *Executor) run() {
	defer close(e.done)
	var carry *job // a job that did not fit the last tick
	for {
		var jobs []*job
		if carry != nil {
			jobs, carry = append(jobs, carry), nil
		} else {
			select {
			case j := <-e.queue:
				jobs = append(jobs, j)
			case <-e.quit:
				return
			}
		}
		rows := jobs[0].batch.Len()
		if e.opts.Gather > 0 && int(e.busy.Load()) > len(jobs) {
			timer := time.NewTimer(e.opts.Gather)
		gather:
			for int(e.busy.Load()) > len(jobs) {
				select {
				case j := <-e.queue:
					if rows+j.batch.Len() > e.opts.Context.BatchSize {
						carry = j
						break gather
					}
					jobs = append(jobs, j)
					rows += j.batch.Len()
				case <-timer.C:
					break gather
				case <-e.quit:
					timer.Stop()
					e.fail(jobs, engine.ErrClosed)
					return
				}
			}
			timer.Stop()
		}
		e.tick(jobs)
	}
}

func (e *Executor) fail(jobs []*job, err error) {
	for _, j := range jobs {
		j.done <- err
	}
}

// tick decodes the jobs' batches as one.
func (e *Executor) tick(jobs []*job) {
	e.mu.Lock()
	defer e.mu.Unlock()
	// Rows in slot order: with a KV stream per sequence, llama.cpp puts
	// sequences into one pass only while their ids follow one another in
	// the batch (llama_batch_allocr::split_equal, sequential), and runs the
	// rest as more passes. In arrival order the same rows took about 1.5
	// times as long at 4 sessions (bench load: 80 against 52 ms per token).
	slices.SortFunc(jobs, func(a, b *job) int { return a.slot.base - b.slot.base })
	var (
		merged engine.Batch
		ready  []*job
		starts []int // each ready job's first row in merged
		before []map[int]int
	)
	for _, j := range jobs {
		if j.aborted.Load() || j.ctx.Err() != nil {
			j.done <- engine.ErrAborted
			continue
		}
		if err := e.check(&j.batch); err != nil {
			j.done <- err
			continue
		}
		starts = append(starts, merged.Len())
		touched := map[int]int{}
		for _, en := range j.batch.Entries {
			for _, s := range en.Seqs {
				if _, ok := touched[s]; !ok {
					touched[s] = e.c.SeqLen(s)
				}
			}
		}
		before = append(before, touched)
		merged.Entries = append(merged.Entries, j.batch.Entries...)
		ready = append(ready, j)
	}
	if len(ready) == 0 {
		return
	}
	if e.opts.OnTick != nil {
		e.opts.OnTick(merged.Len(), len(ready))
	}
	// Once every slot of the pass is aborted nobody wants its rows: stop
	// it (a lone session's rollback then waits for no pass).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var live atomic.Int32
	live.Store(int32(len(ready)))
	for _, j := range ready {
		j.watch(sync.OnceFunc(func() {
			if live.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	err := e.c.Decode(ctx, &merged)
	for _, j := range ready {
		j.watch(nil)
	}
	if errors.Is(err, engine.ErrAborted) {
		err = engine.ErrAborted // the slots' own aborts, not the tick's context
	}
	for k, j := range ready {
		if err != nil {
			j.done <- err
			continue
		}
		if j.aborted.Load() {
			// The pass is shared: drop this slot's positions instead.
			for s, n := range before[k] {
				_ = e.c.Truncate(s, n)
			}
			j.done <- engine.ErrAborted
			continue
		}
		j.done <- e.copyLogits(j, starts[k])
	}
}

// copyLogits keeps a job's rows, which the next tick overwrites.
func (e *Executor) copyLogits(j *job, start int) error {
	j.logits = j.logits[:0]
	for i, en := range j.batch.Entries {
		var row []float32
		if en.Logits {
			var err error
			if row, err = e.c.Logits(start+i, nil); err != nil {
				return err
			}
		}
		j.logits = append(j.logits, row)
	}
	return nil
}

// check validates one slot's batch against the shared context: tokens in
// the vocabulary, positions continuing each sequence, room left.
func (e *Executor) check(b *engine.Batch) error {
	if b.Len() == 0 {
		return fmt.Errorf("%w: empty batch", engine.ErrInvalidInput)
	}
	if b.Len() > e.opts.Context.BatchSize {
		return fmt.Errorf("%w: batch of %d tokens exceeds the batch size %d", engine.ErrInvalidInput, b.Len(), e.opts.Context.BatchSize)
	}
	next := map[int]int{}
	for i, en := range b.Entries {
		if en.Token < 0 || int(en.Token) >= e.vocab {
			return fmt.Errorf("%w: row %d: token %d outside the vocabulary of %d", engine.ErrInvalidInput, i, en.Token, e.vocab)
		}
		for _, s := range en.Seqs {
			n, ok := next[s]
			if !ok {
				n = e.c.SeqLen(s)
			}
			if en.Pos != n {
				return fmt.Errorf("%w: row %d: position %d does not continue its sequence (holds %d)", engine.ErrInvalidInput, i, en.Pos, n)
			}
			if n >= e.opts.Context.CtxPerSeq {
				return fmt.Errorf("%w: a sequence would exceed %d positions", engine.ErrContextFull, e.opts.Context.CtxPerSeq)
			}
			next[s] = n + 1
		}
	}
	return nil
}

// Acquire takes a free slot, waiting until one is free or ctx is done.
func (e *Executor) Acquire(ctx context.Context) (*Slot, error) {
	for {
		if s, ok := e.TryAcquire(); ok {
			return s, nil
		}
		select {
		case <-e.freed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// TryAcquire takes the lowest free slot if there is one.
func (e *Executor) TryAcquire() (*Slot, bool) {
	e.freeMu.Lock()
	defer e.freeMu.Unlock()
	i := slices.Index(e.free, true)
	if i < 0 {
		return nil, false
	}
	e.free[i] = false
	e.busy.Add(1)
	return e.slots[i], true
}

// Release frees a slot. Its sequences keep what they hold: each has a KV
// stream of its own, so emptying them frees nothing for others, and the
// slot's next generation may start from what they hold (a conversation's
// next turn, a popular passage) instead of prefilling it again.
func (e *Executor) Release(s *Slot) {
	e.freeMu.Lock()
	e.free[s.base/s.n] = true
	e.busy.Add(-1)
	e.freeMu.Unlock()
	select {
	case e.freed <- struct{}{}:
	default: // enough tokens wait already
	}
}

// Slot is one decoder's view of the shared context: sequences 0…n-1 of the
// slot are the context's base…base+n-1. One goroutine uses a slot at a
// time (Abort excepted).
type Slot struct {
	e      *Executor
	base   int
	n      int
	last   *job // the last decoded batch, for Logits and TopK
	flight atomic.Pointer[job]
}

var _ engine.Context = (*Slot)(nil)

// Decode implements engine.Context: the batch joins the next tick.
func (s *Slot) Decode(ctx context.Context, b *engine.Batch) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", engine.ErrAborted, err)
	}
	j := &job{slot: s, ctx: ctx, done: make(chan error, 1)}
	for i, en := range b.Entries {
		seqs := make([]int, len(en.Seqs))
		for k, q := range en.Seqs {
			if q < 0 || q >= s.n {
				return fmt.Errorf("%w: row %d: sequence id %d out of range [0, %d)", engine.ErrInvalidInput, i, q, s.n)
			}
			seqs[k] = s.base + q
		}
		j.batch.Entries = append(j.batch.Entries, engine.Entry{Token: en.Token, Pos: en.Pos, Seqs: seqs, Logits: en.Logits})
	}
	s.flight.Store(j)
	defer s.flight.Store(nil)
	select {
	case s.e.queue <- j:
	case <-s.e.quit:
		return engine.ErrClosed
	}
	stop := context.AfterFunc(ctx, j.abort)
	defer stop()
	err := <-j.done
	if err != nil {
		if errors.Is(err, engine.ErrAborted) && ctx.Err() != nil {
			return fmt.Errorf("%w: %w", engine.ErrAborted, ctx.Err())
		}
		return err
	}
	s.last = j
	return nil
}

func (s *Slot) row(i int) ([]float32, error) {
	if s.last == nil || i < 0 || i >= len(s.last.logits) || s.last.logits[i] == nil {
		return nil, fmt.Errorf("%w: no logits for row %d of the last batch", engine.ErrInvalidInput, i)
	}
	return s.last.logits[i], nil
}

// Logits implements engine.Context.
func (s *Slot) Logits(i int, dst []float32) ([]float32, error) {
	r, err := s.row(i)
	if err != nil {
		return dst, err
	}
	return append(dst[:0], r...), nil
}

// TopK implements engine.Context.
func (s *Slot) TopK(i, k int, dst []engine.TokenLogit) ([]engine.TokenLogit, error) {
	r, err := s.row(i)
	if err != nil {
		return dst, err
	}
	return engine.TopK(r, k, dst), nil
}

// Embedding implements engine.Context: slots carry no hidden states.
func (s *Slot) Embedding(int, []float32) ([]float32, error) {
	return nil, fmt.Errorf("%w: shared contexts have no embeddings", engine.ErrInvalidInput)
}

func (s *Slot) seq(q int) (int, error) {
	if q < 0 || q >= s.n {
		return 0, fmt.Errorf("%w: sequence id %d out of range [0, %d)", engine.ErrInvalidInput, q, s.n)
	}
	return s.base + q, nil
}

// SeqLen implements engine.Context.
func (s *Slot) SeqLen(q int) int {
	g, err := s.seq(q)
	if err != nil {
		return 0
	}
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return s.e.c.SeqLen(g)
}

// Truncate implements engine.Context.
func (s *Slot) Truncate(q, pos int) error {
	g, err := s.seq(q)
	if err != nil {
		return err
	}
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return s.e.c.Truncate(g, pos)
}

// CopySeq implements engine.Context.
func (s *Slot) CopySeq(src, dst, p0, p1 int) error {
	gs, err := s.seq(src)
	if err != nil {
		return err
	}
	gd, err := s.seq(dst)
	if err != nil {
		return err
	}
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return s.e.c.CopySeq(gs, gd, p0, p1)
}

// SeqState implements engine.Context.
func (s *Slot) SeqState(q int) ([]byte, error) {
	g, err := s.seq(q)
	if err != nil {
		return nil, err
	}
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return s.e.c.SeqState(g)
}

// SetSeqState implements engine.Context.
func (s *Slot) SetSeqState(q int, state []byte, n int) error {
	g, err := s.seq(q)
	if err != nil {
		return err
	}
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return s.e.c.SetSeqState(g, state, n)
}

// Abort implements engine.Context: the batch in flight is withdrawn, or
// undone after the pass it shares.
func (s *Slot) Abort() {
	if j := s.flight.Load(); j != nil {
		j.abort()
	}
}

// Options implements engine.Context: the slot's own sequences.
func (s *Slot) Options() engine.ContextOptions {
	o := s.e.opts.Context
	o.MaxSeqs = s.n
	return o
}

// VocabSize implements engine.Context.
func (s *Slot) VocabSize() int { return s.e.vocab }

// Close implements engine.Context: it empties the slot's sequences; the
// slot stays the executor's.
func (s *Slot) Close() error {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	for i := range s.n {
		_ = s.e.c.Truncate(s.base+i, 0)
	}
	return nil
}
