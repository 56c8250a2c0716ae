package retrievalbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dragon-rag/dragon/internal/procstatus"
	"github.com/dragon-rag/dragon/retrieval"
	"github.com/dragon-rag/dragon/retrieval/weaviate"
)

// ScalePoint is one backend at one corpus size, for queries of one mode
// (hybrid unless said otherwise).
type ScalePoint struct {
	Passages int     `json:"passages"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	// QPS is queries per second with Clients queries in flight.
	QPS float64 `json:"qps"`
	// RecallAt10 is the share of the exact top 10 (exact BM25, brute-force
	// dense search, fused alike for hybrid) that the backend returns.
	RecallAt10 float64 `json:"recall_at_10"`
	IngestPerS float64 `json:"ingest_per_s"`
	// RSSMB is the resident memory of what serves the index: this process
	// for bleve (less what it held before), the engine's nodes otherwise.
	RSSMB float64 `json:"rss_mb"`
}

// Cluster is a running engine: its URLs and the resident memory of its
// nodes.
type Cluster interface {
	URL() string
	// GRPC is the gRPC address of the node URL names.
	GRPC() string
	RSSBytes() (int64, error)
	Stop() error
}

// ScaleOptions configure Scale.
type ScaleOptions struct {
	// Corpus is a folder of text (a synthetic corpus, `dragon index
	// synth`) and Passages how many passages it makes.
	Corpus   string
	Passages int
	// Tokenizer cuts passages; Embedder embeds them and the queries.
	Tokenizer retrieval.Tokenizer
	Embedder  retrieval.Embedder
	Queries   []string
	// Warmup are other queries run first on each backend, unmeasured, so
	// that the latencies are those of a serving engine rather than of one
	// just started on cold files; none of them is a measured query, whose
	// terms would then be cached.
	Warmup []string
	// Mode of the queries (default hybrid); recall is against the exact
	// search of the same mode.
	Mode retrieval.Mode
	// Backends to measure: "bleve", or "engine-N" started by StartEngine.
	Backends []string
	// Replicas of each engine shard (default min(2, N), as a cluster that
	// survives losing a node keeps them); 1 halves what a 2-core machine
	// ingests without changing what a query visits (one copy of each of
	// N shards, read at consistency ONE).
	Replicas int
	// SearchEf is the engine's query-time HNSW candidate list (0: the
	// collection's; weaviate.Layout). It may change on a kept collection.
	SearchEf int
	// Quantizer turns on the collection's vector quantizer
	// (weaviate.Layout), on a kept collection too.
	Quantizer string
	// GraphConnections and GraphEfConstruction build a new collection's
	// graph (weaviate.Layout).
	GraphConnections, GraphEfConstruction int
	// GraphQL sends the engine's searches as GraphQL rather than over its
	// gRPC API (the default), to compare the two.
	GraphQL     bool
	StartEngine func(nodes int) (Cluster, error)
	// Clients in flight for QPS (default 4).
	Clients int
	Dir     string
	// Reuse keeps what an earlier run left in Dir (the reference index,
	// the engines' data) and its ingest rates, so a corpus too large to
	// ingest twice can be queried again.
	Reuse bool
	Log   func(format string, args ...any)
}

// Scale measures each backend over one corpus.
func Scale(ctx context.Context, o ScaleOptions) (map[string]ScalePoint, error) {
	if o.Clients <= 0 {
		o.Clients = 4
	}
	if o.Mode == retrieval.ModeAuto {
		o.Mode = retrieval.ModeHybrid
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	// The reference: exact BM25 (bleve) and exact dense search (a scan of
	// every vector), fused by the same RRF.
	// What earlier work left for the collector would make the index's
	// share look smaller, even negative.
	debug.FreeOSMemory()
	before := selfRSS()
	exact, buildS, err := referenceIndex(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("reference index: %w", err)
	}
	n := exact.Stats().Manifest.Passages
	o.Log("%d passages indexed by bleve in %.0fs", n, buildS)
	ref := make([][]string, len(o.Queries))
	for i, q := range o.Queries {
		hits, err := exact.Search(ctx, q, 10, o.Mode)
		if err != nil {
			exact.Close()
			return nil, err
		}
		ref[i] = hitKeys(hits)
	}
	if err := exact.Close(); err != nil {
		return nil, err
	}

	out := map[string]ScalePoint{}
	for _, b := range o.Backends {
		var (
			s      retrieval.Searcher
			ingest float64
			rss    func() float64
			stop   = func() {}
		)
		switch {
		case b == "bleve":
			// The bleve index as the daemons open it: past
			// retrieval.DefaultExactDenseMax passages it searches through
			// its vectors' codes, where the reference scores every vector.
			ix, err := retrieval.Open(filepath.Join(o.Dir, "bleve"), retrieval.Options{ReadOnly: true, Embedder: o.Embedder})
			if err != nil {
				return out, err
			}
			s, stop = ix, func() { ix.Close() }
			indexS := buildS
			ingest = float64(n) / indexS
			rss = func() float64 { return float64(selfRSS()-before) / (1 << 20) }
		case strings.HasPrefix(b, "engine-"):
			nodes, err := strconv.Atoi(strings.TrimPrefix(b, "engine-"))
			if err != nil || nodes < 1 {
				return out, fmt.Errorf("backend %q: want engine-N", b)
			}
			cl, err := o.StartEngine(nodes)
			if err != nil {
				return out, err
			}
			cfg := weaviate.Config{URL: cl.URL(), GRPC: cl.GRPC(), Collection: "Scale", Timeout: time.Minute}
			if o.GraphQL {
				cfg.GRPC = ""
			}
			store, err := weaviate.New(cfg)
			if err != nil {
				cl.Stop()
				return out, err
			}
			if err := awaitServing(ctx, store, 2*time.Minute); err != nil {
				cl.Stop()
				return out, fmt.Errorf("%s: %w", b, err)
			}
			layout := weaviate.Layout{Shards: nodes, Replicas: min(2, nodes)}
			if o.Replicas > 0 {
				layout.Replicas = min(o.Replicas, nodes)
			}
			layout.SearchEf, layout.Quantizer = o.SearchEf, o.Quantizer
			layout.GraphConnections, layout.GraphEfConstruction = o.GraphConnections, o.GraphEfConstruction
			rateFile := filepath.Join(o.Dir, b+".ingest-per-s")
			earlier, haveEarlier := readFloat(rateFile)
			if complete, err := keptComplete(ctx, store, o, haveEarlier, n); err != nil {
				cl.Stop()
				return out, fmt.Errorf("%s: %w", b, err)
			} else if complete {
				// Streaming again would only check what the count says,
				// by cutting the whole corpus again (minutes at 10^6).
				if o.SearchEf > 0 {
					err = retrySettled(ctx, 2*time.Minute, func() error { return store.SetSearchEf(ctx, o.SearchEf) })
				}
				if err != nil {
					cl.Stop()
					return out, fmt.Errorf("%s: search ef: %w", b, err)
				}
				ingest = earlier
				o.Log("%s: all %d passages there (counted), not streamed again", b, n)
			} else {
				t0 := time.Now()
				// On reuse this only checks that every passage is there.
				rep, err := streamSettled(ctx, store, retrieval.StreamOptions{Tokenizer: o.Tokenizer, Embedder: o.Embedder, Batch: 512, Layout: layout}, o.Corpus, 2*time.Minute)
				if err == nil && len(rep.Failed) > 0 {
					err = fmt.Errorf("%d passages refused, the first: %v", len(rep.Failed), rep.Failed[0])
				}
				if err != nil {
					cl.Stop()
					return out, fmt.Errorf("%s: ingest: %w", b, err)
				}
				ingest = float64(rep.Passages) / time.Since(t0).Seconds()
				if o.Reuse && haveEarlier && rep.Passages == 0 {
					ingest = earlier
				} else if err := writeFloat(rateFile, ingest); err != nil {
					cl.Stop()
					return out, err
				}
				o.Log("%s: %d passages ingested (%d there before) at %.0f/s", b, rep.Passages, rep.Present, ingest)
			}
			r, err := retrieval.OpenRemote(ctx, store, o.Embedder)
			if err != nil {
				cl.Stop()
				return out, err
			}
			s = r
			stop = func() { store.Close(); cl.Stop() }
			rss = func() float64 {
				v, _ := cl.RSSBytes()
				return float64(v) / (1 << 20)
			}
		default:
			return out, fmt.Errorf("unknown backend %q (bleve, engine-N)", b)
		}
		if err := warm(ctx, s, o.Mode, o.Warmup, o.Clients); err != nil {
			stop()
			return out, fmt.Errorf("%s: warm-up: %w", b, err)
		}
		p, err := measure(ctx, s, o.Mode, o.Queries, ref, o.Clients)
		if err != nil {
			stop()
			return out, fmt.Errorf("%s: %w", b, err)
		}
		p.Passages, p.IngestPerS, p.RSSMB = n, ingest, rss()
		o.Log("%s: %+v", b, p)
		out[b] = p
		stop()
	}
	return out, nil
}

// referenceIndex builds the exact index (or, on reuse, opens the one an
// earlier run built) and says how long building took. It is searched
// exactly at any size.
func referenceIndex(ctx context.Context, o ScaleOptions) (*retrieval.Index, float64, error) {
	dir := filepath.Join(o.Dir, "bleve")
	secFile := dir + ".build-s"
	if s, ok := readFloat(secFile); ok && o.Reuse {
		ix, err := retrieval.Open(dir, retrieval.Options{ReadOnly: true, Embedder: o.Embedder, ExactDenseMax: 1 << 40})
		return ix, s, err
	}
	os.RemoveAll(dir)
	start := time.Now()
	// Each commit rewrites the vectors file whole: commits of the default
	// 4,096 passages would write ~190 GB at 10^6 passages, eight commits
	// about 4.5 times the final file.
	ix, _, err := retrieval.Build(ctx, dir, retrieval.Options{
		Tokenizer: o.Tokenizer, Embedder: o.Embedder, ExactDenseMax: 1 << 40, EmbedBatch: 256,
		CommitEvery: max(4096, o.Passages/8),
	}, o.Corpus)
	if err != nil {
		return nil, 0, err
	}
	s := time.Since(start).Seconds()
	if err := writeFloat(secFile, s); err != nil {
		ix.Close()
		return nil, 0, err
	}
	return ix, s, nil
}

func readFloat(path string) (float64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	return v, err == nil
}

func writeFloat(path string, v float64) error {
	return os.WriteFile(path, []byte(strconv.FormatFloat(v, 'g', -1, 64)+"\n"), 0o644)
}

// hitKeys names hits by file name and offset: a passage's source is its
// file's absolute path, and the reference index and an engine's ingest
// may have read the one corpus folder by different paths (a kept folder
// linked from another run's), which made every hit a miss. The
// synthetic corpus is one folder, so its file names are unique.
func hitKeys(hits []retrieval.Hit) []string {
	out := make([]string, len(hits))
	for i, h := range hits {
		out[i] = fmt.Sprintf("%s@%d", filepath.Base(h.Passage.Source), h.Passage.Start)
	}
	return out
}

// awaitServing waits until the engine answers a read of the collection's
// schema, or says anything but that it is unavailable (no collection
// yet, say; what is wrong then is for the ingest to report): nodes
// restarted on kept data report ready before their consensus has
// settled, and answer 500s until then.
func awaitServing(ctx context.Context, store *weaviate.Client, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		_, err := store.SearchEf(ctx)
		if !errors.Is(err, weaviate.ErrUnavailable) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not serving after %s: %w", within, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// keptComplete says whether a kept collection already holds the whole
// corpus: a stream ran to its end before (the rate file it leaves), and
// the collection counts the reference's n passages (ids are passage ids,
// so none is there twice). A quantizer to turn on needs the stream's
// schema update.
func keptComplete(ctx context.Context, store *weaviate.Client, o ScaleOptions, ingestedBefore bool, n int) (bool, error) {
	if !o.Reuse || !ingestedBefore || o.Quantizer != "" {
		return false, nil
	}
	var count int
	err := retrySettled(ctx, 2*time.Minute, func() (err error) {
		count, err = store.Count(ctx)
		return err
	})
	if errors.Is(err, weaviate.ErrNoCollection) {
		return false, nil
	}
	return count == n, err
}

// streamSettled streams the corpus into store, again while the cluster
// says it is unavailable (up to within): reads settle first on restarted
// nodes, and a schema update (a kept collection's new search ef) can
// still meet the leader's election. Streaming is idempotent.
func streamSettled(ctx context.Context, store *weaviate.Client, so retrieval.StreamOptions, corpus string, within time.Duration) (rep retrieval.StreamReport, err error) {
	err = retrySettled(ctx, within, func() error {
		rep, err = retrieval.Stream(ctx, store, so, corpus)
		return err
	})
	return rep, err
}

// retrySettled calls f again while the cluster says it is unavailable
// (up to within).
func retrySettled(ctx context.Context, within time.Duration, f func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := f()
		if !errors.Is(err, weaviate.ErrUnavailable) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// warm runs queries from clients goroutines at once, for their effect on
// the engine's caches only.
func warm(ctx context.Context, s retrieval.Searcher, mode retrieval.Mode, queries []string, clients int) error {
	errs := make([]error, clients)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < len(queries) && errs[c] == nil; i += clients {
				_, errs[c] = s.Search(ctx, queries[i], 10, mode)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// measure runs the queries one at a time (latency, recall), then from
// clients goroutines at once (throughput).
func measure(ctx context.Context, s retrieval.Searcher, mode retrieval.Mode, queries []string, ref [][]string, clients int) (ScalePoint, error) {
	var p ScalePoint
	lat := make([]float64, 0, len(queries))
	var recall float64
	for i, q := range queries {
		t0 := time.Now()
		hits, err := s.Search(ctx, q, 10, mode)
		if err != nil {
			return p, err
		}
		lat = append(lat, float64(time.Since(t0).Microseconds())/1000)
		got := hitKeys(hits)
		shared := 0
		for _, k := range ref[i] {
			if slices.Contains(got, k) {
				shared++
			}
		}
		if len(ref[i]) > 0 {
			recall += float64(shared) / float64(len(ref[i]))
		}
	}
	slices.Sort(lat)
	p.P50Ms = lat[len(lat)/2]
	p.P99Ms = lat[min(len(lat)-1, len(lat)*99/100)]
	p.RecallAt10 = recall / float64(len(queries))

	var wg sync.WaitGroup
	var firstErr error
	var mu sync.Mutex
	t0 := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < len(queries); i += clients {
				if _, err := s.Search(ctx, queries[i], 10, mode); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	p.QPS = float64(len(queries)) / time.Since(t0).Seconds()
	return p, firstErr
}

// selfRSS is this process's resident set in bytes (0 where /proc is not).
func selfRSS() int64 { return rssOf(os.Getpid()) }

// rssOf is a process's resident set in bytes (0 where /proc is not).
func rssOf(pid int) int64 {
	kb, _ := procstatus.KB(procstatus.Of(pid), "VmRSS")
	return kb << 10
}

// ScriptCluster is a cluster started by deploy/weaviate/cluster.sh.
type ScriptCluster struct {
	Script, Dir string
	Base        int
	Env         []string
}

// URL implements Cluster.
func (c *ScriptCluster) URL() string { return fmt.Sprintf("http://127.0.0.1:%d", c.Base) }

// GRPC implements Cluster (cluster.sh's ports: BASE+100+I).
func (c *ScriptCluster) GRPC() string { return fmt.Sprintf("127.0.0.1:%d", c.Base+100) }

// RSSBytes implements Cluster: the nodes' resident memory summed.
func (c *ScriptCluster) RSSBytes() (int64, error) {
	pids, err := filepath.Glob(filepath.Join(c.Dir, "node-*.pid"))
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, f := range pids {
		b, err := os.ReadFile(f)
		if err != nil {
			return 0, err
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return 0, err
		}
		sum += rssOf(pid)
	}
	return sum, nil
}

// Stop implements Cluster.
func (c *ScriptCluster) Stop() error { return runScript(c.Script, c.Env, "stop", c.Dir) }

// Pause freezes node i (SIGSTOP); Resume lets it go on.
func (c *ScriptCluster) Pause(i int) error {
	return runScript(c.Script, c.Env, "pause", c.Dir, strconv.Itoa(i))
}

// Resume lets a paused node i go on.
func (c *ScriptCluster) Resume(i int) error {
	return runScript(c.Script, c.Env, "resume", c.Dir, strconv.Itoa(i))
}

// StartScriptCluster starts nodes with the script (which waits until all
// are ready).
func StartScriptCluster(script, dir string, nodes, base int, env []string) (*ScriptCluster, error) {
	c := &ScriptCluster{Script: script, Dir: dir, Base: base, Env: env}
	if err := runScript(script, env, "start", dir, strconv.Itoa(nodes), strconv.Itoa(base)); err != nil {
		return nil, err
	}
	return c, nil
}

func runScript(script string, env []string, args ...string) error {
	cmd := exec.Command(script, args...)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", filepath.Base(script), strings.Join(args, " "), err, out)
	}
	return nil
}
