package retrieval

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/internal/weaviatetest"
	"github.com/dragon-rag/dragon/retrieval/weaviate"
)

// cancellingEmbedder cancels the run after a number of Embed calls: an
// ingest killed between embedding a batch and storing it.
type cancellingEmbedder struct {
	*synonymEmbedder
	after  int
	cancel context.CancelFunc
}

func (e *cancellingEmbedder) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	e.after--
	if e.after == 0 {
		e.cancel()
	}
	return e.synonymEmbedder.Embed(ctx, texts)
}

// An ingest interrupted halfway and run again ends with exactly the
// corpus's passages, each once, and does not embed again what it stored.
func TestStreamResumesWithoutDuplicates(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{}
	for i := range 40 {
		files[fmt.Sprintf("doc%02d.txt", i)] = strings.Repeat(fmt.Sprintf("Document %d talks about topic %d and the doctor gave medicine. ", i, i%7), 20)
	}
	writeFiles(t, filepath.Join(root, "docs"), files)
	ix, _, err := Build(t.Context(), filepath.Join(root, "idx"), Options{Tokenizer: newWordTokenizer()}, filepath.Join(root, "docs"))
	require.NoError(t, err)
	want := map[string]bool{}
	for _, p := range ix.Passages() {
		want[fmt.Sprintf("%s@%d-%d", filepath.Base(p.Source), p.Start, p.End)] = true
	}
	require.NoError(t, ix.Close())
	require.Greater(t, len(want), 100)

	cl := weaviatetest.Start(t, 1)
	store, err := weaviate.New(weaviate.Config{URL: cl.URL(0), Collection: "Docs"})
	require.NoError(t, err)
	tok := newWordTokenizer()
	base := newSynonymEmbedder()

	ctx, cancel := context.WithCancel(t.Context())
	emb := &cancellingEmbedder{synonymEmbedder: base, after: 4, cancel: cancel} // the probe, then 3 batches
	first, err := Stream(ctx, store, StreamOptions{Tokenizer: tok, Embedder: emb, Batch: 32}, filepath.Join(root, "docs"))
	require.ErrorIs(t, err, context.Canceled)
	stored, err := store.Count(t.Context())
	require.NoError(t, err)
	t.Logf("interrupted after storing %d of %d passages", stored, len(want))
	require.Greater(t, stored, 0)
	require.Less(t, stored, len(want))
	assert.Equal(t, first.Passages, stored)

	calls := base.calls
	last := map[Phase]Progress{}
	second, err := Stream(t.Context(), store, StreamOptions{Tokenizer: tok, Embedder: base, Batch: 32,
		Progress: func(p Progress) { last[p.Phase] = p }}, filepath.Join(root, "docs"))
	require.NoError(t, err)
	assert.Empty(t, second.Failed)
	assert.Equal(t, stored, second.Present, "what the first run stored is found, not written again")
	assert.Equal(t, len(want)-stored, second.Passages)
	byFile := last[PhaseIndex]
	assert.Equal(t, Progress{Phase: PhaseIndex, Done: 40, Total: 40, Item: byFile.Item}, byFile)
	assert.Equal(t, "doc39.txt", filepath.Base(byFile.Item))
	assert.Equal(t, Progress{Phase: PhaseStats, Done: len(want), Total: len(want)}, last[PhaseStats], "the terms counted last")
	gen, err := store.TermStatsGeneration(t.Context())
	require.NoError(t, err)
	assert.NotEmpty(t, gen, "the statistics stored")
	embedded := base.calls - calls
	assert.LessOrEqual(t, embedded, 1+(len(want)-stored+31)/32+1, "only missing passages are embedded")

	n, err := store.Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, len(want), n, "exactly the corpus, no duplicates")

	// The collection remembers its embedder: another is refused.
	_, err = Stream(t.Context(), store, StreamOptions{Tokenizer: tok}, filepath.Join(root, "docs"))
	assert.ErrorIs(t, err, weaviate.ErrInvalid, "a BM25-only run into a dense collection")
}

// A changed file streamed or pushed again replaces its passages: the
// collection ends with exactly the new version's, nothing of the old.
func TestChangedFilesReplaceTheirPassages(t *testing.T) {
	v1 := map[string]string{
		"a.txt":    strings.Repeat("Volcanoes erupt lava and ash over the island. ", 30),
		"b.txt":    strings.Repeat("Rivers carry water and silt down to the sea. ", 60),
		"box.mbox": "From alice@example.com Mon Jan  1 00:00:00 2024\nSubject: one\n\nThe ferry leaves at noon.\n\nFrom bob@example.com Mon Jan  1 00:00:00 2024\nSubject: two\n\nThe museum opens on Sunday.\n",
	}
	v2 := map[string]string{
		"a.txt":    strings.Repeat("Glaciers carve valleys into the old mountains. ", 30),
		"b.txt":    strings.Repeat("Rivers carry water and silt down to the sea. ", 20),
		"box.mbox": "From alice@example.com Mon Jan  1 00:00:00 2024\nSubject: one\n\nThe ferry leaves at noon.\n",
	}
	cl := weaviatetest.Start(t, 1)
	tok := newWordTokenizer()
	emb := newSynonymEmbedder()
	exactly := func(t *testing.T, store *weaviate.Client, docs string) {
		t.Helper()
		ix, _, err := Build(t.Context(), t.TempDir(), Options{Tokenizer: tok}, docs)
		require.NoError(t, err)
		var want []uint64
		for _, p := range ix.Passages() {
			want = append(want, RemotePID(p))
		}
		require.NoError(t, ix.Close())
		have, err := store.Existing(t.Context(), want)
		require.NoError(t, err)
		assert.Len(t, have, len(want), "every current passage is stored")
		n, err := store.Count(t.Context())
		require.NoError(t, err)
		assert.Equal(t, len(want), n, "and nothing else")
	}

	t.Run("stream", func(t *testing.T) {
		docs := filepath.Join(t.TempDir(), "docs")
		writeFiles(t, docs, v1)
		store, err := weaviate.New(weaviate.Config{URL: cl.URL(0), Collection: "Streamed"})
		require.NoError(t, err)
		_, err = Stream(t.Context(), store, StreamOptions{Tokenizer: tok, Embedder: emb}, docs)
		require.NoError(t, err)
		exactly(t, store, docs)

		writeFiles(t, docs, v2)
		rep, err := Stream(t.Context(), store, StreamOptions{Tokenizer: tok, Embedder: emb}, docs)
		require.NoError(t, err)
		assert.Positive(t, rep.Removed)
		assert.Positive(t, rep.Present, "b.txt's first passages are unchanged")
		exactly(t, store, docs)
	})

	t.Run("push", func(t *testing.T) {
		docs := filepath.Join(t.TempDir(), "docs")
		writeFiles(t, docs, v1)
		store, err := weaviate.New(weaviate.Config{URL: cl.URL(0), Collection: "Pushed"})
		require.NoError(t, err)
		for _, files := range []map[string]string{v1, v2} {
			writeFiles(t, docs, files)
			ix, _, err := Build(t.Context(), t.TempDir(), Options{Tokenizer: tok, Embedder: emb}, docs)
			require.NoError(t, err)
			failed, err := Push(t.Context(), ix, store, weaviate.Layout{}, 64, nil)
			require.NoError(t, err)
			assert.Empty(t, failed)
			require.NoError(t, ix.Close())
			exactly(t, store, docs)
		}
	})
}
