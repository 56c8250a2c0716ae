package weaviate

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Spec is what a collection is made for: a passage store is only usable
// with the embedder and chunking it was filled with.
type Spec struct {
	// Embedder is the fingerprint of the embedder of the vectors ("" for a
	// BM25-only collection).
	Embedder string `json:"embedder"`
	Dims     int    `json:"dims"`
	// ChunkTokens and Overlap size the passages.
	ChunkTokens int `json:"chunk_tokens"`
	Overlap     int `json:"overlap"`
	// Tokenizer is the fingerprint of the tokenizer that cut them.
	Tokenizer string `json:"tokenizer"`
	// Analyzer names the analysis of the terms field.
	Analyzer string `json:"analyzer"`
}

// Layout places a new collection on the cluster.
type Layout struct {
	// Shards (default 1) and Replicas (default 1; 2 or more survive losing
	// a node).
	Shards, Replicas int
	// SearchEf is the length of the HNSW graph's candidate list at query
	// time (0: defaultSearchEf for a new collection, an existing one's
	// left as it is). Unlike the layout it can change on a collection
	// that holds passages, and it changes no stored data: a longer list
	// finds more of the true nearest vectors for proportionally more
	// search time.
	SearchEf int
	// Quantizer compresses the vectors the graph is searched on: "" keeps
	// them float32 (a new collection; an existing one keeps its own), "rq"
	// is Weaviate's 8-bit rotational quantization, whose distances cost
	// less per node visited; the RescoreLimit best candidates (0:
	// defaultRescoreLimit) are then scored again on the float vectors. It
	// can be turned on for a collection that holds passages (the engine
	// compresses them in place) but never off again.
	Quantizer    string
	RescoreLimit int
	// GraphConnections and GraphEfConstruction build a new collection's
	// HNSW graph (0: defaultGraphConnections, defaultGraphEfConstruction):
	// more links per node, and a longer candidate list while linking,
	// make a graph that finds more of the true nearest vectors at a given
	// SearchEf, for a slower ingest. Fixed once the collection exists.
	GraphConnections, GraphEfConstruction int
}

// The graph's defaults.
const (
	defaultGraphConnections    = 32
	defaultGraphEfConstruction = 128
)

// Quantizers are the values Layout.Quantizer takes.
var Quantizers = []string{"", "rq"}

// defaultRescoreLimit covers a hybrid search's dense pool (retrieval's
// 4·k for k = 10, at least 50).
const defaultRescoreLimit = 64

// defaultSearchEf is a new collection's query-time candidate list.
const defaultSearchEf = 256

// specPrefix marks our description of a collection.
const specPrefix = "dragon passages v1 "

// EnsureCollection creates the collection for spec, or checks that the
// existing one was made for the same spec, and returns the spec it holds.
func (c *Client) EnsureCollection(ctx context.Context, spec Spec, layout Layout) error {
	if layout.SearchEf < 0 {
		return fmt.Errorf("%w: search ef %d: want 0 (the collection's) or more", ErrInvalid, layout.SearchEf)
	}
	if !slices.Contains(Quantizers, layout.Quantizer) {
		return fmt.Errorf("%w: quantizer %q: want rq, or none (empty)", ErrInvalid, layout.Quantizer)
	}
	if layout.RescoreLimit < 0 {
		return fmt.Errorf("%w: rescore limit %d: want 0 (the default) or more", ErrInvalid, layout.RescoreLimit)
	}
	if layout.GraphConnections < 0 || layout.GraphEfConstruction < 0 {
		return fmt.Errorf("%w: graph connections %d, ef construction %d: want 0 (the default) or more", ErrInvalid, layout.GraphConnections, layout.GraphEfConstruction)
	}
	got, err := c.Spec(ctx)
	switch {
	case err == nil:
		if got != spec {
			return fmt.Errorf("%w: collection %s holds passages made for %+v, not %+v (another embedder or chunking: use another collection)", ErrInvalid, c.cfg.Collection, got, spec)
		}
		return c.reconfigure(ctx, layout)
	case !errors.Is(err, ErrNoCollection):
		return err
	}
	desc, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	vic := map[string]any{
		"distance":       "cosine",
		"ef":             cmp.Or(layout.SearchEf, defaultSearchEf),
		"efConstruction": cmp.Or(layout.GraphEfConstruction, defaultGraphEfConstruction),
		"maxConnections": cmp.Or(layout.GraphConnections, defaultGraphConnections),
	}
	if layout.Quantizer != "" {
		vic[layout.Quantizer] = quantizerConfig(layout.RescoreLimit)
	}
	class := map[string]any{
		"class":             c.cfg.Collection,
		"description":       specPrefix + string(desc),
		"vectorizer":        "none",
		"vectorIndexConfig": vic,
		"replicationConfig": map[string]any{"factor": max(1, layout.Replicas)},
		"shardingConfig":    map[string]any{"desiredCount": max(1, layout.Shards)},
		// Terms arrive analyzed (package retrieval's analyzer, the same as
		// bleve's): split on white space, no stop words.
		"invertedIndexConfig": map[string]any{
			"bm25":      map[string]any{"k1": 1.2, "b": 0.75},
			"stopwords": map[string]any{"preset": "none"},
		},
		"properties": []map[string]any{
			prop("pid", "text", "field", true, false),
			prop("source", "text", "field", true, false),
			prop("start", "int", "", false, false),
			prop("end", "int", "", false, false),
			prop("tokens", "int", "", false, false),
			prop("text", "text", "word", false, false),
			prop("meta", "text", "word", false, false),
			prop("terms", "text", "whitespace", true, true),
			// Summed for the corpus's term count (BM25's average length).
			prop("nterms", "int", "", true, false),
		},
	}
	if err := c.do(ctx, http.MethodPost, "/v1/schema", class, nil); err != nil {
		if strings.Contains(err.Error(), "already exists") {
			return c.EnsureCollection(ctx, spec, layout) // created meanwhile
		}
		return fmt.Errorf("create collection %s: %w", c.cfg.Collection, err)
	}
	return nil
}

// SearchEf returns the collection's query-time candidate list (Layout).
func (c *Client) SearchEf(ctx context.Context) (int, error) {
	_, ef, err := c.vectorIndexConfig(ctx)
	return ef, err
}

// SetSearchEf changes the collection's query-time candidate list
// (Layout.SearchEf) if it differs.
func (c *Client) SetSearchEf(ctx context.Context, ef int) error {
	if ef < 1 {
		return fmt.Errorf("%w: search ef %d: want at least 1", ErrInvalid, ef)
	}
	return c.reconfigure(ctx, Layout{SearchEf: ef})
}

// reconfigure brings an existing collection's vector index to what layout
// asks, in one read and at most one update: the search ef and the
// quantizer change in place (the engine compresses the vectors it holds,
// shard by shard, before it searches them again); a graph built otherwise
// is refused, since the engine cannot rebuild it, and so is trading one
// quantizer for another.
func (c *Client) reconfigure(ctx context.Context, layout Layout) error {
	class, ef, err := c.vectorIndexConfig(ctx)
	if err != nil {
		return err
	}
	vic := class["vectorIndexConfig"].(map[string]any)
	m, _ := vic["maxConnections"].(float64)
	efc, _ := vic["efConstruction"].(float64)
	if (layout.GraphConnections > 0 && int(m) != layout.GraphConnections) ||
		(layout.GraphEfConstruction > 0 && int(efc) != layout.GraphEfConstruction) {
		return fmt.Errorf("%w: collection %s's graph was built with %d connections and ef construction %d, not %d and %d (a graph is rebuilt only by a new collection)",
			ErrInvalid, c.cfg.Collection, int(m), int(efc), layout.GraphConnections, layout.GraphEfConstruction)
	}
	changed := false
	if layout.SearchEf > 0 && layout.SearchEf != ef {
		vic["ef"] = layout.SearchEf
		changed = true
	}
	if q := layout.Quantizer; q != "" {
		have, haveLimit := quantizerOf(vic)
		switch {
		case have != "" && have != q:
			return fmt.Errorf("%w: collection %s is compressed with %s already, which cannot be turned off", ErrInvalid, c.cfg.Collection, have)
		case have != q || (layout.RescoreLimit > 0 && haveLimit != layout.RescoreLimit):
			vic[q] = quantizerConfig(layout.RescoreLimit)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if err := c.do(ctx, http.MethodPut, "/v1/schema/"+c.cfg.Collection, class, nil); err != nil {
		return fmt.Errorf("update the vector index of %s: %w", c.cfg.Collection, err)
	}
	return nil
}

// Quantizer returns the collection's vector quantizer ("" for none) and
// its rescore limit.
func (c *Client) Quantizer(ctx context.Context) (string, int, error) {
	class, _, err := c.vectorIndexConfig(ctx)
	if err != nil {
		return "", 0, err
	}
	q, limit := quantizerOf(class["vectorIndexConfig"].(map[string]any))
	return q, limit, nil
}

// quantizerOf reads which quantizer a vector index config has enabled.
func quantizerOf(vic map[string]any) (string, int) {
	for _, q := range []string{"rq", "pq", "sq", "bq"} {
		if m, ok := vic[q].(map[string]any); ok && m["enabled"] == true {
			limit, _ := m["rescoreLimit"].(float64)
			return q, int(limit)
		}
	}
	return "", 0
}

func quantizerConfig(rescoreLimit int) map[string]any {
	return map[string]any{"enabled": true, "bits": 8, "rescoreLimit": cmp.Or(rescoreLimit, defaultRescoreLimit)}
}

// vectorIndexConfig reads the collection's class (whole, as an update
// must send it back) and its vector index's ef.
func (c *Client) vectorIndexConfig(ctx context.Context) (map[string]any, int, error) {
	var class map[string]any
	if err := c.do(ctx, http.MethodGet, "/v1/schema/"+c.cfg.Collection, nil, &class); err != nil {
		return nil, 0, err
	}
	vic, ok := class["vectorIndexConfig"].(map[string]any)
	if !ok {
		return nil, 0, fmt.Errorf("weaviate: collection %s has no vector index config", c.cfg.Collection)
	}
	ef, ok := vic["ef"].(float64)
	if !ok {
		return nil, 0, fmt.Errorf("weaviate: collection %s: vector index ef is %v", c.cfg.Collection, vic["ef"])
	}
	return class, int(ef), nil
}

func prop(name, typ, tokenization string, filterable, searchable bool) map[string]any {
	p := map[string]any{
		"name": name, "dataType": []string{typ},
		"indexFilterable": filterable, "indexSearchable": searchable,
	}
	if typ == "text" {
		p["tokenization"] = tokenization
	}
	if typ == "int" {
		delete(p, "indexSearchable")
	}
	return p
}

// Spec returns the spec the collection was made for.
func (c *Client) Spec(ctx context.Context) (Spec, error) {
	var class struct {
		Description string `json:"description"`
	}
	if err := c.do(ctx, http.MethodGet, "/v1/schema/"+c.cfg.Collection, nil, &class); err != nil {
		return Spec{}, err
	}
	raw, ok := strings.CutPrefix(class.Description, specPrefix)
	if !ok {
		return Spec{}, fmt.Errorf("%w: collection %s was not made by dragon (no passage spec in its description)", ErrInvalid, c.cfg.Collection)
	}
	var s Spec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		return Spec{}, fmt.Errorf("%w: collection %s: bad spec: %v", ErrInvalid, c.cfg.Collection, err)
	}
	return s, nil
}

// ObjectID is the object id of a passage: a name-based UUID (version 5
// layout) of its passage id, so writing a passage again replaces it.
func ObjectID(pid uint64) string { return nameUUID("dragon-passage:" + strconv.FormatUint(pid, 16)) }
