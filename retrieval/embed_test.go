package retrieval

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
)

// manualEmbedding decodes text alone and mean-pools rows from..n-1: the
// definition EngineEmbedder must match however it packs its batches.
func manualEmbedding(t *testing.T, m engine.Model, text string, from int) []float32 {
	t.Helper()
	toks, err := m.Tokenize(text, true, false)
	require.NoError(t, err)
	c, err := m.NewContext(engine.ContextOptions{CtxPerSeq: len(toks), MaxSeqs: 1, Embeddings: true})
	require.NoError(t, err)
	defer c.Close()
	var b engine.Batch
	for p, tok := range toks {
		b.Add(tok, p, true, 0)
	}
	require.NoError(t, c.Decode(context.Background(), &b))
	var sum []float64
	for i := from; i < len(toks); i++ {
		row, err := c.Embedding(i, nil)
		require.NoError(t, err)
		if sum == nil {
			sum = make([]float64, len(row))
		}
		for d, v := range row {
			sum[d] += float64(v)
		}
	}
	out, err := normalize(sum)
	require.NoError(t, err)
	return out
}

func TestEngineEmbedderMeanPoolsAndNormalizes(t *testing.T) {
	m := fakeModel()
	texts := make([]string, 21) // more texts than MaxSeqs, and varied lengths
	for i := range texts {
		texts[i] = fmt.Sprintf("passage %d: %s", i, strings.Repeat("lorem ipsum ", i%5+1))
	}
	tests := []struct {
		name string
		opts EngineEmbedderOptions
		from int
	}{
		{"defaults skip the first position", EngineEmbedderOptions{}, 1},
		{"keep first, tight batches", EngineEmbedderOptions{KeepFirst: true, MaxSeqs: 3, MaxTokens: 80}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := NewEngineEmbedder(m, tc.opts)
			defer e.Close()
			got, err := e.Embed(t.Context(), texts)
			require.NoError(t, err)
			require.Len(t, got, len(texts))
			for i, v := range got {
				require.Len(t, v, m.Info().EmbedDim)
				var ss float64
				for _, x := range v {
					ss += float64(x) * float64(x)
				}
				assert.InDelta(t, 1, math.Sqrt(ss), 1e-5, "text %d must be unit length", i)
				want := manualEmbedding(t, m, texts[i], tc.from)
				assert.InDeltaSlice(t, want, v, 1e-5, "text %d: batched and alone must agree", i)
			}
			// The context is reused: a second call gives the same vectors.
			again, err := e.Embed(t.Context(), texts[:4])
			require.NoError(t, err)
			assert.Equal(t, got[:4], again)
		})
	}
}

func TestEngineEmbedderTruncatesAndRejects(t *testing.T) {
	m := fakeModel()
	e := NewEngineEmbedder(m, EngineEmbedderOptions{MaxTokens: 16})
	defer e.Close()
	long := strings.Repeat("abcdefgh", 10)
	got, err := e.Embed(t.Context(), []string{long, long[:15]}) // BOS + 15 bytes = 16 tokens
	require.NoError(t, err)
	assert.Equal(t, got[1], got[0], "a text is cut at MaxTokens tokens")

	assert.Contains(t, e.Fingerprint(), m.Info().Fingerprint)
	assert.Contains(t, e.Fingerprint(), "mean-skip-first")
	assert.NotEqual(t, e.Fingerprint(), NewEngineEmbedder(m, EngineEmbedderOptions{KeepFirst: true}).Fingerprint())

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = e.Embed(ctx, []string{"cancelled"})
	assert.ErrorIs(t, err, engine.ErrAborted)
	// The embedder still works after an aborted pass.
	_, err = e.Embed(t.Context(), []string{"fine"})
	assert.NoError(t, err)
}

func TestEngineEmbedderIndexes(t *testing.T) {
	// The fake model's embeddings carry no meaning, but an index built
	// with them must work end to end: a passage is its own nearest
	// neighbour.
	m := fakeModel()
	emb := NewEngineEmbedder(m, EngineEmbedderOptions{})
	defer emb.Close()
	ix, _, _ := buildTestIndex(t, Options{Tokenizer: m, Embedder: emb, Chunk: ChunkOptions{Tokens: 48, Overlap: 8}})
	assert.Equal(t, m.Info().EmbedDim, ix.Stats().Manifest.Dims)
	assert.Equal(t, m.Info().Fingerprint, ix.Stats().Manifest.Tokenizer)
	for _, word := range []string{"whales", "automobile", "bread"} {
		lex, err := ix.Search(t.Context(), word, 1, ModeBM25)
		require.NoError(t, err)
		require.Len(t, lex, 1)
		p := lex[0].Passage
		hits, err := ix.Search(t.Context(), p.Text, 1, ModeDense)
		require.NoError(t, err)
		require.Len(t, hits, 1)
		assert.InDelta(t, 1, hits[0].Cosine, 1e-5)
		assert.Equal(t, p, hits[0].Passage)
	}
}
