package retrieval

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/internal/testmodel"
	"github.com/dragon-rag/dragon/internal/weaviatetest"
	"github.com/dragon-rag/dragon/retrieval/weaviate"
)

var remoteQueries = []string{
	"energy independence and foreign oil",
	"tax relief for working families",
	"the war in Iraq and terrorism",
	"slavery and the emancipation of slaves",
	"social security reform",
	"health insurance for every American",
	"the national debt and the budget deficit",
	"tariffs on imports and trade with Great Britain",
	"the Indian tribes on the frontier",
	"education and our schools",
}

// The same corpus and vectors in a bleve index and in a Weaviate node:
// BM25-only search returns the same passages with the same R (ties
// aside), since both are ranked by the same scorer; hybrid search
// overlaps as the engine's approximate vector search allows.
func TestRemoteMatchesBleve(t *testing.T) {
	sotu := filepath.Join(testmodel.CorpusDir(t), "sotu")
	entries, err := os.ReadDir(sotu)
	require.NoError(t, err)
	var files []string
	for _, e := range entries {
		if n := e.Name(); filepath.Ext(n) == ".txt" && (n < "1800" || (n > "1930" && n < "1950") || n > "2000") {
			files = append(files, filepath.Join(sotu, n))
		}
	}
	require.Greater(t, len(files), 30)
	emb := newSynonymEmbedder()
	ix, _, err := Build(t.Context(), filepath.Join(t.TempDir(), "idx"), Options{Tokenizer: newWordTokenizer(), Embedder: emb}, files...)
	require.NoError(t, err)
	defer ix.Close()
	n := ix.Stats().Manifest.Passages
	t.Logf("%d addresses, %d passages", len(files), n)

	cl := weaviatetest.Start(t, 1)
	store, err := weaviate.New(weaviate.Config{URL: cl.URL(0), Collection: "Sotu"})
	require.NoError(t, err)
	failed, err := Push(t.Context(), ix, store, weaviate.Layout{}, 500, nil)
	require.NoError(t, err)
	require.Empty(t, failed)
	failed, err = Push(t.Context(), ix, store, weaviate.Layout{}, 500, nil)
	require.NoError(t, err, "pushing again is harmless")
	require.Empty(t, failed)
	count, err := store.Count(t.Context())
	require.NoError(t, err)
	require.Equal(t, n, count, "no passage twice")

	key := func(h Hit) string { return fmt.Sprintf("%s@%d", filepath.Base(h.Passage.Source), h.Passage.Start) }
	// Both ways of asking the engine (GraphQL, gRPC) rank alike.
	hybrid := map[string][][]Hit{}
	for _, api := range []string{"graphql", "grpc"} {
		t.Run(api, func(t *testing.T) {
			cfg := weaviate.Config{URL: cl.URL(0), Collection: "Sotu"}
			if api == "grpc" {
				cfg.GRPC = cl.GRPC(0)
			}
			store, err := weaviate.New(cfg)
			require.NoError(t, err)
			defer store.Close()
			hybrid[api] = remoteMatchesLocal(t, ix, store, emb, key)
		})
	}
	require.Len(t, hybrid["grpc"], len(remoteQueries))
	for i, q := range remoteQueries {
		a, b := hybrid["graphql"][i], hybrid["grpc"][i]
		require.Len(t, b, len(a), q)
		for j := range a {
			assert.Equal(t, key(a[j]), key(b[j]), "%q rank %d", q, j+1)
			assert.InDelta(t, a[j].Score, b[j].Score, 1e-6, "%q rank %d", q, j+1)
			assert.Equal(t, a[j].Passage.Text, b[j].Passage.Text, "%q rank %d", q, j+1)
		}
	}

	// The passages were searched in the node's memtables so far; a node
	// stopped writes them out as segments, searched through the blocks'
	// recorded bounds (BlockMax WAND: releases before 1.38.3 got them wrong).
	cl.Stop(0)
	cl.Restart(0)
	grpcStore, err := weaviate.New(weaviate.Config{URL: cl.URL(0), GRPC: cl.GRPC(0), Collection: "Sotu"})
	require.NoError(t, err)
	defer grpcStore.Close()
	flushed := remoteMatchesLocal(t, ix, grpcStore, emb, key)
	for i, q := range remoteQueries {
		require.Len(t, flushed[i], len(hybrid["grpc"][i]), q)
		for j, h := range flushed[i] {
			assert.Equal(t, key(hybrid["grpc"][i][j]), key(h), "%q rank %d, from segments", q, j+1)
		}
	}

	// A store without the embedder's vectors is refused for dense search.
	_, err = OpenRemote(t.Context(), store, NewEngineEmbedder(fakeModel(), EngineEmbedderOptions{}))
	assert.ErrorIs(t, err, ErrEmbedder)
}

// remoteMatchesLocal checks that store ranks BM25 like ix, score for
// score, and shares most of ix's hybrid top 10; it returns its hybrid hits.
func remoteMatchesLocal(t *testing.T, ix *Index, store *weaviate.Client, emb Embedder, key func(Hit) string) [][]Hit {
	remote, err := OpenRemote(t.Context(), store, emb)
	require.NoError(t, err)
	var overlap float64
	var hybrid [][]Hit
	for _, q := range remoteQueries {
		local, err := ix.Search(t.Context(), q, 10, ModeBM25)
		require.NoError(t, err)
		far, err := remote.Search(t.Context(), q, 10, ModeBM25)
		require.NoError(t, err)
		require.Len(t, far, len(local), q)
		for i := range local {
			assert.InDelta(t, local[i].Score, far[i].Score, 1e-9, "%q rank %d", q, i+1)
			assert.InDelta(t, local[i].BM25, far[i].BM25, 1e-9, "%q rank %d", q, i+1)
		}
		// Passages tied with the 10th may be cut differently.
		last := local[len(local)-1].Score
		above := func(hs []Hit) []string {
			var out []string
			for _, h := range hs {
				if h.Score > last+1e-9 {
					out = append(out, key(h))
				}
			}
			slices.Sort(out)
			return out
		}
		assert.Equal(t, above(local), above(far), q)

		local, err = ix.Search(t.Context(), q, 10, ModeHybrid)
		require.NoError(t, err)
		far, err = remote.Search(t.Context(), q, 10, ModeHybrid)
		require.NoError(t, err)
		shared := 0
		for _, h := range far {
			if slices.ContainsFunc(local, func(l Hit) bool { return key(l) == key(h) }) {
				shared++
			}
		}
		overlap += float64(shared) / float64(len(local))
		hybrid = append(hybrid, far)
		t.Logf("%-50q hybrid top 10 shared: %d", q, shared)
	}
	overlap /= float64(len(remoteQueries))
	t.Logf("hybrid: %.2f of the top 10 shared on average", overlap)
	assert.GreaterOrEqual(t, overlap, 0.8)
	return hybrid
}
