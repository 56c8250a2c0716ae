package weaviate

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/internal/weaviatetest"
)

func unitVec(xs ...float64) []float32 {
	var n float64
	for _, x := range xs {
		n += x * x
	}
	v := make([]float32, len(xs))
	for i, x := range xs {
		v[i] = float32(x / math.Sqrt(n))
	}
	return v
}

func testObjects() []Object {
	return []Object{
		{PID: 1, Source: "a.txt", Start: 0, End: 20, Tokens: 5, Text: "Etna is a volcano", Terms: []string{"etna", "volcano"}, Vector: unitVec(1, 0, 0, 0), Meta: map[string]string{"from": "x"}},
		{PID: 2, Source: "a.txt", Start: 20, End: 40, Tokens: 5, Text: "Vesuvius is a volcano too", Terms: []string{"vesuviu", "volcano"}, Vector: unitVec(0.9, 0.1, 0, 0)},
		{PID: 3, Source: "b.txt", Start: 0, End: 30, Tokens: 6, Text: "Bees make honey", Terms: []string{"bee", "make", "honei"}, Vector: unitVec(0, 0, 1, 0)},
		{PID: 1 << 63, Source: "c.txt", Start: 0, End: 9, Tokens: 3, Text: "Chess knights", Terms: []string{"chess", "knight"}, Vector: unitVec(0, 0, 0, 1)},
	}
}

// One real node: a collection made for a spec, passages written twice
// (still once each), each kind of search, deletion by source.
func TestCollectionRoundTrip(t *testing.T) {
	cl := weaviatetest.Start(t, 1)
	ctx := t.Context()
	c, err := New(Config{URL: cl.URL(0), Collection: "Passages"})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Ready(ctx))

	_, err = c.Count(ctx)
	require.ErrorIs(t, err, ErrNoCollection)
	spec := Spec{Embedder: "test", Dims: 4, ChunkTokens: 64, Tokenizer: "tok", Analyzer: "en"}
	require.NoError(t, c.EnsureCollection(ctx, spec, Layout{}))
	require.NoError(t, c.EnsureCollection(ctx, spec, Layout{}), "the same spec again is fine")
	other := spec
	other.Embedder = "another"
	require.ErrorIs(t, c.EnsureCollection(ctx, other, Layout{}), ErrInvalid)

	// The query-time candidate list: the default at creation, changed on
	// the existing collection, kept when a layout leaves it out.
	ef, err := c.SearchEf(ctx)
	require.NoError(t, err)
	assert.Equal(t, defaultSearchEf, ef)
	require.NoError(t, c.EnsureCollection(ctx, spec, Layout{SearchEf: 700}))
	require.NoError(t, c.EnsureCollection(ctx, spec, Layout{}))
	ef, err = c.SearchEf(ctx)
	require.NoError(t, err)
	assert.Equal(t, 700, ef)
	require.ErrorIs(t, c.EnsureCollection(ctx, spec, Layout{SearchEf: -1}), ErrInvalid)
	// The graph's build parameters are fixed once it exists.
	require.NoError(t, c.EnsureCollection(ctx, spec, Layout{GraphConnections: 32, GraphEfConstruction: 128}), "the defaults, asked for")
	require.ErrorIs(t, c.EnsureCollection(ctx, spec, Layout{GraphConnections: 48}), ErrInvalid)
	wide, err := New(Config{URL: cl.URL(0), Collection: "Wide"})
	require.NoError(t, err)
	defer wide.Close()
	require.NoError(t, wide.EnsureCollection(ctx, spec, Layout{GraphConnections: 48, GraphEfConstruction: 256}))
	class, _, err := wide.vectorIndexConfig(ctx)
	require.NoError(t, err)
	vic := class["vectorIndexConfig"].(map[string]any)
	assert.Equal(t, []any{48.0, 256.0}, []any{vic["maxConnections"], vic["efConstruction"]})
	require.NoError(t, wide.EnsureCollection(ctx, spec, Layout{}), "a layout without them keeps them")

	for range 2 {
		failed, err := c.Upsert(ctx, testObjects())
		require.NoError(t, err)
		require.Empty(t, failed)
	}
	n, err := c.Count(ctx)
	require.NoError(t, err)
	assert.Equal(t, 4, n, "writing a passage again replaces it")

	have, err := c.Existing(ctx, []uint64{1, 3, 99, 1 << 63})
	require.NoError(t, err)
	assert.Equal(t, map[uint64]bool{1: true, 3: true, 1 << 63: true}, have)

	// Searches, over GraphQL and over gRPC.
	g, err := New(Config{URL: cl.URL(0), GRPC: cl.GRPC(0), Collection: "Passages"})
	require.NoError(t, err)
	defer g.Close()
	for _, s := range []struct {
		api string
		c   *Client
	}{{"graphql", c}, {"grpc", g}} {
		lex, err := s.c.Lexical(ctx, []string{"volcano", "etna"}, 10)
		require.NoError(t, err, s.api)
		require.Len(t, lex, 2, s.api)
		assert.Equal(t, uint64(1), lex[0].PID, "%s: matches both terms", s.api)
		assert.Equal(t, []string{"etna", "volcano"}, lex[0].Terms, s.api)
		assert.Empty(t, lex[0].Text, "%s: candidates carry ids and terms only", s.api)
		assert.Greater(t, lex[0].Score, lex[1].Score, s.api)

		got, err := s.c.Fetch(ctx, []uint64{1, 99, 1 << 63})
		require.NoError(t, err, s.api)
		require.Len(t, got, 2, "%s: an unknown passage is absent, not an error", s.api)
		want := testObjects()[0]
		want.Vector = nil
		assert.Equal(t, want, got[1], s.api)
		assert.Equal(t, "Chess knights", got[1<<63].Text, s.api)

		near, err := s.c.Nearest(ctx, unitVec(0.95, 0.05, 0, 0), 2)
		require.NoError(t, err, s.api)
		require.Len(t, near, 2, s.api)
		assert.ElementsMatch(t, []uint64{1, 2}, []uint64{near[0].PID, near[1].PID}, s.api)
		assert.InDelta(t, 1, near[0].Score, 0.01, s.api)
	}

	st, err := c.DocFreqs(ctx, []string{"volcano", "honei", "absent"}, true)
	require.NoError(t, err)
	assert.Equal(t, Stats{Passages: 4, Terms: 9, DocFreq: map[string]int{"volcano": 2, "honei": 1, "absent": 0}}, st)
	st, err = c.DocFreqs(ctx, []string{"volcano"}, false)
	require.NoError(t, err)
	assert.Equal(t, Stats{DocFreq: map[string]int{"volcano": 2}}, st, "no totals unless asked")

	deleted, err := c.DeleteUnder(ctx, "a.txt")
	require.NoError(t, err)
	assert.Equal(t, 2, deleted)
	n, err = c.Count(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n)

	// A folder and an mbox's messages go with their path.
	failed, err := c.Upsert(ctx, []Object{
		{PID: 10, Source: "/d/box.mbox#1", Text: "m", Terms: []string{"m"}, Vector: unitVec(1, 1, 0, 0)},
		{PID: 11, Source: "/d/box.mbox#2", Text: "m", Terms: []string{"m"}, Vector: unitVec(1, 1, 0, 0)},
		{PID: 12, Source: "/d/sub/x.txt", Text: "x", Terms: []string{"x"}, Vector: unitVec(1, 1, 0, 0)},
		{PID: 13, Source: "/dx/y.txt", Text: "y", Terms: []string{"y"}, Vector: unitVec(1, 1, 0, 0)},
	})
	require.NoError(t, err)
	require.Empty(t, failed)
	deleted, err = c.DeleteUnder(ctx, "/d/box.mbox")
	require.NoError(t, err)
	assert.Equal(t, 2, deleted)
	deleted, err = c.DeleteUnder(ctx, "/d")
	require.NoError(t, err)
	assert.Equal(t, 1, deleted, "/dx is not under /d")
	_, err = c.DeleteUnder(ctx, "/d*")
	assert.ErrorIs(t, err, ErrInvalid)

	// A vector of another dimension is refused, object by object.
	failed, err = c.Upsert(ctx, []Object{{PID: 7, Source: "d.txt", Text: "x", Terms: []string{"x"}, Vector: unitVec(1, 2, 3)}})
	if err == nil {
		require.Len(t, failed, 1)
		assert.Equal(t, uint64(7), failed[0].PID)
		assert.Contains(t, failed[0].Err, "length")
	} else {
		assert.ErrorIs(t, err, ErrInvalid)
	}
}

// The vector quantizer: refused unless known, set at creation, turned
// on for a collection that holds passages, kept when a later layout
// leaves it out, and never traded for another.
func TestQuantizer(t *testing.T) {
	cl := weaviatetest.Start(t, 1)
	ctx := t.Context()
	spec := Spec{Embedder: "test", Dims: 4, ChunkTokens: 64, Tokenizer: "tok", Analyzer: "en"}

	fresh, err := New(Config{URL: cl.URL(0), Collection: "Fresh"})
	require.NoError(t, err)
	defer fresh.Close()
	require.ErrorIs(t, fresh.EnsureCollection(ctx, spec, Layout{Quantizer: "pq"}), ErrInvalid)
	require.ErrorIs(t, fresh.EnsureCollection(ctx, spec, Layout{Quantizer: "rq", RescoreLimit: -1}), ErrInvalid)
	require.NoError(t, fresh.EnsureCollection(ctx, spec, Layout{Quantizer: "rq", RescoreLimit: 100}))
	q, limit, err := fresh.Quantizer(ctx)
	require.NoError(t, err)
	assert.Equal(t, "rq", q)
	assert.Equal(t, 100, limit)

	c, err := New(Config{URL: cl.URL(0), Collection: "Passages"})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.EnsureCollection(ctx, spec, Layout{}))
	failed, err := c.Upsert(ctx, testObjects())
	require.NoError(t, err)
	require.Empty(t, failed)
	q, _, err = c.Quantizer(ctx)
	require.NoError(t, err)
	assert.Empty(t, q, "float32 unless asked")

	require.NoError(t, c.EnsureCollection(ctx, spec, Layout{Quantizer: "rq"}))
	require.NoError(t, c.EnsureCollection(ctx, spec, Layout{}))
	q, limit, err = c.Quantizer(ctx)
	require.NoError(t, err)
	assert.Equal(t, "rq", q)
	assert.Equal(t, defaultRescoreLimit, limit)
	// The compressed graph still finds the nearest passages (rescored on
	// the float vectors).
	require.EventuallyWithT(t, func(c2 *assert.CollectT) {
		near, err := c.Nearest(ctx, unitVec(0.95, 0.05, 0, 0), 2)
		require.NoError(c2, err)
		require.Len(c2, near, 2)
		assert.ElementsMatch(c2, []uint64{1, 2}, []uint64{near[0].PID, near[1].PID})
	}, 30*time.Second, 200*time.Millisecond)
}

func TestBadInput(t *testing.T) {
	ctx := t.Context()
	t.Run("unreachable host", func(t *testing.T) {
		c, err := New(Config{URL: "http://127.0.0.1:1", Collection: "Passages", Timeout: 2 * time.Second})
		require.NoError(t, err)
		start := time.Now()
		_, err = c.Count(ctx)
		assert.ErrorIs(t, err, ErrUnavailable)
		assert.Less(t, time.Since(start), 3*time.Second)
	})
	t.Run("a cluster still electing its leader", func(t *testing.T) {
		answers := map[string]string{
			"/v1/schema/Settling": `{"error":[{"message":"failed to execute query: rpc error: code = Canceled desc = grpc: the client connection is closing"}]}`,
			"/v1/schema/Broken":   `{"error":[{"message":"index out of range"}]}`,
		}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.Method == http.MethodPut:
				// A schema update relayed to a leader that is not
				// settled yet is refused as unprocessable.
				w.WriteHeader(http.StatusUnprocessableEntity)
				_, _ = io.WriteString(w, `{"error":[{"message":"rpc error: code = Canceled desc = grpc: the client connection is closing"}]}`)
			case r.URL.Path == "/v1/schema/Writable":
				_, _ = io.WriteString(w, `{"class":"Writable","vectorIndexConfig":{"ef":256}}`)
			default:
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = io.WriteString(w, answers[r.URL.Path])
			}
		}))
		defer srv.Close()
		settling, err := New(Config{URL: srv.URL, Collection: "Settling"})
		require.NoError(t, err)
		_, err = settling.SearchEf(ctx)
		assert.ErrorIs(t, err, ErrUnavailable, "the engine's plumbing, not the request")
		writable, err := New(Config{URL: srv.URL, Collection: "Writable"})
		require.NoError(t, err)
		err = writable.SetSearchEf(ctx, 1024)
		assert.ErrorIs(t, err, ErrUnavailable, "a write refused by unsettled plumbing")
		broken, err := New(Config{URL: srv.URL, Collection: "Broken"})
		require.NoError(t, err)
		_, err = broken.SearchEf(ctx)
		assert.ErrorIs(t, err, ErrInvalid)
		assert.ErrorContains(t, err, "index out of range")
	})
	t.Run("bad names and URLs", func(t *testing.T) {
		_, err := New(Config{URL: "http://x", Collection: "lower"})
		assert.Error(t, err)
		for _, u := range []string{"http://h/Coll", "weaviate:///Coll", "weaviate://h/", "weaviate://h/bad-name"} {
			_, err := ParseURL(u)
			assert.Error(t, err, u)
		}
		cfg, err := ParseURL("weaviate+https://:secret@search.example:443/Wiki?timeout=3s")
		require.NoError(t, err)
		assert.Equal(t, Config{URL: "https://search.example:443", Collection: "Wiki", APIKey: "secret", Timeout: 3 * time.Second}, cfg)
		cfg, err = ParseURL("weaviate://search.example:8080/Wiki?grpc=:50051")
		require.NoError(t, err)
		assert.Equal(t, "search.example:50051", cfg.GRPC, "the URL's host")
		cfg, err = ParseURL("weaviate://search.example:8080/Wiki?grpc=grpc.example:443")
		require.NoError(t, err)
		assert.Equal(t, "grpc.example:443", cfg.GRPC)
		for _, g := range []string{"50051", "host", "host:"} {
			_, err := ParseURL("weaviate://h:8080/Wiki?grpc=" + g)
			assert.Error(t, err, g)
		}
	})
	t.Run("unreachable gRPC port", func(t *testing.T) {
		cl := weaviatetest.Start(t, 1)
		c := grpcClient(t, Config{URL: cl.URL(0), GRPC: "127.0.0.1:1", Collection: "Passages", Timeout: 2 * time.Second})
		start := time.Now()
		_, err := c.Lexical(ctx, []string{"a"}, 5)
		assert.ErrorIs(t, err, ErrUnavailable)
		assert.Less(t, time.Since(start), 3*time.Second)
		assert.ErrorIs(t, c.Ready(ctx), ErrUnavailable, "HTTP answers, the search port does not")
	})
	t.Run("api key", func(t *testing.T) {
		cl := weaviatetest.Start(t, 1, "WEAVIATE_API_KEY=right-key")
		wrong, err := New(Config{URL: cl.URL(0), Collection: "Passages", APIKey: "wrong-key"})
		require.NoError(t, err)
		_, err = wrong.Count(ctx)
		assert.ErrorIs(t, err, ErrAuth)
		right, err := New(Config{URL: cl.URL(0), Collection: "Passages", APIKey: "right-key"})
		require.NoError(t, err)
		_, err = right.Count(ctx)
		assert.ErrorIs(t, err, ErrNoCollection, "the key is accepted; the collection is not there")

		// The same over gRPC, searches' way in: a collection to search
		// first, then each fault.
		require.NoError(t, right.EnsureCollection(ctx, Spec{Embedder: "test", Dims: 4}, Layout{}))
		failed, err := right.Upsert(ctx, testObjects())
		require.NoError(t, err)
		require.Empty(t, failed)
		cfg := Config{URL: cl.URL(0), GRPC: cl.GRPC(0), Collection: "Passages", APIKey: "right-key"}
		ok := grpcClient(t, cfg)
		require.NoError(t, ok.Ready(ctx), "HTTP and the search port answer")
		near, err := ok.Nearest(ctx, unitVec(0.95, 0.05, 0, 0), 2)
		require.NoError(t, err)
		assert.Len(t, near, 2)
		_, err = ok.Nearest(ctx, []float32{1, 0, 0}, 2)
		assert.ErrorIs(t, err, ErrInvalid, "a vector of the wrong dimension")
		cfg.APIKey = "wrong-key"
		_, err = grpcClient(t, cfg).Lexical(ctx, []string{"a"}, 5)
		assert.ErrorIs(t, err, ErrAuth)
		cfg.APIKey, cfg.Collection = "right-key", "Missing"
		_, err = grpcClient(t, cfg).Lexical(ctx, []string{"a"}, 5)
		assert.ErrorIs(t, err, ErrNoCollection)
	})
}

// grpcClient is a client for cfg whose replication factor is known, so
// that its searches go to the gRPC port without asking HTTP first.
func grpcClient(t *testing.T, cfg Config) *Client {
	c, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	c.factor = 1
	return c
}

func TestObjectID(t *testing.T) {
	assert.Equal(t, ObjectID(42), ObjectID(42))
	assert.NotEqual(t, ObjectID(42), ObjectID(43))
	assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, ObjectID(1<<63))
}

// Three nodes, every shard on two of them: killing one node mid-loop
// fails no query outside a short window, and after it comes back every
// passage is there, once.
func TestClusterSurvivesLosingANode(t *testing.T) {
	cl := weaviatetest.Start(t, 3)
	ctx := t.Context()
	c, err := New(Config{URL: cl.URL(0), Collection: "Wiki", Timeout: 5 * time.Second})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.EnsureCollection(ctx, Spec{Embedder: "test", Dims: 4}, Layout{Shards: 3, Replicas: 2}))
	const n = 300
	var objs []Object
	for i := range n {
		objs = append(objs, Object{
			PID: uint64(1000 + i), Source: fmt.Sprintf("doc%d.txt", i/10), Start: i, End: i + 1, Text: fmt.Sprintf("passage %d", i),
			Terms:  []string{"common", fmt.Sprintf("w%d", i%7), fmt.Sprintf("u%d", i)},
			Vector: unitVec(float64(i%5)+1, float64(i%3), float64(i%11), 1),
		})
	}
	for i := 0; i < n; i += 100 {
		failed, err := c.Upsert(ctx, objs[i:i+100])
		require.NoError(t, err)
		require.Empty(t, failed)
	}

	search := func(c *Client) error {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		lex, err := c.Lexical(qctx, []string{"w3", "u10"}, 20)
		if err != nil {
			return err
		}
		if len(lex) == 0 || lex[0].PID != 1010 {
			return fmt.Errorf("lexical top hit %v, want passage 1010", lex)
		}
		near, err := c.Nearest(qctx, objs[42].Vector, 5)
		if err != nil {
			return err
		}
		if len(near) == 0 || near[0].Score < 0.999 {
			return fmt.Errorf("nearest %v, want an exact match first", near)
		}
		return nil
	}
	// Searches over GraphQL and over gRPC, each through node 0.
	g, err := New(Config{URL: cl.URL(0), GRPC: cl.GRPC(0), Collection: "Wiki", Timeout: 5 * time.Second})
	require.NoError(t, err)
	defer g.Close()
	query := func() error {
		if err := search(c); err != nil {
			return fmt.Errorf("graphql: %w", err)
		}
		if err := search(g); err != nil {
			return fmt.Errorf("grpc: %w", err)
		}
		return nil
	}
	require.NoError(t, query())
	cl.Kill(2)
	killed := time.Now()
	var lastFailure time.Duration
	var failures, total int
	for time.Since(killed) < 15*time.Second {
		total++
		if err := query(); err != nil {
			failures++
			lastFailure = time.Since(killed)
			t.Logf("query at +%v: %v", lastFailure.Round(time.Millisecond), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d of %d queries failed in the 15 s after the kill; last failure at +%v", failures, total, lastFailure.Round(time.Millisecond))
	assert.Less(t, lastFailure, 5*time.Second, "queries succeed again within 5 s of losing a node")

	cl.Restart(2)
	for i := range 3 {
		ci, err := New(Config{URL: cl.URL(i), Collection: "Wiki"})
		require.NoError(t, err)
		got, err := ci.Count(ctx)
		require.NoError(t, err)
		assert.Equal(t, n, got, "node %d", i)
		pids := make([]uint64, n)
		for j := range pids {
			pids[j] = uint64(1000 + j)
		}
		have, err := ci.Existing(ctx, pids)
		require.NoError(t, err)
		assert.Len(t, have, n, "node %d", i)
	}
}

func TestGQLString(t *testing.T) {
	for in, want := range map[string]string{
		`plain`:          `"plain"`,
		`say "hi"\now`:   `"say \"hi\"\\now"`,
		"bell\a tab\t é": `"bell\u0007 tab\t é"`,
	} {
		assert.Equal(t, want, gqlString(in))
	}
}

// The stored term statistics equal live counts, in several chunks and scan
// pages, and every write removes them until they are counted again.
func TestTermStats(t *testing.T) {
	cl := weaviatetest.Start(t, 1)
	ctx := t.Context()
	c, err := New(Config{URL: cl.URL(0), Collection: "Stats"})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.EnsureCollection(ctx, Spec{Embedder: "test", Dims: 4, Analyzer: "en"}, Layout{}))
	oldChunk, oldPage := termStatsChunk, scanPage
	termStatsChunk, scanPage = 3, 2
	t.Cleanup(func() { termStatsChunk, scanPage = oldChunk, oldPage })

	gen, err := c.TermStatsGeneration(ctx)
	require.NoError(t, err)
	assert.Empty(t, gen, "none counted yet")
	_, ok, err := c.ReadTermStats(ctx)
	require.NoError(t, err)
	assert.False(t, ok)

	objs := testObjects()
	objs = append(objs, Object{PID: 5, Source: "d.txt", Text: "volcano volcano bees", Terms: []string{"volcano", "volcano", "bee"}, Vector: unitVec(1, 0, 1, 0)})
	_, err = c.Upsert(ctx, objs)
	require.NoError(t, err)
	built, err := c.RebuildTermStats(ctx, nil)
	require.NoError(t, err)
	gen, err = c.TermStatsGeneration(ctx)
	require.NoError(t, err)
	assert.Equal(t, built.Generation, gen)

	got, ok, err := c.ReadTermStats(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	terms := []string{"etna", "volcano", "vesuviu", "bee", "make", "honei", "chess", "knight"}
	live, err := c.DocFreqs(ctx, terms, true)
	require.NoError(t, err)
	assert.Equal(t, live.Passages, got.Passages)
	assert.Equal(t, live.Terms, got.Terms)
	assert.Len(t, got.DocFreq, len(terms), "3 chunks of 3 terms, the last short")
	for _, term := range terms {
		assert.Equal(t, live.DocFreq[term], got.DocFreq[term], term)
	}
	assert.Equal(t, 3, got.DocFreq["volcano"], "a passage counts a term once")

	for name, write := range map[string]func() error{
		"upsert": func() error { _, err := c.Upsert(ctx, objs[:1]); return err },
		"delete": func() error { _, err := c.DeleteUnder(ctx, "d.txt"); return err },
	} {
		_, err := c.RebuildTermStats(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, write(), name)
		gen, err := c.TermStatsGeneration(ctx)
		require.NoError(t, err)
		assert.Empty(t, gen, "%s removes the statistics", name)
	}
	got, err = c.RebuildTermStats(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, 4, got.Passages)
	assert.Equal(t, 2, got.DocFreq["volcano"])
}
