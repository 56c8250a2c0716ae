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

// TestMedianRun: the run of median tokens/s, the lower middle of an even
// count, with every run's tokens/s in run order; one run as it is.
func TestMedianRun(t *testing.T) {
	one := Mode{TokS: 3, PinnedMB: 1}
	assert.Equal(t, one, medianRun([]Mode{one}))
	for _, c := range []struct {
		name string
		runs []Mode
		want Mode
	}{
		{"odd", []Mode{{TokS: 5, PinnedMB: 1}, {TokS: 2, PinnedMB: 2}, {TokS: 3, PinnedMB: 3}},
			Mode{TokS: 3, PinnedMB: 3, TokSRuns: []float64{5, 2, 3}}},
		{"even", []Mode{{TokS: 4, PinnedMB: 1}, {TokS: 1, PinnedMB: 2}, {TokS: 3, PinnedMB: 3}, {TokS: 2, PinnedMB: 4}},
			Mode{TokS: 2, PinnedMB: 4, TokSRuns: []float64{4, 1, 3, 2}}},
	} {
		assert.Equal(t, c.want, medianRun(c.runs), c.name)
	}
}

// TestPassTimes: each size's count, median (the mean of the middle two
// of an even count) and slowest; none, nil.
func TestPassTimes(t *testing.T) {
	assert.Nil(t, passTimes(nil))
	assert.Equal(t, map[int]PassTimes{
		1: {Passes: 3, MedianMS: 300, MaxMS: 310},
		9: {Passes: 4, MedianMS: 525, MaxMS: 600},
	}, passTimes(map[int][]float64{1: {310, 290, 300}, 9: {600, 500, 550, 480}}))
}
