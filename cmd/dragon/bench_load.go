package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/loadbench"
	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/retrieval"
	"github.com/dragon-rag/dragon/session"
)

func init() { benchCommands = append(benchCommands, newBenchLoadCmd) }

func newBenchLoadCmd() *cobra.Command {
	var (
		o           loadbench.Options
		concurrency string
		questions   int
	)
	cmd := &cobra.Command{
		Use:   "load",
		Short: "A cloud daemon's throughput and per-token latency with 1, 2, 4, 8 devices at once, against the engine's own ceiling",
		Long: `Starts a cloud daemon from this binary on one core with one thread and,
for each concurrency N, runs N clients on the other core that speak the
device's half of the peer protocol: each asks --requests questions one after
another (cloud-only mode, greedy, --passages passages, --max-tokens tokens),
so that N generations share the cloud's batched forward passes. Prints the
cloud's aggregate tokens/s, the percentiles of the gaps between tokens, the
errors, and engine_tok_s: the same answers' rows decoded on a bare engine
context on the cloud's core, one decode call per step for all sessions.
Needs make model and make index first.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, s := range strings.Split(concurrency, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil || n < 1 || n > 64 {
					return fmt.Errorf("--concurrency %q: each between 1 and 64", s)
				}
				o.Concurrency = append(o.Concurrency, n)
			}
			if questions < 1 || questions > len(promptset.Questions) {
				return fmt.Errorf("--questions %d: between 1 and %d", questions, len(promptset.Questions))
			}
			if o.Requests < 1 || o.MaxTokens < 1 || o.Passages < 1 || o.Threads < 1 {
				return fmt.Errorf("--requests, --max-tokens, --passages and --threads must be positive")
			}
			o.Questions = promptset.Questions[:questions]
			var err error
			if o.Binary, err = os.Executable(); err != nil {
				return err
			}
			m, err := llamacpp.Load(o.Model, llamacpp.Options{Threads: o.Threads})
			if err != nil {
				return err
			}
			defer m.Close()
			ix, closeIx, err := openIndex(o.CloudIndex, m, 1)
			if err != nil {
				return err
			}
			defer closeIx()
			dec, err := decoder.New(m, decoder.Options{MaxPassages: o.Passages, CtxPerSeq: 1024, Threads: 1})
			if err != nil {
				return err
			}
			defer dec.Close()
			r := session.IndexRetriever{Index: ix, Mode: retrieval.ModeAuto}
			o.Engine = m
			o.Prompts = func(ctx context.Context, q string) ([][]engine.Token, error) {
				ps, err := r.Retrieve(ctx, q, o.Passages, retrieval.Filter{})
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
			}
			o.Log = func(format string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), format+"\n", a...) }
			res, err := loadbench.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			return writeJSON(cmd.OutOrStdout(), res)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Model, "model", defaultModel(), "GGUF model file")
	f.StringVar(&o.CloudIndex, "cloud-index", "data/index/cloud", "the cloud's index")
	f.StringVar(&concurrency, "concurrency", "1,2,4,8", "numbers of devices at once")
	f.IntVar(&questions, "questions", len(promptset.Questions), "questions of the built-in set, asked round-robin")
	f.IntVar(&o.Requests, "requests", 3, "questions each device asks, one after another")
	f.IntVar(&o.MaxTokens, "max-tokens", 128, "most tokens per answer (the daemons' default)")
	f.IntVar(&o.Passages, "passages", 2, "cloud passages per answer")
	f.StringSliceVar(&o.CloudFlags, "cloud-flag", nil, "a flag for the cloud daemon (repeat: --cloud-flag=--prefill-chunk=64)")
	f.BoolVar(&o.Spec, "spec", false, "local speculative decoding on the cloud (the replay decodes plainly)")
	f.IntVar(&o.Threads, "threads", 1, "compute threads of the cloud and of the replay")
	f.StringVar(&o.CloudCores, "cloud-cores", "0", "cores of the cloud and of the replay, as taskset takes them (empty: no pinning)")
	f.StringVar(&o.ClientCores, "client-cores", "1", "cores of the clients (empty: no pinning)")
	f.Bool("json", true, "print one JSON object (always)")
	return cmd
}
