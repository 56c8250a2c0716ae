package retrieval

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Hit is one retrieved passage.
type Hit struct {
	// Passage is a copy; its Meta map is shared and must not be modified.
	Passage Passage
	// Score is R(d, q), calibrated so that softmax over the hits is the
	// document weight (see Weights and the temperatures in score.go).
	Score float64
	// BM25Rank and DenseRank are the 1-based ranks in each ranker's
	// candidate list; 0 when the ranker did not run or did not return it.
	BM25Rank, DenseRank int
	// BM25 is bleve's raw BM25 score, Cosine the cosine similarity to the
	// query (0 where the ranker did not return the passage).
	BM25, Cosine float64
	// FirstStage is the retriever's R when a re-ranker replaced Score
	// with its own (0 otherwise).
	FirstStage float64
}

// Searcher is what generation needs of an index; *Index implements it and
// tests of the layers above can fake it.
type Searcher interface {
	Search(ctx context.Context, query string, k int, mode Mode) ([]Hit, error)
}

var _ Searcher = (*Index)(nil)

// hybridPool is the fewest candidates each ranker contributes to fusion:
// RRF needs lists deeper than k to tell agreement from chance.
const hybridPool = 50

// Search returns the k passages most relevant to query, best first.
func (ix *Index) Search(ctx context.Context, query string, k int, mode Mode) ([]Hit, error) {
	return ix.search(ctx, query, k, mode, Filter{})
}

// SearchFilter is Search among the passages f lets through. Their scores
// are the ones Search would give them: a filter narrows, it does not
// re-rank.
func (ix *Index) SearchFilter(ctx context.Context, query string, k int, mode Mode, f Filter) ([]Hit, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return ix.search(ctx, query, k, mode, f)
}

var _ FilterSearcher = (*Index)(nil)

// exactFilterMax is the most passages a filter may let through for BM25
// to score each of them; past it, bleve's candidates are filtered from a
// pool deepened in proportion to what the filter keeps out. A variable
// for the tests of both ways.
var exactFilterMax = 2048

// maxFilterPool bounds that deepened pool.
const maxFilterPool = 20000

func (ix *Index) search(ctx context.Context, query string, k int, mode Mode, f Filter) ([]Hit, error) {
	if k <= 0 {
		return nil, fmt.Errorf("retrieval: search needs k > 0, got %d", k)
	}
	if strings.TrimSpace(query) == "" {
		return nil, errors.New("retrieval: empty query")
	}
	ix.mu.RLock()
	closed, dense, dims := ix.closed, ix.man.Dense, ix.man.Dims
	ix.mu.RUnlock()
	stats := ix.corpusStats()
	if closed {
		return nil, ErrClosed
	}
	mode, err := ix.resolveMode(mode, dense)
	if err != nil {
		return nil, err
	}
	pool := k
	if mode == ModeHybrid {
		pool = max(4*k, hybridPool)
	}
	filtered := !f.IsZero()
	var allowed map[uint64]bool
	if filtered {
		allowed = ix.allowed(f)
		if len(allowed) == 0 {
			return nil, nil
		}
	}

	var lex []scored
	var upper float64
	switch {
	case mode == ModeDense:
	case filtered && len(allowed) <= exactFilterMax:
		if lex, upper, err = ix.scoreBM25(ctx, query, allowed, pool, stats); err != nil {
			return nil, fmt.Errorf("search %s: %w", ix.dir, err)
		}
	default:
		deep := pool
		if filtered {
			deep = min(max(pool, pool*stats.docs/len(allowed)), maxFilterPool)
		}
		if lex, upper, err = ix.bm25.search(ctx, query, deep, stats); err != nil {
			return nil, fmt.Errorf("search %s: %w", ix.dir, err)
		}
		if filtered {
			lex = slices.DeleteFunc(lex, func(s scored) bool { return !allowed[s.id] })
			lex = lex[:min(len(lex), pool)]
		}
	}
	var qv []float32
	if mode != ModeBM25 {
		if qv, err = ix.embedQuery(ctx, query, dims); err != nil {
			return nil, err
		}
	}

	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if ix.closed {
		return nil, ErrClosed
	}
	live := func(id uint64) bool { return ix.passages[id] != nil && (!filtered || allowed[id]) }
	// Bleve may briefly hold passages a concurrent writer is removing.
	lex = slices.DeleteFunc(lex, func(s scored) bool { return !live(s.id) })
	var sem []scored
	switch {
	case qv == nil:
	case filtered && len(allowed) <= exactFilterMax:
		sem, err = ix.vecs.scoreAmong(qv, pool, allowed)
	case filtered:
		sem, err = ix.vecs.search(qv, pool, live, ix.opts.ExactDenseMax)
	default:
		sem, err = ix.vecs.search(qv, pool, nil, ix.opts.ExactDenseMax)
	}
	if err != nil {
		return nil, fmt.Errorf("search %s: %w", ix.dir, err)
	}
	hits := best(fuse(mode, lex, upper, sem, pool, ix.isPendingLocked), k)
	for i := range hits {
		hits[i].Passage = *ix.passages[hits[i].Passage.ID]
	}
	return hits, nil
}

// allowed are the passages f lets through.
func (ix *Index) allowed(f Filter) map[uint64]bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := map[uint64]bool{}
	for id, p := range ix.passages {
		if f.match(p) {
			out[id] = true
		}
	}
	return out
}

// scoreBM25 scores each of the allowed passages as bleve would (the
// corpus's statistics, the passage's terms) and returns the best n.
func (ix *Index) scoreBM25(ctx context.Context, query string, allowed map[uint64]bool, n int, st corpusStats) ([]scored, float64, error) {
	terms := Terms(query)
	df, err := ix.bm25.docFreqs(ctx, terms)
	if err != nil {
		return nil, 0, err
	}
	sc := NewLexicalScorer(terms, df, st.docs, st.terms)
	ix.mu.RLock()
	texts := make(map[uint64]string, len(allowed))
	for id := range allowed {
		if p := ix.passages[id]; p != nil {
			texts[id] = p.Text
		}
	}
	ix.mu.RUnlock()
	var out []scored
	for id, text := range texts {
		if v := sc.Score(Terms(text)); v > 0 {
			out = append(out, scored{id, v})
		}
	}
	return topScored(out, n), sc.Upper(), nil
}

// isPendingLocked says whether a passage awaits its vector. Callers hold
// mu.
func (ix *Index) isPendingLocked(id uint64) bool {
	_, ok := ix.pending[id]
	return ok
}

func (ix *Index) corpusStats() corpusStats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return corpusStats{docs: len(ix.passages), terms: ix.terms}
}

func (ix *Index) resolveMode(mode Mode, dense bool) (Mode, error) {
	switch mode {
	case ModeAuto:
		if dense && ix.opts.Embedder != nil {
			return ModeHybrid, nil
		}
		return ModeBM25, nil
	case ModeBM25:
		return mode, nil
	case ModeDense, ModeHybrid:
		if !dense {
			return 0, fmt.Errorf("retrieval: %s search: index %s has no dense vectors (built without an embedder)", mode, ix.dir)
		}
		if ix.opts.Embedder == nil {
			return 0, fmt.Errorf("%w: %s search needs the index's embedder", ErrEmbedder, mode)
		}
		return mode, nil
	}
	return 0, fmt.Errorf("retrieval: unknown search mode %d", int(mode))
}

func (ix *Index) embedQuery(ctx context.Context, query string, dims int) ([]float32, error) {
	vs, err := ix.opts.Embedder.Embed(ctx, []string{query})
	if err != nil {
		return nil, fmt.Errorf("embed query: %w", err)
	}
	if len(vs) != 1 {
		return nil, fmt.Errorf("embed query: embedder returned %d vectors for 1 text", len(vs))
	}
	qv, err := unit(vs[0])
	if err != nil {
		return nil, fmt.Errorf("embed query: %w", err)
	}
	if dims != 0 && len(qv) != dims {
		return nil, fmt.Errorf("%w: query has %d dimensions, index %d", ErrEmbedder, len(qv), dims)
	}
	return qv, nil
}

// fuse merges the rankers' lists (each best first, at most pool long) into
// hits with R set. Passage holds only the ID; the caller fills in the rest.
//
// In hybrid fusion a passage missing from one list counts as ranked just
// past its end (pool+1) rather than contributing nothing: "not in the top
// 50" is weak evidence against it, and with plain RRF a passage only one
// ranker found would get a weight e^-5 below one both found. A passage
// still waiting for its vector (pending, nil for none) has no dense rank
// to miss: its BM25 rank stands in for it, so a document just added ranks
// as its words say until its vectors are in.
func fuse(mode Mode, lex []scored, upper float64, sem []scored, pool int, pending func(uint64) bool) []Hit {
	byID := map[uint64]*Hit{}
	var order []uint64
	get := func(id uint64) *Hit {
		h := byID[id]
		if h == nil {
			h = &Hit{Passage: Passage{ID: id}}
			byID[id] = h
			order = append(order, id)
		}
		return h
	}
	for i, s := range lex {
		h := get(s.id)
		h.BM25Rank, h.BM25 = i+1, s.score
	}
	for i, s := range sem {
		h := get(s.id)
		h.DenseRank, h.Cosine = i+1, s.score
	}
	hits := make([]Hit, 0, len(order))
	for _, id := range order {
		h := byID[id]
		switch mode {
		case ModeBM25:
			h.Score = bm25R(h.BM25, upper)
		case ModeDense:
			h.Score = denseR(h.Cosine)
		default:
			dense := h.DenseRank
			if dense == 0 && pending != nil && pending(id) {
				dense = h.BM25Rank
			}
			h.Score = rrfR(rrf(h.BM25Rank, pool)+rrf(dense, pool), 2)
		}
		hits = append(hits, *h)
	}
	return hits
}

// best sorts fused hits by R, ties by passage id, and keeps the first k.
func best(hits []Hit, k int) []Hit {
	slices.SortFunc(hits, func(a, b Hit) int {
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		return cmp.Compare(a.Passage.ID, b.Passage.ID)
	})
	return hits[:min(k, len(hits))]
}

// rrf is one ranker's reciprocal-rank term; rank 0 means absent from a list
// of pool candidates.
func rrf(rank, pool int) float64 {
	if rank == 0 {
		rank = pool + 1
	}
	return 1 / float64(RRFK+rank)
}
