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

func TestStatsCacheAsksOnlyForWhatItLacks(t *testing.T) {
	now := time.Unix(0, 0)
	c := newStatsCache()
	c.now = func() time.Time { return now }
	df := map[string]int{"volcano": 3, "etna": 1, "lava": 2}
	var asked [][]string
	var totalsAsked []bool
	fail := false
	fetch := func(_ context.Context, terms []string, withTotals bool) (weaviate.Stats, error) {
		if fail {
			return weaviate.Stats{}, errors.New("engine down")
		}
		asked = append(asked, terms)
		totalsAsked = append(totalsAsked, withTotals)
		st := weaviate.Stats{DocFreq: map[string]int{}}
		if withTotals {
			st.Passages, st.Terms = 10, 100+int64(len(asked))
		}
		for _, t := range terms {
			st.DocFreq[t] = df[t]
		}
		return st, nil
	}
	want := func(terms int64, m map[string]int) weaviate.Stats {
		return weaviate.Stats{Passages: 10, Terms: terms, DocFreq: m}
	}

	st, err := c.stats(t.Context(), []string{"etna", "volcano"}, fetch)
	require.NoError(t, err)
	assert.Equal(t, want(101, map[string]int{"etna": 1, "volcano": 3}), st)

	st, err = c.stats(t.Context(), []string{"volcano", "lava"}, fetch)
	require.NoError(t, err)
	assert.Equal(t, want(101, map[string]int{"volcano": 3, "lava": 2}), st, "the totals held")
	assert.Equal(t, [][]string{{"etna", "volcano"}, {"lava"}}, asked, "only the term not held")
	assert.Equal(t, []bool{true, false}, totalsAsked, "the totals fresh: not asked again")

	fail = true
	st, err = c.stats(t.Context(), []string{"lava", "etna"}, fetch)
	require.NoError(t, err, "all held and fresh: no request")
	assert.Equal(t, want(101, map[string]int{"lava": 2, "etna": 1}), st)

	now = now.Add(statsTTL + time.Second)
	_, err = c.stats(t.Context(), []string{"etna"}, fetch)
	assert.Error(t, err, "stale: asked again, and the engine's error comes back")
	fail = false
	df["etna"] = 5
	st, err = c.stats(t.Context(), []string{"etna"}, fetch)
	require.NoError(t, err)
	assert.Equal(t, want(103, map[string]int{"etna": 5}), st, "a stale count is replaced")
	assert.Equal(t, []bool{true, false, true}, totalsAsked, "stale totals asked again")
}
