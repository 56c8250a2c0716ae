package specdec

import (
	"os"
	"path/filepath"
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
// each, and reads back what it saved; a damaged file is refused.
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

	h, err = NewHistory(100)
	require.NoError(t, err)
	h.Add(seqOf(1, 2, 3))
	h.Add(seqOf(1<<31-1, 0, 151935))
	path := filepath.Join(t.TempDir(), "history")
	require.NoError(t, h.Save(path))
	back, err := LoadHistory(path, 100)
	require.NoError(t, err)
	assert.Equal(t, h.Sequences(), back.Sequences())
	small, err := LoadHistory(path, 3)
	require.NoError(t, err)
	assert.Equal(t, [][]Token{seqOf(1<<31-1, 0, 151935)}, small.Sequences(), "a smaller budget keeps the most recent")
	empty, err := LoadHistory(filepath.Join(t.TempDir(), "none"), 10)
	require.NoError(t, err)
	assert.Zero(t, empty.Tokens())

	b, err := os.ReadFile(path)
	require.NoError(t, err)
	for name, bad := range map[string][]byte{
		"a changed byte": func() []byte { c := append([]byte(nil), b...); c[len(historyMagic)+2] ^= 1; return c }(),
		"cut off":        b[:len(b)-3],
		"not a history":  []byte("hello, world"),
		"empty":          {},
	} {
		p := filepath.Join(t.TempDir(), "bad")
		require.NoError(t, os.WriteFile(p, bad, 0o644))
		_, err := LoadHistory(p, 100)
		assert.ErrorIs(t, err, ErrBadHistory, name)
	}
}
