package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/internal/testmodel"
	"github.com/dragon-rag/dragon/retrieval"
)

// embeddingSetup points --embed-model at the test's embedding model for
// the test and writes warmDocs as files; it returns the chat model's path
// and the files' folder.
func embeddingSetup(t *testing.T) (model, src string) {
	t.Helper()
	old := embedModel
	embedModel = testmodel.EmbedPath(t)
	t.Cleanup(func() { embedModel = old })
	src = t.TempDir()
	for name, text := range warmDocs {
		require.NoError(t, os.WriteFile(filepath.Join(src, name), []byte(text+"\n"), 0o644))
	}
	return testmodel.Path(t), src
}

// runIndex runs `dragon index args...` and returns its stdout.
func runIndex(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newIndexCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(t.Context())
	return out.String(), err
}

// `dragon index build` embeds with the sentence-embedding model by
// default, search finds a paraphrase through it, and adding to the index
// later uses the index's embedder whatever --embed-model says.
func TestIndexDenseWithEmbeddingModel(t *testing.T) {
	model, src := embeddingSetup(t)
	dir := filepath.Join(t.TempDir(), "index")
	_, err := runIndex(t, "build", "--dir", dir, "--model", model, "--threads", "2", "-q", src)
	require.NoError(t, err)
	man, err := retrieval.ReadManifest(dir)
	require.NoError(t, err)
	require.True(t, man.Dense)
	assert.Contains(t, man.Embedder, "engine-model-mean-l2")
	assert.Equal(t, 384, man.Dims)

	out, err := runIndex(t, "search", "--dir", dir, "--model", model, "--mode", "dense", "-k", "1", "a mountain spewing molten rock")
	require.NoError(t, err)
	assert.Contains(t, out, "volcano.txt", out)

	// The chat model's embedder is refused for an index of another one.
	embedModel = model
	more := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(more, "tea.txt"), []byte("Green tea is steamed or pan-fired soon after picking.\n"), 0o644))
	_, err = runIndex(t, "add", "--dir", dir, "--model", model, "-q", more)
	require.Error(t, err, "the chat GGUF is no embedding model")
	assert.Contains(t, err.Error(), "not an embedding model")

	embedModel = testmodel.EmbedPath(t)
	_, err = runIndex(t, "add", "--dir", dir, "--model", model, "-q", more)
	require.NoError(t, err)
	out, err = runIndex(t, "search", "--dir", dir, "--model", model, "--mode", "dense", "-k", "1", "a drink made from leaves")
	require.NoError(t, err)
	assert.Contains(t, out, "tea.txt", out)
}
