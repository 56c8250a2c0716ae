package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/testmodel"
	"github.com/dragon-rag/dragon/internal/weaviatetest"
	"github.com/dragon-rag/dragon/retrieval"
)

// An index pushed to a Weaviate node (twice: no copies) is what --index
// weaviate://... serves; when the node dies, search and readiness fail
// at once with a clear error instead of hanging.
func TestIndexPushAndServeFromWeaviate(t *testing.T) {
	m, err := llamacpp.Load(testmodel.Path(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	dir, ps := warmIndex(t, m)
	cl := weaviatetest.Start(t, 1)
	url := "weaviate://" + strings.TrimPrefix(cl.URL(0), "http://") + "/Warm"

	for range 2 {
		out, err := runIndex(t, "push", "--dir", dir, "--to", url, "-q")
		require.NoError(t, err)
		assert.Contains(t, out, "0 failed; the collection holds 5 passages", out)
	}

	ix, closeIx, err := openSearcher(url, m, 1, false)
	require.NoError(t, err)
	defer closeIx()
	r, ok := ix.(*retrieval.RemoteIndex)
	require.True(t, ok)
	require.NoError(t, r.Ready(t.Context()))
	hits, err := ix.Search(t.Context(), "volcano in Sicily", 2, retrieval.ModeAuto)
	require.NoError(t, err)
	require.NotEmpty(t, hits)
	assert.Equal(t, "volcano.txt", filepath.Base(hits[0].Passage.Source))
	assert.Contains(t, hits[0].Passage.Text, "Etna")
	assert.Len(t, ps, 5)

	_, _, err = openSearcher(strings.Replace(url, "/Warm", "/Missing", 1), m, 1, false)
	assert.ErrorContains(t, err, "no such collection")

	cl.Kill(0)
	start := time.Now()
	assert.Error(t, r.Ready(t.Context()))
	_, err = ix.Search(t.Context(), "volcano", 2, retrieval.ModeBM25)
	assert.ErrorContains(t, err, "unavailable")
	assert.Less(t, time.Since(start), 5*time.Second, "a dead backend is an error, not a hang")
}

// `index build --retrieval URL` streams files into a collection with the
// embedding model's vectors; `index add` of the same files finds them all
// there; the cloud's --index URL searches them densely.
func TestIndexBuildIntoWeaviate(t *testing.T) {
	model, src := embeddingSetup(t)
	cl := weaviatetest.Start(t, 1)
	url := "weaviate://" + strings.TrimPrefix(cl.URL(0), "http://") + "/Docs"

	out, err := runIndex(t, "build", "--retrieval", url, "--model", model, "-q", src)
	require.NoError(t, err)
	assert.Contains(t, out, "5 passages stored, 0 already there, 0 refused; the collection holds 5", out)
	out, err = runIndex(t, "add", "--retrieval", url, "--model", model, "-q", src)
	require.NoError(t, err)
	assert.Contains(t, out, "0 passages stored, 5 already there", out)

	m, err := llamacpp.Load(model, llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	ix, closeIx, err := openSearcher(url, m, 1, false)
	require.NoError(t, err)
	defer closeIx()
	hits, err := ix.Search(t.Context(), "a mountain spewing molten rock", 1, retrieval.ModeDense)
	require.NoError(t, err)
	require.Len(t, hits, 1)
	assert.Equal(t, "volcano.txt", filepath.Base(hits[0].Passage.Source))

	out, err = runIndex(t, "delete", "--retrieval", url, filepath.Join(src, "volcano.txt"))
	require.NoError(t, err)
	assert.Contains(t, out, "volcano.txt: 1 passages")
	hits, err = ix.Search(t.Context(), "a mountain spewing molten rock", 5, retrieval.ModeDense)
	require.NoError(t, err)
	for _, h := range hits {
		assert.NotEqual(t, "volcano.txt", filepath.Base(h.Passage.Source))
	}

	_, err = runIndex(t, "build", "--model", model, src)
	assert.ErrorContains(t, err, `required flag "dir" not set`)
}
