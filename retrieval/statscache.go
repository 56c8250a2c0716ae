package retrieval

import (
	"context"
	"sync"
	"time"

	"github.com/dragon-rag/dragon/retrieval/weaviate"
)

// statsTTL bounds how stale a remote collection's BM25 statistics may be:
// while it is being filled, scores may differ from an exact count's for
// that long.
const statsTTL = 30 * time.Second

// statsCacheMax bounds the terms remembered; past it the cache starts
// over.
const statsCacheMax = 100_000

// statsCache remembers a remote collection's corpus statistics and
// document frequencies for statsTTL. The engine counts a term's passages
// by visiting them, so the costly terms are the common ones, which are
// exactly those queries repeat.
type statsCache struct {
	now func() time.Time

	mu      sync.Mutex
	total   weaviate.Stats // Passages and Terms only
	totalAt time.Time
	df      map[string]counted
}

// counted is a term's document frequency and when it was counted.
type counted struct {
	n  int
	at time.Time
}

func newStatsCache() *statsCache {
	return &statsCache{now: time.Now, df: map[string]counted{}}
}

// stats returns the statistics for terms, asking fetch only for what it
// does not hold fresh: the terms, and the totals.
func (c *statsCache) stats(ctx context.Context, terms []string, fetch func(ctx context.Context, terms []string, withTotals bool) (weaviate.Stats, error)) (weaviate.Stats, error) {
	out := weaviate.Stats{DocFreq: make(map[string]int, len(terms))}
	var missing []string
	c.mu.Lock()
	now := c.now()
	for _, t := range terms {
		if d, ok := c.df[t]; ok && now.Sub(d.at) <= statsTTL {
			out.DocFreq[t] = d.n
		} else {
			missing = append(missing, t)
		}
	}
	fresh := !c.totalAt.IsZero() && now.Sub(c.totalAt) <= statsTTL
	out.Passages, out.Terms = c.total.Passages, c.total.Terms
	c.mu.Unlock()
	if len(missing) == 0 && fresh {
		return out, nil
	}

	st, err := fetch(ctx, missing, !fresh)
	if err != nil {
		return weaviate.Stats{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.df)+len(missing) > statsCacheMax {
		c.df = map[string]counted{}
	}
	if !fresh {
		out.Passages, out.Terms = st.Passages, st.Terms
		c.total, c.totalAt = weaviate.Stats{Passages: st.Passages, Terms: st.Terms}, now
	}
	for _, t := range missing {
		out.DocFreq[t] = st.DocFreq[t]
		c.df[t] = counted{st.DocFreq[t], now}
	}
	return out, nil
}
