package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/enginebench"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
)

func init() { benchCommands = append(benchCommands, newBenchEngineCmd) }

func newBenchEngineCmd() *cobra.Command {
	var (
		modelPath, profile string
		threads, reps, ctx int
		onlyRows, onlySeqs int
		seconds            float64
		asJSON, unified    bool
		inPlace            bool
	)
	cmd := &cobra.Command{
		Use:   "engine",
		Short: "Decode, batched verification, multi-sequence decode and prefill costs",
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := llamacpp.Load(modelPath, llamacpp.Options{Threads: threads, InPlace: inPlace})
			if err != nil {
				return err
			}
			defer m.Close()
			stop, err := startProfile(profile)
			if err != nil {
				return err
			}
			opts := enginebench.Options{
				Threads: threads, CtxTokens: ctx, Reps: reps, Unified: unified,
				InsideDecode: func(c engine.Context) time.Duration {
					return c.(*llamacpp.Context).LastDecodeInside()
				},
			}
			if onlyRows > 0 {
				ms, err := enginebench.Repeat(cmd.Context(), m, opts, onlyRows, onlySeqs, time.Duration(seconds*float64(time.Second)))
				stop()
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%d-row passes: %.2f ms each (%d rows of each of %d sequences)\n", onlyRows*onlySeqs, ms, onlyRows, onlySeqs)
				return nil
			}
			res, err := enginebench.Run(cmd.Context(), m, opts)
			stop()
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "model %s, %d threads, context %d, median of %d\n", res.Model, res.Threads, res.CtxTokens, res.Reps)
			fmt.Fprintf(out, "decode %.2f ms, prefill %.0f tok/s\n", res.DecodeMS, res.PrefillTokS)
			for _, k := range enginebench.VerifySizes {
				fmt.Fprintf(out, "verify %2d tokens: %.2f ms (last row's logits only: %.2f ms)\n", k, res.VerifyMS[fmt.Sprint(k)], res.PromptMS[fmt.Sprint(k)])
			}
			for _, k := range enginebench.MultiseqSizes {
				fmt.Fprintf(out, "%d sequences × 1 token: %.2f ms\n", k, res.MultiseqMS[fmt.Sprint(k)])
			}
			fmt.Fprintf(out, "verify16/decode %.2f, multiseq8/multiseq1 %.2f, wrapper share of a decode step %.1f%%\n",
				res.Verify16OverDecode, res.Multiseq8OverMulti1, 100*res.DecodeOverheadShare)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&modelPath, "model", defaultModel(), "GGUF model file")
	f.IntVar(&threads, "threads", 2, "compute threads")
	f.IntVar(&reps, "reps", 30, "repetitions per figure (median reported)")
	f.IntVar(&ctx, "ctx", 256, "context held when decoding")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	f.BoolVar(&unified, "unified", false, "one KV buffer for all sequences")
	f.BoolVar(&inPlace, "in-place", false, "compute from the file's pages, never repacked (as a model streamed under --memory-mb)")
	f.StringVar(&profile, "cpuprofile", "", "write a Go CPU profile")
	f.IntVar(&onlyRows, "only-rows", 0, "only repeat passes of this many rows of each sequence (for perf record)")
	f.IntVar(&onlySeqs, "only-seqs", 1, "with --only-rows: sequences in each pass")
	f.Float64Var(&seconds, "seconds", 10, "how long --only-rows repeats")
	return cmd
}
