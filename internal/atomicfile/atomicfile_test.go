package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A write replaces the file; a failed one leaves the old file and no
// temporary beside it.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	require.NoError(t, Write(path, func(w io.Writer) error { _, err := io.WriteString(w, "one"); return err }))
	require.NoError(t, Write(path, func(w io.Writer) error { _, err := io.WriteString(w, "two"); return err }))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "two", string(b))

	boom := errors.New("boom")
	err = Write(path, func(w io.Writer) error { io.WriteString(w, "half"); return boom })
	require.ErrorIs(t, err, boom)
	b, err = os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "two", string(b), "the old file stays")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file left")
}
