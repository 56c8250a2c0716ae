package retrieval

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSearchFilter(t *testing.T) {
	ix, _, _ := newEmptyIndex(t)
	defer ix.Close()
	var box strings.Builder
	for i, m := range []struct{ from, date string }{
		{"Ann <ann@example.com>", "Mon, 1 Jan 2001 10:00:00 +0000"},
		{"Bob <bob@example.com>", "Fri, 1 Jun 2001 10:00:00 +0000"},
		{"Ann <ann@example.com>", "Sat, 1 Dec 2001 10:00:00 +0000"},
		{"Cid <cid@example.com>", "not a date"},
	} {
		fmt.Fprintf(&box, "From x@y Mon Jan  1 00:00:00 2001\nFrom: %s\nSubject: boat %d\nDate: %s\n\nThe boat trip number %d went fine.\n\n", m.from, i, m.date, i)
	}
	_, err := ix.Put(t.Context(), "mail/box.mbox", []byte(box.String()), nil)
	require.NoError(t, err)
	_, err = ix.Put(t.Context(), "notes/boat.txt", []byte("A note on the boat trip, dated nowhere."), nil)
	require.NoError(t, err)
	_, err = ix.EmbedPending(t.Context(), 100)
	require.NoError(t, err)

	all, err := ix.Search(t.Context(), "boat trip", 10, ModeBM25)
	require.NoError(t, err)
	require.Len(t, all, 5)
	score := map[string]float64{}
	for _, h := range all {
		score[h.Passage.Source] = h.Score
	}
	day := func(s string) time.Time { d, _ := time.Parse("2006-01-02", s); return d }
	cases := []struct {
		name string
		f    Filter
		want []string
	}{
		{"source prefix", Filter{SourcePrefix: "notes/"}, []string{"notes/boat.txt"}},
		{"from", Filter{From: "ANN@"}, []string{"mail/box.mbox#1", "mail/box.mbox#3"}},
		{"date range", Filter{After: day("2001-05-01"), Before: day("2002-01-01")}, []string{"mail/box.mbox#2", "mail/box.mbox#3"}},
		{"from and after", Filter{From: "ann", After: day("2001-06-01")}, []string{"mail/box.mbox#3"}},
		{"nothing", Filter{From: "zed"}, nil},
	}
	for _, deep := range []bool{false, true} {
		if deep {
			old := exactFilterMax
			exactFilterMax = 0
			t.Cleanup(func() { exactFilterMax = old })
		}
		for _, tc := range cases {
			for _, mode := range []Mode{ModeBM25, ModeHybrid, ModeDense} {
				hits, err := SearchWith(t.Context(), ix, "boat trip", 10, mode, tc.f)
				require.NoError(t, err)
				var got []string
				for _, h := range hits {
					got = append(got, h.Passage.Source)
					if mode == ModeBM25 {
						assert.InDelta(t, score[h.Passage.Source], h.Score, 1e-9, "%s: a filter narrows, it does not re-score", tc.name)
					}
				}
				assert.ElementsMatch(t, tc.want, got, "%s, %v, deep pool %v", tc.name, mode, deep)
			}
		}
	}
	_, err = ix.SearchFilter(t.Context(), "boat", 2, ModeBM25, Filter{After: day("2002-01-01"), Before: day("2001-01-01")})
	assert.ErrorContains(t, err, "is not after")
}
