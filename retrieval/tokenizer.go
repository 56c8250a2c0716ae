package retrieval

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/dragon-rag/dragon/engine"
)

// Tokenizer is the part of a model that chunking needs. engine.Model
// satisfies it, so passages are cut on the generation model's own token
// boundaries and a passage of N tokens costs exactly N KV positions.
type Tokenizer interface {
	Tokenize(text string, addSpecial, parseSpecial bool) ([]engine.Token, error)
	// Piece returns the bytes a token stands for.
	Piece(t engine.Token) []byte
}

// tokenizerID names a tokenizer for the manifest: the vocabulary
// fingerprint of an engine.Model, else the Go type.
func tokenizerID(t Tokenizer) string {
	if m, ok := t.(interface{ Info() engine.ModelInfo }); ok {
		return m.Info().Fingerprint
	}
	return fmt.Sprintf("%T", t)
}

// tokenBounds tokenizes text and returns the byte offset where each token
// starts, plus len(text) at the end: token i covers text[b[i]:b[i+1]].
//
// The offsets come from matching each token's piece against the text, not
// from summing piece lengths, because tokenizers do not always reproduce
// their input: SentencePiece models add a leading space, some normalize
// characters, byte-fallback tokens split a UTF-8 character. Bytes that no
// piece accounts for are given to the token before them, so the bounds stay
// monotone and consecutive chunks tile the text exactly.
func tokenBounds(tok Tokenizer, text string) ([]engine.Token, []int, error) {
	// No BOS and no control-token parsing: a document that contains
	// "<|im_start|>" must not turn into a chat turn.
	toks, err := tok.Tokenize(text, false, false)
	if err != nil {
		return nil, nil, fmt.Errorf("tokenize: %w", err)
	}
	bounds := make([]int, len(toks)+1)
	pos := 0
	for i, t := range toks {
		bounds[i] = pos
		pos = advance(text, pos, tok.Piece(t))
	}
	bounds[len(toks)] = len(text)
	return toks, bounds, nil
}

// lookahead is how far past the cursor a normalized piece is searched for.
const lookahead = 64

// advance returns the cursor after matching piece at text[pos:].
func advance(text string, pos int, piece []byte) int {
	if len(piece) == 0 {
		return pos
	}
	rest := text[pos:]
	if strings.HasPrefix(rest, string(piece)) {
		return pos + len(piece)
	}
	// SentencePiece's "▁" prefix becomes a space the text may not have.
	if trimmed := bytes.TrimLeft(piece, " "); len(trimmed) < len(piece) {
		if len(trimmed) == 0 {
			return pos
		}
		if strings.HasPrefix(rest, string(trimmed)) {
			return pos + len(trimmed)
		}
		piece = trimmed
	}
	// Normalized or skipped characters: resynchronize a little further on.
	window := rest[:min(len(rest), lookahead+len(piece))]
	if i := strings.Index(window, string(piece)); i >= 0 {
		return pos + i + len(piece)
	}
	return pos
}
