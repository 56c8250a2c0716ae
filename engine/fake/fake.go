// Package fake is a deterministic, pure-Go engine backend for testing the
// layers above engine without cgo or weights.
//
// Tokens are bytes (id = byte + ByteOffset) plus a few control tokens, so
// text round-trips exactly and multi-byte UTF-8 spans several tokens. The
// logits of a position depend only on the tokens of its sequence up to and
// including it, which makes batched and one-by-one decoding agree exactly.
// They mix a pseudo-random part seeded by the last Order tokens with a bonus
// for the token that followed the previous occurrence of the current bigram,
// (or, with CopyOrder 1, of the last token), so text in the context is
// likely to be copied, as in RAG.
package fake

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dragon-rag/dragon/engine"
)

// Control tokens.
const (
	TokBOS      engine.Token = 0
	TokEOS      engine.Token = 1 // <|im_end|>
	TokImStart  engine.Token = 2 // <|im_start|>
	ByteOffset               = 3
	MinVocab                 = ByteOffset + 256
	imStartText              = "<|im_start|>"
	imEndText                = "<|im_end|>"
)

// Config shapes the fake model's distributions.
type Config struct {
	Vocab int     // vocabulary size, at least MinVocab (default MinVocab)
	Seed  uint64  // varies the distributions
	Order int     // how many trailing tokens seed the random part (default 3)
	Scale float64 // spread of random logits (default 2)
	Copy  float64 // logit bonus for continuing an n-gram seen earlier (default 4)
	// CopyOrder is the n of that n-gram: 2 (default) continues bigrams, 1
	// continues any token seen before, so the model copies far more often.
	CopyOrder int
	// Latency is slept per batch token and CallLatency per Decode call
	// (waiting for aborts), so tests can exercise preemption and a
	// memory-bound cost shape: a k-token pass costing far less than k
	// one-token passes.
	Latency     time.Duration
	CallLatency time.Duration
	Name        string
	// Unused are ids the tokenizer marks unused (ModelInfo.Unused).
	Unused []engine.Token
}

func (c Config) withDefaults() Config {
	if c.Vocab < MinVocab {
		c.Vocab = MinVocab
	}
	if c.Order <= 0 {
		c.Order = 3
	}
	if c.Scale == 0 {
		c.Scale = 2
	}
	if c.Copy == 0 {
		c.Copy = 4
	}
	if c.CopyOrder <= 0 {
		c.CopyOrder = 2
	}
	if c.Name == "" {
		c.Name = "fake"
	}
	return c
}

// Model is a fake model.
type Model struct {
	cfg Config
}

// New returns a fake model.
func New(cfg Config) *Model { return &Model{cfg: cfg.withDefaults()} }

// Info implements engine.Model.
func (m *Model) Info() engine.ModelInfo {
	return engine.ModelInfo{
		Path: "fake:" + m.cfg.Name, Arch: "fake", Name: m.cfg.Name,
		VocabSize: m.cfg.Vocab, EmbedDim: 16, TrainCtx: 1 << 16,
		Fingerprint: fmt.Sprintf("fake-bytes-v1/vocab=%d", m.cfg.Vocab),
		Unused:      m.cfg.Unused,
	}
}

// Tokenize implements engine.Model.
func (m *Model) Tokenize(text string, addSpecial, parseSpecial bool) ([]engine.Token, error) {
	var out []engine.Token
	if addSpecial {
		out = append(out, TokBOS)
	}
	for len(text) > 0 {
		if parseSpecial && strings.HasPrefix(text, imStartText) {
			out = append(out, TokImStart)
			text = text[len(imStartText):]
			continue
		}
		if parseSpecial && strings.HasPrefix(text, imEndText) {
			out = append(out, TokEOS)
			text = text[len(imEndText):]
			continue
		}
		out = append(out, engine.Token(text[0])+ByteOffset)
		text = text[1:]
	}
	return out, nil
}

// Piece implements engine.Model.
func (m *Model) Piece(t engine.Token) []byte {
	switch {
	case t == TokImStart:
		return []byte(imStartText)
	case t == TokEOS:
		return []byte(imEndText)
	case t >= ByteOffset && t < ByteOffset+256:
		return []byte{byte(t - ByteOffset)}
	}
	return nil
}

// IsEOG implements engine.Model.
func (m *Model) IsEOG(t engine.Token) bool { return t == TokEOS }

// ChatPrompt implements engine.Model with ChatML.
func (m *Model) ChatPrompt(msgs []engine.Message, addAssistant bool) (string, error) {
	if len(msgs) == 0 {
		return "", fmt.Errorf("%w: no messages", engine.ErrInvalidInput)
	}
	var b strings.Builder
	for _, msg := range msgs {
		fmt.Fprintf(&b, "%s%s\n%s%s\n", imStartText, msg.Role, msg.Content, imEndText)
	}
	if addAssistant {
		b.WriteString(imStartText + "assistant\n")
	}
	return b.String(), nil
}

// NewContext implements engine.Model.
func (m *Model) NewContext(opts engine.ContextOptions) (engine.Context, error) {
	if opts.MaxSeqs <= 0 || opts.CtxPerSeq <= 0 {
		return nil, fmt.Errorf("%w: context needs MaxSeqs and CtxPerSeq > 0 (got %d, %d)", engine.ErrInvalidInput, opts.MaxSeqs, opts.CtxPerSeq)
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = opts.CtxPerSeq
	}
	return &Context{
		model: m,
		opts:  opts,
		lens:  engine.NewSeqLens(opts.MaxSeqs, opts.CtxPerSeq),
		seqs:  make([][]engine.Token, opts.MaxSeqs),
	}, nil
}

// Close implements engine.Model.
func (m *Model) Close() error { return nil }

// Distribution returns the fake model's logits for the next token after
// history, the whole sequence so far. Exposed so tests can compute expected
// values by hand.
func (m *Model) Distribution(history []engine.Token) []float32 {
	return m.logits(history, make([]float32, m.cfg.Vocab))
}

func (m *Model) logits(history []engine.Token, out []float32) []float32 {
	cfg := m.cfg
	h := fnv.New64a()
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], cfg.Seed)
	h.Write(buf[:])
	start := max(0, len(history)-cfg.Order)
	for _, t := range history[start:] {
		binary.LittleEndian.PutUint32(buf[:4], uint32(t))
		h.Write(buf[:4])
	}
	rng := rand.New(rand.NewPCG(h.Sum64(), cfg.Seed^0x9e3779b97f4a7c15))
	for j := range out {
		out[j] = float32(rng.NormFloat64() * cfg.Scale)
	}
	// Control tokens other than EOS are never predicted.
	out[TokBOS] = -30
	out[TokImStart] = -30
	out[TokEOS] -= 3
	if k := cfg.CopyOrder; len(history) >= k {
		tail := history[len(history)-k:]
		for i := len(history) - 2; i >= k-1; i-- {
			if slices.Equal(history[i-k+1:i+1], tail) {
				out[history[i+1]] += float32(cfg.Copy)
				break
			}
		}
	}
	return out
}

// Context is a fake decoding context.
type Context struct {
	model *Model
	opts  engine.ContextOptions
	lens  *engine.SeqLens
	seqs  [][]engine.Token // tokens by position, per sequence

	rows    [][]float32 // logits of the last decode, by batch row
	hasRow  []bool
	abortMu sync.Mutex
	abortCh chan struct{}
	closed  bool
}

// Decode implements engine.Context.
func (c *Context) Decode(ctx context.Context, b *engine.Batch) error {
	if c.closed {
		return engine.ErrClosed
	}
	if err := c.lens.Check(b, c.model.cfg.Vocab, c.opts.BatchSize); err != nil {
		return err
	}
	abort := c.arm()
	defer c.disarm()
	if delay := c.model.cfg.CallLatency + c.model.cfg.Latency*time.Duration(len(b.Entries)); delay > 0 {
		timer := time.NewTimer(delay)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-abort:
			return engine.ErrAborted
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", engine.ErrAborted, ctx.Err())
		}
	} else if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", engine.ErrAborted, ctx.Err())
	}

	n := len(b.Entries)
	c.rows = slices.Grow(c.rows[:0], n)[:n]
	c.hasRow = slices.Grow(c.hasRow[:0], n)[:n]
	for i, e := range b.Entries {
		for _, seq := range e.Seqs {
			c.seqs[seq] = append(c.seqs[seq][:e.Pos], e.Token)
		}
		c.hasRow[i] = e.Logits
		if e.Logits {
			if c.rows[i] == nil {
				c.rows[i] = make([]float32, c.model.cfg.Vocab)
			}
			c.model.logits(c.seqs[e.Seqs[0]], c.rows[i])
		}
	}
	c.lens.Apply(b)
	return nil
}

func (c *Context) arm() chan struct{} {
	c.abortMu.Lock()
	defer c.abortMu.Unlock()
	c.abortCh = make(chan struct{})
	return c.abortCh
}

func (c *Context) disarm() {
	c.abortMu.Lock()
	defer c.abortMu.Unlock()
	c.abortCh = nil
}

// Abort implements engine.Context.
func (c *Context) Abort() {
	c.abortMu.Lock()
	defer c.abortMu.Unlock()
	if c.abortCh != nil {
		close(c.abortCh)
		c.abortCh = nil
	}
}

func (c *Context) row(i int) ([]float32, error) {
	if i < 0 || i >= len(c.hasRow) || !c.hasRow[i] {
		return nil, fmt.Errorf("%w: batch row %d has no logits", engine.ErrInvalidInput, i)
	}
	return c.rows[i], nil
}

// Logits implements engine.Context.
func (c *Context) Logits(i int, dst []float32) ([]float32, error) {
	r, err := c.row(i)
	if err != nil {
		return dst, err
	}
	return append(dst[:0], r...), nil
}

// TopK implements engine.Context.
func (c *Context) TopK(i, k int, dst []engine.TokenLogit) ([]engine.TokenLogit, error) {
	r, err := c.row(i)
	if err != nil {
		return dst, err
	}
	return engine.TopK(r, k, dst), nil
}

// Embedding implements engine.Context: a fixed projection of the logits.
func (c *Context) Embedding(i int, dst []float32) ([]float32, error) {
	if !c.opts.Embeddings {
		return dst, fmt.Errorf("%w: context created without embeddings", engine.ErrInvalidInput)
	}
	r, err := c.row(i)
	if err != nil {
		return dst, err
	}
	dst = slices.Grow(dst[:0], 16)[:16]
	clear(dst)
	for j, v := range r {
		dst[j%16] += v
	}
	var norm float64
	for _, v := range dst {
		norm += float64(v * v)
	}
	for j := range dst {
		dst[j] /= float32(math.Sqrt(norm) + 1e-9)
	}
	return dst, nil
}

// SeqLen implements engine.Context.
func (c *Context) SeqLen(seq int) int { return c.lens.Len(seq) }

// Truncate implements engine.Context.
func (c *Context) Truncate(seq, pos int) error {
	if err := c.lens.Truncate(seq, pos); err != nil {
		return err
	}
	c.seqs[seq] = c.seqs[seq][:c.lens.Len(seq)]
	return nil
}

// CopySeq implements engine.Context.
func (c *Context) CopySeq(src, dst, p0, p1 int) error {
	if err := c.lens.Copy(src, dst, p0, p1); err != nil {
		return err
	}
	c.seqs[dst] = append(c.seqs[dst][:p0], c.seqs[src][p0:p1]...)
	return nil
}

// stateMagic starts a fake sequence state.
const stateMagic = "fake-seq-v1"

// SeqState implements engine.Context: the sequence's tokens.
func (c *Context) SeqState(seq int) ([]byte, error) {
	if c.closed {
		return nil, engine.ErrClosed
	}
	if seq < 0 || seq >= len(c.seqs) || c.lens.Len(seq) == 0 {
		return nil, fmt.Errorf("%w: no state in sequence %d", engine.ErrInvalidInput, seq)
	}
	out := []byte(stateMagic)
	for _, t := range c.seqs[seq][:c.lens.Len(seq)] {
		out = binary.AppendUvarint(out, uint64(t))
	}
	return out, nil
}

// SetSeqState implements engine.Context.
func (c *Context) SetSeqState(seq int, state []byte, n int) error {
	if c.closed {
		return engine.ErrClosed
	}
	if !strings.HasPrefix(string(state), stateMagic) {
		return fmt.Errorf("%w: not a fake sequence state", engine.ErrInvalidInput)
	}
	var toks []engine.Token
	for b := state[len(stateMagic):]; len(b) > 0; {
		v, k := binary.Uvarint(b)
		if k <= 0 || v >= uint64(c.model.cfg.Vocab) {
			return fmt.Errorf("%w: corrupt fake sequence state", engine.ErrInvalidInput)
		}
		toks, b = append(toks, engine.Token(v)), b[k:]
	}
	if len(toks) != n {
		return fmt.Errorf("%w: a state of %d positions loaded as %d", engine.ErrInvalidInput, len(toks), n)
	}
	if err := c.lens.Load(seq, n); err != nil {
		return err
	}
	c.seqs[seq] = toks
	return nil
}

// Options implements engine.Context.
func (c *Context) Options() engine.ContextOptions { return c.opts }

// VocabSize implements engine.Context.
func (c *Context) VocabSize() int { return c.model.cfg.Vocab }

// Close implements engine.Context.
func (c *Context) Close() error { c.closed = true; return nil }
