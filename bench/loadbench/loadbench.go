// Package loadbench measures a cloud daemon under many devices at once
// (`dragon bench load`): N clients speak the device's half of the peer
// protocol to one cloud, each asking its questions one after another in
// cloud-only mode, and the cloud's aggregate tokens per second, the
// per-token latency the clients see and the errors are reported for each
// N. The same run replays the requests' rows on a bare engine context, one
// decode call per step for all sessions: the ceiling batching can reach.
//
// Cloud-only sessions put the whole load on the cloud and none on the
// clients, so on a small machine the cloud's core is the one that limits;
// in dragon or tw mode each device would decode its own passages too and,
// sharing the other core, would pace the cloud instead.
package loadbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/bench/aggbench"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/internal/timing"
	"github.com/dragon-rag/dragon/profiler"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
)

// Options of a run.
type Options struct {
	// Binary is the dragon binary the cloud runs from; Env extra
	// environment for it.
	Binary string
	Env    []string
	// Model is the GGUF file; Engine the same model loaded with one thread
	// in this process, for the handshake and the engine replay.
	Model  string
	Engine engine.Model
	// CloudIndex is the cloud's index folder.
	CloudIndex string
	// Prompts is the token sequences the cloud prefills for a question,
	// one per passage (the same retrieval and prompt code as the cloud).
	Prompts func(ctx context.Context, query string) ([][]engine.Token, error)
	// Questions are asked round-robin: client i's r-th request is question
	// (i·Requests + r) mod len(Questions), unless Pick is set.
	Questions []string
	// Pick, when set, chooses the question of client c's r-th request
	// when n clients run at once, as an index into Questions; then only
	// the questions picked get prompts for the replay.
	Pick        func(n, c, r int) int
	Concurrency []int
	Requests    int // per client
	MaxTokens   int
	Passages    int
	// CloudFlags are more flags for the cloud daemon.
	CloudFlags []string
	// NoReplay skips the engine replay (EngineTokS stays empty and
	// Prompts may be nil).
	NoReplay bool
	// Metrics are metric families of the cloud's /metrics to read after
	// each concurrency (Result.CloudMetrics).
	Metrics []string
	// Spec turns the cloud's local speculative decoding on (then its rows
	// differ from the replay's, which decodes plainly).
	Spec bool
	// Threads is the cloud's compute threads (and the replay's).
	Threads int
	// CloudCores and ClientCores pin the cloud and this process (clients,
	// then the replay on CloudCores), as taskset lists ("0", "0,1", "2-5");
	// empty: no pinning.
	CloudCores, ClientCores string
	Log                     func(format string, args ...any)
}

// Result is the JSON `dragon bench load` prints, keyed by concurrency.
type Result struct {
	// TokS is the cloud's aggregate tokens per second: every answer's
	// tokens over the time from the first request to the last answer.
	TokS map[string]float64 `json:"tok_s"`
	// P50MS and P99MS are percentiles of the gaps between consecutive
	// tokens of an answer, as the clients received them.
	P50MS map[string]float64 `json:"p50_ms"`
	P99MS map[string]float64 `json:"p99_ms"`
	// TTFTMS is the median time from opening the stream to the first token.
	TTFTMS map[string]float64 `json:"ttft_ms"`
	Errors map[string]int     `json:"errors"`
	// EngineTokS is the same answers' rows decoded on a bare context with
	// one decode call per step for all sessions, on the cloud's core.
	EngineTokS map[string]float64 `json:"engine_tok_s"`
	// SessionsPerTick is the mean number of sessions whose rows shared one
	// of the cloud's forward passes (from its dragon_batch_sessions).
	SessionsPerTick map[string]float64 `json:"sessions_per_tick"`
	Answers         map[string]int     `json:"answers"`
	Tokens          map[string]int     `json:"tokens"`
	FirstError      string             `json:"first_error,omitempty"`
	// CloudMetrics are the samples of Options.Metrics (name with labels:
	// value), as the cloud reported them after each concurrency: totals
	// since the cloud started.
	CloudMetrics map[string]map[string]float64 `json:"cloud_metrics,omitempty"`
}

// job is one answered request, as the replay needs it.
type job struct {
	question int
	tokens   int
}

// Run measures each concurrency in turn against one cloud daemon, then
// replays the answers on the engine.
func Run(ctx context.Context, o Options) (Result, error) {
	if len(o.Questions) == 0 || len(o.Concurrency) == 0 || o.Requests < 1 || o.MaxTokens < 1 || o.Passages < 1 {
		return Result{}, errors.New("loadbench: need questions, concurrencies, requests, max tokens and passages")
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	res := Result{
		TokS: map[string]float64{}, P50MS: map[string]float64{}, P99MS: map[string]float64{}, TTFTMS: map[string]float64{},
		Errors: map[string]int{}, EngineTokS: map[string]float64{}, SessionsPerTick: map[string]float64{}, Answers: map[string]int{}, Tokens: map[string]int{},
	}
	pick := o.Pick
	if pick == nil {
		pick = func(_, c, r int) int { return (c*o.Requests + r) % len(o.Questions) }
	}
	// The prompts first, before anything is timed.
	prompts := make([][][]engine.Token, len(o.Questions))
	used := make([]bool, len(o.Questions))
	for i := range used {
		used[i] = o.Pick == nil
	}
	for _, n := range o.Concurrency {
		for c := range n {
			for r := range o.Requests {
				qi := pick(n, c, r)
				if qi < 0 || qi >= len(o.Questions) {
					return res, fmt.Errorf("loadbench: %d clients, client %d, request %d: question %d of %d", n, c, r, qi, len(o.Questions))
				}
				used[qi] = true
			}
		}
	}
	for i, q := range o.Questions {
		if o.NoReplay || !used[i] {
			continue
		}
		p, err := o.Prompts(ctx, q)
		if err != nil {
			return res, fmt.Errorf("loadbench: prompts of %q: %w", q, err)
		}
		prompts[i] = p
	}
	if o.Threads < 1 {
		o.Threads = 1
	}
	if err := pin(o.ClientCores); err != nil {
		return res, err
	}
	most := slices.Max(o.Concurrency)
	args := []string{o.Binary, "cloud", "--model", o.Model, "--index", o.CloudIndex, "--profile", "",
		"--threads", strconv.Itoa(o.Threads), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
		"--max-sessions", strconv.Itoa(most), "--max-queue", strconv.Itoa(most),
		"--passages", strconv.Itoa(o.Passages), "--max-passages", strconv.Itoa(o.Passages), "--rerank-model", ""}
	if !o.Spec {
		args = append(args, "--no-spec")
	}
	args = append(args, o.CloudFlags...)
	cloud, err := aggbench.StartDaemon("cloud", o.CloudCores, o.Env, args...)
	if err != nil {
		return res, err
	}
	defer cloud.Stop(10 * time.Second)
	conn, err := grpc.NewClient(cloud.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return res, err
	}
	defer conn.Close()
	peer := dragonv1.NewPeerServiceClient(conn)
	hello := session.NewHello(o.Engine.Info(), aggregator.Device, profiler.DecodeFit{})

	jobs := map[int][][]job{}
	var ticks, shared float64 // the cloud's counters before this concurrency
	for _, n := range o.Concurrency {
		key := strconv.Itoa(n)
		var (
			mu     sync.Mutex
			gaps   []float64
			ttfts  []float64
			tokens int
			errs   int
		)
		perClient := make([][]job, n)
		start := time.Now()
		var wg sync.WaitGroup
		for c := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := range o.Requests {
					qi := pick(n, c, r)
					id := uint64(n)<<32 | uint64(c)<<16 | uint64(r)
					began := time.Now()
					sum, err := ask(ctx, peer, hello, id, o.Questions[qi], o.MaxTokens, o.Passages)
					mu.Lock()
					if err != nil {
						errs++
						if res.FirstError == "" {
							res.FirstError = fmt.Sprintf("%d clients, client %d, request %d: %v", n, c, r, err)
						}
					} else if len(sum.TokenTimes) > 0 {
						tokens += len(sum.Tokens)
						ttfts = append(ttfts, timing.MS(sum.TokenTimes[0].Sub(began)))
						for i := 1; i < len(sum.TokenTimes); i++ {
							gaps = append(gaps, timing.MS(sum.TokenTimes[i].Sub(sum.TokenTimes[i-1])))
						}
						perClient[c] = append(perClient[c], job{question: qi, tokens: len(sum.Tokens)})
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		wall := time.Since(start)
		jobs[n] = perClient
		res.TokS[key] = float64(tokens) / wall.Seconds()
		res.P50MS[key] = percentile(gaps, 0.50)
		res.P99MS[key] = percentile(gaps, 0.99)
		res.TTFTMS[key] = timing.Median(ttfts)
		res.Errors[key] = errs
		res.Tokens[key] = tokens
		res.Answers[key] = n*o.Requests - errs
		if t, sh, err := batchSessions(ctx, cloud.HTTPAddr()); err == nil && t > ticks {
			res.SessionsPerTick[key] = (sh - shared) / (t - ticks)
			ticks, shared = t, sh
		}
		o.Log("%d clients: %d answers, %d tokens in %.1f s: %.1f tok/s, gap p50 %.1f ms p99 %.1f ms, %d errors",
			n, n*o.Requests-errs, tokens, wall.Seconds(), res.TokS[key], res.P50MS[key], res.P99MS[key], errs)
		o.Log("%d clients: %.2f sessions per forward pass", n, res.SessionsPerTick[key])
		if len(o.Metrics) > 0 {
			m, err := scrape(ctx, cloud.HTTPAddr(), o.Metrics)
			if err != nil {
				return res, fmt.Errorf("loadbench: the cloud's metrics: %w", err)
			}
			if res.CloudMetrics == nil {
				res.CloudMetrics = map[string]map[string]float64{}
			}
			res.CloudMetrics[key] = m
		}
	}
	if err := cloud.Stop(10 * time.Second); err != nil {
		return res, err
	}
	if o.NoReplay {
		return res, nil
	}

	// The ceiling, on the cloud's core now that it is free.
	if err := pin(o.CloudCores); err != nil {
		return res, err
	}
	for _, n := range o.Concurrency {
		tps, err := Replay(ctx, o.Engine, prompts, jobs[n], o.Passages, o.Threads)
		if err != nil {
			return res, fmt.Errorf("loadbench: engine replay of %d clients: %w", n, err)
		}
		res.EngineTokS[strconv.Itoa(n)] = tps
		o.Log("%d clients: engine alone %.1f tok/s", n, tps)
	}
	return res, nil
}

// ask is one cloud-only generation as a device runs it.
func ask(ctx context.Context, peer dragonv1.PeerServiceClient, hello *dragonv1.Hello, id uint64, q string, maxTokens, passages int) (session.Summary, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	stream, err := peer.Session(ctx)
	if err != nil {
		return session.Summary{}, err
	}
	defer func() { _ = stream.CloseSend() }()
	if _, err := session.Handshake(ctx, stream, hello); err != nil {
		return session.Summary{}, err
	}
	begin := &dragonv1.Begin{
		SessionId: id, Query: q, Mode: dragonv1.Mode_MODE_CLOUD_ONLY, PassagesCloud: uint32(passages),
		Sampling: &dragonv1.SamplingParams{MaxTokens: uint32(maxTokens)},
	}
	if err := stream.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Begin{Begin: begin}}); err != nil {
		return session.Summary{}, err
	}
	return session.ReceiveSolo(ctx, session.Options{Self: aggregator.Device, SessionID: id, MaxTokens: maxTokens}, stream, nil)
}

// percentile of v by nearest rank (0 when empty).
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// pin moves this process, all its threads, to cores (taskset; nothing
// when cores is empty or taskset is missing).
func pin(cores string) error {
	if cores == "" {
		return nil
	}
	ts, err := exec.LookPath("taskset")
	if err != nil {
		return nil
	}
	if out, err := exec.Command(ts, "-a", "-p", "-c", cores, strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
		return fmt.Errorf("loadbench: taskset: %v: %s", err, out)
	}
	return nil
}

// batchSessions reads the cloud's dragon_batch_sessions histogram: the
// forward passes so far and the sessions they carried in all.
func batchSessions(ctx context.Context, addr string) (ticks, sessions float64, err error) {
	if addr == "" {
		return 0, 0, errors.New("no metrics address")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		switch name {
		case "dragon_batch_sessions_count":
			ticks, err = strconv.ParseFloat(value, 64)
		case "dragon_batch_sessions_sum":
			sessions, err = strconv.ParseFloat(value, 64)
		}
		if err != nil {
			return 0, 0, err
		}
	}
	return ticks, sessions, nil
}

// scrape reads the samples of the metric families names from the text
// exposition at addr/metrics: sample name with its labels -> value.
func scrape(ctx context.Context, addr string, names []string) (map[string]float64, error) {
	if addr == "" {
		return nil, errors.New("no metrics address")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return ParseMetrics(string(body), names)
}

// ParseMetrics picks the samples of the metric families names out of a
// Prometheus text exposition: sample name with its labels -> value.
// Families with suffixed samples (histograms: _bucket, _sum, _count)
// match by their family name.
func ParseMetrics(body string, names []string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		sample, value := line[:i], line[i+1:]
		family, _, _ := strings.Cut(sample, "{")
		want := false
		for _, n := range names {
			if family == n || strings.HasPrefix(family, n+"_") && slices.Contains([]string{"bucket", "sum", "count", "total"}, family[len(n)+1:]) {
				want = true
				break
			}
		}
		if !want {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("metric %s: %w", sample, err)
		}
		out[sample] = v
	}
	return out, nil
}
