package retrievalbench

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
