// Package engine is the language-model runtime seen by the rest of dragon:
// a loaded model (tokenizer, vocabulary, chat template) and decoding
// contexts that hold one KV sequence per slot.
//
// Two backends implement it: engine/llamacpp (llama.cpp through cgo, the
// real thing) and engine/fake (pure Go, deterministic, for tests of the
// layers above). Everything outside engine/ sees only these interfaces, so
// the pinned llama.cpp binding can be replaced without touching callers.
package engine

import (
	"context"
	"errors"
)

// Token is a vocabulary id.
type Token = int32

// Typed errors. Backends wrap them with context; test with errors.Is.
var (
	// ErrAborted: the decode was cancelled from another goroutine. The
	// context is usable afterwards and no position of the aborted batch
	// stays in any sequence.
	ErrAborted = errors.New("engine: decode aborted")
	// ErrContextFull: a sequence would grow past its share of the context.
	ErrContextFull = errors.New("engine: context full")
	// ErrBadModel: the model file is missing, unreadable or not a usable GGUF.
	ErrBadModel = errors.New("engine: bad model")
	// ErrInvalidInput: a caller error (empty prompt, sequence id out of
	// range, row without logits, ...).
	ErrInvalidInput = errors.New("engine: invalid input")
	// ErrClosed: the model or context was already closed.
	ErrClosed = errors.New("engine: closed")
)

// Role of a chat message.
type Role string

// Chat roles understood by the templates.
const (
	RoleSystem    Role = "system"
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
)

// Message is one turn of a chat prompt.
type Message struct {
	Role    Role
	Content string
}

// ModelInfo describes a loaded model.
type ModelInfo struct {
	Path      string
	Arch      string // general.architecture, e.g. "llama"
	Name      string // general.name
	VocabSize int
	EmbedDim  int
	TrainCtx  int
	// Fingerprint identifies the tokenizer and vocabulary (tokens, merges,
	// special ids; not the weights, shapes or architecture):
	// two models with the same fingerprint produce distributions over the
	// same token ids, so their next-token distributions can be mixed.
	Fingerprint string
	// Unused are the token ids the tokenizer marks unused: padding rows of
	// the output matrix (Qwen2.5's 151665-151935), which the decoder masks
	// so that no side ever emits one.
	Unused []Token
	// Pooling is how an embedding model's metadata says to pool its token
	// states into one vector of a text: "mean", "cls" or "last"; "rank"
	// for a cross-encoder, whose context scores each sequence (SeqScorer);
	// empty for a generative model.
	Pooling string
	// Bidirectional is set for encoders (BERT): every token attends to the
	// whole text, so a text is embedded in one pass, never in pieces.
	Bidirectional bool
}

// Model is a loaded model: safe for concurrent use by many goroutines.
type Model interface {
	Info() ModelInfo
	// Tokenize converts text to tokens. addSpecial adds BOS where the model
	// wants one; parseSpecial turns "<|im_start|>"-style text into control
	// tokens.
	Tokenize(text string, addSpecial, parseSpecial bool) ([]Token, error)
	// Piece returns the raw bytes of one token (possibly half a UTF-8
	// character; use Detokenizer to stream text).
	Piece(t Token) []byte
	// IsEOG reports whether t ends a generation (EOS, <|im_end|>, ...).
	IsEOG(t Token) bool
	// ChatPrompt renders messages with the model's chat template; with
	// addAssistant the text ends where the assistant's answer begins.
	ChatPrompt(msgs []Message, addAssistant bool) (string, error)
	// NewContext creates a decoding context with its own KV cache.
	NewContext(opts ContextOptions) (Context, error)
	Close() error
}

// ContextOptions configure a decoding context.
type ContextOptions struct {
	// CtxPerSeq is the number of KV positions each sequence may hold.
	CtxPerSeq int
	// MaxSeqs is the number of sequences; ids are 0..MaxSeqs-1.
	MaxSeqs int
	// BatchSize is the most tokens one Decode call may carry (0: CtxPerSeq).
	BatchSize int
	// Threads for compute (0: backend default).
	Threads int
	// Embeddings makes Decode also produce per-token hidden states.
	Embeddings bool
	// Unified keeps all sequences in one KV buffer: needed for tokens that
	// belong to several sequences and partial CopySeq (the decoder uses
	// neither: its token trees copy whole streams);
	// otherwise each sequence has its own stream (backend permitting). On
	// llama.cpp a sequence's results in a unified context depend, within
	// rounding, on where its cells lie among the other sequences' (attention
	// sums over the cells in buffer order), so they are not bit for bit those
	// of the sequence alone.
	Unified bool
	// Cells is the size of the unified KV buffer (0: CtxPerSeq·MaxSeqs).
	// Sequences that share a prefix share its cells, so many short-lived
	// branch sequences need far fewer cells than they would apart.
	Cells int
}

// Entry is one token of a batch.
type Entry struct {
	Token Token
	Pos   int
	// Seqs are the sequences this token belongs to; usually one. A token in
	// several sequences is computed once and visible to all of them (shared
	// prefixes, token trees).
	Seqs []int
	// Logits asks for this row's next-token logits (and embedding).
	Logits bool
}

// Batch is the input of one forward pass.
type Batch struct {
	Entries []Entry
}

// Add appends one token.
func (b *Batch) Add(t Token, pos int, logits bool, seqs ...int) {
	b.Entries = append(b.Entries, Entry{Token: t, Pos: pos, Seqs: seqs, Logits: logits})
}

// Reset empties the batch, keeping its storage.
func (b *Batch) Reset() { b.Entries = b.Entries[:0] }

// Len is the number of tokens in the batch.
func (b *Batch) Len() int { return len(b.Entries) }

// TokenLogit is one entry of a top-k list.
type TokenLogit struct {
	Token Token
	Logit float32
}

// SeqScorer is implemented by the embeddings contexts of ranking models
// (Pooling "rank"): after a Decode, the relevance score the model gave each
// sequence of the batch, read from its whole sequence.
type SeqScorer interface {
	SeqScore(seq int) (float32, error)
}

// Context is a decoding context. It is not safe for concurrent use except
// for Abort, which may be called from any goroutine.
type Context interface {
	// Decode runs one forward pass over the batch. Positions of each
	// sequence must continue where it ends (SeqLen). Cancelling ctx or
	// calling Abort stops a decode in flight with ErrAborted.
	Decode(ctx context.Context, b *Batch) error
	// Logits copies the logits of batch row i of the last Decode into dst
	// (grown as needed) and returns it.
	Logits(i int, dst []float32) ([]float32, error)
	// TopK returns the k largest logits of row i, largest first, without
	// copying the full row out of the backend.
	TopK(i, k int, dst []TokenLogit) ([]TokenLogit, error)
	// Embedding copies the hidden state of batch row i (Embeddings option).
	Embedding(i int, dst []float32) ([]float32, error)
	// SeqLen is the number of positions sequence seq holds.
	SeqLen(seq int) int
	// Truncate removes positions [pos, end) of sequence seq.
	Truncate(seq, pos int) error
	// CopySeq makes positions [p0, p1) of src also belong to dst, which
	// must hold exactly p0 positions (shares the cells, copies nothing).
	CopySeq(src, dst, p0, p1 int) error
	// SeqState serialises what sequence seq holds in the KV cache, for
	// SetSeqState on a context of the same model and options (DRCG/KV:
	// another machine prefills, this one decodes).
	SeqState(seq int) ([]byte, error)
	// SetSeqState loads a SeqState into sequence seq, which must be empty;
	// the state must hold positions [0, n).
	SetSeqState(seq int, state []byte, n int) error
	// Abort stops the decode in flight, if any.
	Abort()
	Options() ContextOptions
	VocabSize() int
	Close() error
}
