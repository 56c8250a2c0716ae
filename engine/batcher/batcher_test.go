package batcher

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var model = fake.New(fake.Config{Seed: 9, Vocab: 300, CallLatency: 2 * time.Millisecond})

func newExecutor(t *testing.T, slots int, onTick func(rows, slots int)) *Executor {
	e, err := New(model, Options{Slots: slots, SeqsPerSlot: 2, Context: engine.ContextOptions{CtxPerSeq: 128, BatchSize: 64}, OnTick: onTick})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	return e
}

func tokens(t *testing.T, s string) []engine.Token {
	toks, err := model.Tokenize(s, false, false)
	require.NoError(t, err)
	return toks
}

// decodeAll prefills text into both sequences of c, then decodes greedily
// n tokens, one per call, and returns the last row's logits of each call.
func decodeAll(t *testing.T, c engine.Context, text string, n int) [][]float32 {
	ctx := context.Background()
	toks := tokens(t, text)
	for seq := range 2 {
		_, err := engine.Prefill(ctx, c, seq, toks, nil)
		require.NoError(t, err)
	}
	var out [][]float32
	var b engine.Batch
	last := toks[len(toks)-1]
	for i := range n {
		b.Reset()
		b.Add(last, len(toks)+i, true, 0)
		b.Add(last, len(toks)+i, true, 1)
		require.NoError(t, c.Decode(ctx, &b))
		row, err := c.Logits(1, nil)
		require.NoError(t, err)
		out = append(out, row)
		last = engine.Token(argmax(row))
	}
	return out
}

func argmax(v []float32) int {
	best := 0
	for i := range v {
		if v[i] > v[best] {
			best = i
		}
	}
	return best
}

// TestSlotsDecodeLikeTheirOwnContexts: four slots decoding at once, their
// rows merged into shared passes, get exactly what a context of their own
// gives.
func TestSlotsDecodeLikeTheirOwnContexts(t *testing.T) {
	var maxSlots atomic.Int32
	e := newExecutor(t, 4, func(_, slots int) {
		if int32(slots) > maxSlots.Load() {
			maxSlots.Store(int32(slots))
		}
	})
	texts := []string{"the lamp at dusk", "tides rise twice", "gulls nest on cliffs", "the harbour office"}
	var wg sync.WaitGroup
	got := make([][][]float32, len(texts))
	for i, text := range texts {
		s, ok := e.TryAcquire()
		require.True(t, ok)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer e.Release(s)
			got[i] = decodeAll(t, s, text, 20)
		}()
	}
	wg.Wait()
	for i, text := range texts {
		own, err := model.NewContext(engine.ContextOptions{CtxPerSeq: 128, MaxSeqs: 2, BatchSize: 64})
		require.NoError(t, err)
		assert.Equal(t, decodeAll(t, own, text, 20), got[i], "slot %d", i)
	}
	assert.Greater(t, maxSlots.Load(), int32(1), "rows of several slots shared a pass")
	_, ok := e.TryAcquire()
	assert.True(t, ok, "released slots are free again")
}

// TestBadBatchFailsOnlyItsSlot: a batch that does not continue its
// sequence fails alone; a slot aborted mid-tick leaves nothing behind.
func TestBadBatchFailsOnlyItsSlot(t *testing.T) {
	e := newExecutor(t, 2, nil)
	a, _ := e.TryAcquire()
	b, _ := e.TryAcquire()
	ctx := context.Background()
	_, err := engine.Prefill(ctx, a, 0, tokens(t, "abc"), nil)
	require.NoError(t, err)
	var bad engine.Batch
	bad.Add(5, 7, true, 0) // position 7 does not continue an empty sequence
	assert.ErrorIs(t, b.Decode(ctx, &bad), engine.ErrInvalidInput)
	bad.Reset()
	bad.Add(5, 0, true, 2) // outside the slot
	assert.ErrorIs(t, b.Decode(ctx, &bad), engine.ErrInvalidInput)
	var good engine.Batch
	good.Add(4, 3, true, 0)
	require.NoError(t, a.Decode(ctx, &good))
	assert.Equal(t, 4, a.SeqLen(0))
	assert.Equal(t, 0, b.SeqLen(0))

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	good.Reset()
	good.Add(4, 4, true, 0)
	assert.ErrorIs(t, a.Decode(cctx, &good), engine.ErrAborted)
	assert.Equal(t, 4, a.SeqLen(0), "an aborted batch leaves no position")
	_, err = a.Logits(0, nil)
	require.NoError(t, err, "the last completed batch's rows stay readable")
}

// TestAbortDuringSharedPass: an abort that lands while the pass runs
// undoes the slot's positions after it; the other slot's result stands.
func TestAbortDuringSharedPass(t *testing.T) {
	slow := fake.New(fake.Config{Seed: 9, Vocab: 300, CallLatency: 50 * time.Millisecond})
	started := make(chan int, 4)
	e, err := New(slow, Options{Slots: 2, SeqsPerSlot: 1, Context: engine.ContextOptions{CtxPerSeq: 64, BatchSize: 16},
		Gather: time.Second, OnTick: func(_, slots int) { started <- slots }})
	require.NoError(t, err)
	defer e.Close()
	a, _ := e.TryAcquire()
	b, _ := e.TryAcquire()
	var wg sync.WaitGroup
	var errA, errB error
	wg.Add(2)
	go func() {
		defer wg.Done()
		var bt engine.Batch
		bt.Add(4, 0, true, 0)
		errA = a.Decode(context.Background(), &bt)
	}()
	go func() {
		defer wg.Done()
		var bt engine.Batch
		bt.Add(5, 0, true, 0)
		errB = b.Decode(context.Background(), &bt)
	}()
	require.Equal(t, 2, <-started, "both batches in one pass")
	a.Abort()
	wg.Wait()
	assert.ErrorIs(t, errA, engine.ErrAborted)
	assert.Zero(t, a.SeqLen(0))
	require.NoError(t, errB)
	assert.Equal(t, 1, b.SeqLen(0))
}

// TestAbortStopsALonePass: a pass whose only slot is aborted stops at
// once rather than running to its end, and leaves no position behind.
func TestAbortStopsALonePass(t *testing.T) {
	tests := []struct {
		name  string
		abort func(s *Slot, cancel context.CancelFunc)
	}{
		{"Abort", func(s *Slot, _ context.CancelFunc) { s.Abort() }},
		{"cancelled context", func(_ *Slot, cancel context.CancelFunc) { cancel() }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			slow := fake.New(fake.Config{Seed: 9, Vocab: 300, CallLatency: 10 * time.Second})
			started := make(chan struct{}, 1)
			e, err := New(slow, Options{Slots: 2, SeqsPerSlot: 1, Context: engine.ContextOptions{CtxPerSeq: 64, BatchSize: 16},
				OnTick: func(int, int) { started <- struct{}{} }})
			require.NoError(t, err)
			defer e.Close()
			a, _ := e.TryAcquire()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				var bt engine.Batch
				bt.Add(4, 0, true, 0)
				done <- a.Decode(ctx, &bt)
			}()
			<-started
			begun := time.Now()
			tc.abort(a, cancel)
			select {
			case err := <-done:
				assert.ErrorIs(t, err, engine.ErrAborted)
				assert.Less(t, time.Since(begun), 5*time.Second, "the pass stopped at the abort")
			case <-time.After(5 * time.Second):
				t.Fatal("the aborted pass ran on")
			}
			assert.Zero(t, a.SeqLen(0))
		})
	}
}
