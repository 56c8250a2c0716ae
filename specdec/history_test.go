package specdec

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func seqOf(ts ...int) []Token {
	out := make([]Token, len(ts))
	for i, t := range ts {
		out[i] = Token(t)
	}
	return out
}

// The store keeps the most recent sequences within its budget, a copy of
// each.
func TestHistory(t *testing.T) {
	_, err := NewHistory(0)
	require.ErrorIs(t, err, ErrInvalid)
	h, err := NewHistory(6)
	require.NoError(t, err)
	a := seqOf(1, 2, 3)
	h.Add(a)
	a[0] = 99
	h.Add(nil)
	h.Add(seqOf(4, 5))
	assert.Equal(t, [][]Token{seqOf(1, 2, 3), seqOf(4, 5)}, h.Sequences(), "a copy; empty ones skipped")
	h.Add(seqOf(6, 7))
	assert.Equal(t, [][]Token{seqOf(4, 5), seqOf(6, 7)}, h.Sequences(), "the oldest goes past the budget")
	assert.Equal(t, 4, h.Tokens())
	h.Add(seqOf(10, 11, 12, 13, 14, 15, 16, 17))
	assert.Equal(t, [][]Token{seqOf(12, 13, 14, 15, 16, 17)}, h.Sequences(), "a sequence past the budget keeps its end")
}
