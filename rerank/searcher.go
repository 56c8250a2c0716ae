package rerank

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/dragon-rag/dragon/retrieval"
)

// DefaultCandidates is how many passages the first stage retrieves for the
// cross-encoder to re-rank when Searcher.Candidates is unset (measured:
// docs/BENCHMARKS.md, "Re-ranking").
const DefaultCandidates = 16

// Searcher re-ranks another searcher's candidates with a cross-encoder:
// the first stage retrieves Candidates passages, the cross-encoder scores
// each against the question, and the k it scores highest are returned, best
// first, with Hit.Score the cross-encoder's logit. That logit is R(d, q) on
// a scale both sides share when they run the same model file, unlike the
// first stages' (see retrieval.Hit.Score and docs/DESIGN-NOTES.md).
type Searcher struct {
	Inner      retrieval.Searcher
	Reranker   *Reranker
	Candidates int
}

var _ retrieval.Searcher = (*Searcher)(nil)

// Search implements retrieval.Searcher.
func (s *Searcher) Search(ctx context.Context, query string, k int, mode retrieval.Mode) ([]retrieval.Hit, error) {
	return s.SearchFilter(ctx, query, k, mode, retrieval.Filter{})
}

var _ retrieval.FilterSearcher = (*Searcher)(nil)

// SearchFilter implements retrieval.FilterSearcher: the candidates are the
// first stage's among the passages f lets through.
func (s *Searcher) SearchFilter(ctx context.Context, query string, k int, mode retrieval.Mode, f retrieval.Filter) ([]retrieval.Hit, error) {
	if k <= 0 {
		return nil, fmt.Errorf("rerank: search needs k > 0, got %d", k)
	}
	n := max(k, cmp.Or(s.Candidates, DefaultCandidates))
	hits, err := retrieval.SearchWith(ctx, s.Inner, query, n, mode, f)
	if err != nil {
		return nil, err
	}
	texts := make([]string, len(hits))
	for i, h := range hits {
		texts[i] = h.Passage.Text
	}
	scores, err := s.Reranker.Score(ctx, query, texts)
	if err != nil {
		return nil, err
	}
	for i := range hits {
		hits[i].FirstStage = hits[i].Score
		hits[i].Score = float64(scores[i])
	}
	// Stable: ties keep the first stage's order.
	slices.SortStableFunc(hits, func(a, b retrieval.Hit) int { return cmp.Compare(b.Score, a.Score) })
	return hits[:min(k, len(hits))], nil
}
