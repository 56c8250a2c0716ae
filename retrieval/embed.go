package retrieval

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/dragon-rag/dragon/engine"
)

// Embedder maps texts to vectors for dense retrieval. Vectors of one
// embedder all have the same length; they need not be normalized.
type Embedder interface {
	Embed(ctx context.Context, texts []string) ([][]float32, error)
}

// Fingerprinter is implemented by embedders that can name themselves; an
// index remembers the name and refuses vectors from another embedder,
// whose space would be unrelated.
type Fingerprinter interface {
	Fingerprint() string
}

func embedderID(e Embedder) string {
	if f, ok := e.(Fingerprinter); ok {
		return f.Fingerprint()
	}
	return fmt.Sprintf("%T", e)
}

// Pooling turns a text's per-token hidden states into one vector.
type Pooling int

const (
	// PoolPrompt wraps the text in a prompt that asks for its meaning in
	// one word and takes the hidden state of the prompt's last token: the
	// model has to squeeze the text's meaning into the state from which it
	// would predict that word (PromptEOL, Jiang et al. 2023). On SmolLM2
	// it ranks paraphrases with no word in common first where mean pooling
	// misses a third of them (retrieval/real_test.go).
	PoolPrompt Pooling = iota
	// PoolMean averages the hidden states of the text's tokens.
	PoolMean
)

// The prompt of PoolPrompt, around the text.
const (
	promptHead = `This passage : "`
	promptTail = `" means in one word:"`
)

// EngineEmbedderOptions configure an EngineEmbedder.
type EngineEmbedderOptions struct {
	// Pooling of a generative model's hidden states (default PoolPrompt).
	// An embedding model (one whose metadata names a pooling, such as
	// all-MiniLM-L6-v2) is always pooled as its metadata says.
	Pooling Pooling
	// MaxTokens truncates each text, prompt included (default 512, or
	// DefaultEncoderTokens for an embedding model).
	MaxTokens int
	// MaxSeqs is how many texts share one forward pass (default 8, or 1
	// for an embedding model). An encoder's pass attends over the whole
	// batch under a mask, so packing texts saves nothing there: on
	// all-MiniLM-L6-v2 Q8_0, one thread, 48-word passages embed at 19.8/s
	// one to a pass and 14.9/s packed eight to a pass (BenchmarkMiniLMEmbed).
	MaxSeqs int
	// Threads for the engine context (0: backend default).
	Threads int
	// KeepFirst includes the first position in PoolMean's mean. It is left
	// out by default: decoder-only models park a large, input-independent
	// activation on the first token (the "attention sink"), which would
	// pull every mean towards the same direction and crush the cosines
	// together.
	KeepFirst bool
}

// DefaultEncoderTokens is an embedding model's default MaxTokens:
// sentence-transformers' max_seq_length for all-MiniLM-L6-v2, the length
// it was trained on (its positions go to 512).
const DefaultEncoderTokens = 256

// EngineEmbedder embeds texts with a model through the engine: an
// embedding model (a BERT encoder such as all-MiniLM-L6-v2) pooled as its
// metadata says, or the generation model itself, its hidden states pooled
// as Pooling says. Vectors are L2-normalized. It is safe for concurrent
// use; calls are serialized on one engine context.
type EngineEmbedder struct {
	model engine.Model
	opts  EngineEmbedderOptions
	// pooling is the embedding model's own ("mean", "cls", "last"), or
	// empty for a generative model pooled by opts.
	pooling string

	mu         sync.Mutex
	ectx       engine.Context
	batch      engine.Batch
	row        []float32
	head, tail []engine.Token // PoolPrompt's prompt, tokenized on first use
}

// NewEngineEmbedder returns an embedder over m. The engine context is
// created on first use; Close frees it (m stays open).
func NewEngineEmbedder(m engine.Model, opts EngineEmbedderOptions) *EngineEmbedder {
	info := m.Info()
	if opts.MaxTokens <= 0 {
		opts.MaxTokens = 512
		if info.Pooling != "" {
			opts.MaxTokens = DefaultEncoderTokens
		}
	}
	if info.TrainCtx > 0 && info.Bidirectional {
		// An encoder's learned positions end there.
		opts.MaxTokens = min(opts.MaxTokens, info.TrainCtx)
	}
	if opts.MaxSeqs <= 0 {
		opts.MaxSeqs = 8
		if info.Bidirectional {
			opts.MaxSeqs = 1
		}
	}
	return &EngineEmbedder{model: m, opts: opts, pooling: info.Pooling}
}

// Fingerprint names the model and the pooling, so an index built with
// another model (even one sharing the vocabulary) is refused.
func (e *EngineEmbedder) Fingerprint() string {
	info := e.model.Info()
	pool := "prompt-last:" + promptHead + "%s" + promptTail
	switch {
	case e.pooling != "":
		pool = "model-" + e.pooling
	case e.opts.Pooling == PoolMean && e.opts.KeepFirst:
		pool = "mean"
	case e.opts.Pooling == PoolMean:
		pool = "mean-skip-first"
	}
	return fmt.Sprintf("engine-%s-l2/v1|%s|%s|dim=%d|%s", pool, info.Name, info.Arch, info.EmbedDim, info.Fingerprint)
}

// Embed implements Embedder. Texts are packed several to a forward pass,
// one KV sequence each.
func (e *EngineEmbedder) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	toks := make([][]engine.Token, len(texts))
	for i, t := range texts {
		tt, err := e.tokenize(t)
		if err != nil {
			return nil, fmt.Errorf("embed: text %d: %w", i, err)
		}
		toks[i] = tt
	}
	if e.ectx == nil {
		c, err := e.model.NewContext(engine.ContextOptions{
			CtxPerSeq:  e.opts.MaxTokens,
			MaxSeqs:    e.opts.MaxSeqs,
			BatchSize:  e.opts.MaxTokens,
			Threads:    e.opts.Threads,
			Embeddings: true,
		})
		if err != nil {
			return nil, fmt.Errorf("embed: new context: %w", err)
		}
		e.ectx = c
	}
	out := make([][]float32, len(texts))
	for i := 0; i < len(toks); {
		j, used := i, 0
		for j < len(toks) && j-i < e.opts.MaxSeqs && used+len(toks[j]) <= e.opts.MaxTokens {
			used += len(toks[j])
			j++
		}
		if err := e.embedPass(ctx, toks[i:j], out[i:j]); err != nil {
			return nil, err
		}
		i = j
	}
	return out, nil
}

// tokenize gives the tokens one text is embedded from: the text truncated
// to MaxTokens, inside the prompt for PoolPrompt. Truncation cuts the text,
// never the prompt's tail, whose last token is the one pooled.
func (e *EngineEmbedder) tokenize(text string) ([]engine.Token, error) {
	if e.pooling != "" {
		// [CLS] text [SEP] for BERT: truncation keeps the closing token.
		tt, err := e.model.Tokenize(text, true, false)
		if err != nil {
			return nil, fmt.Errorf("tokenize: %w", err)
		}
		if len(tt) == 0 {
			return nil, fmt.Errorf("%w: no tokens", engine.ErrInvalidInput)
		}
		if n := e.opts.MaxTokens; len(tt) > n {
			tt = append(tt[:n-1], tt[len(tt)-1])
		}
		return tt, nil
	}
	if e.opts.Pooling == PoolMean {
		tt, err := e.model.Tokenize(text, true, false)
		if err != nil {
			return nil, fmt.Errorf("tokenize: %w", err)
		}
		if len(tt) == 0 {
			return nil, fmt.Errorf("%w: no tokens", engine.ErrInvalidInput)
		}
		return tt[:min(len(tt), e.opts.MaxTokens)], nil
	}
	if e.head == nil {
		head, err := e.model.Tokenize(promptHead, true, false)
		if err != nil {
			return nil, fmt.Errorf("tokenize prompt: %w", err)
		}
		tail, err := e.model.Tokenize(promptTail, false, false)
		if err != nil {
			return nil, fmt.Errorf("tokenize prompt: %w", err)
		}
		e.head, e.tail = head, tail
	}
	room := e.opts.MaxTokens - len(e.head) - len(e.tail)
	if room < 1 {
		return nil, fmt.Errorf("%w: MaxTokens %d leaves no room for text inside the %d-token prompt", engine.ErrInvalidInput, e.opts.MaxTokens, len(e.head)+len(e.tail))
	}
	body, err := e.model.Tokenize(text, false, false)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	if len(body) == 0 {
		return nil, fmt.Errorf("%w: no tokens", engine.ErrInvalidInput)
	}
	body = body[:min(len(body), room)]
	return slices.Concat(e.head, body, e.tail), nil
}

// embedPass decodes texts as sequences 0..len-1 of one batch and pools each.
func (e *EngineEmbedder) embedPass(ctx context.Context, toks [][]engine.Token, out [][]float32) (err error) {
	defer func() {
		for s := range toks {
			if terr := e.ectx.Truncate(s, 0); terr != nil && err == nil {
				err = fmt.Errorf("embed: clear sequence %d: %w", s, terr)
			}
		}
		if err != nil && !errors.Is(err, engine.ErrAborted) {
			// A failed decode may leave the context in any state.
			e.ectx.Close()
			e.ectx = nil
		}
	}()
	e.batch.Reset()
	for s, tt := range toks {
		from, to := e.pooled(len(tt))
		for p, t := range tt {
			e.batch.Add(t, p, p >= from && p < to, s)
		}
	}
	if err := e.ectx.Decode(ctx, &e.batch); err != nil {
		return fmt.Errorf("embed: decode: %w", err)
	}
	base := 0 // batch row of the sequence's first token
	for s, tt := range toks {
		var sum []float64
		from, to := e.pooled(len(tt))
		for row := base + from; row < base+to; row++ {
			e.row, err = e.ectx.Embedding(row, e.row)
			if err != nil {
				return fmt.Errorf("embed: row %d: %w", row, err)
			}
			if sum == nil {
				sum = make([]float64, len(e.row))
			}
			for d, v := range e.row {
				sum[d] += float64(v)
			}
		}
		base += len(tt)
		v, err := normalize(sum)
		if err != nil {
			return fmt.Errorf("embed: sequence %d: %w", s, err)
		}
		out[s] = v
	}
	return nil
}

// pooled is the range [from, to) of an n-token text's positions whose
// states are averaged; only those rows come out of the forward pass.
func (e *EngineEmbedder) pooled(n int) (from, to int) {
	switch {
	case e.pooling == "mean":
		// sentence-transformers' mean: every token, [CLS] and [SEP] too.
		return 0, n
	case e.pooling == "cls":
		return 0, 1
	case e.pooling == "last", e.opts.Pooling == PoolPrompt:
		return n - 1, n
	case e.pooling != "":
		return 0, n
	case e.opts.KeepFirst || n == 1:
		return 0, n
	default:
		return 1, n
	}
}

// normalize scales v to unit length (the mean's 1/n cancels out).
func normalize(v []float64) ([]float32, error) {
	var ss float64
	for _, x := range v {
		ss += x * x
	}
	norm := math.Sqrt(ss)
	if norm == 0 || math.IsNaN(norm) || math.IsInf(norm, 0) {
		return nil, fmt.Errorf("%w: embedding has norm %v", engine.ErrInvalidInput, norm)
	}
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x / norm)
	}
	return out, nil
}

// Close frees the engine context.
func (e *EngineEmbedder) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ectx == nil {
		return nil
	}
	err := e.ectx.Close()
	e.ectx = nil
	return err
}
