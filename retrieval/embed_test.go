package retrieval

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
)

// manualEmbedding decodes toks alone and mean-pools rows from..n-1: the
// definition EngineEmbedder must match however it packs its batches.
func manualEmbedding(t *testing.T, m engine.Model, toks []engine.Token, from int) []float32 {
	t.Helper()
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

func tokens(t *testing.T, m engine.Model, text string, special bool) []engine.Token {
	t.Helper()
	toks, err := m.Tokenize(text, special, false)
	require.NoError(t, err)
	return toks
}

func TestEngineEmbedderPoolsAndNormalizes(t *testing.T) {
	m := fakeModel()
	texts := make([]string, 21) // more texts than MaxSeqs, and varied lengths
	for i := range texts {
		texts[i] = fmt.Sprintf("passage %d: %s", i, strings.Repeat("lorem ipsum ", i%5+1))
	}
	// The definitions, one text at a time.
	prompt := func(text string) []float32 {
		toks := slices.Concat(tokens(t, m, promptHead, true), tokens(t, m, text, false), tokens(t, m, promptTail, false))
		return manualEmbedding(t, m, toks, len(toks)-1)
	}
	mean := func(from int) func(string) []float32 {
		return func(text string) []float32 { return manualEmbedding(t, m, tokens(t, m, text, true), from) }
	}
	tests := []struct {
		name string
		opts EngineEmbedderOptions
		want func(text string) []float32
	}{
		{"default: the prompt's last token", EngineEmbedderOptions{}, prompt},
		{"prompt, tight batches", EngineEmbedderOptions{MaxSeqs: 3, MaxTokens: 80}, prompt},
		{"mean skips the first position", EngineEmbedderOptions{Pooling: PoolMean}, mean(1)},
		{"mean, keep first, tight batches", EngineEmbedderOptions{Pooling: PoolMean, KeepFirst: true, MaxSeqs: 3, MaxTokens: 80}, mean(0)},
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
				assert.InDeltaSlice(t, tc.want(texts[i]), v, 1e-5, "text %d: batched and alone must agree", i)
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
	long := strings.Repeat("abcdefgh", 10)

	mean := NewEngineEmbedder(m, EngineEmbedderOptions{Pooling: PoolMean, MaxTokens: 16})
	defer mean.Close()
	got, err := mean.Embed(t.Context(), []string{long, long[:15]}) // BOS + 15 bytes = 16 tokens
	require.NoError(t, err)
	assert.Equal(t, got[1], got[0], "a text is cut at MaxTokens tokens")

	// The prompt's tail survives truncation: the text is what is cut.
	// (The fake model's last-token state hardly depends on the text, so
	// the tokens are checked rather than the vectors.)
	e := NewEngineEmbedder(m, EngineEmbedderOptions{MaxTokens: 64})
	defer e.Close()
	head, tail := tokens(t, m, promptHead, true), tokens(t, m, promptTail, false)
	room := 64 - len(head) - len(tail)
	got1, err := e.tokenize(long)
	require.NoError(t, err)
	assert.Equal(t, slices.Concat(head, tokens(t, m, long[:room], false), tail), got1)
	short, err := e.tokenize("abc")
	require.NoError(t, err)
	assert.Equal(t, slices.Concat(head, tokens(t, m, "abc", false), tail), short)
	_, err = e.Embed(t.Context(), []string{long})
	require.NoError(t, err)

	_, err = NewEngineEmbedder(m, EngineEmbedderOptions{MaxTokens: 8}).Embed(t.Context(), []string{"x"})
	assert.ErrorIs(t, err, engine.ErrInvalidInput, "no room for text inside the prompt")
	_, err = e.Embed(t.Context(), []string{""})
	assert.ErrorIs(t, err, engine.ErrInvalidInput)

	assert.Contains(t, e.Fingerprint(), m.Info().Fingerprint)
	assert.Contains(t, e.Fingerprint(), "prompt-last")
	assert.Contains(t, mean.Fingerprint(), "mean-skip-first")
	assert.NotEqual(t, mean.Fingerprint(), NewEngineEmbedder(m, EngineEmbedderOptions{Pooling: PoolMean, KeepFirst: true}).Fingerprint())

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
	emb := NewEngineEmbedder(m, EngineEmbedderOptions{Pooling: PoolMean})
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
