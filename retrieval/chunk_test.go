package retrieval

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestChunkAlignsWithTokens(t *testing.T) {
	words := strings.Fields(strings.Repeat("the quick brown fox jumps over the lazy dog while zebras graze; ", 12))
	text := strings.Join(words, " ") + "\n"
	tests := []struct {
		name   string
		tok    Tokenizer
		text   string
		tokens int
	}{
		{"bytes", fakeModel(), text, 64},
		{"bytes-utf8", fakeModel(), strings.Repeat("Zürich straße – ünïcödé 東京 ", 20), 16},
		{"words", newWordTokenizer(), text, 10},
		{"sentencepiece", &spTokenizer{*newWordTokenizer()}, "Leading  double   spaces\tand tabs " + text, 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, bounds, err := tokenBounds(tc.tok, tc.text)
			require.NoError(t, err)
			isBound := map[int]bool{}
			for _, b := range bounds {
				isBound[b] = true
			}
			spans, err := chunkText(tc.tok, tc.text, ChunkOptions{Tokens: tc.tokens})
			require.NoError(t, err)
			require.Greater(t, len(spans), 2)

			var joined strings.Builder
			prevEnd := 0
			for i, s := range spans {
				assert.Equal(t, prevEnd, s.Start, "passage %d must start where %d ended", i, i-1)
				assert.True(t, isBound[s.Start] && isBound[s.End], "passage %d [%d,%d) must begin and end on token boundaries", i, s.Start, s.End)
				assert.LessOrEqual(t, s.Tokens, tc.tokens)
				assert.True(t, utf8.ValidString(tc.text[s.Start:s.End]), "passage %d is not valid UTF-8", i)
				joined.WriteString(tc.text[s.Start:s.End])
				prevEnd = s.End
			}
			assert.Equal(t, tc.text, joined.String(), "passages without overlap must tile the text")
			// A full passage re-tokenizes to exactly its token count
			// (the byte and word tokenizers are context-free).
			if tc.name == "bytes" || tc.name == "words" {
				toks, err := tc.tok.Tokenize(tc.text[spans[0].Start:spans[0].End], false, false)
				require.NoError(t, err)
				assert.Len(t, toks, tc.tokens)
			}
		})
	}
}

func TestTokenBoundsMatchPieces(t *testing.T) {
	tests := []struct {
		name string
		tok  Tokenizer
		text string
		trim bool // compare without surrounding white space
	}{
		{"bytes", fakeModel(), "naïve café, 東京!", false},
		{"words", newWordTokenizer(), "one two  three   four", false},
		{"sentencepiece adds a space and collapses runs", &spTokenizer{*newWordTokenizer()}, "alpha  beta\t\tgamma    delta", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			toks, bounds, err := tokenBounds(tc.tok, tc.text)
			require.NoError(t, err)
			require.Len(t, bounds, len(toks)+1)
			assert.Equal(t, 0, bounds[0])
			assert.Equal(t, len(tc.text), bounds[len(toks)])
			for i, tk := range toks {
				got, want := tc.text[bounds[i]:bounds[i+1]], string(tc.tok.Piece(tk))
				if tc.trim {
					got, want = strings.TrimSpace(got), strings.TrimSpace(want)
				}
				assert.Equal(t, want, got, "token %d", i)
			}
		})
	}
}

func TestChunkOverlap(t *testing.T) {
	text := strings.Repeat("abcdefghij", 20) // 200 bytes = 200 fake tokens
	tests := []struct {
		tokens, overlap int
		wantPassages    int
	}{
		{64, 0, 4},  // 0,64,128,192
		{64, 16, 4}, // stride 48: 0,48,96,144 (144+64 > 200)
		{64, 32, 6}, // stride 32: 0,32,...,160
		{64, 63, 137},
	}
	for _, tc := range tests {
		spans, err := chunkText(fakeModel(), text, ChunkOptions{Tokens: tc.tokens, Overlap: tc.overlap})
		require.NoError(t, err)
		require.Len(t, spans, tc.wantPassages, "tokens=%d overlap=%d", tc.tokens, tc.overlap)
		for i := 1; i < len(spans); i++ {
			shared := spans[i-1].End - spans[i].Start
			assert.Equal(t, tc.overlap, shared, "passages %d and %d share %d tokens", i-1, i, shared)
		}
		assert.Equal(t, 0, spans[0].Start)
		assert.Equal(t, len(text), spans[len(spans)-1].End)
	}
}

func TestChunkOptionsValidate(t *testing.T) {
	assert.NoError(t, ChunkOptions{Tokens: 64, Overlap: 63}.validate())
	assert.Error(t, ChunkOptions{Tokens: 64, Overlap: 64}.validate())
	assert.Error(t, ChunkOptions{Tokens: 64, Overlap: -1}.validate())
	assert.Equal(t, DefaultChunkTokens, ChunkOptions{}.withDefaults().Tokens)
}

func TestChunkDropsBlankPassages(t *testing.T) {
	text := "word" + strings.Repeat(" ", 100) + "end"
	spans, err := chunkText(fakeModel(), text, ChunkOptions{Tokens: 16})
	require.NoError(t, err)
	for _, s := range spans {
		assert.NotEmpty(t, strings.TrimSpace(text[s.Start:s.End]))
	}
	assert.Len(t, spans, 2)
}
