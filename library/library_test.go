package library

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dragon-rag/dragon/engine/fake"
	"github.com/dragon-rag/dragon/retrieval"
)

// The library's loop and its watcher must end with Run; bleve's analysis
// workers are process-wide and never stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/blevesearch/bleve_index_api.AnalysisWorker"))
}

func denseIndex(t *testing.T) (*retrieval.Index, string, retrieval.Options) {
	t.Helper()
	opts := retrieval.Options{Tokenizer: fake.New(fake.Config{Vocab: 300}), Embedder: retrieval.RandomEmbedder{Dims: 8}, DeferVectors: true}
	dir := filepath.Join(t.TempDir(), "index")
	ix, _, err := retrieval.Build(t.Context(), dir, opts)
	require.NoError(t, err)
	return ix, dir, opts
}

// TestRunEmbedsWhileIdle: vectors are computed in the background, not
// while an answer is being generated, and reach disk with a checkpoint.
func TestRunEmbedsWhileIdle(t *testing.T) {
	ix, dir, opts := denseIndex(t)
	var busy atomic.Bool
	lib := New(ix, Options{Busy: busy.Load, EmbedBatch: 2, CheckpointEvery: time.Hour})
	d, err := lib.Add(t.Context(), Upload{Name: "a.txt", Data: strings.NewReader(strings.Repeat("walrus tusks are teeth. ", 40))})
	require.NoError(t, err)
	require.Equal(t, retrieval.StatusEmbedding, d.Status)
	require.Greater(t, d.Passages, 2)

	busy.Store(true)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); lib.Run(ctx) }()
	time.Sleep(3 * busyPoll)
	assert.Equal(t, d.Passages, ix.Pending(), "nothing embedded while answering")

	busy.Store(false)
	require.Eventually(t, func() bool { return ix.Pending() == 0 }, 10*time.Second, 10*time.Millisecond)
	got, ok := lib.Get(d.ID)
	require.True(t, ok)
	assert.Equal(t, retrieval.StatusIndexed, got.Status)
	assert.Equal(t, got.Passages, got.Embedded)

	cancel()
	<-done
	require.NoError(t, ix.Close())
	ix, err = retrieval.Open(dir, opts)
	require.NoError(t, err)
	defer ix.Close()
	assert.Zero(t, ix.Pending(), "the vectors were checkpointed")
}

// TestAddsWaitForAnswers: an add waits while an answer is being
// generated, and goes ahead once it is done.
func TestAddsWaitForAnswers(t *testing.T) {
	ix, _, _ := denseIndex(t)
	defer ix.Close()
	var busy atomic.Bool
	busy.Store(true)
	lib := New(ix, Options{Busy: busy.Load})
	added := make(chan time.Time, 1)
	go func() {
		_, err := lib.Add(t.Context(), Upload{Name: "n.txt", Data: strings.NewReader("a note")})
		assert.NoError(t, err)
		added <- time.Now()
	}()
	time.Sleep(300 * time.Millisecond)
	freed := time.Now()
	busy.Store(false)
	select {
	case at := <-added:
		assert.True(t, at.After(freed), "added only once the answer was done")
	case <-time.After(5 * time.Second):
		t.Fatal("the add never went ahead")
	}
}

func TestAddLimitsAndDeletes(t *testing.T) {
	ix, _, _ := denseIndex(t)
	defer ix.Close()
	var removed []retrieval.Passage
	lib := New(ix, Options{Limits: Limits{FileBytes: 64}, OnRemove: func(ps []retrieval.Passage) { removed = append(removed, ps...) }})
	ctx := t.Context()

	out, err := lib.AddAll(ctx, []Upload{
		{Name: "ok.txt", Data: strings.NewReader("a short note about puffins")},
		{Name: "declared.txt", Data: strings.NewReader("x"), Size: 1 << 30},
		{Name: "long.txt", Data: strings.NewReader(strings.Repeat("y", 65)), Size: -1},
		{Name: "a/../../b.txt", Data: strings.NewReader("z")},
	})
	require.NoError(t, err)
	require.Len(t, out, 4)
	assert.Equal(t, retrieval.StatusEmbedding, out[0].Status)
	assert.Contains(t, out[1].Error, "declared 1073741824 bytes, over the 64")
	assert.Contains(t, out[2].Error, "over the 64 bytes")
	assert.Contains(t, out[3].Error, `".."`)
	page, err := lib.List(0, "", false)
	require.NoError(t, err)
	assert.Equal(t, 3, page.Total, "failed files with a name are listed")
	assert.Equal(t, 2, lib.Stats().Failed)
	time.Sleep(2 * time.Millisecond) // a later time of adding
	_, err = lib.Add(t.Context(), Upload{Name: "0-newest.txt", Data: strings.NewReader("the newest note")})
	require.NoError(t, err)
	page, err = lib.List(0, "", false)
	require.NoError(t, err)
	assert.Equal(t, "0-newest.txt", page.Documents[0].Source, "by source")
	page, err = lib.List(2, "", true)
	require.NoError(t, err)
	assert.Equal(t, "0-newest.txt", page.Documents[0].Source, "the most recently added first")
	assert.Equal(t, "2", page.Next)

	_, err = lib.List(10, "x", false)
	assert.ErrorContains(t, err, "bad page token")

	n, err := lib.DeleteSource("ok.txt")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	require.Len(t, removed, 1)
	assert.Contains(t, removed[0].Text, "puffins")
	_, err = lib.DeleteSource("ok.txt")
	assert.ErrorIs(t, err, retrieval.ErrNotIndexed)
}

// TestWatchKeepsAFolderInSync: new, changed and removed files reach the
// index within seconds, and what changed while nothing watched is synced
// when watching starts again.
func TestWatchKeepsAFolderInSync(t *testing.T) {
	ix, _, _ := denseIndex(t)
	defer ix.Close()
	lib := New(ix, Options{})
	dir := t.TempDir()
	write := func(name, text string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
	sources := func() []string {
		var out []string
		for _, d := range lib.ix.Documents() {
			rel, _ := filepath.Rel(dir, d.Source)
			out = append(out, rel+"="+d.Status)
		}
		return out
	}
	search := func(q string) []string {
		hits, err := ix.Search(t.Context(), q, 3, retrieval.ModeBM25)
		require.NoError(t, err)
		var out []string
		for _, h := range hits {
			rel, _ := filepath.Rel(dir, h.Passage.Source)
			out = append(out, rel)
		}
		return out
	}
	write("a.txt", "the heron waits by the weir")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- lib.Watch(ctx, dir) }()
	require.Eventually(t, func() bool { return len(search("heron")) == 1 }, 10*time.Second, 20*time.Millisecond, "synced at start")

	write("sub/b.md", "# Otters\n\notters in the millpond")
	require.Eventually(t, func() bool { return len(search("millpond")) == 1 }, 10*time.Second, 20*time.Millisecond, "a new file in a new folder")
	write("a.txt", "the kingfisher dives by the weir")
	require.Eventually(t, func() bool { return len(search("kingfisher")) == 1 && len(search("heron")) == 0 }, 10*time.Second, 20*time.Millisecond, "a changed file")
	require.NoError(t, os.Remove(filepath.Join(dir, "sub", "b.md")))
	require.Eventually(t, func() bool { return len(search("millpond")) == 0 }, 10*time.Second, 20*time.Millisecond, "a removed file")

	cancel()
	require.NoError(t, <-done)
	// While nothing watches: one file goes, one comes.
	require.NoError(t, os.Remove(filepath.Join(dir, "a.txt")))
	write("c.txt", "a note about the lock keeper")
	rep, err := lib.Sync(t.Context(), dir)
	require.NoError(t, err)
	assert.Equal(t, SyncReport{Added: 1, Removed: 1}, rep)
	assert.Equal(t, []string{"c.txt=embedding"}, sources())
}
