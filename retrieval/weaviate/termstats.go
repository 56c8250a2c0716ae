package weaviate

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Term statistics: BM25 needs, for each query term, how many passages
// hold it, and the engine counts that by visiting every one of them (a
// term in a tenth of a million passages is a tenth of a million object
// reads per query). So the counts are made once, by a scan after the
// collection is written, and kept in a sidecar collection of their own
// (Collection + "_TermStats"): a summary object and the table in chunks.
//
// They are valid while the summary exists and counts as many passages as
// the collection holds. Every write through a Client removes the summary
// first (Upsert) or right after (deletions), so statistics never
// outlive the passages they counted; the writer rebuilds them when it is
// done (RebuildTermStats). Until then, readers count live.

// TermStats are a collection's BM25 statistics, counted over every passage.
type TermStats struct {
	// Generation names this count: a rebuild gets a new one.
	Generation string
	// Passages, and analyzed terms in all of them.
	Passages int
	Terms    int64
	// DocFreq is how many passages hold each term (absent: none).
	DocFreq map[string]int
}

// termStatsChunk is how many terms one stored object of the table holds
// (~0.3 MB of text).
var termStatsChunk = 20_000

// scanPage is how many passages one page of the scan reads.
var scanPage = 2_000

// statsClass is the sidecar collection of the term statistics.
func (c *Client) statsClass() string { return c.cfg.Collection + "_TermStats" }

// nameUUID is a name-based UUID (version 5 layout) of name.
func nameUUID(name string) string {
	h := sha1.Sum([]byte(name))
	h[6] = h[6]&0x0f | 0x50
	h[8] = h[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

var summaryID = nameUUID("dragon-termstats:summary")

func chunkID(i int) string { return nameUUID("dragon-termstats:chunk:" + strconv.Itoa(i)) }

type statsSummary struct {
	Generation string `json:"generation"`
	Passages   int    `json:"passages"`
	NTerms     int64  `json:"nterms"`
	Chunks     int    `json:"chunks"`
}

// TermStatsGeneration returns the generation of the collection's term
// statistics, or "" when there are none valid: none made, removed by a
// write since, or counting another number of passages than the collection
// holds.
func (c *Client) TermStatsGeneration(ctx context.Context) (string, error) {
	sum, ok, err := c.statsSummary(ctx)
	if err != nil || !ok {
		return "", err
	}
	n, err := c.Count(ctx)
	if err != nil {
		return "", err
	}
	if n != sum.Passages {
		return "", nil
	}
	return sum.Generation, nil
}

func (c *Client) statsSummary(ctx context.Context) (statsSummary, bool, error) {
	cons, err := c.readConsistency(ctx)
	if err != nil {
		return statsSummary{}, false, err
	}
	q := fmt.Sprintf(`{ Get { %s(where: {path: ["kind"], operator: Equal, valueText: "summary"}, limit: 2%s) { generation passages nterms chunks } } }`,
		c.statsClass(), cons)
	var data struct {
		Get map[string][]statsSummary
	}
	if err := c.graphQL(ctx, q, &data); errors.Is(err, ErrNoCollection) {
		return statsSummary{}, false, nil
	} else if err != nil {
		return statsSummary{}, false, err
	}
	rows := data.Get[c.statsClass()]
	if len(rows) != 1 {
		return statsSummary{}, false, nil
	}
	return rows[0], true, nil
}

// ReadTermStats returns the collection's term statistics; ok is false when
// there are none valid (then count live).
func (c *Client) ReadTermStats(ctx context.Context) (st TermStats, ok bool, err error) {
	sum, ok, err := c.statsSummary(ctx)
	if err != nil || !ok {
		return TermStats{}, false, err
	}
	cons, err := c.readConsistency(ctx)
	if err != nil {
		return TermStats{}, false, err
	}
	q := fmt.Sprintf(`{ Get { %s(where: {path: ["generation"], operator: Equal, valueText: %s}, limit: %d%s) { kind seq table } } }`,
		c.statsClass(), gqlString(sum.Generation), sum.Chunks+1, cons)
	var data struct {
		Get map[string][]struct {
			Kind  string `json:"kind"`
			Seq   int    `json:"seq"`
			Table string `json:"table"`
		}
	}
	if err := c.graphQL(ctx, q, &data); err != nil {
		return TermStats{}, false, err
	}
	st = TermStats{Generation: sum.Generation, Passages: sum.Passages, Terms: sum.NTerms, DocFreq: map[string]int{}}
	seen := make([]bool, sum.Chunks)
	for _, row := range data.Get[c.statsClass()] {
		if row.Kind != "chunk" {
			continue
		}
		if row.Seq < 0 || row.Seq >= sum.Chunks || seen[row.Seq] {
			return TermStats{}, false, fmt.Errorf("%w: %s: term statistics chunk %d of %d", ErrInvalid, c.statsClass(), row.Seq, sum.Chunks)
		}
		seen[row.Seq] = true
		for line := range strings.Lines(row.Table) {
			term, n, found := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
			df, err := strconv.Atoi(n)
			if !found || err != nil {
				return TermStats{}, false, fmt.Errorf("%w: %s: bad term statistics line %q", ErrInvalid, c.statsClass(), line)
			}
			st.DocFreq[term] = df
		}
	}
	if slices.Contains(seen, false) {
		// Rewritten under us: count live until the next look.
		return TermStats{}, false, nil
	}
	// Removed (by a write) while the table was read: not valid.
	if gen, err := c.TermStatsGeneration(ctx); err != nil || gen != st.Generation {
		return TermStats{}, false, err
	}
	return st, true, nil
}

// RebuildTermStats counts the statistics over every passage and stores
// them, replacing any earlier count; progress, if set, is called with the
// passages counted so far.
func (c *Client) RebuildTermStats(ctx context.Context, progress func(counted int)) (TermStats, error) {
	if err := c.InvalidateTermStats(ctx); err != nil {
		return TermStats{}, err
	}
	st, err := c.countTerms(ctx, progress)
	if err != nil {
		return TermStats{}, err
	}
	if err := c.ensureStatsClass(ctx); err != nil {
		return TermStats{}, err
	}
	terms := make([]string, 0, len(st.DocFreq))
	for t := range st.DocFreq {
		terms = append(terms, t)
	}
	slices.Sort(terms)
	chunks := (len(terms) + termStatsChunk - 1) / termStatsChunk
	var objs []wireObject
	for i := range chunks {
		var b strings.Builder
		for _, t := range terms[i*termStatsChunk : min(len(terms), (i+1)*termStatsChunk)] {
			fmt.Fprintf(&b, "%s %d\n", t, st.DocFreq[t])
		}
		objs = append(objs, wireObject{Class: c.statsClass(), ID: chunkID(i), Properties: map[string]any{
			"kind": "chunk", "generation": st.Generation, "seq": i, "table": b.String(),
		}})
	}
	// The chunks in small batches (each is large), the summary last: a
	// reader sees a table only once it is whole.
	for start := 0; start < len(objs); start += 4 {
		if err := c.writeObjects(ctx, objs[start:min(len(objs), start+4)]); err != nil {
			return TermStats{}, fmt.Errorf("write term statistics: %w", err)
		}
	}
	if err := c.writeObjects(ctx, []wireObject{{Class: c.statsClass(), ID: summaryID, Properties: map[string]any{
		"kind": "summary", "generation": st.Generation, "passages": st.Passages, "nterms": st.Terms, "chunks": chunks,
	}}}); err != nil {
		return TermStats{}, fmt.Errorf("write term statistics: %w", err)
	}
	return st, nil
}

// countTerms scans every passage's terms, in object id order.
func (c *Client) countTerms(ctx context.Context, progress func(int)) (TermStats, error) {
	gen := make([]byte, 8)
	if _, err := rand.Read(gen); err != nil {
		return TermStats{}, err
	}
	st := TermStats{Generation: hex.EncodeToString(gen), DocFreq: map[string]int{}}
	cons, err := c.readConsistency(ctx)
	if err != nil {
		return TermStats{}, err
	}
	after := ""
	for {
		cursor := ""
		if after != "" {
			cursor = ", after: " + gqlString(after)
		}
		q := fmt.Sprintf(`{ Get { %s(limit: %d%s%s) { terms _additional { id } } } }`, c.cfg.Collection, scanPage, cursor, cons)
		var data struct {
			Get map[string][]struct {
				Terms      string `json:"terms"`
				Additional struct {
					ID string `json:"id"`
				} `json:"_additional"`
			}
		}
		if err := c.graphQL(ctx, q, &data); err != nil {
			return TermStats{}, fmt.Errorf("count terms: %w", err)
		}
		rows := data.Get[c.cfg.Collection]
		for _, r := range rows {
			terms := strings.Fields(r.Terms)
			st.Passages++
			st.Terms += int64(len(terms))
			slices.Sort(terms)
			for _, t := range slices.Compact(terms) {
				st.DocFreq[t]++
			}
		}
		if progress != nil {
			progress(st.Passages)
		}
		if len(rows) < scanPage {
			return st, nil
		}
		after = rows[len(rows)-1].Additional.ID
	}
}

// InvalidateTermStats removes the summary, so readers count live until
// the statistics are rebuilt.
func (c *Client) InvalidateTermStats(ctx context.Context) error {
	// Deleting from a class that does not exist is an engine error, and
	// an object that does not exist no error at all.
	err := c.do(ctx, http.MethodGet, "/v1/schema/"+c.statsClass(), nil, nil)
	if errors.Is(err, ErrNoCollection) {
		return nil
	}
	if err == nil {
		err = c.do(ctx, http.MethodDelete, "/v1/objects/"+c.statsClass()+"/"+summaryID+"?consistency_level=QUORUM", nil, nil)
	}
	if err != nil {
		return fmt.Errorf("invalidate term statistics: %w", err)
	}
	return nil
}

func (c *Client) ensureStatsClass(ctx context.Context) error {
	err := c.do(ctx, http.MethodGet, "/v1/schema/"+c.statsClass(), nil, nil)
	if err == nil {
		return nil
	}
	if !errors.Is(err, ErrNoCollection) {
		return err
	}
	factor, err := c.replicationFactor(ctx)
	if err != nil {
		return err
	}
	class := map[string]any{
		"class":             c.statsClass(),
		"description":       "dragon: BM25 term statistics of " + c.cfg.Collection,
		"vectorizer":        "none",
		"vectorIndexConfig": map[string]any{"skip": true},
		"replicationConfig": map[string]any{"factor": factor},
		"properties": []map[string]any{
			prop("kind", "text", "field", true, false),
			prop("generation", "text", "field", true, false),
			prop("seq", "int", "", false, false),
			prop("passages", "int", "", false, false),
			prop("nterms", "int", "", false, false),
			prop("chunks", "int", "", false, false),
			prop("table", "text", "whitespace", false, false),
		},
	}
	if err := c.do(ctx, http.MethodPost, "/v1/schema", class, nil); err != nil && !strings.Contains(err.Error(), "already exists") {
		return fmt.Errorf("create %s: %w", c.statsClass(), err)
	}
	return nil
}

// writeObjects stores objects of any class; any object refused fails the
// call.
func (c *Client) writeObjects(ctx context.Context, objs []wireObject) error {
	refused, err := c.batch(ctx, objs)
	if err != nil {
		return err
	}
	for id, msgs := range refused {
		return fmt.Errorf("%w: object %s: %s", ErrInvalid, id, strings.Join(msgs, "; "))
	}
	return nil
}
