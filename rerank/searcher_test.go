package rerank

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/retrieval"
)

// listSearcher returns its passages in order, scored 1, 0.9, 0.8, …, and
// remembers how many were asked for.
type listSearcher struct {
	texts []string
	asked int
}

func (l *listSearcher) Search(_ context.Context, _ string, k int, _ retrieval.Mode) ([]retrieval.Hit, error) {
	l.asked = k
	var hits []retrieval.Hit
	for i, t := range l.texts[:min(k, len(l.texts))] {
		hits = append(hits, retrieval.Hit{Passage: retrieval.Passage{ID: uint64(i), Text: t}, Score: 1 - 0.1*float64(i)})
	}
	return hits, nil
}

func TestSearcherKeepsTheCrossEncodersTopK(t *testing.T) {
	r, _ := loadReranker(t)
	ctx := context.Background()
	// The first stage's order: least relevant first.
	first := &listSearcher{texts: []string{berlin.passages[5], berlin.passages[1], berlin.passages[4], berlin.passages[3], berlin.passages[0], berlin.passages[2]}}
	s := &Searcher{Inner: first, Reranker: r, Candidates: 6}
	hits, err := s.Search(ctx, berlin.query, 2, retrieval.ModeAuto)
	require.NoError(t, err)
	assert.Equal(t, 6, first.asked)
	scores, err := r.Score(ctx, berlin.query, first.texts)
	require.NoError(t, err)
	order := []int{0, 1, 2, 3, 4, 5}
	slices.SortFunc(order, func(a, b int) int {
		if scores[a] > scores[b] {
			return -1
		}
		return 1
	})
	require.Len(t, hits, 2)
	for i, h := range hits {
		assert.Equal(t, uint64(order[i]), h.Passage.ID)
		assert.Equal(t, float64(scores[order[i]]), h.Score, "R is the cross-encoder's logit")
		assert.InDelta(t, 1-0.1*float64(order[i]), h.FirstStage, 1e-12)
	}
	assert.Equal(t, berlin.passages[0], hits[0].Passage.Text)

	// Fewer candidates than k: all of them, and never fewer than k asked.
	s.Candidates = 1
	hits, err = s.Search(ctx, berlin.query, 3, retrieval.ModeAuto)
	require.NoError(t, err)
	assert.Equal(t, 3, first.asked)
	assert.Len(t, hits, 3)
	_, err = s.Search(ctx, berlin.query, 0, retrieval.ModeAuto)
	assert.Error(t, err)
}
