package retrieval

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/dragon-rag/dragon/retrieval/weaviate"
)

// AnalyzerName names the analysis of Terms, recorded with a collection so
// that terms analyzed another way are refused.
const AnalyzerName = "bleve-en/v1"

// RemoteIndex searches passages kept in a scale-out engine (a Weaviate
// collection). The engine finds candidates (BM25 over the analyzed terms,
// nearest vectors); ranking, fusion and R are computed here exactly as for
// a local Index, so the two order passages alike and R stays on one scale.
type RemoteIndex struct {
	store *weaviate.Client
	emb   Embedder
	spec  weaviate.Spec
}

var _ Searcher = (*RemoteIndex)(nil)

// lexicalCandidates is how many passages the engine's own BM25 proposes
// per passage we keep: our scoring reorders them (it weighs terms by idf²
// and rewards matching more of them), so the engine must look deeper.
const lexicalCandidates = 4

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
	return &RemoteIndex{store: store, emb: emb, spec: spec}, nil
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

	// The two rankers' requests go out at once.
	var (
		lex, sem           []scored
		upper              float64
		lexCands, semCands []weaviate.Candidate
		lexErr, semErr     error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if mode != ModeDense {
			lex, upper, lexCands, lexErr = r.lexical(ctx, query, pool)
		}
	}()
	if mode != ModeBM25 {
		semCands, semErr = r.nearest(ctx, query, pool)
	}
	<-done
	if err := cmp.Or(lexErr, semErr); err != nil {
		return nil, fmt.Errorf("search %s: %w", r.store, err)
	}
	found := make(map[uint64]weaviate.Candidate, len(lexCands)+len(semCands))
	for _, c := range lexCands {
		found[c.PID] = c
	}
	for _, c := range semCands {
		found[c.PID] = c
		sem = append(sem, scored{c.PID, c.Score})
	}
	hits := best(fuse(mode, lex, upper, sem, pool), k)
	for i := range hits {
		c := found[hits[i].Passage.ID]
		hits[i].Passage = Passage{ID: c.PID, Source: c.Source, Start: c.Start, End: c.End, Tokens: c.Tokens, Text: c.Text, Meta: c.Meta}
	}
	return hits, nil
}

// lexical ranks the engine's BM25 candidates with LexicalScorer and keeps
// the pool best, with the query's upper bound.
func (r *RemoteIndex) lexical(ctx context.Context, query string, pool int) ([]scored, float64, []weaviate.Candidate, error) {
	terms := Terms(query)
	if len(terms) == 0 {
		return nil, 0, nil, nil
	}
	unique := slices.Compact(slices.Sorted(slices.Values(terms)))
	st, err := r.store.DocFreqs(ctx, unique)
	if err != nil {
		return nil, 0, nil, err
	}
	cands, err := r.store.Lexical(ctx, unique, lexicalCandidates*pool)
	if err != nil {
		return nil, 0, nil, err
	}
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
	return out[:min(pool, len(out))], sc.Upper(), cands, nil
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
