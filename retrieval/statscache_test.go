package retrieval

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/retrieval/weaviate"
)

// fakeStats is a collection's statistics as a statsSource sees them.
type fakeStats struct {
	df    map[string]int
	table *weaviate.TermStats // stored, or nil
	fail  bool

	asked       [][]string // live counts asked for
	totalsAsked []bool
	tableReads  int
}

func (f *fakeStats) TermStatsGeneration(context.Context) (string, error) {
	if f.fail {
		return "", errors.New("engine down")
	}
	if f.table == nil {
		return "", nil
	}
	return f.table.Generation, nil
}

func (f *fakeStats) ReadTermStats(context.Context) (weaviate.TermStats, bool, error) {
	f.tableReads++
	if f.table == nil {
		return weaviate.TermStats{}, false, nil
	}
	return *f.table, true, nil
}

func (f *fakeStats) DocFreqs(_ context.Context, terms []string, withTotals bool) (weaviate.Stats, error) {
	if f.fail {
		return weaviate.Stats{}, errors.New("engine down")
	}
	f.asked = append(f.asked, terms)
	f.totalsAsked = append(f.totalsAsked, withTotals)
	st := weaviate.Stats{DocFreq: map[string]int{}}
	if withTotals {
		st.Passages, st.Terms = 10, 100+int64(len(f.asked))
	}
	for _, t := range terms {
		st.DocFreq[t] = f.df[t]
	}
	return st, nil
}

func TestStatsCacheAsksOnlyForWhatItLacks(t *testing.T) {
	now := time.Unix(0, 0)
	src := &fakeStats{df: map[string]int{"volcano": 3, "etna": 1, "lava": 2}}
	c := newStatsCache(src)
	c.now = func() time.Time { return now }
	want := func(terms int64, m map[string]int) weaviate.Stats {
		return weaviate.Stats{Passages: 10, Terms: terms, DocFreq: m}
	}

	st, err := c.stats(t.Context(), []string{"etna", "volcano"})
	require.NoError(t, err)
	assert.Equal(t, want(101, map[string]int{"etna": 1, "volcano": 3}), st)

	st, err = c.stats(t.Context(), []string{"volcano", "lava"})
	require.NoError(t, err)
	assert.Equal(t, want(101, map[string]int{"volcano": 3, "lava": 2}), st, "the totals held")
	assert.Equal(t, [][]string{{"etna", "volcano"}, {"lava"}}, src.asked, "only the term not held")
	assert.Equal(t, []bool{true, false}, src.totalsAsked, "the totals fresh: not asked again")

	src.fail = true
	st, err = c.stats(t.Context(), []string{"lava", "etna"})
	require.NoError(t, err, "all held and fresh: no request")
	assert.Equal(t, want(101, map[string]int{"lava": 2, "etna": 1}), st)

	now = now.Add(statsTTL + time.Second)
	_, err = c.stats(t.Context(), []string{"etna"})
	assert.Error(t, err, "stale: asked again, and the engine's error comes back")
	src.fail = false
	src.df["etna"] = 5
	st, err = c.stats(t.Context(), []string{"etna"})
	require.NoError(t, err)
	assert.Equal(t, want(103, map[string]int{"etna": 5}), st, "a stale count is replaced")
	assert.Equal(t, []bool{true, false, true}, src.totalsAsked, "stale totals asked again")
	assert.Zero(t, src.tableReads, "no table stored: never read")
}

func TestStatsCacheReadsTheStoredTable(t *testing.T) {
	now := time.Unix(0, 0)
	gen1 := &weaviate.TermStats{Generation: "g1", Passages: 1000, Terms: 9000, DocFreq: map[string]int{"etna": 7, "volcano": 40}}
	src := &fakeStats{df: map[string]int{"etna": 99}, table: gen1}
	c := newStatsCache(src)
	c.now = func() time.Time { return now }

	st, err := c.stats(t.Context(), []string{"etna", "volcano", "absent"})
	require.NoError(t, err)
	assert.Equal(t, weaviate.Stats{Passages: 1000, Terms: 9000, DocFreq: map[string]int{"etna": 7, "volcano": 40, "absent": 0}}, st)
	assert.Empty(t, src.asked, "nothing counted live")

	now = now.Add(statsTTL + time.Second)
	_, err = c.stats(t.Context(), []string{"etna"})
	require.NoError(t, err)
	assert.Equal(t, 1, src.tableReads, "looked again, the same generation: not read again")

	now = now.Add(statsTTL + time.Second)
	src.table = &weaviate.TermStats{Generation: "g2", Passages: 1001, Terms: 9010, DocFreq: map[string]int{"etna": 8}}
	st, err = c.stats(t.Context(), []string{"etna"})
	require.NoError(t, err)
	assert.Equal(t, weaviate.Stats{Passages: 1001, Terms: 9010, DocFreq: map[string]int{"etna": 8}}, st, "a rebuilt table replaces the one held")
	assert.Equal(t, 2, src.tableReads)

	src.table = nil // a write removed it
	st, err = c.stats(t.Context(), []string{"etna"})
	require.NoError(t, err)
	assert.Equal(t, 8, st.DocFreq["etna"], "held until the next look")
	now = now.Add(statsTTL + time.Second)
	st, err = c.stats(t.Context(), []string{"etna"})
	require.NoError(t, err)
	assert.Equal(t, weaviate.Stats{Passages: 10, Terms: 101, DocFreq: map[string]int{"etna": 99}}, st, "none valid: counted live")
}
