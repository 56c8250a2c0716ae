package llamacpp

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/gguf"
	"github.com/dragon-rag/dragon/engine/residency"
)

// TestPrefetchStreamsEveryLayerAndChangesNoLogit: a context whose model
// streams its layers through its buffers (every tensor but the token
// embeddings, nothing pinned) decodes the same logits bit for bit as one
// without; its readers read every layer's tensors once a pass (and the
// first two layers of the next pass ahead of it; not the output head's),
// and the layers' weights ran from the buffers, not the mapping.
func TestPrefetchStreamsEveryLayerAndChangesNoLogit(t *testing.T) {
	m, ranges := loadInPlace(t)
	require.NotEmpty(t, ranges)
	var perPass, ahead, layerWeights int64
	var largest int64
	layerBytes := map[int]int64{}
	for _, r := range ranges {
		if r.Layer == m.Layers() {
			continue // the output head: left to the mapping's faults
		}
		perPass += r.Size
		if r.Layer < 2 {
			ahead += r.Size
		}
		layerWeights++
		layerBytes[r.Layer] += r.Size
		largest = max(largest, layerBytes[r.Layer])
	}
	require.Less(t, layerWeights, int64(len(ranges)), "SmolLM2 ties its output to its embeddings: the head reads them")

	require.Error(t, m.SetPrefetch(&Prefetch{Ranges: ranges, Readers: 0}), "no readers")
	require.Error(t, m.SetPrefetch(&Prefetch{Ranges: []residency.Read{{Layer: 2, Name: "blk.2.a", Size: 1}, {Layer: 1, Name: "blk.1.a", Size: 1}}, Readers: 1}), "out of layer order")
	require.Error(t, m.SetPrefetch(&Prefetch{Ranges: []residency.Read{{Layer: m.Layers() + 1, Size: 1}}, Readers: 1}), "no such layer")
	require.Error(t, m.SetPrefetch(&Prefetch{Ranges: []residency.Read{{Layer: 1, Size: 1}}, Readers: 1}), "a layer's tensor without its name")
	require.NoError(t, m.SetPrefetch(&Prefetch{Ranges: ranges, Readers: 3}))

	opts := engine.ContextOptions{CtxPerSeq: 256, MaxSeqs: 1, BatchSize: 64}
	streamed := newCtx(t, m, opts)
	require.ErrorIs(t, m.SetPrefetch(nil), engine.ErrInvalidInput, "not while a context is open")
	buffers := streamed.StreamBuffers()
	assert.GreaterOrEqual(t, buffers, 2*largest, "two buffers, each of the largest layer")
	assert.Less(t, buffers, 2*largest+2*int64(len(ranges))*8192, "and the alignment around its spans")
	plain := newCtx(t, loadReal(t), opts)
	require.Zero(t, plain.PrefetchedBytes())
	ctx := context.Background()
	toks := tokens(t, m, passage)
	var passes int64
	// Every weight but each layer's attention norm (its node runs before
	// the layer's reads are waited for) runs from the buffers.
	leastUses := func() int64 { return passes * (layerWeights - int64(m.Layers())) }
	for _, c := range []*Context{plain, streamed} {
		_, err := engine.Prefill(ctx, c, 0, toks, nil)
		require.NoError(t, err)
	}
	passes++
	for step := range 4 {
		var rows [2][]float32
		for i, c := range []*Context{plain, streamed} {
			if step > 0 {
				var b engine.Batch
				b.Add(toks[step], c.SeqLen(0), true, 0)
				require.NoError(t, c.Decode(ctx, &b))
			}
			var err error
			rows[i], err = c.Logits(lastRow(c), nil)
			require.NoError(t, err)
		}
		assert.Zero(t, maxAbsDiff(rows[0], rows[1]), "step %d: the same logits", step)
		if step > 0 {
			passes++
		}
		assert.GreaterOrEqual(t, streamed.StreamedUses(), leastUses(), "step %d: the layers ran from the buffers", step)
		read := streamed.PrefetchedBytes()
		assert.GreaterOrEqual(t, read, passes*perPass, "step %d: every layer's tensors read once a pass", step)
		assert.LessOrEqual(t, read, passes*perPass+ahead, "step %d: and the next pass's first two layers, no more", step)
	}
}

// loadInPlace loads the real model as a streamed device does (in place,
// not repacked), and lists what a pass reads of it with nothing pinned.
func loadInPlace(t *testing.T) (*Model, []residency.Read) {
	path := realModelPath(t)
	m, err := Load(path, Options{Threads: 1, InPlace: true})
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	tensors, err := gguf.Tensors(path)
	require.NoError(t, err)
	return m, residency.Reads(tensors, nil, m.Layers())
}

// lastRow is the index of the last row of c's last batch with logits.
func lastRow(c *Context) int {
	last := -1
	for i, r := range c.rows {
		if r {
			last = i
		}
	}
	return last
}

// TestPrefetchAbortAndTurns: a streamed prefill aborted mid-layer leaves
// the context computing what a fresh one does (its buffers are read
// again where the abort left them half read), and after every pass the
// weights point at the mapping again: an embedding context of the same
// model, which has no buffers and runs from the mapping, gets what one
// of an unstreamed model gets, also while the streamed context decodes.
func TestPrefetchAbortAndTurns(t *testing.T) {
	m, ranges := loadInPlace(t)
	require.NoError(t, m.SetPrefetch(&Prefetch{Ranges: ranges, Readers: 2}))
	other := loadReal(t)
	ctx := context.Background()

	streamed := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 2048, MaxSeqs: 1, BatchSize: 2048})
	long := tokens(t, m, strings.Repeat(passage+" ", 40))[:1500]
	var b engine.Batch
	for i, tok := range long {
		b.Add(tok, i, i == len(long)-1, 0)
	}
	done := make(chan error, 1)
	go func() { done <- streamed.Decode(ctx, &b) }()
	time.Sleep(150 * time.Millisecond) // inside the first of three graphs
	streamed.Abort()
	require.ErrorIs(t, <-done, engine.ErrAborted)

	short := long[:20]
	logits := func(c *Context) []float32 {
		pb, err := engine.Prefill(ctx, c, 0, short, nil)
		require.NoError(t, err)
		row, err := c.Logits(pb.Len()-1, nil)
		require.NoError(t, err)
		return row
	}
	fresh := newCtx(t, other, engine.ContextOptions{CtxPerSeq: 256, MaxSeqs: 1, BatchSize: 64})
	assert.Zero(t, maxAbsDiff(logits(streamed), logits(fresh)), "after the abort, what a fresh context computes")
	assert.Positive(t, streamed.StreamedUses())

	embed := func(model *Model) func() []float32 {
		c := newCtx(t, model, engine.ContextOptions{CtxPerSeq: 128, MaxSeqs: 1, BatchSize: 128, Embeddings: true})
		return func() []float32 {
			require.NoError(t, c.Truncate(0, 0))
			var b engine.Batch
			for i, tok := range short {
				b.Add(tok, i, true, 0)
			}
			require.NoError(t, c.Decode(ctx, &b))
			e, err := c.Embedding(len(short)-1, nil)
			require.NoError(t, err)
			return e
		}
	}
	want := embed(other)()
	fromMapping := embed(m)
	assert.Zero(t, maxAbsDiff(fromMapping(), want), "after the streamed passes, the weights are the mapping's")
	// Side by side with a streamed context's passes: they take turns.
	stop := make(chan struct{})
	decoded := make(chan error, 1)
	go func() {
		defer close(decoded)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := streamed.Truncate(0, 0); err != nil {
				decoded <- err
				return
			}
			if _, err := engine.Prefill(ctx, streamed, 0, short, nil); err != nil {
				decoded <- err
				return
			}
		}
	}()
	for range 5 {
		assert.Zero(t, maxAbsDiff(fromMapping(), want), "while the streamed context decodes")
	}
	close(stop)
	require.NoError(t, <-decoded)
}
