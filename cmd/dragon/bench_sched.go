package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/aggregator/aggsim"
	"github.com/dragon-rag/dragon/bench/schedbench"
)

func init() { benchCommands = append(benchCommands, newBenchSchedCmd) }

func newBenchSchedCmd() *cobra.Command {
	var (
		o          schedbench.Options
		trace      string
		latencies  string
		strategies string
		observed   bool
		asJSON     bool
	)
	cmd := &cobra.Command{
		Use:   "sched",
		Short: "Compare aggregator placement strategies in the simulator (decode/acceptance trace under a latency trace)",
		Long: `Replays a trace of decoding times and draft acceptance (from --trace, or a
synthetic one) through the real aggregator and scheduler on a virtual clock,
under a one-way latency of L plus a sinusoidal jitter of amplitude L/5
(DRAGON §7.4), for each strategy and latency, and prints median per-token
latencies. Runs take milliseconds each.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.LatencyMS, err = parseFloats(latencies); err != nil {
				return fmt.Errorf("--latencies: %w", err)
			}
			for _, s := range strings.Split(strategies, ",") {
				st, err := aggregator.ParseStrategy(strings.TrimSpace(s))
				if err != nil {
					return fmt.Errorf("--strategies: %w", err)
				}
				o.Strategies = append(o.Strategies, st)
			}
			if trace != "" {
				if o.Trace, err = aggsim.LoadTrace(trace); err != nil {
					return err
				}
			}
			if observed {
				o.Estimates = aggsim.Observed
			}
			res, err := schedbench.Run(o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, res)
			}
			fmt.Fprintf(out, "%s trace, %d runs of %d tokens; median ms per token\n", res.Trace, res.Runs, res.Steps)
			keys := make([]string, 0, len(res.TokenWiseMS))
			for k := range res.TokenWiseMS {
				keys = append(keys, k)
			}
			sort.Slice(keys, func(i, j int) bool {
				a, _ := strconv.ParseFloat(keys[i], 64)
				b, _ := strconv.ParseFloat(keys[j], 64)
				return a < b
			})
			fmt.Fprintf(out, "%-10s", "latency")
			for _, k := range keys {
				fmt.Fprintf(out, "%9s", k+"ms")
			}
			fmt.Fprintln(out)
			for _, st := range o.Strategies {
				fmt.Fprintf(out, "%-10s", st)
				for _, k := range keys {
					fmt.Fprintf(out, "%9.1f", res.PerTokenMS[st.String()][k])
				}
				fmt.Fprintln(out)
			}
			fmt.Fprintf(out, "%-10s", "tw")
			for _, k := range keys {
				fmt.Fprintf(out, "%9.1f", res.TokenWiseMS[k])
			}
			fmt.Fprintln(out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&trace, "trace", "", `JSON trace {"decode_ms": {"device": [...], "cloud": [...]}, "accept": {"device": [...], "cloud": [...]}} (dragon ask --trace writes one); default: synthetic`)
	f.StringVar(&latencies, "latencies", "0,50,100,200,300", "one-way base latencies in ms, comma-separated")
	f.StringVar(&strategies, "strategies", "greedy,device,cloud,random", "strategies to compare")
	f.IntVar(&o.Runs, "runs", 50, "runs per strategy and latency")
	f.IntVar(&o.Steps, "steps", 200, "target tokens per run")
	f.Float64Var(&o.PeriodMS, "period", 2000, "period of the sinusoidal jitter in ms")
	f.Uint64Var(&o.Seed, "seed", 1, "seed of the runs")
	f.BoolVar(&observed, "observed", false, "let the scheduler estimate costs from what it observes (as live sessions do) instead of the trace's true means")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

// parseFloats reads a comma-separated list of non-negative numbers.
func parseFloats(s string) ([]float64, error) {
	var out []float64
	for _, p := range strings.Split(s, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || x < 0 {
			return nil, fmt.Errorf("%q is not a non-negative number", p)
		}
		out = append(out, x)
	}
	return out, nil
}
