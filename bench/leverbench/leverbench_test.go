package leverbench

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/specdec"
)

// TestModesSpeculate: each mode's local speculation, and an unknown mode
// refused.
func TestModesSpeculate(t *testing.T) {
	for _, c := range []struct {
		mode    string
		enabled bool
		tree    int
	}{
		{"unbudgeted", false, 0},
		{"plain", false, 0},
		{"linear", true, 1},
		{"trees", true, specdec.DefaultTreeBudget},
		{"draft", true, 1},
		{"trees-draft", true, specdec.DefaultTreeBudget},
	} {
		o, ok := specOf(c.mode)
		require.True(t, ok, c.mode)
		assert.Equal(t, c.enabled, o.Enabled, c.mode)
		if c.enabled {
			assert.Equal(t, c.tree, o.TreeBudget, c.mode)
			assert.NoError(t, o.Validate(), c.mode)
		}
	}
	for _, m := range Modes {
		_, ok := specOf(m)
		assert.True(t, ok, m)
	}
	_, ok := specOf("telepathy")
	assert.False(t, ok)
}

// TestProcReads: this process's status and I/O counters parse.
func TestProcReads(t *testing.T) {
	rss, err := procStatus("VmRSS")
	require.NoError(t, err)
	assert.Positive(t, rss)
	_, err = procStatus("NoSuchField")
	assert.Error(t, err)
	assert.GreaterOrEqual(t, readFromStorage(), int64(0))
}
