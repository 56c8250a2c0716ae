package retrieval

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/dragon-rag/dragon/retrieval/weaviate"
)

// AnalyzerName names the analysis of Terms, recorded with a collection so
// that terms analyzed another way are refused.
const AnalyzerName = "bleve-en/v1"

// RemoteIndex searches passages kept in a scale-out engine (a Weaviate
// collection). The engine finds candidates (BM25 over the analyzed terms,
// nearest vectors); ranking, fusion and R are computed here exactly as for
// a local Index, so the two order passages alike and R stays on one scale.
// The corpus statistics BM25 needs come from the collection's stored
// table, or are counted live and remembered for statsTTL (statsCache).
type RemoteIndex struct {
	store *weaviate.Client
	emb   Embedder
	spec  weaviate.Spec
	stats *statsCache
}

var _ Searcher = (*RemoteIndex)(nil)

// lexicalCandidates is how many passages the engine's own BM25 proposes
// for a ranking of pool passages of which k are returned: our scoring
// reorders them (it weighs terms by idf² and rewards matching more of
// them), so the engine must look deeper, most of all near the top. Each
// candidate is an object the engine loads and parses, most of a lexical
// search's cost: at 10^6 passages, hybrid queries (pool 50) with 100
// candidates rather than 200 took 0.76–0.85× the time at p50 (two runs)
// for a recall@10 of 0.947 rather than 0.948 (docs/BENCHMARKS.md).
func lexicalCandidates(pool, k int) int { return max(2*pool, 4*k) }

// OpenRemote checks that the collection holds passages analyzed our way
// and, for dense search, vectors from emb (nil: BM25 only).
func OpenRemote(ctx context.Context, store *weaviate.Client, emb Embedder) (*RemoteIndex, error) {
	spec, err := store.Spec(ctx)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", store, err)
	}
	if spec.Analyzer != AnalyzerName {
		return nil, fmt.Errorf("open %s: its terms were analyzed as %q, this build analyzes as %q (ingest again)", store, spec.Analyzer, AnalyzerName)
	}
	if emb != nil && spec.Embedder != "" && embedderID(emb) != spec.Embedder {
		return nil, fmt.Errorf("%w: %s holds vectors of %q, not of %q", ErrEmbedder, store, spec.Embedder, embedderID(emb))
	}
	r := &RemoteIndex{store: store, emb: emb, spec: spec, stats: newStatsCache(store)}
	// The stored statistics, if any, are read now rather than on a
	// user's first query.
	if _, err := r.stats.storedTable(ctx); err != nil {
		return nil, fmt.Errorf("open %s: %w", store, err)
	}
	return r, nil
}

// Ready reports whether the engine answers.
func (r *RemoteIndex) Ready(ctx context.Context) error { return r.store.Ready(ctx) }

// Search implements Searcher.
func (r *RemoteIndex) Search(ctx context.Context, query string, k int, mode Mode) ([]Hit, error) {
	if k <= 0 {
		return nil, fmt.Errorf("retrieval: search needs k > 0, got %d", k)
	}
	if strings.TrimSpace(query) == "" {
		return nil, errors.New("retrieval: empty query")
	}
	dense := r.spec.Embedder != "" && r.emb != nil
	switch {
	case mode == ModeAuto && dense:
		mode = ModeHybrid
	case mode == ModeAuto:
		mode = ModeBM25
	case mode != ModeBM25 && r.spec.Embedder == "":
		return nil, fmt.Errorf("%w: %s has no vectors for %s search", ErrEmbedder, r.store, mode)
	case mode != ModeBM25 && r.emb == nil:
		return nil, fmt.Errorf("%w: %s search needs the collection's embedder", ErrEmbedder, mode)
	}
	pool := k
	if mode == ModeHybrid {
		pool = max(4*k, hybridPool)
	}

	// Every request goes out at once: the corpus statistics, the engine's
	// BM25 candidates and the nearest vectors.
	terms := Terms(query)
	unique := slices.Compact(slices.Sorted(slices.Values(terms)))
	var (
		st                    weaviate.Stats
		lexCands, semCands    []weaviate.Candidate
		stErr, lexErr, semErr error
		wg                    sync.WaitGroup
	)
	if mode != ModeDense && len(unique) > 0 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			st, stErr = r.stats.stats(ctx, unique)
		}()
		go func() {
			defer wg.Done()
			lexCands, lexErr = r.store.Lexical(ctx, unique, lexicalCandidates(pool, k))
		}()
	}
	if mode != ModeBM25 {
		semCands, semErr = r.nearest(ctx, query, pool)
	}
	wg.Wait()
	if err := cmp.Or(stErr, lexErr, semErr); err != nil {
		return nil, fmt.Errorf("search %s: %w", r.store, err)
	}
	var (
		lex   []scored
		upper float64
	)
	if len(unique) > 0 {
		lex, upper = rankLexical(terms, st, lexCands, pool)
	}
	sem := make([]scored, len(semCands))
	for i, c := range semCands {
		sem[i] = scored{c.PID, c.Score}
	}
	hits := best(fuse(mode, lex, upper, sem, pool, nil), k)

	// Only the passages kept travel whole.
	ids := make([]uint64, len(hits))
	for i, h := range hits {
		ids[i] = h.Passage.ID
	}
	objs, err := r.store.Fetch(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("search %s: %w", r.store, err)
	}
	out := hits[:0]
	for _, h := range hits {
		o, ok := objs[h.Passage.ID]
		if !ok {
			continue // deleted since the search
		}
		h.Passage = Passage{ID: o.PID, Source: o.Source, Start: o.Start, End: o.End, Tokens: o.Tokens, Text: o.Text, Meta: o.Meta}
		out = append(out, h)
	}
	return out, nil
}

// rankLexical ranks the engine's BM25 candidates with LexicalScorer and
// keeps the pool best, with the query's upper bound.
func rankLexical(terms []string, st weaviate.Stats, cands []weaviate.Candidate, pool int) ([]scored, float64) {
	sc := NewLexicalScorer(terms, st.DocFreq, st.Passages, st.Terms)
	out := make([]scored, 0, len(cands))
	for _, c := range cands {
		if s := sc.Score(c.Terms); s > 0 {
			out = append(out, scored{c.PID, s})
		}
	}
	slices.SortFunc(out, func(a, b scored) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	return out[:min(pool, len(out))], sc.Upper()
}

// nearest embeds the query and asks the engine for its nearest vectors.
func (r *RemoteIndex) nearest(ctx context.Context, query string, pool int) ([]weaviate.Candidate, error) {
	vs, err := r.emb.Embed(ctx, []string{query})
	if err != nil {
		return nil, fmt.Errorf("embed query: %w", err)
	}
	if len(vs) != 1 {
		return nil, fmt.Errorf("%w: %d embeddings for one query", ErrEmbedder, len(vs))
	}
	if len(vs[0]) != r.spec.Dims {
		return nil, fmt.Errorf("%w: query embedding has %d dimensions, the collection %d", ErrEmbedder, len(vs[0]), r.spec.Dims)
	}
	qv, err := unit(vs[0])
	if err != nil {
		return nil, err
	}
	return r.store.Nearest(ctx, qv, pool)
}
