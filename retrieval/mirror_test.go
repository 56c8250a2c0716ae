package retrieval

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/internal/weaviatetest"
	"github.com/dragon-rag/dragon/retrieval/weaviate"
)

// remoteSources are the sources a BM25 search of the collection finds.
func remoteSources(t *testing.T, store *weaviate.Client, query string) []string {
	t.Helper()
	r, err := OpenRemote(t.Context(), store, nil)
	require.NoError(t, err)
	hits, err := r.Search(t.Context(), query, 10, ModeBM25)
	require.NoError(t, err)
	var out []string
	for _, h := range hits {
		out = append(out, h.Passage.Source)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// A writable index mirrored into a real Weaviate node: a file appears in
// the collection once its vectors are in, a changed file replaces its
// passages there, a deleted one leaves, a failed re-add keeps the old
// version, and a corpus's own passages are untouched. The state survives
// a restart, and a lost state only rewrites the same passages.
func TestMirror(t *testing.T) {
	cl := weaviatetest.Start(t, 1)
	ctx := t.Context()
	ix, dir, opts := newEmptyIndex(t)
	require.NoError(t, ix.Close())
	opts.DeferVectors = true
	ix, err := Open(dir, opts)
	require.NoError(t, err)
	defer ix.Close()
	store, err := weaviate.New(weaviate.Config{URL: cl.URL(0), Collection: "Public"})
	require.NoError(t, err)
	defer store.Close()

	// A corpus streamed into the collection beforehand.
	corpus := t.TempDir() + "/corpus.txt"
	require.NoError(t, os.WriteFile(corpus, []byte("Corals build reefs in warm shallow seas."), 0o644))
	_, err = Stream(ctx, store, StreamOptions{Tokenizer: opts.Tokenizer, Embedder: opts.Embedder, Chunk: ChunkOptions{Tokens: 16}}, corpus)
	require.NoError(t, err)

	m, err := NewMirror(ctx, ix, store, nil)
	require.NoError(t, err)
	_, err = ix.Put(ctx, "notes/volcano.md", []byte("Etna erupted lava over the vineyards."), nil)
	require.NoError(t, err)
	_, err = ix.Put(ctx, "inbox.mbox", []byte(testMbox), nil)
	require.NoError(t, err)

	docs := ix.Documents()
	m.Unwritten(docs)
	for _, d := range docs {
		assert.Equal(t, StatusWriting, d.Status, d.Source)
	}
	rep, err := m.Sync(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Waiting, "no vectors yet: nothing written")
	assert.Empty(t, remoteSources(t, store, "lava vineyards"))

	_, err = ix.EmbedPending(ctx, 100)
	require.NoError(t, err)
	rep, err = m.Sync(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Written)
	assert.Equal(t, []string{"notes/volcano.md"}, remoteSources(t, store, "lava vineyards"))
	assert.Equal(t, []string{"inbox.mbox#2"}, remoteSources(t, store, "glacier dawn"))
	assert.Equal(t, []string{corpus}, remoteSources(t, store, "corals reefs"))
	docs = ix.Documents()
	m.Unwritten(docs)
	for _, d := range docs {
		assert.Equal(t, StatusIndexed, d.Status, d.Source)
	}
	count, err := store.Count(ctx)
	require.NoError(t, err)

	// A restart finds nothing to do; a lost state rewrites, never doubles.
	m, err = NewMirror(ctx, ix, store, nil)
	require.NoError(t, err)
	rep, err = m.Sync(ctx)
	require.NoError(t, err)
	assert.Zero(t, rep.Written)
	require.NoError(t, os.Remove(mirrorFile(ix, store)))
	m, err = NewMirror(ctx, ix, store, nil)
	require.NoError(t, err)
	rep, err = m.Sync(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Written)
	again, err := store.Count(ctx)
	require.NoError(t, err)
	assert.Equal(t, count, again)

	// A changed file replaces its passages; a deleted one goes.
	_, err = ix.Put(ctx, "notes/volcano.md", []byte("Vesuvius buried Pompeii under ash."), nil)
	require.NoError(t, err)
	_, err = ix.DeleteDocument(ix.Documents()[0].ID) // inbox.mbox
	require.NoError(t, err)
	_, err = ix.EmbedPending(ctx, 100)
	require.NoError(t, err)
	rep, err = m.Sync(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Written)
	assert.Equal(t, 1, rep.Removed)
	assert.Empty(t, remoteSources(t, store, "lava vineyards"))
	assert.Empty(t, remoteSources(t, store, "glacier dawn"))
	assert.Equal(t, []string{"notes/volcano.md"}, remoteSources(t, store, "Pompeii ash"))

	// A new version that does not read keeps the one before, there too.
	infos, err := ix.PutAll(ctx, []PutFile{{Name: "notes/volcano.md", Err: errors.New("cut off")}})
	require.NoError(t, err)
	require.Equal(t, StatusFailed, infos[0].Status)
	rep, err = m.Sync(ctx)
	require.NoError(t, err)
	assert.Zero(t, rep.Written)
	assert.Equal(t, []string{"notes/volcano.md"}, remoteSources(t, store, "Pompeii ash"))

	// A file named as the corpus's replaces the corpus's passages.
	_, err = ix.Put(ctx, corpus[1:], []byte("Kelp forests grow in cold water."), nil)
	require.NoError(t, err)
	_, err = ix.EmbedPending(ctx, 100)
	require.NoError(t, err)
	_, err = m.Sync(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{corpus}, remoteSources(t, store, "corals reefs"), "a name of its own: the corpus file stays")

	// Reopened from a checkpoint (no journal to replay) with the state
	// lost, Run still writes what the collection lacks.
	require.NoError(t, ix.Checkpoint())
	require.NoError(t, ix.Close())
	ix, err = Open(dir, opts)
	require.NoError(t, err)
	defer ix.Close()
	require.Zero(t, ix.Changes(), "nothing replayed")
	_, err = store.DeleteSources(ctx, []string{"notes/volcano.md"}, nil)
	require.NoError(t, err)
	require.NoError(t, os.Remove(mirrorFile(ix, store)))
	m, err = NewMirror(ctx, ix, store, nil)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); m.Run(runCtx, 20*time.Millisecond) }()
	assert.Eventually(t, func() bool { return slices.Contains(remoteSources(t, store, "Pompeii ash"), "notes/volcano.md") },
		10*time.Second, 20*time.Millisecond)
	stop()
	<-ran

	// The term statistics are counted again once asked.
	require.NoError(t, RefreshTermStats(ctx, store, nil))
	gen, err := store.TermStatsGeneration(ctx)
	require.NoError(t, err)
	assert.NotEmpty(t, gen)
}
