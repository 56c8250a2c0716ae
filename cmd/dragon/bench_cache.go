package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/cachebench"
	"github.com/dragon-rag/dragon/bench/loadbench"
	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/retrieval"
	"github.com/dragon-rag/dragon/session"
)

func init() { benchCommands = append(benchCommands, newBenchCacheCmd) }

func newBenchCacheCmd() *cobra.Command {
	var (
		model, cloudIx, deviceIx, corpus string
		cloudProfile, deviceProfile      string
		latencies, concurrency           string
		restoreCore                      string
		questions, maxTokens, passages   int
		repeats                          int
		loadRequests, loadTokens, pool   int
		zipfS, jitter                    float64
		seed                             uint64
		asJSON                           bool
		skipLoad, skipTTFT, skipRestore  bool
	)
	cmd := &cobra.Command{
		Use:   "cache",
		Short: "The KV prefix cache: cold and warm time to first token, prefill against restore, a loaded cloud with and without it",
		Long: `Three measurements of the daemons' KV prefix cache.

TTFT: for device-only and for dragon at each --latencies one-way latency
(netsim; no jitter unless --jitter, since the target subtracts 2L), a fresh cloud and device daemon (cores 0 and 1, one
thread each, as bench agg; caches at their defaults, memory only) answer
each of --questions built-in questions once (cold), then each again after
the others (warm), greedily with --max-tokens tokens. Medians of the time to
first token, the share of the decoding sides' passages restored from the
cache, and how many warm answers equal the cold ones token for token.

Restore: in this process, pinned to --restore-core with one thread, each
passage of the built-in prompt set as the decoder renders it: prefilling the
whole prompt into an empty sequence against loading its saved KV state
(medians over passages and --repeats).

Load: bench load's cloud (core 0, one thread, cloud-only clients on core 1)
with --load-concurrency clients, each asking --load-requests questions; the
questions are excerpts of a pool of --load-passages-pool cloud passages
(evenly spaced through the index, each kept only if its excerpt retrieves it
first), drawn Zipf(s) by pool rank with a fixed seed, the same sequence with
the cloud's cache off (--kv-cache-mb 0) and on (its default). Tokens per
second of each, and the cache's hit rate from the cloud's /metrics.

Needs make model, make corpus, make index and make profile first.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			logf := func(format string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), format+"\n", a...) }
			if questions < 1 || questions > len(promptset.Questions) {
				return fmt.Errorf("--questions %d: between 1 and %d", questions, len(promptset.Questions))
			}
			if maxTokens < 1 || passages < 1 || repeats < 1 || loadRequests < 1 || loadTokens < 1 || pool < 1 {
				return fmt.Errorf("--max-tokens, --passages, --repeats, --load-requests, --load-max-tokens and --load-passages-pool must be positive")
			}
			if jitter < 0 || jitter > 1 {
				return fmt.Errorf("--jitter %v: between 0 and 1", jitter)
			}
			lats, err := parseFloats(latencies)
			if err != nil {
				return fmt.Errorf("--latencies: %w", err)
			}
			var conc []int
			for _, s := range strings.Split(concurrency, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil || n < 1 || n > 64 {
					return fmt.Errorf("--load-concurrency %q: each between 1 and 64", s)
				}
				conc = append(conc, n)
			}
			binary, err := os.Executable()
			if err != nil {
				return err
			}
			m, err := llamacpp.Load(model, llamacpp.Options{Threads: 1})
			if err != nil {
				return err
			}
			defer m.Close()

			o := cachebench.Options{Log: logf}
			if !skipRestore {
				prompts, err := promptset.BuiltIn(corpus, questions, passages)
				if err != nil {
					return err
				}
				o.Restore = &cachebench.RestorePart{Model: m, Prompts: prompts, Repeats: repeats, Threads: 1, Core: restoreCore}
			}
			if !skipTTFT {
				o.TTFT = &cachebench.TTFTOptions{
					Binary: binary, Model: model, CloudIndex: cloudIx, DeviceIndex: deviceIx,
					CloudProfile: cloudProfile, DeviceProfile: deviceProfile, CloudCores: "0", DeviceCores: "1",
					Questions: promptset.Questions[:questions], Configs: cachebench.Configs(lats, jitter),
					MaxTokens: maxTokens, Passages: passages, Log: logf,
				}
			}
			if !skipLoad {
				ix, closeIx, err := openIndex(cloudIx, m, 1)
				if err != nil {
					return err
				}
				defer closeIx()
				r := session.IndexRetriever{Index: ix, Mode: retrieval.ModeAuto}
				entries, dropped, err := cachebench.BuildPool(ctx, ix.Passages(), pool,
					func(ctx context.Context, q string, k int) ([]retrieval.Hit, error) {
						return ix.Search(ctx, q, k, retrieval.ModeAuto)
					})
				if err != nil {
					return err
				}
				logf("load: a pool of %d cloud passages (%d dropped: not retrieved first by their excerpt)", len(entries), dropped)
				dec, err := decoder.New(m, decoder.Options{MaxPassages: passages, CtxPerSeq: 1024, Threads: 1})
				if err != nil {
					return err
				}
				defer dec.Close()
				o.Load = &cachebench.LoadOptions{
					Base: loadbench.Options{
						Binary: binary, Model: model, Engine: m, CloudIndex: cloudIx,
						Concurrency: conc, Requests: loadRequests, MaxTokens: loadTokens, Passages: passages,
						Threads: 1, CloudCores: "0", ClientCores: "1", Log: logf,
						// The replay's prompts, as bench load makes them.
						Prompts: func(ctx context.Context, q string) ([][]engine.Token, error) {
							ps, err := r.Retrieve(ctx, q, passages, retrieval.Filter{})
							if err != nil {
								return nil, err
							}
							if err := dec.Begin(ctx, q, ps, nil); err != nil {
								return nil, err
							}
							out := make([][]engine.Token, dec.Seqs())
							for i := range out {
								out[i] = append([]engine.Token(nil), dec.Prompt(i)...)
							}
							return out, nil
						},
					},
					Pool: entries, PoolDropped: dropped, S: zipfS, Seed: seed,
				}
			}
			res, err := cachebench.Run(ctx, o)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			return cachebench.WriteTable(cmd.OutOrStdout(), res)
		},
	}
	f := cmd.Flags()
	f.StringVar(&model, "model", defaultModel(), "GGUF model file")
	f.StringVar(&cloudIx, "cloud-index", "data/index/cloud", "the cloud's index")
	f.StringVar(&deviceIx, "device-index", "data/index/device", "the device's index")
	f.StringVar(&corpus, "corpus", "data/corpus", "corpus folder of the built-in prompt set (make corpus)")
	f.StringVar(&cloudProfile, "cloud-profile", "data/profile-cloud.json", "the cloud daemon's decoding profile (make profile)")
	f.StringVar(&deviceProfile, "device-profile", "data/profile-device.json", "the device daemon's decoding profile (make profile)")
	f.IntVar(&questions, "questions", 8, "questions of the built-in set (TTFT; and prompts of the built-in set for the restore part)")
	f.IntVar(&maxTokens, "max-tokens", 16, "tokens per answer of the TTFT part")
	f.IntVar(&passages, "passages", 2, "passages per side")
	f.StringVar(&latencies, "latencies", "0,100", "one-way latencies of the dragon configurations, in ms")
	f.Float64Var(&jitter, "jitter", 0, "the links' jitter (normal, standard deviation) as a fraction of their latency; bench agg uses 0.2")
	f.IntVar(&repeats, "repeats", 5, "repeats of each passage in the restore part")
	f.StringVar(&restoreCore, "restore-core", "0", "core to pin this process to for the restore part (empty: no pinning)")
	f.StringVar(&concurrency, "load-concurrency", "1,8", "numbers of clients at once in the load part")
	f.IntVar(&loadRequests, "load-requests", 6, "questions each client asks in the load part")
	f.IntVar(&loadTokens, "load-max-tokens", 32, "most tokens per answer in the load part")
	f.IntVar(&pool, "load-passages-pool", 200, "cloud passages the load part draws from")
	f.Float64Var(&zipfS, "zipf-s", 1.0, "Zipf exponent of the load part's draws")
	f.Uint64Var(&seed, "seed", 1, "seed of the load part's draws")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	f.BoolVar(&skipLoad, "skip-load", false, "skip the load part")
	f.BoolVar(&skipTTFT, "skip-ttft", false, "skip the TTFT part")
	f.BoolVar(&skipRestore, "skip-restore", false, "skip the prefill-against-restore part")
	return cmd
}
