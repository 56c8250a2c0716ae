package retrieval

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Chunking defaults.
const (
	DefaultChunkTokens = 64
	DefaultOverlap     = 0
)

// ChunkOptions size passages in model tokens.
type ChunkOptions struct {
	// Tokens is the most tokens a passage holds (default 64).
	Tokens int
	// Overlap is how many tokens a passage shares with the one before it,
	// so that a sentence cut by a boundary is whole in one of the two.
	Overlap int
}

func (o ChunkOptions) withDefaults() ChunkOptions {
	if o.Tokens <= 0 {
		o.Tokens = DefaultChunkTokens
	}
	return o
}

func (o ChunkOptions) validate() error {
	if o.Overlap < 0 || o.Overlap >= o.Tokens {
		return fmt.Errorf("retrieval: overlap %d must be in [0, %d) for %d-token passages", o.Overlap, o.Tokens, o.Tokens)
	}
	return nil
}

// span is one passage of a text: bytes [Start, End) holding Tokens tokens.
type span struct {
	Start, End int
	Tokens     int
}

// chunkText cuts text into passages of at most opts.Tokens tokens, each
// starting where a token starts. Passages that hold only white space are
// dropped.
func chunkText(tok Tokenizer, text string, opts ChunkOptions) ([]span, error) {
	_, bounds, err := tokenBounds(tok, text)
	if err != nil {
		return nil, err
	}
	return chunkBounds(text, bounds, opts), nil
}

// chunkBounds is chunkText after tokenization: bounds[i] is where token i
// starts and bounds[n] == len(text).
func chunkBounds(text string, bounds []int, opts ChunkOptions) []span {
	n := len(bounds) - 1
	var out []span
	for start := 0; start < n; {
		end := min(start+opts.Tokens, n)
		// Byte-level tokenizers may split a character over several tokens;
		// never cut inside one, or the passage would not be valid UTF-8.
		for end < n && end > start+1 && !runeStartAt(text, bounds[end]) {
			end--
		}
		s := span{Start: bounds[start], End: bounds[end], Tokens: end - start}
		if strings.TrimSpace(text[s.Start:s.End]) != "" {
			out = append(out, s)
		}
		if end == n {
			break
		}
		next := max(end-opts.Overlap, start+1)
		for next < end && !runeStartAt(text, bounds[next]) {
			next++
		}
		start = next
	}
	return out
}

func runeStartAt(text string, i int) bool {
	return i >= len(text) || utf8.RuneStart(text[i])
}
