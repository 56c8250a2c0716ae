package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/gguf"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/engine/residency"
	"github.com/dragon-rag/dragon/internal/procstatus"
	"github.com/dragon-rag/dragon/profiler"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/rerank"
	"github.com/dragon-rag/dragon/retrieval"
	"github.com/dragon-rag/dragon/session"
	"github.com/dragon-rag/dragon/specdec"
	"github.com/dragon-rag/dragon/wire"
)

// Default addresses of the two daemons.
const (
	defaultCloudAddr  = "127.0.0.1:7070"
	defaultDeviceAddr = "127.0.0.1:7071"
	defaultCloudHTTP  = "127.0.0.1:9070"
	defaultDeviceHTTP = "127.0.0.1:8080"
)

func parseModeName(s string) (dragonv1.Mode, error) { return session.ParseModeName(s) }

func modeName(m dragonv1.Mode) string { return session.ModeName(m) }

// sideFlags are what both daemons load: the model, the corpus, the
// decoder, the limits and the decoding fit.
type sideFlags struct {
	model, index, retrieval, profile string
	// writableIndex opens a local index for writing: the device daemon is
	// its only writer and serves the document API over it.
	writableIndex                  bool
	rerankModel                    string
	rerankCandidates, rescoreEvery int
	posteriorEvery                 int
	threads, passages, maxPassages int
	// closedBook, when not empty, is the relevance of the closed-book
	// document each retrieval adds (session.ClosedBook).
	closedBook                      string
	closedBookScore                 float64
	ctxPerSeq, maxTokens, limitToks int
	maxPrompt                       int
	// hedges reserves hedge branches (decoder.Options.Hedges); hedgeBelow
	// replaces the measured rule (session.Options.HedgeBelow).
	hedges        int
	hedgeBelow    float64
	noSpec, pprof bool
	listen, http  string
	drain         time.Duration
	grpc          wire.Config
	kvCache       kvCacheFlags
	// memoryMB > 0 sizes the context to a budget (planMemory); only the
	// device daemon registers it. plan is what fitMemory made of it, and
	// pin the tensors a streamed plan locks.
	memoryMB int
	plan     memoryPlan
	pin      []gguf.Tensor
	// streamReaders read each layer of a streamed model into one of two
	// layer buffers, the next while this one runs (llamacpp.Prefetch); 0
	// leaves them to the pass's page faults. Only the device daemon
	// registers it.
	streamReaders int
	// draftModel is a smaller model of the same tokenizer kept in memory
	// beside the model (Lever's draft model, decoder.Options.Assistant);
	// only the device daemon registers it.
	draftModel string
}

// daemonDefaults are a daemon's flag defaults: make run's for its side,
// DRAGON's model family (make qwen) over the demo corpora cut by its
// tokenizer (make index-qwen), the re-ranker's relevance (make
// rerank-model) and its own profile (make profile-qwen).
type daemonDefaults struct {
	listen, http, model, index, profile, rerank string
	kvCacheMB                                   int
}

// The cross-encoder make rerank-model fetches, both daemons' default.
const defaultRerankModel = "models/ms-marco-MiniLM-L-12-v2.F32.gguf"

var (
	cloudDefaults = daemonDefaults{
		listen: defaultCloudAddr, http: defaultCloudHTTP, model: "models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
		index: "data/index-qwen/cloud", profile: "data/profile-Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.json", rerank: defaultRerankModel, kvCacheMB: 1024,
	}
	deviceDefaults = daemonDefaults{
		listen: defaultDeviceAddr, http: defaultDeviceHTTP, model: "models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
		index: "data/index-qwen/device", profile: "data/profile-Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.json", rerank: defaultRerankModel, kvCacheMB: 256,
	}
)

func (f *sideFlags) register(cmd *cobra.Command, def daemonDefaults) {
	fs := cmd.Flags()
	f.kvCache.register(fs, def.kvCacheMB)
	fs.StringVar(&f.listen, "listen", def.listen, "gRPC address to serve on")
	fs.StringVar(&f.http, "http", def.http, "HTTP address for /metrics, /healthz and /readyz (empty: none)")
	fs.BoolVar(&f.pprof, "pprof", false, "also serve /debug/pprof on the HTTP address")
	fs.DurationVar(&f.drain, "drain-timeout", 30*time.Second, "on SIGTERM, how long generations in progress may take to finish")
	fs.StringVar(&f.model, "model", def.model, "GGUF model file (default: make run's for this side, which make qwen fetches)")
	fs.StringVar(&f.index, "index", def.index, "this side's corpus: an index folder (make index; also bleve:DIR), a Weaviate collection (weaviate://HOST:PORT/COLLECTION, weaviate+https://...; ?grpc=:PORT searches over its gRPC port; API key in $DRAGON_WEAVIATE_API_KEY), or empty for no retrieval")
	fs.StringVar(&f.retrieval, "retrieval", "auto", "ranker: auto, bm25, dense or hybrid")
	fs.StringVar(&f.rerankModel, "rerank-model", def.rerank, "cross-encoder GGUF (make rerank-model fetches the default) that re-ranks --rerank-candidates first-stage passages to keep the best; its logit becomes each passage's relevance R, on one scale on both sides (empty: no re-ranking, R is the first stage's; the default is left out with --index '')")
	fs.IntVar(&f.rerankCandidates, "rerank-candidates", rerank.DefaultCandidates, "first-stage passages the cross-encoder re-ranks")
	fs.IntVar(&f.rescoreEvery, "rescore-every", 0, "dynamic weights (DRAGON §4.1): every this many answer tokens the cross-encoder scores the passages again against the question and the answer so far, and the new weights and h̃ hold from that position on (0: the retrieval scores for the whole answer; needs --rerank-model)")
	fs.IntVar(&f.posteriorEvery, "posterior-every", 0, "posterior weights for requests that do not say (GenerateRequest.posterior_every; the device sends its value to the cloud): every this many answer tokens each passage's weight becomes its posterior given the answer so far, e^R(d)·Π_t p(x_t | d, x_<t) normalised, and h̃ weighs the sides by it too; exact on both sides, the positions fixed by the token count (0: the relevance scores for the whole answer)")
	fs.StringVar(&f.profile, "profile", def.profile, "decoding-latency fit from `dragon profile` (a missing file: learn it while serving)")
	fs.IntVar(&f.threads, "threads", defaultThreads("/sys/devices/system/cpu", runtime.NumCPU()), "compute threads (default: 1, or on a big.LITTLE CPU its big cores, all cores but one at most)")
	fs.IntVar(&f.passages, "passages", 2, "passages to retrieve when a request does not say")
	fs.IntVar(&f.maxPassages, "max-passages", 8, "most passages a request may ask for")
	fs.StringVar(&f.closedBook, "closed-book", "", "add to every retrieval the closed-book document (the question alone: the model's own knowledge) at this relevance R, on the ranker's scale (with --rerank-model a cross-encoder logit, where 0 is even odds of relevance); it takes one more KV sequence (empty: off)")
	fs.IntVar(&f.ctxPerSeq, "ctx", 1024, "KV positions per passage sequence")
	fs.IntVar(&f.maxTokens, "max-tokens", 128, "tokens per answer when a request does not say")
	fs.IntVar(&f.limitToks, "max-tokens-limit", 512, "most tokens a request may ask for")
	fs.IntVar(&f.maxPrompt, "max-prompt-bytes", 16<<10, "longest prompt a request may send")
	fs.BoolVar(&f.noSpec, "no-spec", false, "turn local speculative decoding off")
	fs.IntVar(&f.hedges, "hedges", 0, "hedge branches one generation may decode at once (hedged drafts, for requests that ask for them): each reserves --max-passages more KV sequences; 0: this side never hedges")
	fs.Float64Var(&f.hedgeBelow, "hedge-below", 0, "hedge every draft whose probability is below this instead of where the measured rule says hedging pays (experiments; 0: the rule)")
	f.grpc.RegisterFlags(fs, "") // --token may also come from $DRAGON_TOKEN
}

func (f *sideFlags) validate() error {
	switch {
	case f.threads < 1:
		return fmt.Errorf("--threads %d: need at least 1", f.threads)
	case f.passages < 0 || f.maxPassages < 1 || f.passages > f.maxPassages:
		return fmt.Errorf("--passages %d and --max-passages %d: need 0 ≤ passages ≤ max-passages, max-passages ≥ 1", f.passages, f.maxPassages)
	case f.ctxPerSeq < 64:
		return fmt.Errorf("--ctx %d: need at least 64", f.ctxPerSeq)
	case f.maxTokens < 1 || f.limitToks < f.maxTokens:
		return fmt.Errorf("--max-tokens %d and --max-tokens-limit %d: need 1 ≤ max-tokens ≤ limit", f.maxTokens, f.limitToks)
	case f.maxPrompt < 1:
		return fmt.Errorf("--max-prompt-bytes %d: need at least 1", f.maxPrompt)
	case f.rerankCandidates < 1:
		return fmt.Errorf("--rerank-candidates %d: need at least 1", f.rerankCandidates)
	case f.rerankModel != "" && f.index == "":
		return errors.New("--rerank-model needs an --index to re-rank")
	case f.rescoreEvery < 0 || (f.rescoreEvery > 0 && f.rerankModel == ""):
		return fmt.Errorf("--rescore-every %d: need 0, or more with a --rerank-model to score with", f.rescoreEvery)
	case f.posteriorEvery < 0 || (f.posteriorEvery > 0 && f.rescoreEvery > 0):
		return fmt.Errorf("--posterior-every %d: need 0 or more, and not beside --rescore-every (one way of moving the weights)", f.posteriorEvery)
	case f.hedges > 0 && (f.posteriorEvery > 0 || f.rescoreEvery > 0):
		return fmt.Errorf("--hedges %d: a hedge branch decodes under the weights of its fork, so it needs static weights (not --posterior-every or --rescore-every)", f.hedges)
	case f.closedBook != "" && f.index == "":
		return errors.New("--closed-book needs an --index: without passages the model answers closed-book anyway")
	case f.closedBook != "" && f.rescoreEvery > 0:
		return errors.New("--closed-book and --rescore-every: the cross-encoder cannot re-score a document without text")
	case f.memoryMB < 0:
		return fmt.Errorf("--memory-mb %d: need 0 (no budget) or more", f.memoryMB)
	case f.streamReaders < 0:
		return fmt.Errorf("--stream-readers %d: need 0 (the pass's page faults read the weights) or more", f.streamReaders)
	case f.draftModel != "" && f.noSpec:
		return errors.New("--draft-model drafts for local speculative decoding, which --no-spec turns off")
	case f.hedges < 0 || f.hedges > session.MaxHedges:
		return fmt.Errorf("--hedges %d: need 0 to %d", f.hedges, session.MaxHedges)
	case f.hedgeBelow < 0 || f.hedgeBelow > 1:
		return fmt.Errorf("--hedge-below %v: need a probability (0: the measured rule)", f.hedgeBelow)
	}
	if f.closedBook != "" {
		v, err := session.ParseClosedBook(f.closedBook)
		if err != nil {
			return fmt.Errorf("--closed-book %q: %w", f.closedBook, err)
		}
		f.closedBookScore = v
	}
	return f.kvCache.validate()
}

// closedBookSeqs is the KV sequences the closed-book document adds to a
// generation's passages.
func (f *sideFlags) closedBookSeqs() int {
	if f.closedBook == "" {
		return 0
	}
	return 1
}

// side is what a daemon loaded.
type side struct {
	model     engine.Model
	retriever session.Retriever
	// index is the local index this daemon writes (the device's), for the
	// document API; nil otherwise.
	index *retrieval.Index
	// backendReady checks a remote retrieval backend (nil: none).
	backendReady func(context.Context) error
	decoder      decoder.Options
	fit          profiler.DecodeFit
	hedgeBelow   float64
	limits       session.Limits
	registry     *prometheus.Registry
	metrics      *session.Metrics
	close        func()
}

func (f *sideFlags) load(log *slog.Logger) (*side, error) {
	if f.index == "" && f.rerankModel == defaultRerankModel {
		f.rerankModel = "" // nothing to re-rank: the default re-ranker is not asked for
	}
	if err := f.validate(); err != nil {
		return nil, err
	}
	if f.grpc.Token == "" {
		f.grpc.Token = os.Getenv("DRAGON_TOKEN") // kept off the command line, where ps shows it
	}
	mode, err := retrieval.ParseMode(f.retrieval)
	if err != nil {
		return nil, err
	}
	atLeastTwoProcs()
	// Under a budget every weight stays in the file's mapping, where the
	// kernel can drop it and read it back (a plan may stream it): repacked
	// for faster kernels, Q4_K weights would be anonymous memory instead.
	m, err := llamacpp.Load(f.model, llamacpp.Options{Threads: f.threads, InPlace: f.memoryMB > 0})
	if err != nil {
		return nil, fmt.Errorf("%w (make qwen fetches the default ones, make model the tests' SmolLM2)", err)
	}
	// The draft model, its decoder (made below) and the model close
	// together, after whatever else the side opened.
	var (
		draft     *llamacpp.Model
		assistant *decoder.Decoder
	)
	closeModels := func() {
		if assistant != nil {
			assistant.Close()
		}
		if draft != nil {
			draft.Close()
		}
		m.Close()
	}
	if f.draftModel != "" {
		if draft, err = llamacpp.Load(f.draftModel, llamacpp.Options{Threads: f.threads, InPlace: f.memoryMB > 0}); err != nil {
			m.Close()
			return nil, fmt.Errorf("--draft-model: %w", err)
		}
	}
	s := &side{model: m, close: closeModels}
	if f.memoryMB > 0 {
		var draftFP llamacpp.Footprint
		if draft != nil {
			draftFP = draft.Footprint()
		}
		if err := f.fitMemory(m.Footprint(), draftFP, log); err != nil {
			closeModels()
			return nil, err
		}
		if f.plan.Streamed {
			if err := f.streamWeights(m, log); err != nil {
				closeModels()
				return nil, err
			}
		}
	}
	var reranker *rerank.Reranker
	if f.index != "" {
		ix, closeIx, err := openSearcher(f.index, m, f.threads, f.writableIndex)
		if err != nil {
			closeModels()
			return nil, fmt.Errorf("%w (make index-qwen builds the default ones, make index SmolLM2's; --index '' serves without retrieval)", err)
		}
		if r, ok := ix.(*retrieval.RemoteIndex); ok {
			s.backendReady = r.Ready
		}
		if w, ok := ix.(*retrieval.Index); ok && f.writableIndex {
			s.index = w
		}
		s.close = func() { closeIx(); closeModels() }
		if f.rerankModel != "" {
			rr, closeRR, err := openReranker(f.rerankModel, f.threads)
			if err != nil {
				s.close()
				return nil, err
			}
			reranker = rr
			ix = &rerank.Searcher{Inner: ix, Reranker: rr, Candidates: f.rerankCandidates}
			s.close = func() { closeRR(); closeIx(); closeModels() }
			log.Info("re-ranking", "model", rr.Name(), "candidates", f.rerankCandidates)
		}
		s.retriever = session.IndexRetriever{Index: ix, Mode: mode}
		if f.closedBook != "" {
			s.retriever = session.ClosedBook{Inner: s.retriever, Score: f.closedBookScore}
			log.Info("closed-book document in every retrieval", "relevance", f.closedBookScore)
		}
	}
	s.decoder = decoder.Options{MaxPassages: f.maxPassages + f.closedBookSeqs(), CtxPerSeq: f.ctxPerSeq, Threads: f.threads, Hedges: f.hedges}
	if f.plan.Streamed {
		s.decoder.BatchSize = f.plan.Ubatch
	}
	s.hedgeBelow = f.hedgeBelow
	if f.rescoreEvery > 0 {
		s.decoder.RescoreEvery, s.decoder.Rescore = f.rescoreEvery, rescoreWith(reranker)
	}
	if !f.noSpec {
		s.decoder.Spec = specdec.DefaultOptions()
	}
	if draft != nil {
		// It holds the same passages (decoder.checkAssistant), in passes
		// as large as the model's.
		assistant, err = decoder.New(draft, decoder.Options{MaxPassages: s.decoder.MaxPassages, CtxPerSeq: f.ctxPerSeq, Threads: f.threads, BatchSize: s.decoder.BatchSize})
		if err != nil {
			s.close()
			return nil, fmt.Errorf("--draft-model: %w", err)
		}
		s.decoder.Assistant = assistant
		log.Info("drafting also from a draft model", "draft_model", f.draftModel, "weights_mb", mib(draft.Footprint().Weights))
	}
	if f.profile != "" {
		p, err := profiler.Load(f.profile)
		switch {
		case err == nil:
			s.fit = p.Fit
		case errors.Is(err, os.ErrNotExist):
			log.Info("no decoding profile; the scheduler learns costs while serving", "profile", f.profile)
		default:
			s.close()
			return nil, err
		}
	}
	s.limits = session.Limits{MaxTokens: f.limitToks, MaxPassages: f.maxPassages, MaxPrompt: f.maxPrompt}
	s.registry = prometheus.NewRegistry()
	s.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerResidentMemory(s.registry, procstatus.Self)
	s.metrics = session.NewMetrics(s.registry)
	if s.decoder.Cache, err = f.kvCache.open(f.model, s.registry, log); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// fitMemory lowers --max-passages (and --passages with it) to what
// --memory-mb holds, or fails when it cannot hold one sequence.
func (f *sideFlags) fitMemory(fp, draft llamacpp.Footprint, log *slog.Logger) error {
	// Each hedge branch takes a sequence per passage.
	per, extra := 1+f.hedges, f.closedBookSeqs()
	tensors, err := gguf.Tensors(f.model)
	if err != nil {
		return err
	}
	_, layer := residency.Plan(tensors, 0)
	shape := streamShape{LargestLayer: layer, Head: residency.HeadBytes(tensors), HeadFaults: residency.FaultRoom(f.model)}
	p, err := planMemory(int64(f.memoryMB)<<20, fp, draft, f.ctxPerSeq, (f.maxPassages+extra)*per, int64(f.kvCache.memoryMB)<<20, shape)
	if err != nil {
		return err
	}
	f.plan = p
	if p.Streamed {
		f.pin, _ = residency.Plan(tensors, p.Pinned)
	}
	if p.Sequences < (f.maxPassages+extra)*per {
		if p.Sequences < (1+extra)*per {
			return fmt.Errorf("--memory-mb %d holds %d sequences: too few for one passage, %d closed-book and %d hedge branches (lower --hedges)", f.memoryMB, p.Sequences, extra, f.hedges)
		}
		log.Info("--memory-mb lowers --max-passages", "max_passages", p.Sequences/per-extra, "asked", f.maxPassages, "hedges", f.hedges)
		f.maxPassages = p.Sequences/per - extra
		f.passages = min(f.passages, f.maxPassages)
	}
	log.Info("memory budget", "memory_mb", f.memoryMB, "weights_mb", mib(p.Weights), "compute_mb", mib(p.Compute),
		"kv_cache_mb", mib(p.Cache), "context_kv_mb", mib(p.KV), "draft_model_mb", mib(p.Draft), "sequences", p.Sequences, "ctx", f.ctxPerSeq, "streamed", p.Streamed)
	return nil
}

// streamWeights carries out a streamed plan (Lever): the part the budget
// holds is locked in memory so that only the rest is read again by every
// pass, into the readers' layer buffers (--stream-readers) or, without
// readers, by the pass's faults on a mapping read ahead and dropped
// behind (sequential advice: 578 MB read a token for the 1.5B under 560
// MiB in bench lever, against 918 with the kernel's default). A process
// that may not lock memory streams it all, and says so. The locks go with
// the mapping, when the model is closed or unloaded while idle
// (--idle-unload, which a streamed device should leave off: the model
// loaded back is not pinned).
func (f *sideFlags) streamWeights(m *llamacpp.Model, log *slog.Logger) error {
	if err := residency.Advise(f.model, residency.AdviceSequential); err != nil {
		return err
	}
	// Token embeddings are read a row a token: read ahead, each row would
	// fill the little page cache the budget leaves (residency.AdviseRows).
	if err := residency.AdviseRows(f.model); err != nil {
		return err
	}
	if f.draftModel != "" {
		if err := residency.AdviseRows(f.draftModel); err != nil {
			return fmt.Errorf("--draft-model: %w", err)
		}
		// Every draft token reads the whole draft model: a part of it left
		// to the page cache would be read from the file again and again,
		// beside the model's streamed layers.
		if d, err := residency.PinWhole(f.draftModel); err != nil {
			log.Warn("--memory-mb: the draft model is not locked in memory", "err", err)
		} else {
			log.Info("--memory-mb: the draft model is locked in memory", "pinned_mb", mib(d.Bytes))
		}
	}
	pinned := f.pin
	p, err := residency.Pin(f.model, f.pin)
	if err != nil {
		log.Warn("--memory-mb: the weights are streamed, none of them locked in memory", "err", err)
		pinned = nil
	} else {
		log.Info("--memory-mb: the weights are streamed from the file", "weights_mb", mib(f.plan.Weights), "pinned_mb", mib(p.Bytes),
			"pinned_tensors", len(f.pin), "pass_tokens", f.plan.Ubatch, "head_readahead_mb", mib(f.plan.HeadRoom))
	}
	if f.streamReaders == 0 {
		return nil
	}
	// What stays in the file is read ahead of each layer by a few
	// threads, not by the pass's page faults one readahead at a time.
	tensors, err := gguf.Tensors(f.model)
	if err != nil {
		return err
	}
	reads := residency.Reads(tensors, pinned, m.Layers())
	if err := m.SetPrefetch(&llamacpp.Prefetch{Ranges: reads, Readers: f.streamReaders}); err != nil {
		return fmt.Errorf("--stream-readers: %w", err)
	}
	log.Info("--memory-mb: the streamed layers are read into layer buffers", "readers", f.streamReaders, "tensors", len(reads))
	return nil
}

// config is the session configuration of what was loaded.
func (s *side) config(log *slog.Logger) session.SideConfig {
	return session.SideConfig{Model: s.model, Decoder: s.decoder, Retriever: s.retriever, Limits: s.limits, Fit: s.fit, HedgeBelow: s.hedgeBelow, Metrics: s.metrics, Log: log}
}

// autoInsecure lets a daemon or client on loopback run without TLS when
// nothing about TLS was configured: traffic that never leaves the machine
// gains nothing from it, and the demo then needs no flags. Anything else
// still has to ask for plaintext with --insecure.
func autoInsecure(c *wire.Config, addr string) {
	if c.Insecure || c.CertFile != "" || c.CAFile != "" || c.KeyFile != "" {
		return
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return
	}
	if host == "localhost" {
		c.Insecure = true
		return
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		c.Insecure = true
	}
}

// serve runs a gRPC server on addr with the health service until ctx is
// done, then stops it gracefully (forcefully after a grace period).
func serve(ctx context.Context, log *slog.Logger, addr string, cfg wire.Config, drain time.Duration, register func(*grpc.Server)) error {
	autoInsecure(&cfg, addr)
	cfg.NoAuthMethods = append(cfg.NoAuthMethods, "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch")
	opts, err := cfg.ServerOptions()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(opts...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	register(srv)
	// Stock tools (grpcurl, evans) list and call every service without
	// the .proto files; behind the same token as the rest.
	reflection.Register(srv)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("serving", "addr", ln.Addr().String(), "tls", !cfg.Insecure)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	hs.Shutdown()
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(drain):
		log.Warn("generations still running after the drain timeout: stopping them", "drain_timeout", drain)
		srv.Stop()
	}
	return nil
}

// httpServer serves a daemon's HTTP endpoints: /metrics, /healthz (the
// process is up), /readyz (it serves gRPC, is not shutting down and its
// remote retrieval backend, if any, is ready; extra says more, e.g.
// whether the cloud is reachable), optional pprof, and whatever routes
// adds.
type httpServer struct {
	ready atomic.Bool
	mux   *http.ServeMux
}

func newHTTPServer(reg *prometheus.Registry, pprofOn bool, extra func() string, backendReady func(context.Context) error) *httpServer {
	h := &httpServer{mux: http.NewServeMux()}
	h.mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	h.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	h.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !h.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		if backendReady != nil {
			ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
			defer cancel()
			if err := backendReady(ctx); err != nil {
				http.Error(w, "retrieval backend not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ready")
		if extra != nil {
			fmt.Fprintln(w, extra())
		}
	})
	if pprofOn {
		h.mux.HandleFunc("/debug/pprof/", pprof.Index)
		h.mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		h.mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		h.mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		h.mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return h
}

// run serves on addr until ctx is done.
func (h *httpServer) run(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: h.mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	h.ready.Store(false)
	shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shut)
}

// serveAll runs the gRPC server and, when addr is set, the HTTP server,
// until ctx is done or either fails.
func serveAll(ctx context.Context, log *slog.Logger, f *sideFlags, h *httpServer, register func(*grpc.Server)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	n := 1
	if f.http != "" {
		// Listening before gRPC says it serves: whoever waits for that
		// line finds the HTTP address said before it.
		ln, err := net.Listen("tcp", f.http)
		if err != nil {
			return fmt.Errorf("http: %w", err)
		}
		log.Info("serving http", "addr", ln.Addr().String())
		n++
		go func() { errc <- h.run(ctx, ln) }()
	}
	go func() {
		errc <- serve(ctx, log, f.listen, f.grpc, f.drain, func(g *grpc.Server) {
			register(g)
			h.ready.Store(true)
		})
	}()
	var first error
	for range n {
		if err := <-errc; err != nil && first == nil {
			first = err
			cancel()
		} else if first == nil {
			cancel() // one ended: stop the other
		}
	}
	return first
}

// atLeastTwoProcs gives the daemon a second P unless GOMAXPROCS was set.
// Pinned to one core, Go gives it one, and a goroutine in a cgo call (a
// forward pass, a KV restore) keeps that P until sysmon takes it back,
// milliseconds later on an idle daemon: the peer stream's goroutines would
// wait that long for a message that had already arrived.
func atLeastTwoProcs() {
	if os.Getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) < 2 {
		runtime.GOMAXPROCS(2)
	}
}

// daemonLog is the daemons' logger: info level unless --verbose.
func daemonLog(cmd *cobra.Command, name string) *slog.Logger {
	level := slog.LevelInfo
	if v, _ := cmd.Flags().GetBool("verbose"); v {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("daemon", name)
}

// openReranker loads a cross-encoder for re-ranking, on its own context of
// threads threads. The returned func closes what it opened.
func openReranker(path string, threads int) (*rerank.Reranker, func(), error) {
	m, err := llamacpp.Load(path, llamacpp.Options{Threads: threads})
	if err != nil {
		return nil, nil, fmt.Errorf("--rerank-model: %w (make rerank-model fetches the default one)", err)
	}
	r, err := rerank.New(m, rerank.Options{Threads: threads})
	if err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("--rerank-model %s: %w", path, err)
	}
	return r, func() { r.Close(); m.Close() }, nil
}

// rescoreWith is dynamic weights' relevance: the cross-encoder's logit of
// each passage against the question followed by the answer so far.
func rescoreWith(r *rerank.Reranker) func(ctx context.Context, query, answer string, passages []decoder.Passage) ([]float64, error) {
	return func(ctx context.Context, query, answer string, passages []decoder.Passage) ([]float64, error) {
		texts := make([]string, len(passages))
		for i, p := range passages {
			texts[i] = p.Text
		}
		return r.Relevance(ctx, strings.TrimSpace(query+" "+answer), texts)
	}
}
