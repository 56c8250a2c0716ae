package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/experiments"
	"github.com/dragon-rag/dragon/bench/promptset"
)

func init() { benchCommands = append(benchCommands, newBenchExpCmd) }

func newBenchExpCmd() *cobra.Command {
	var (
		o         experiments.Options
		latencies string
		questions int
	)
	cmd := &cobra.Command{
		Use:   "exp",
		Short: "The published evaluation: E1 time per token and E2 TTFT of each mode over added latency, E3 placement strategies (CSV, plots, docs/EXPERIMENTS.md)",
		Long: `Starts a cloud and a device daemon as dragon bench agg does (pinned to cores 0
and 1, one thread each, the link through netsim with one-way latency L and
jitter L/5) and asks each question in every mode (dragon, tw, sw,
device-only, cloud-only, context, kv) and in dragon mode with each placement
strategy, at each L; then replays the placement strategies in the
simulator. Writes docs/experiments/e1.csv, e2.csv, e3.csv and their plots,
and regenerates docs/EXPERIMENTS.md. Needs make model, make index and make
profile first (make experiments does all of it).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.LatencyMS, err = parseFloats(latencies); err != nil {
				return fmt.Errorf("--latencies: %w", err)
			}
			if questions < 1 || questions > len(promptset.Questions) {
				return fmt.Errorf("--questions %d: between 1 and %d", questions, len(promptset.Questions))
			}
			if o.Agg.MaxTokens < 2 || o.Agg.Passages < 1 || o.SimRuns < 1 || o.SimSteps < 2 {
				return fmt.Errorf("--max-tokens ≥ 2, --passages ≥ 1, --sim-runs ≥ 1 and --sim-steps ≥ 2")
			}
			o.Agg.Questions = promptset.Questions[:questions]
			if o.Agg.Binary, err = os.Executable(); err != nil {
				return err
			}
			o.Command = "dragon " + strings.Join(os.Args[1:], " ")
			o.Log = func(format string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), format+"\n", a...) }
			res, err := experiments.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s/EXPERIMENTS.md and %s/experiments/ in %.1f minutes\n", o.Dir, o.Dir, res.Elapsed.Minutes())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Agg.Model, "model", defaultModel(), "GGUF model file")
	f.StringVar(&o.Agg.CloudIndex, "cloud-index", "data/index/cloud", "the cloud's index")
	f.StringVar(&o.Agg.DeviceIndex, "device-index", "data/index/device", "the device's index")
	f.StringVar(&latencies, "latencies", "0,50,100,200,300", "added one-way latencies in ms")
	f.IntVar(&questions, "questions", 8, "questions of the built-in set")
	f.IntVar(&o.Agg.MaxTokens, "max-tokens", 32, "tokens per answer")
	f.IntVar(&o.Agg.Passages, "passages", 2, "passages per side")
	f.IntVar(&o.SimRuns, "sim-runs", 200, "simulator runs per strategy and latency")
	f.IntVar(&o.SimSteps, "sim-steps", 128, "tokens per simulator run")
	f.StringVar(&o.Dir, "out", "docs", "folder of EXPERIMENTS.md and experiments/")
	return cmd
}
