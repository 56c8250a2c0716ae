// Package rerank scores (question, passage) pairs with a cross-encoder run
// through the engine, and re-ranks a retriever's candidates by it: the
// "retrieve many, keep k" of production RAG and the relevance R(d, x) of
// DRAGON's document weights (§4.1). The model is a BERT cross-encoder
// converted by tools/rerankconv (`make rerank-model`): rank pooling, and
// the passage's tokens in the segment-1 copy of the vocabulary.
package rerank

import (
	"container/list"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/dragon-rag/dragon/engine"
)

// ErrNotRanker marks a model that is not a cross-encoder converted for
// this package.
var ErrNotRanker = errors.New("rerank: not a ranking model")

// Options configure a Reranker.
type Options struct {
	// Threads of the cross-encoder's own context (0: the model's default).
	Threads int
	// MaxTokens bounds a (question, passage) pair, [CLS] and both [SEP]s
	// included (default and most: the model's positions, 512). Longer
	// pairs are cut, the passage first, and a warning is logged once.
	MaxTokens int
	// CacheSize is how many pair scores are kept for repeated questions
	// (default 65,536; about 3 MiB).
	CacheSize int
}

// Reranker scores pairs on one engine context of its own, one pair a pass
// (packing pairs into one pass was slower on CPU). Safe for concurrent use;
// calls are serialized.
type Reranker struct {
	model     engine.Model
	offset    engine.Token // segment-1 id = segment-0 id + offset
	sep       engine.Token
	maxTokens int
	threads   int

	mu        sync.Mutex
	ectx      engine.Context
	batch     engine.Batch
	cache     map[[32]byte]*list.Element
	order     *list.List // front: most recently used
	cacheSize int
	truncated sync.Once
}

type cached struct {
	key   [32]byte
	score float32
}

// segmentName is the text tools/rerankconv gives the segment-1 copy of
// token i; the first one marks a converted file.
func segmentName(i int) string { return fmt.Sprintf("[segment 1 #%d]", i) }

// New returns a reranker over m, which must be a converted cross-encoder.
// The engine context is created on first use; Close frees it (m stays
// open).
func New(m engine.Model, opts Options) (*Reranker, error) {
	info := m.Info()
	if info.Pooling != "rank" {
		return nil, fmt.Errorf("%w: %s pools %q, not rank (convert a cross-encoder with make rerank-model)", ErrNotRanker, info.Name, info.Pooling)
	}
	half := info.VocabSize / 2
	if info.VocabSize%2 != 0 || string(m.Piece(engine.Token(half))) != segmentName(0) {
		return nil, fmt.Errorf("%w: %s has no segment-1 vocabulary (convert it with tools/rerankconv)", ErrNotRanker, info.Name)
	}
	// [CLS] a [SEP]: the separator is what the tokenizer closes with.
	probe, err := m.Tokenize("a", true, false)
	if err != nil || len(probe) < 3 {
		return nil, fmt.Errorf("%w: %s does not wrap text in [CLS] … [SEP] (%v)", ErrNotRanker, info.Name, err)
	}
	r := &Reranker{
		model:     m,
		offset:    engine.Token(half),
		sep:       probe[len(probe)-1],
		maxTokens: opts.MaxTokens,
		threads:   opts.Threads,
		cacheSize: opts.CacheSize,
		cache:     map[[32]byte]*list.Element{},
		order:     list.New(),
	}
	if r.maxTokens <= 0 || (info.TrainCtx > 0 && r.maxTokens > info.TrainCtx) {
		r.maxTokens = info.TrainCtx
	}
	if r.maxTokens <= 0 {
		r.maxTokens = 512
	}
	if r.cacheSize <= 0 {
		r.cacheSize = 1 << 16
	}
	return r, nil
}

// Name is the model's name, for logs.
func (r *Reranker) Name() string { return r.model.Info().Name }

// Score returns the cross-encoder's logit of relevance for each passage to
// query: higher is more relevant; the scale is the model's log-odds, the
// same on every machine that runs the same file.
func (r *Reranker) Score(ctx context.Context, query string, passages []string) ([]float32, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]float32, len(passages))
	var q []engine.Token
	for i, p := range passages {
		key := sha256.Sum256([]byte(query + "\x00" + p))
		if e, ok := r.cache[key]; ok {
			r.order.MoveToFront(e)
			out[i] = e.Value.(*cached).score
			continue
		}
		if q == nil {
			var err error
			if q, err = r.model.Tokenize(query, true, false); err != nil {
				return nil, fmt.Errorf("rerank: tokenize question: %w", err)
			}
		}
		s, err := r.scorePair(ctx, q, p)
		if err != nil {
			return nil, fmt.Errorf("rerank: passage %d: %w", i, err)
		}
		out[i] = s
		r.remember(key, s)
	}
	return out, nil
}

// Relevance is Score in float64: R(d, q) as document weights take it.
func (r *Reranker) Relevance(ctx context.Context, query string, passages []string) ([]float64, error) {
	scores, err := r.Score(ctx, query, passages)
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(scores))
	for i, s := range scores {
		out[i] = float64(s)
	}
	return out, nil
}

func (r *Reranker) remember(key [32]byte, s float32) {
	r.cache[key] = r.order.PushFront(&cached{key: key, score: s})
	for r.order.Len() > r.cacheSize {
		old := r.order.Remove(r.order.Back()).(*cached)
		delete(r.cache, old.key)
	}
}

// scorePair decodes [CLS] q [SEP] p [SEP], p in segment 1, and reads the
// sequence's score.
func (r *Reranker) scorePair(ctx context.Context, q []engine.Token, passage string) (score float32, err error) {
	p, err := r.model.Tokenize(passage, false, false)
	if err != nil {
		return 0, fmt.Errorf("tokenize: %w", err)
	}
	if n := len(q) + len(p) + 1; n > r.maxTokens {
		r.truncated.Do(func() {
			slog.Warn("rerank: a question and passage exceed the cross-encoder's tokens; cut to fit (said once)",
				"tokens", n, "max", r.maxTokens)
		})
		if len(q) > r.maxTokens/2 {
			// Keep the question's closing [SEP].
			q = append(q[:r.maxTokens/2-1:r.maxTokens/2-1], q[len(q)-1])
		}
		p = p[:max(0, r.maxTokens-len(q)-1)]
	}
	if r.ectx == nil {
		c, err := r.model.NewContext(engine.ContextOptions{
			CtxPerSeq: r.maxTokens, MaxSeqs: 1, BatchSize: r.maxTokens, Threads: r.threads, Embeddings: true,
		})
		if err != nil {
			return 0, fmt.Errorf("new context: %w", err)
		}
		r.ectx = c
	}
	defer func() {
		if terr := r.ectx.Truncate(0, 0); terr != nil && err == nil {
			err = terr
		}
		if err != nil && !errors.Is(err, engine.ErrAborted) {
			// A failed decode may leave the context in any state.
			r.ectx.Close()
			r.ectx = nil
		}
	}()
	r.batch.Reset()
	for pos, t := range q {
		r.batch.Add(t, pos, true, 0)
	}
	for i, t := range append(p, r.sep) {
		r.batch.Add(t+r.offset, len(q)+i, true, 0)
	}
	if err := r.ectx.Decode(ctx, &r.batch); err != nil {
		return 0, fmt.Errorf("decode: %w", err)
	}
	scorer, ok := r.ectx.(engine.SeqScorer)
	if !ok {
		return 0, fmt.Errorf("%w: the engine's context gives no scores", ErrNotRanker)
	}
	return scorer.SeqScore(0)
}

// Close frees the engine context.
func (r *Reranker) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ectx == nil {
		return nil
	}
	err := r.ectx.Close()
	r.ectx = nil
	return err
}
