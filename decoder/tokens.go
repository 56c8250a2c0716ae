package decoder

import (
	"fmt"
	"slices"

	"github.com/dragon-rag/dragon/engine"
)

// recentPrompts is how many prompt tokenizations a decoder remembers:
// a few generations' passages.
const recentPrompts = 64

// promptTokens remembers the tokens of recent prompts. A prompt recurs
// whenever a question retrieves the same passage again, and tokenizing a
// passage's prompt was a large share of what a warm answer did before its
// first token once the KV came from the cache.
type promptTokens struct {
	order []string // oldest first
	toks  map[string][]engine.Token
}

// tokenize returns text's tokens (with the BOS token and special tokens
// parsed, as prompts are tokenized), from memory when it was seen lately.
// The caller owns the slice.
func (p *promptTokens) tokenize(m engine.Model, text string) ([]engine.Token, error) {
	if toks, ok := p.toks[text]; ok {
		return slices.Clone(toks), nil
	}
	toks, err := m.Tokenize(text, true, true)
	if err != nil {
		return nil, fmt.Errorf("decoder: tokenize prompt: %w", err)
	}
	if p.toks == nil {
		p.toks = make(map[string][]engine.Token, recentPrompts)
	}
	if len(p.order) == recentPrompts {
		delete(p.toks, p.order[0])
		p.order = slices.Delete(p.order, 0, 1)
	}
	p.order = append(p.order, text)
	p.toks[text] = slices.Clone(toks)
	return toks, nil
}
