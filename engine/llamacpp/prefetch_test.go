package llamacpp

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/gguf"
	"github.com/dragon-rag/dragon/engine/residency"
)

// TestPrefetchReadsEveryLayerAheadAndChangesNoLogit: a context whose model
// reads its layers ahead (every tensor but the token embeddings, nothing
// pinned) decodes the same logits bit for bit as one without, and its
// readers read every range once a pass: the graph's layers were found and
// waited for.
func TestPrefetchReadsEveryLayerAheadAndChangesNoLogit(t *testing.T) {
	path := realModelPath(t)
	m, err := Load(path, Options{Threads: 1, InPlace: true})
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	tensors, err := gguf.Tensors(path)
	require.NoError(t, err)
	ranges := residency.Reads(tensors, nil, m.Layers())
	var perPass int64
	for _, r := range ranges {
		perPass += r.Size
	}
	require.NotEmpty(t, ranges)

	require.Error(t, m.SetPrefetch(&Prefetch{Ranges: ranges, Readers: 0}), "no readers")
	require.Error(t, m.SetPrefetch(&Prefetch{Ranges: []residency.Read{{Layer: 2, Size: 1}, {Layer: 1, Size: 1}}, Readers: 1}), "out of layer order")
	require.Error(t, m.SetPrefetch(&Prefetch{Ranges: []residency.Read{{Layer: m.Layers() + 1, Size: 1}}, Readers: 1}), "no such layer")
	require.NoError(t, m.SetPrefetch(&Prefetch{Ranges: ranges, Readers: 3}))

	opts := engine.ContextOptions{CtxPerSeq: 256, MaxSeqs: 1, BatchSize: 64}
	streamed := newCtx(t, m, opts)
	plain := newCtx(t, loadReal(t), opts)
	require.Zero(t, plain.PrefetchedBytes())
	ctx := context.Background()
	toks := tokens(t, m, passage)
	var passes int64
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
			rows[i], err = c.Logits(lastRow(c), nil)
			require.NoError(t, err)
		}
		assert.Zero(t, maxAbsDiff(rows[0], rows[1]), "step %d: the same logits", step)
		if step > 0 {
			passes++
		}
	}
	assert.Equal(t, passes*perPass, streamed.PrefetchedBytes(), "every range read once a pass, %d passes", passes)
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
