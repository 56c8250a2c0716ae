package weaviate

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Candidate is a passage a search returned.
type Candidate struct {
	Object
	// Score is the engine's BM25 score (Lexical) or the cosine similarity
	// (Nearest).
	Score float64
}

// Lexical returns up to n passages by the engine's BM25 over the terms
// field, best first. A candidate carries its passage id and analyzed terms
// only (the caller scores them itself and Fetches the few it keeps): the
// text of hundreds of candidates was most of a query's cost.
func (c *Client) Lexical(ctx context.Context, terms []string, n int) ([]Candidate, error) {
	if len(terms) == 0 || n <= 0 {
		return nil, nil
	}
	if c.rpc != nil {
		return c.lexicalGRPC(ctx, terms, n)
	}
	cons, err := c.readConsistency(ctx)
	if err != nil {
		return nil, err
	}
	q := fmt.Sprintf(`{ Get { %s(bm25: {query: %s, properties: ["terms"]}, limit: %d%s) { pid terms _additional { score } } } }`,
		c.cfg.Collection, gqlString(strings.Join(terms, " ")), n, cons)
	return c.candidates(ctx, q, func(a additional) (float64, error) { return strconv.ParseFloat(a.Score, 64) })
}

// Nearest returns up to n passages by cosine similarity to v, best first,
// as passage ids and scores (Fetch gets the rest).
func (c *Client) Nearest(ctx context.Context, v []float32, n int) ([]Candidate, error) {
	if len(v) == 0 || n <= 0 {
		return nil, nil
	}
	if c.rpc != nil {
		return c.nearestGRPC(ctx, v, n)
	}
	vec, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	cons, err := c.readConsistency(ctx)
	if err != nil {
		return nil, err
	}
	q := fmt.Sprintf(`{ Get { %s(nearVector: {vector: %s}, limit: %d%s) { pid _additional { distance } } } }`,
		c.cfg.Collection, vec, n, cons)
	return c.candidates(ctx, q, func(a additional) (float64, error) { return 1 - a.Distance, nil })
}

type additional struct {
	Score    string  `json:"score"`
	Distance float64 `json:"distance"`
}

func (c *Client) candidates(ctx context.Context, q string, score func(additional) (float64, error)) ([]Candidate, error) {
	var data struct {
		Get map[string][]struct {
			wireProps
			Additional additional `json:"_additional"`
		}
	}
	if err := c.graphQL(ctx, q, &data); err != nil {
		return nil, err
	}
	rows := data.Get[c.cfg.Collection]
	out := make([]Candidate, 0, len(rows))
	for _, r := range rows {
		o, err := r.object(c.cfg.Collection)
		if err != nil {
			return nil, err
		}
		s, err := score(r.Additional)
		if err != nil {
			return nil, fmt.Errorf("weaviate: bad score for %s: %w", r.PID, err)
		}
		out = append(out, Candidate{Object: o, Score: s})
	}
	return out, nil
}

// Fetch returns the stored passages among pids (without vectors), by
// passage id, in one request.
func (c *Client) Fetch(ctx context.Context, pids []uint64) (map[uint64]Object, error) {
	return c.byPIDs(ctx, pids, "pid source start end tokens text meta terms")
}

// byPIDs gets the fields of the stored passages among pids.
func (c *Client) byPIDs(ctx context.Context, pids []uint64, fields string) (map[uint64]Object, error) {
	out := make(map[uint64]Object, len(pids))
	if len(pids) == 0 {
		return out, nil
	}
	var rows []wireProps
	if c.rpc != nil {
		var err error
		if rows, err = c.byPIDsGRPC(ctx, pids, strings.Fields(fields)); err != nil {
			return nil, err
		}
	} else {
		cons, err := c.readConsistency(ctx)
		if err != nil {
			return nil, err
		}
		q := fmt.Sprintf(`{ Get { %s(where: {path: ["pid"], operator: ContainsAny, valueText: [%s]}, limit: %d%s) { %s } } }`,
			c.cfg.Collection, pidList(pids), len(pids), cons, fields)
		var data struct {
			Get map[string][]wireProps
		}
		if err := c.graphQL(ctx, q, &data); err != nil {
			return nil, err
		}
		rows = data.Get[c.cfg.Collection]
	}
	for _, r := range rows {
		o, err := r.object(c.cfg.Collection)
		if err != nil {
			return nil, err
		}
		out[o.PID] = o
	}
	return out, nil
}

// wireProps are a passage's properties as a query returns them (those not
// asked for stay empty).
type wireProps struct {
	PID    string `json:"pid"`
	Source string `json:"source"`
	Start  int    `json:"start"`
	End    int    `json:"end"`
	Tokens int    `json:"tokens"`
	Text   string `json:"text"`
	Meta   string `json:"meta"`
	Terms  string `json:"terms"`
}

func (r wireProps) object(collection string) (Object, error) {
	pid, err := strconv.ParseUint(r.PID, 16, 64)
	if err != nil {
		return Object{}, fmt.Errorf("weaviate: bad pid %q in %s", r.PID, collection)
	}
	o := Object{PID: pid, Source: r.Source, Start: r.Start, End: r.End, Tokens: r.Tokens, Text: r.Text, Terms: strings.Fields(r.Terms)}
	if r.Meta != "" {
		if err := json.Unmarshal([]byte(r.Meta), &o.Meta); err != nil {
			return Object{}, fmt.Errorf("weaviate: bad meta for %s: %w", r.PID, err)
		}
	}
	return o, nil
}

// pidTexts is pids as the pid property's strings.
func pidTexts(pids []uint64) []string {
	ids := make([]string, len(pids))
	for i, p := range pids {
		ids[i] = strconv.FormatUint(p, 16)
	}
	return ids
}

// pidList is pids as a GraphQL list of the pid property's strings.
func pidList(pids []uint64) string {
	ids := pidTexts(pids)
	for i, id := range ids {
		ids[i] = strconv.Quote(id)
	}
	return strings.Join(ids, ",")
}

// Stats are the corpus statistics BM25 needs for a query.
type Stats struct {
	// Passages in the collection, and analyzed terms in all of them.
	Passages int
	Terms    int64
	// DocFreq is how many passages hold each query term.
	DocFreq map[string]int
}

// DocFreqs returns the statistics for terms, in one request; the
// collection's totals (Passages, Terms) only withTotals, since summing the
// term counts visits every passage.
func (c *Client) DocFreqs(ctx context.Context, terms []string, withTotals bool) (Stats, error) {
	if len(terms) == 0 && !withTotals {
		return Stats{DocFreq: map[string]int{}}, nil
	}
	var b strings.Builder
	b.WriteString("{ Aggregate { ")
	if withTotals {
		b.WriteString("total: " + c.cfg.Collection + " { meta { count } nterms { sum } } ")
	}
	for i, t := range terms {
		fmt.Fprintf(&b, `t%d: %s(where: {path: ["terms"], operator: Equal, valueText: %s}) { meta { count } } `, i, c.cfg.Collection, gqlString(t))
	}
	b.WriteString("} }")
	var data struct {
		Aggregate map[string][]struct {
			Meta struct {
				Count int `json:"count"`
			} `json:"meta"`
			NTerms *struct {
				Sum float64 `json:"sum"`
			} `json:"nterms"`
		}
	}
	if err := c.graphQL(ctx, b.String(), &data); err != nil {
		return Stats{}, err
	}
	count := func(key string) int {
		if rows := data.Aggregate[key]; len(rows) > 0 {
			return rows[0].Meta.Count
		}
		return 0
	}
	st := Stats{Passages: count("total"), DocFreq: make(map[string]int, len(terms))}
	if rows := data.Aggregate["total"]; len(rows) > 0 && rows[0].NTerms != nil {
		st.Terms = int64(rows[0].NTerms.Sum)
	}
	for i, t := range terms {
		st.DocFreq[t] = count(fmt.Sprintf("t%d", i))
	}
	return st, nil
}

// gqlString is s as a GraphQL string literal: JSON's escapes are
// GraphQL's (Go's %q may write \x and \a, which GraphQL lacks).
func gqlString(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}
