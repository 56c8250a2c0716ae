package cachebench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/dragon-rag/dragon/bench/loadbench"
	"github.com/dragon-rag/dragon/retrieval"
)

// PoolEntry is a cloud passage of the load's pool and a query that
// retrieves it first.
type PoolEntry struct {
	// Rank is the passage's Zipf rank, 1-based.
	Rank      int    `json:"rank"`
	PassageID uint64 `json:"passage_id"`
	Source    string `json:"source"`
	Query     string `json:"query"`
}

// Searcher retrieves the k best passages for a query, as the cloud does.
type Searcher func(ctx context.Context, query string, k int) ([]retrieval.Hit, error)

// Excerpt is a run of words words of text a quarter of the way in (the
// whole text when it is shorter), "" when text has fewer than minWords
// words: a query that retrieves the passage it comes from.
func Excerpt(text string, words, minWords int) string {
	f := strings.Fields(text)
	if len(f) < minWords {
		return ""
	}
	start := min(len(f)/4, max(0, len(f)-words))
	return strings.Join(f[start:min(len(f), start+words)], " ")
}

// BuildPool takes size passages evenly spaced through passages (index
// order), makes a query of each (Excerpt, 16 words, at least 12), and keeps
// those the searcher retrieves first (by id, or an identical text); ranks
// follow the passages' order. dropped counts the passages left out.
func BuildPool(ctx context.Context, passages []retrieval.Passage, size int, search Searcher) (pool []PoolEntry, dropped int, err error) {
	if size < 1 || len(passages) == 0 {
		return nil, 0, errors.New("cachebench: a pool needs passages and a size ≥ 1")
	}
	size = min(size, len(passages))
	seen := map[string]bool{}
	for i := range size {
		p := passages[i*len(passages)/size]
		q := Excerpt(p.Text, 16, 12)
		if q == "" || seen[q] {
			dropped++
			continue
		}
		hits, err := search(ctx, q, 1)
		if err != nil {
			return nil, 0, fmt.Errorf("cachebench: search %q: %w", q, err)
		}
		if len(hits) == 0 || (hits[0].Passage.ID != p.ID && hits[0].Passage.Text != p.Text) {
			dropped++
			continue
		}
		seen[q] = true
		pool = append(pool, PoolEntry{Rank: len(pool) + 1, PassageID: p.ID, Source: p.Source, Query: q})
	}
	if len(pool) == 0 {
		return nil, dropped, errors.New("cachebench: no passage of the pool is retrieved first by its excerpt")
	}
	return pool, dropped, nil
}

// Draws are the pool indices (rank - 1) of each request: by concurrency,
// then client, then request.
type Draws map[int][][]int

// DrawRequests draws, from z, a pool index for each request of each
// client at each concurrency, in that order.
func DrawRequests(z *Zipf, concurrency []int, requests int) Draws {
	d := Draws{}
	for _, n := range concurrency {
		if _, ok := d[n]; ok {
			continue
		}
		per := make([][]int, n)
		for c := range per {
			for range requests {
				per[c] = append(per[c], z.Rank()-1)
			}
		}
		d[n] = per
	}
	return d
}

// Distinct is how many pool indices the draws name, and how many draws
// there are.
func (d Draws) Distinct() (distinct, total int) {
	seen := map[int]bool{}
	for _, per := range d {
		for _, reqs := range per {
			for _, i := range reqs {
				seen[i] = true
				total++
			}
		}
	}
	return len(seen), total
}

// LoadResult is the load part: the same Zipf-drawn requests against a
// cloud without its KV cache and with it.
type LoadResult struct {
	TokSOff map[string]float64 `json:"tok_s_off"`
	TokSOn  map[string]float64 `json:"tok_s_on"`
	// HitRate is the cloud's hits of all tiers over hits and misses,
	// during the cache-on runs (all concurrencies); HitRateBy per
	// concurrency; Hits by tier and Misses in all.
	HitRate   float64            `json:"hit_rate"`
	HitRateBy map[string]float64 `json:"hit_rate_by_concurrency"`
	Hits      map[string]float64 `json:"hits"`
	Misses    float64            `json:"misses"`
	// The pool: passages kept and dropped (not retrieved first by their
	// excerpt), Zipf's s and seed, draws and the distinct pool entries
	// they name.
	Pool        int     `json:"pool"`
	PoolDropped int     `json:"pool_dropped"`
	ZipfS       float64 `json:"zipf_s"`
	Seed        uint64  `json:"seed"`
	Draws       int     `json:"draws"`
	Distinct    int     `json:"distinct_queries"`
	Requests    int     `json:"requests_per_client"`
	MaxTokens   int     `json:"max_tokens"`
	Passages    int     `json:"passages"`
	// Off and On are bench load's whole results (the engine's ceiling is
	// replayed once, in Off).
	Off loadbench.Result `json:"off"`
	On  loadbench.Result `json:"on"`
}

// LoadOptions of the load part.
type LoadOptions struct {
	// Base is bench load's options (binary, model, engine, cloud index,
	// concurrencies, requests, tokens, passages, cores, prompts for the
	// replay: none skips it); its Questions, Pick and CloudFlags are set
	// here.
	Base        loadbench.Options
	Pool        []PoolEntry
	PoolDropped int
	S           float64
	Seed        uint64
}

// Cache metric families of a daemon's /metrics.
const (
	metricHits   = "dragon_kvcache_hits_total"
	metricMisses = "dragon_kvcache_misses_total"
)

// RunLoad runs bench load twice with the same Zipf-drawn queries: the
// cloud's KV cache off (--kv-cache-mb 0), then on (its default).
func RunLoad(ctx context.Context, o LoadOptions) (LoadResult, error) {
	if len(o.Pool) == 0 {
		return LoadResult{}, errors.New("cachebench: empty pool")
	}
	z, err := NewZipf(NewRand(o.Seed), o.S, len(o.Pool))
	if err != nil {
		return LoadResult{}, err
	}
	draws := DrawRequests(z, o.Base.Concurrency, o.Base.Requests)
	res := LoadResult{Pool: len(o.Pool), PoolDropped: o.PoolDropped, ZipfS: o.S, Seed: o.Seed,
		Requests: o.Base.Requests, MaxTokens: o.Base.MaxTokens, Passages: o.Base.Passages}
	res.Distinct, res.Draws = draws.Distinct()
	base := o.Base
	base.Questions = make([]string, len(o.Pool))
	for i, p := range o.Pool {
		base.Questions[i] = p.Query
	}
	base.Pick = func(n, c, r int) int { return draws[n][c][r] }
	base.Metrics = []string{metricHits, metricMisses}
	log := base.Log
	if log == nil {
		log = func(string, ...any) {}
	}

	off := base
	off.CloudFlags = append(slices.Clone(base.CloudFlags), "--kv-cache-mb", "0")
	off.NoReplay = base.Prompts == nil
	log("load: the cloud's KV cache off")
	if res.Off, err = loadbench.Run(ctx, off); err != nil {
		return res, fmt.Errorf("cachebench: load, cache off: %w", err)
	}
	on := base
	on.NoReplay = true
	log("load: the cloud's KV cache on")
	if res.On, err = loadbench.Run(ctx, on); err != nil {
		return res, fmt.Errorf("cachebench: load, cache on: %w", err)
	}
	res.TokSOff, res.TokSOn = res.Off.TokS, res.On.TokS
	res.HitRate, res.HitRateBy, res.Hits, res.Misses = HitRates(res.On.CloudMetrics, base.Concurrency)
	return res, nil
}

// HitRates reads hit rates from cumulative cache metrics after each
// concurrency (run in order): overall (after the last), per concurrency
// (the increase over it), the hits by tier and the misses overall.
func HitRates(metrics map[string]map[string]float64, concurrency []int) (rate float64, by map[string]float64, hits map[string]float64, misses float64) {
	by = map[string]float64{}
	hits = map[string]float64{}
	var prevH, prevM float64
	for _, n := range concurrency {
		key := strconv.Itoa(n)
		m, ok := metrics[key]
		if !ok {
			continue
		}
		h, mi := 0.0, 0.0
		clear(hits)
		for sample, v := range m {
			family, labels, _ := strings.Cut(sample, "{")
			switch family {
			case metricHits:
				h += v
				tier := strings.TrimSuffix(strings.TrimPrefix(labels, `tier="`), `"}`)
				hits[tier] += v
			case metricMisses:
				mi += v
			}
		}
		if d := (h - prevH) + (mi - prevM); d > 0 {
			by[key] = (h - prevH) / d
		}
		prevH, prevM = h, mi
		misses = mi
		if h+mi > 0 {
			rate = h / (h + mi)
		}
	}
	return rate, by, hits, misses
}
