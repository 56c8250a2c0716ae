package main

import (
	"cmp"
	"context"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/retrievalbench"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/rerank"
	"github.com/dragon-rag/dragon/retrieval"
)

func init() { benchCommands = append(benchCommands, newBenchRetrievalCmd) }

// retrievalReport is `dragon bench retrieval --json`.
type retrievalReport struct {
	Date      string                        `json:"date"`
	CPUs      int                           `json:"cpus"`
	Threads   int                           `json:"threads"`
	Corpus    string                        `json:"corpus"`
	EmbedPerS map[string]float64            `json:"embed_per_s"`
	EmbedOn   int                           `json:"embed_passages"`
	Quality   *retrievalbench.QualityResult `json:"quality,omitempty"`
	// Rerank is Quality's re-ranking run (--rerank-model), also at the top.
	Rerank *retrievalbench.RerankResult `json:"rerank,omitempty"`
	// Scale is backend → corpus size → query figures, on synthetic corpora
	// with ScaleVectors ("words" or "random").
	ScaleVectors string `json:"scale_vectors,omitempty"`
	// ScaleReplicas is --scale-replicas (0: the default, 2).
	ScaleReplicas int `json:"scale_replicas,omitempty"`
	// ScaleSearchEf is --scale-search-ef (0: the collection's).
	ScaleSearchEf int `json:"scale_search_ef,omitempty"`
	// ScaleQuantizer is --scale-quantizer ("": the collection's).
	ScaleQuantizer string `json:"scale_quantizer,omitempty"`
	// ScaleGraph is --scale-graph-connections and
	// --scale-graph-ef-construction (0: the engine collection's defaults).
	ScaleGraphConnections    int `json:"scale_graph_connections,omitempty"`
	ScaleGraphEfConstruction int `json:"scale_graph_ef_construction,omitempty"`
	// ScaleAPI is --scale-api: how the engine is asked (grpc or graphql).
	ScaleAPI string `json:"scale_api,omitempty"`
	// ScaleBM25 is --scale-bm25: the engine's BM25 searcher (blockmax or
	// exhaustive).
	ScaleBM25 string `json:"scale_bm25,omitempty"`
	// ScaleWarmup is --warmup: unmeasured questions asked of each backend
	// before the measured ones.
	ScaleWarmup int                                             `json:"scale_warmup_queries,omitempty"`
	Scale       map[string]map[string]retrievalbench.ScalePoint `json:"scale,omitempty"`
}

func newBenchRetrievalCmd() *cobra.Command {
	var (
		model, wiki, questions             string
		embedders                          []string
		threads, sample, pool              int
		embedOn                            int
		seed                               uint64
		asJSON, noQuality                  bool
		sizes                              []int
		backends                           []string
		script                             string
		queries, warmup                    int
		scaleMode, scaleVectors, quantizer string
		scaleAPI, scaleBM25                string
		replicas, searchEf                 int
		graphM, graphEfc                   int
		keep                               string
		rerankModel, rerankFirst           string
		rerankCandidates                   int
	)
	cmd := &cobra.Command{
		Use:   "retrieval",
		Short: "Retrieval quality on labelled questions (answer recall@k, DPR's metric) and embedding throughput",
		Long: `Cuts the Wikipedia corpus (make wiki) into passages with the chat model's
tokenizer, keeps the Natural Questions and TriviaQA test questions whose
answer some passage holds, and measures answer recall@k of BM25, and of
dense and hybrid search with each embedder, on a sample of them over a pool
of passages (those holding the sampled answers, at most 3 each, and random
others). Embedding throughput is measured on passages of the same corpus.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			logf := func(format string, a ...any) {
				if !asJSON {
					fmt.Fprintf(cmd.ErrOrStderr(), format+"\n", a...)
				}
			}
			m, err := llamacpp.Load(model, llamacpp.Options{Threads: threads})
			if err != nil {
				return err
			}
			defer m.Close()
			scratch, err := os.MkdirTemp("", "dragon-bench-retrieval-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(scratch)
			start := time.Now()
			ix, _, err := retrieval.Build(ctx, filepath.Join(scratch, "wiki"), retrieval.Options{Tokenizer: m}, wiki)
			if err != nil {
				return fmt.Errorf("%w (make wiki fetches the corpus)", err)
			}
			var passages []string
			for _, p := range ix.Passages() {
				passages = append(passages, p.Text)
			}
			ix.Close()
			logf("corpus %s: %d passages (cut in %v)", wiki, len(passages), time.Since(start).Round(time.Second))

			embs := map[string]retrieval.Embedder{}
			for _, spec := range embedders {
				name, path, _ := strings.Cut(spec, "=")
				if path == "" {
					path = name
				}
				if name == chatEmbedder {
					path = chatEmbedder
				} else if path == "minilm" {
					path = embedModel
				}
				e, closeE, err := newEmbedder(path, m, threads)
				if err != nil {
					return err
				}
				defer closeE()
				embs[name] = e
			}
			rep := retrievalReport{
				Date: time.Now().UTC().Format(time.DateOnly), CPUs: runtime.NumCPU(), Threads: threads, Corpus: wiki,
				EmbedPerS: map[string]float64{}, EmbedOn: embedOn,
			}
			rng := rand.New(rand.NewPCG(seed, 1))
			texts := make([]string, embedOn)
			for i := range texts {
				texts[i] = passages[rng.IntN(len(passages))]
			}
			for name, e := range embs {
				if rep.EmbedPerS[name], err = retrievalbench.EmbedRate(ctx, e, texts); err != nil {
					return fmt.Errorf("embed rate of %s: %w", name, err)
				}
				logf("embed %s: %.1f passages/s", name, rep.EmbedPerS[name])
			}
			if !noQuality {
				var qs []retrievalbench.Question
				for _, f := range []string{"nq.test.tsv", "trivia.test.tsv"} {
					q, err := retrievalbench.LoadQuestions(filepath.Join(questions, f))
					if err != nil {
						return err
					}
					qs = append(qs, q...)
				}
				qo := retrievalbench.QualityOptions{
					Passages: passages, Questions: qs, Sample: sample, Pool: pool, Embedders: embs,
					Tokenizer: m, Seed: seed, Dir: filepath.Join(scratch, "quality"), Log: logf,
				}
				if rerankModel != "" {
					// One thread: the cost the daemons pay per pair.
					rr, closeRR, err := openReranker(rerankModel, 1)
					if err != nil {
						return err
					}
					defer closeRR()
					qo.Reranker, qo.RerankCandidates, qo.RerankFirst = rr, rerankCandidates, rerankFirst
				}
				res, err := retrievalbench.Quality(ctx, qo)
				if err != nil {
					return err
				}
				rep.Quality = &res
				rep.Rerank = res.Rerank
			}
			if len(sizes) > 0 {
				// Half the questions from each set, and the warm-up's from
				// the questions after those.
				var qs, ws []string
				for _, f := range []string{"nq.test.tsv", "trivia.test.tsv"} {
					q, err := retrievalbench.LoadQuestions(filepath.Join(questions, f))
					if err != nil {
						return err
					}
					measured := min(len(q), queries/2)
					for _, x := range q[:measured] {
						qs = append(qs, x.Text)
					}
					for _, x := range q[measured:min(len(q), measured+warmup/2)] {
						ws = append(ws, x.Text)
					}
				}
				if scaleAPI != "grpc" && scaleAPI != "graphql" {
					return fmt.Errorf("--scale-api %q: want grpc or graphql", scaleAPI)
				}
				if scaleBM25 != "blockmax" && scaleBM25 != "exhaustive" {
					return fmt.Errorf("--scale-bm25 %q: want blockmax or exhaustive", scaleBM25)
				}
				mode, err := retrieval.ParseMode(scaleMode)
				if err != nil {
					return err
				}
				vectors, closeV, err := scaleEmbedder(ctx, scaleVectors, m, passages, threads, keep, logf)
				if err != nil {
					return err
				}
				defer closeV()
				rep.ScaleVectors, rep.ScaleReplicas, rep.ScaleSearchEf, rep.ScaleQuantizer, rep.ScaleWarmup, rep.ScaleAPI, rep.ScaleBM25 = scaleVectors, replicas, searchEf, quantizer, len(ws), scaleAPI, scaleBM25
				rep.ScaleGraphConnections, rep.ScaleGraphEfConstruction = graphM, graphEfc
				base := retrievalbench.ScaleOptions{Tokenizer: m, Embedder: vectors, Queries: qs, Warmup: ws, Mode: mode, Backends: backends, Replicas: replicas, SearchEf: searchEf, Quantizer: quantizer, GraphConnections: graphM, GraphEfConstruction: graphEfc, GraphQL: scaleAPI == "graphql", Log: logf}
				env := []string{"WEAVIATE_BM25=" + scaleBM25}
				if rep.Scale, err = benchScale(ctx, m, passages, sizes, base, script, env, cmp.Or(keep, scratch), keep != ""); err != nil {
					return err
				}
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			return printRetrievalReport(cmd.OutOrStdout(), rep)
		},
	}
	f := cmd.Flags()
	f.StringVar(&model, "model", defaultModel(), "GGUF chat model (its tokenizer cuts passages; the 'chat' embedder)")
	f.StringVar(&wiki, "corpus", "data/corpus/wiki", "real text corpus (make wiki)")
	f.StringVar(&questions, "questions", "data/corpus/questions", "folder of DPR's nq.test.tsv and trivia.test.tsv (make wiki)")
	f.StringSliceVar(&embedders, "embedders", []string{"minilm", chatEmbedder}, "embedders to compare: minilm (--embed-model), chat, or NAME=GGUF")
	f.IntVar(&threads, "threads", 2, "compute threads")
	f.IntVar(&sample, "sample", 200, "answerable questions asked")
	f.IntVar(&pool, "pool", 2000, "passages in the evaluation corpus (0: all)")
	f.IntVar(&embedOn, "embed-passages", 64, "passages embedded for embed_per_s")
	f.Uint64Var(&seed, "seed", 1, "sampling seed")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	f.BoolVar(&noQuality, "no-quality", false, "skip the labelled-question quality run")
	f.StringVar(&rerankModel, "rerank-model", "", "cross-encoder GGUF (make rerank-model) whose re-ranking of the first stage's candidates is measured: recall@k with and without, and ms per pair on one thread")
	f.IntVar(&rerankCandidates, "rerank-candidates", rerank.DefaultCandidates, "first-stage passages re-ranked")
	f.StringVar(&rerankFirst, "rerank-first", "minilm-hybrid", "the first stage re-ranked: a ranker of the quality run (bm25, NAME-dense, NAME-hybrid)")
	f.IntSliceVar(&sizes, "sizes", nil, "synthetic corpus sizes for the scale run, e.g. 10000,100000,1000000 (none: no scale run)")
	f.StringSliceVar(&backends, "backends", []string{"bleve", "engine-1", "engine-3"}, "scale run backends: bleve, engine-N (N Weaviate nodes on loopback)")
	f.StringVar(&script, "cluster-script", "deploy/weaviate/cluster.sh", "starts engine nodes (its binary: $WEAVIATE_BIN or build/weaviate, make weaviate)")
	f.IntVar(&queries, "queries", 200, "scale run queries (real questions)")
	f.IntVar(&warmup, "warmup", 200, "scale run: other questions asked of each backend first, unmeasured (0: measure an engine just started, on cold files)")
	f.StringVar(&scaleMode, "scale-mode", "hybrid", "scale run ranker: hybrid, bm25 or dense (recall against the exact one)")
	f.StringVar(&keep, "keep", "", "keep the scale run's corpora, reference indexes and engine data in this folder, and reuse what an earlier run left there (ingest once, query again)")
	f.IntVar(&graphM, "scale-graph-connections", 0, "scale run: the HNSW graph of a new collection: links per node (0: 32); more find more true nearest vectors at a given search ef, for a slower ingest; the engine folder under --keep is named for it")
	f.IntVar(&graphEfc, "scale-graph-ef-construction", 0, "scale run: the HNSW graph of a new collection: candidate list while linking (0: 128); longer builds a better graph, for a slower ingest; the engine folder under --keep is named for it")
	f.StringVar(&quantizer, "scale-quantizer", "", "scale run: turn on the engine collection's vector quantizer (rq), on a kept collection too (it cannot be turned off)")
	f.IntVar(&searchEf, "scale-search-ef", 0, "scale run: the engine collection's query-time HNSW candidate list (0: the collection's, 256 when new); may change on a kept collection")
	f.IntVar(&replicas, "scale-replicas", 0, "scale run: copies of each engine shard (0: 2, or 1 for one node); 1 halves the ingest on a small machine, a query reads one copy either way")
	f.StringVar(&scaleAPI, "scale-api", "grpc", "scale run: how searches reach the engine: grpc (its binary search API) or graphql")
	f.StringVar(&scaleBM25, "scale-bm25", "blockmax", "scale run: the engine's BM25 searcher: blockmax (BlockMax WAND, skipping blocks that cannot reach the top k) or exhaustive (every posting of every query term), on the same collection")
	f.StringVar(&scaleVectors, "scale-vectors", "words", "scale run vectors: words (each passage the mean of its words' MiniLM vectors) or random (unit vectors, the worst case for a graph index)")
	return cmd
}

func printRetrievalReport(w interface{ Write([]byte) (int, error) }, r retrievalReport) error {
	fmt.Fprintf(w, "embedding, %d threads, %d passages:\n", r.Threads, r.EmbedOn)
	for name, v := range r.EmbedPerS {
		fmt.Fprintf(w, "  %-10s %8.1f passages/s\n", name, v)
	}
	if q := r.Quality; q != nil {
		fmt.Fprintf(w, "answer recall, %d questions (of %d answerable) over %d passages:\n", q.Questions, q.Answerable, q.Passages)
		for name, rec := range q.Recall {
			fmt.Fprintf(w, "  %-14s @1 %.3f  @5 %.3f  @10 %.3f  @20 %.3f\n", name, rec["@1"], rec["@5"], rec["@10"], rec["@20"])
		}
		if rr := q.Rerank; rr != nil {
			fmt.Fprintf(w, "re-ranking %d candidates of %s (%.1f ms a pair, one thread):\n", rr.Candidates, rr.FirstStage, rr.MsPerPair)
			for k, v := range rr.RecallAt {
				fmt.Fprintf(w, "  @%-3s off %.3f  on %.3f\n", k, v["off"], v["on"])
			}
		}
	}
	return nil
}

// scaleWords is how many of the real corpus's most frequent words get a
// MiniLM vector for --scale-vectors words.
const scaleWords = 20_000

// scaleEmbedder gives the scale run's vectors: no model embeds millions of
// passages here, so either each passage's words' MiniLM vectors, averaged,
// or random unit vectors.
// With keep set the word vectors are kept there and read back next time.
func scaleEmbedder(ctx context.Context, kind string, m engine.Model, real []string, threads int, keep string, logf func(string, ...any)) (retrieval.Embedder, func(), error) {
	switch kind {
	case "random":
		return retrieval.RandomEmbedder{Dims: 384}, func() {}, nil
	case "words":
		model, err := retrievalbench.LearnText(real)
		if err != nil {
			return nil, nil, err
		}
		e, closeE, err := newEmbedder(embedModel, m, threads)
		if err != nil {
			return nil, nil, err
		}
		kept := filepath.Join(keep, fmt.Sprintf("word-vectors-%d", scaleWords))
		if keep != "" {
			if w, err := retrievalbench.LoadWordMeanEmbedder(kept, e); err == nil {
				logf("scale vectors: %d words read from %s", w.Words(), kept)
				return w, closeE, nil
			}
		}
		t0 := time.Now()
		w, err := retrievalbench.NewWordMeanEmbedder(ctx, e, model.Frequent(scaleWords))
		if err == nil && keep != "" {
			if err = os.MkdirAll(keep, 0o755); err == nil {
				err = w.Save(kept)
			}
		}
		if err != nil {
			closeE()
			return nil, nil, err
		}
		logf("scale vectors: %d words embedded in %v", w.Words(), time.Since(t0).Round(time.Second))
		return w, closeE, nil
	default:
		return nil, nil, fmt.Errorf("--scale-vectors %q: want words or random", kind)
	}
}

// benchScale writes a synthetic corpus of each size (from the real
// corpus's word statistics) and measures every backend over it.
// benchScale runs the scale measurement of base (its tokenizer, vectors,
// queries, mode, backends, replicas and log) on a synthetic corpus of each
// size, kept under scratch when reuse is set.
func benchScale(ctx context.Context, m engine.Model, real []string, sizes []int, base retrievalbench.ScaleOptions, script string, env []string, scratch string, reuse bool) (map[string]map[string]retrievalbench.ScalePoint, error) {
	logf, vectors := base.Log, base.Embedder
	model, err := retrievalbench.LearnText(real)
	if err != nil {
		return nil, err
	}
	perWord, err := model.TokensPerWord(m)
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]retrievalbench.ScalePoint{}
	for _, n := range sizes {
		// The vectors' fingerprint names the folder: kept engine data is
		// only queried with the vectors it holds.
		fp, ok := vectors.(retrieval.Fingerprinter)
		if !ok {
			return out, fmt.Errorf("scale vectors %T name no fingerprint", vectors)
		}
		dir := filepath.Join(scratch, fmt.Sprintf("scale-%d-%08x", n, crc32.ChecksumIEEE([]byte(fp.Fingerprint()))))
		corpus := filepath.Join(dir, "corpus")
		written := filepath.Join(dir, "corpus.written")
		if _, err := os.Stat(written); err != nil || !reuse {
			os.RemoveAll(corpus)
			if _, err := retrievalbench.WriteSynthCorpus(corpus, model, retrievalbench.SynthWords(n, retrieval.DefaultChunkTokens, perWord), 0, uint64(n)); err != nil {
				return out, err
			}
			if err := os.WriteFile(written, nil, 0o644); err != nil {
				return out, err
			}
		}
		logf("scale: synthetic corpus of about %d passages", n)
		o := base
		o.Corpus, o.Passages, o.Dir, o.Reuse = corpus, n, dir, reuse
		o.StartEngine = func(nodes int) (retrievalbench.Cluster, error) {
			// A kept cluster restarts on the ports its members know; its
			// folder names its replication, which its collection keeps.
			data := fmt.Sprintf("engine-%d", nodes)
			if o.Replicas > 0 {
				data += fmt.Sprintf("-r%d", o.Replicas)
			}
			if o.GraphConnections > 0 || o.GraphEfConstruction > 0 {
				data += fmt.Sprintf("-m%d-efc%d", o.GraphConnections, o.GraphEfConstruction)
			}
			return retrievalbench.StartScriptCluster(script, filepath.Join(dir, data), nodes, 21000+1000*nodes, env)
		}
		res, err := retrievalbench.Scale(ctx, o)
		if err != nil {
			return out, err
		}
		for b, p := range res {
			if out[b] == nil {
				out[b] = map[string]retrievalbench.ScalePoint{}
			}
			out[b][strconv.Itoa(n)] = p
		}
		if !reuse {
			os.RemoveAll(dir)
		}
	}
	return out, nil
}
