package retrievalbench

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/retrieval"
)

// fixedSearcher returns passages q0..q9 for query "q", with the last
// wrong ones given by miss.
type fixedSearcher struct{ miss int }

func (f fixedSearcher) Search(_ context.Context, q string, k int, _ retrieval.Mode) ([]retrieval.Hit, error) {
	var hits []retrieval.Hit
	for i := range k {
		src := q
		if i >= k-f.miss {
			src = "other"
		}
		hits = append(hits, retrieval.Hit{Passage: retrieval.Passage{Source: src, Start: i}})
	}
	return hits, nil
}

func TestMeasureRecall(t *testing.T) {
	queries := []string{"a", "b", "c", "d"}
	ref := make([][]string, len(queries))
	for i, q := range queries {
		hits, _ := fixedSearcher{}.Search(t.Context(), q, 10, retrieval.ModeHybrid)
		ref[i] = hitKeys(hits)
	}
	p, err := measure(t.Context(), fixedSearcher{}, retrieval.ModeHybrid, queries, ref, 2)
	require.NoError(t, err)
	assert.Equal(t, 1.0, p.RecallAt10)
	assert.Greater(t, p.QPS, 0.0)
	assert.LessOrEqual(t, p.P50Ms, p.P99Ms)

	p, err = measure(t.Context(), fixedSearcher{miss: 3}, retrieval.ModeHybrid, queries, ref, 2)
	require.NoError(t, err)
	assert.InDelta(t, 0.7, p.RecallAt10, 1e-12)

	assert.Greater(t, rssOf(os.Getpid()), int64(1<<20), "this process's resident memory")
	assert.Zero(t, rssOf(-1))
}

func TestHitKeysIgnoreTheCorpusFolderPath(t *testing.T) {
	hit := func(src string, start int) retrieval.Hit {
		return retrieval.Hit{Passage: retrieval.Passage{Source: src, Start: start}}
	}
	ref := hitKeys([]retrieval.Hit{hit("/runs/a/corpus/synth-000001.txt", 0), hit("/runs/a/corpus/synth-000002.txt", 40)})
	got := hitKeys([]retrieval.Hit{hit("/runs/b/corpus/synth-000001.txt", 0), hit("/runs/b/corpus/synth-000002.txt", 41)})
	assert.Equal(t, ref[0], got[0], "one passage read through another folder path")
	assert.NotEqual(t, ref[1], got[1], "another offset is another passage")
}

// countingSearcher counts the queries it is asked and fails on "bad".
type countingSearcher struct {
	mu    sync.Mutex
	asked map[string]int
}

func (c *countingSearcher) Search(_ context.Context, q string, _ int, _ retrieval.Mode) ([]retrieval.Hit, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked[q]++
	if q == "bad" {
		return nil, errors.New("engine down")
	}
	return nil, nil
}

func TestWarmAsksEveryQueryOnce(t *testing.T) {
	s := &countingSearcher{asked: map[string]int{}}
	queries := []string{"a", "b", "c", "d", "e"}
	require.NoError(t, warm(t.Context(), s, retrieval.ModeHybrid, queries, 2))
	assert.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}, s.asked)
	require.NoError(t, warm(t.Context(), s, retrieval.ModeHybrid, nil, 4), "no warm-up")

	err := warm(t.Context(), s, retrieval.ModeHybrid, []string{"x", "bad", "y"}, 3)
	assert.ErrorContains(t, err, "engine down")
}

// byteTokenizer makes every byte a token.
type byteTokenizer struct{}

func (byteTokenizer) Tokenize(text string, _, _ bool) ([]engine.Token, error) {
	out := make([]engine.Token, len(text))
	for i := range len(text) {
		out[i] = engine.Token(text[i])
	}
	return out, nil
}

func (byteTokenizer) Piece(t engine.Token) []byte { return []byte{byte(t)} }

func TestScaleReusesWhatItKept(t *testing.T) {
	m, err := LearnText([]string{"The cat sat on the mat. The dog ran after the cat. A bird sang over the river!"})
	require.NoError(t, err)
	dir := t.TempDir()
	corpus := filepath.Join(dir, "corpus")
	_, err = WriteSynthCorpus(corpus, m, 3000, 0, 1)
	require.NoError(t, err)
	o := ScaleOptions{
		Corpus: corpus, Tokenizer: byteTokenizer{}, Embedder: retrieval.RandomEmbedder{Dims: 8},
		Queries: []string{"cat", "dog river", "bird"}, Backends: []string{"bleve"}, Dir: dir, Reuse: true,
	}
	first, err := Scale(t.Context(), o)
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(dir, "bleve.build-s"))
	assert.Equal(t, 1.0, first["bleve"].RecallAt10, "bleve is exact at this size")
	man, err := retrieval.ReadManifest(filepath.Join(dir, "bleve"))
	require.NoError(t, err)
	assert.True(t, man.Dense)

	again, err := Scale(t.Context(), o)
	require.NoError(t, err)
	assert.Equal(t, first["bleve"].IngestPerS, again["bleve"].IngestPerS, "the kept index and its build time are reused")
	assert.Equal(t, first["bleve"].Passages, again["bleve"].Passages)

	o.Reuse = false
	fresh, err := Scale(t.Context(), o)
	require.NoError(t, err)
	assert.Equal(t, first["bleve"].Passages, fresh["bleve"].Passages)
	assert.NotEqual(t, first["bleve"].IngestPerS, fresh["bleve"].IngestPerS, "without reuse the index is built again")
}
