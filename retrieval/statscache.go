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

// statsSource is where a remote collection's statistics come from: the
// table counted once after it was written (weaviate's TermStats), and
// live counts while there is none.
type statsSource interface {
	TermStatsGeneration(ctx context.Context) (string, error)
	ReadTermStats(ctx context.Context) (weaviate.TermStats, bool, error)
	DocFreqs(ctx context.Context, terms []string, withTotals bool) (weaviate.Stats, error)
}

// statsCache gives a remote collection's corpus statistics and document
// frequencies. It reads them from the collection's stored table, which it
// holds in memory and looks at again every statsTTL (a write removes it;
// a rebuild replaces it). Without one it counts live and remembers the
// counts for statsTTL: the engine counts a term's passages by visiting
// them, so the costly terms are the common ones, which are exactly those
// queries repeat.
type statsCache struct {
	now func() time.Time
	src statsSource

	// looking serializes looks at the stored table.
	looking sync.Mutex

	mu        sync.Mutex
	table     *weaviate.TermStats // nil: none valid, count live
	checkedAt time.Time
	total     weaviate.Stats // Passages and Terms only
	totalAt   time.Time
	df        map[string]counted
}

// counted is a term's document frequency and when it was counted.
type counted struct {
	n  int
	at time.Time
}

func newStatsCache(src statsSource) *statsCache {
	return &statsCache{now: time.Now, src: src, df: map[string]counted{}}
}

// stats returns the statistics for terms.
func (c *statsCache) stats(ctx context.Context, terms []string) (weaviate.Stats, error) {
	tbl, err := c.storedTable(ctx)
	if err != nil {
		return weaviate.Stats{}, err
	}
	if tbl != nil {
		out := weaviate.Stats{Passages: tbl.Passages, Terms: tbl.Terms, DocFreq: make(map[string]int, len(terms))}
		for _, t := range terms {
			out.DocFreq[t] = tbl.DocFreq[t]
		}
		return out, nil
	}
	return c.live(ctx, terms)
}

// storedTable returns the collection's stored statistics (nil: none
// valid), looking at the collection again once statsTTL has passed and
// reading the table only when its generation changed.
func (c *statsCache) storedTable(ctx context.Context) (*weaviate.TermStats, error) {
	fresh := func() (*weaviate.TermStats, bool) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.table, !c.checkedAt.IsZero() && c.now().Sub(c.checkedAt) <= statsTTL
	}
	if tbl, ok := fresh(); ok {
		return tbl, nil
	}
	c.looking.Lock()
	defer c.looking.Unlock()
	held, ok := fresh()
	if ok {
		return held, nil // another query looked meanwhile
	}
	now := c.now()
	gen, err := c.src.TermStatsGeneration(ctx)
	if err != nil {
		return nil, err
	}
	var tbl *weaviate.TermStats
	switch {
	case gen == "":
	case held != nil && held.Generation == gen:
		tbl = held
	default:
		st, ok, err := c.src.ReadTermStats(ctx)
		if err != nil {
			return nil, err
		}
		if ok {
			tbl = &st
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.table, c.checkedAt = tbl, now
	return tbl, nil
}

// live returns the statistics for terms counted by the engine, asking
// only for what it does not hold fresh: the terms, and the totals.
func (c *statsCache) live(ctx context.Context, terms []string) (weaviate.Stats, error) {
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

	st, err := c.src.DocFreqs(ctx, missing, !fresh)
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
