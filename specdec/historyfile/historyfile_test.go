package historyfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/specdec"
)

func seqOf(ts ...int) []specdec.Token {
	out := make([]specdec.Token, len(ts))
	for i, t := range ts {
		out[i] = specdec.Token(t)
	}
	return out
}

// A saved store reads back whole, or its most recent part into a smaller
// budget; a missing file is an empty store; a damaged one is refused.
func TestSaveAndLoad(t *testing.T) {
	h, err := specdec.NewHistory(100)
	require.NoError(t, err)
	h.Add(seqOf(1, 2, 3))
	h.Add(seqOf(1<<31-1, 0, 151935))
	path := filepath.Join(t.TempDir(), "history")
	require.NoError(t, Save(h, path))
	back, err := Load(path, 100)
	require.NoError(t, err)
	assert.Equal(t, h.Sequences(), back.Sequences())
	small, err := Load(path, 3)
	require.NoError(t, err)
	assert.Equal(t, [][]specdec.Token{seqOf(1<<31-1, 0, 151935)}, small.Sequences(), "a smaller budget keeps the most recent")
	empty, err := Load(filepath.Join(t.TempDir(), "none"), 10)
	require.NoError(t, err)
	assert.Zero(t, empty.Tokens())

	b, err := os.ReadFile(path)
	require.NoError(t, err)
	for name, bad := range map[string][]byte{
		"a changed byte": func() []byte { c := append([]byte(nil), b...); c[len(magic)+2] ^= 1; return c }(),
		"cut off":        b[:len(b)-3],
		"not a history":  []byte("hello, world"),
		"empty":          {},
	} {
		p := filepath.Join(t.TempDir(), "bad")
		require.NoError(t, os.WriteFile(p, bad, 0o644))
		_, err := Load(p, 100)
		assert.ErrorIs(t, err, ErrBad, name)
	}
}
