// Package experiments runs the evaluation that `make experiments` publishes
// (after DRAGON §7): per-token latency and TTFT of each mode over added
// network latency with two live daemons (E1, E2), and the aggregator
// placement strategies on real runs and in the simulator (E3). Each
// experiment writes a CSV and a PNG plot under docs/experiments, and the
// whole run regenerates docs/EXPERIMENTS.md with the command, the machine
// and the date beside every table.
package experiments

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/bench/aggbench"
	"github.com/dragon-rag/dragon/bench/schedbench"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// Options of a run.
type Options struct {
	// Agg runs the daemons (binary, model, indexes, questions, tokens,
	// passages); its Modes and LatencyMS are set here.
	Agg       aggbench.Options
	LatencyMS []float64
	// SimRuns and SimSteps size E3's simulator part.
	SimRuns, SimSteps int
	// Dir receives experiments/*.csv, *.png and EXPERIMENTS.md.
	Dir string
	// Command is how the run was started, for the report.
	Command string
	Log     func(format string, args ...any)
}

// The modes of E1 and E2, and the strategies of E3 (dragon mode).
var (
	latencyModes = []aggbench.Mode{
		{Name: "dragon", Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION},
		{Name: "tw", Mode: dragonv1.Mode_MODE_TOKEN_WISE_SYNC},
		{Name: "sw", Mode: dragonv1.Mode_MODE_SEQUENCE_WISE_SYNC},
		{Name: "device-only", Mode: dragonv1.Mode_MODE_DEVICE_ONLY},
		{Name: "cloud-only", Mode: dragonv1.Mode_MODE_CLOUD_ONLY},
		{Name: "context", Mode: dragonv1.Mode_MODE_CONTEXT},
		{Name: "kv", Mode: dragonv1.Mode_MODE_KV},
	}
	strategyModes = []aggbench.Mode{
		{Name: "strategy/device", Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION, Strategy: dragonv1.Strategy_STRATEGY_DEVICE},
		{Name: "strategy/cloud", Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION, Strategy: dragonv1.Strategy_STRATEGY_CLOUD},
		{Name: "strategy/random", Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION, Strategy: dragonv1.Strategy_STRATEGY_RANDOM},
	}
	e1Modes    = []string{"dragon", "tw", "sw", "device-only", "cloud-only"}
	e2Modes    = []string{"dragon", "context", "kv", "device-only"}
	strategies = []string{"greedy", "device", "cloud", "random"}
)

// Results are the measured tables, keyed by mode (or strategy) and then
// by one-way latency in ms.
type Results struct {
	PerTokenMS map[string]map[string]float64
	TTFTMS     map[string]map[string]float64
	// Strategy per-token latency, real runs and simulator.
	RealMS, SimMS map[string]map[string]float64
	Acceptance    map[string]float64
	Identical     [2]int // greedy dragon = greedy tw, of prompts
	Questions     int
	Tokens        int
	Passages      int
	SimRuns       int
	SimSteps      int
	Machine       string
	Date          string
	Command       string
	Elapsed       time.Duration
}

// Run measures, then writes the CSVs, plots and the report.
func Run(ctx context.Context, o Options) (Results, error) {
	if len(o.LatencyMS) == 0 || o.Dir == "" {
		return Results{}, errors.New("experiments: need latencies and an output folder")
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	start := time.Now()
	res := Results{
		Questions: len(o.Agg.Questions), Tokens: o.Agg.MaxTokens, Passages: o.Agg.Passages,
		SimRuns: o.SimRuns, SimSteps: o.SimSteps, Machine: Machine(), Date: start.Format("2006-01-02"), Command: o.Command,
	}
	agg := o.Agg
	agg.LatencyMS = o.LatencyMS
	agg.Modes = append(slices.Clone(latencyModes), strategyModes...)
	agg.Log = o.Log
	real, err := aggbench.Run(ctx, agg)
	if err != nil {
		return res, err
	}
	res.PerTokenMS, res.TTFTMS, res.Acceptance = real.PerTokenMS, real.TTFTMS, real.Acceptance
	res.Identical = [2]int{real.GreedyIdentical, real.GreedyPrompts}
	res.RealMS = map[string]map[string]float64{"greedy": real.PerTokenMS["dragon"]}
	for _, m := range strategyModes {
		res.RealMS[strings.TrimPrefix(m.Name, "strategy/")] = real.PerTokenMS[m.Name]
	}

	var sts []aggregator.Strategy
	for _, name := range strategies {
		st, err := aggregator.ParseStrategy(name)
		if err != nil {
			return res, err
		}
		sts = append(sts, st)
	}
	sim, err := schedbench.Run(schedbench.Options{LatencyMS: o.LatencyMS, Runs: o.SimRuns, Steps: o.SimSteps, Seed: 1, Strategies: sts})
	if err != nil {
		return res, err
	}
	res.SimMS = sim.PerTokenMS
	res.Elapsed = time.Since(start)
	return res, Write(o.Dir, o.LatencyMS, res)
}

// Write puts the CSVs and plots under dir/experiments and the report in
// dir/EXPERIMENTS.md.
func Write(dir string, latencies []float64, r Results) error {
	out := filepath.Join(dir, "experiments")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	keys := latencyKeys(latencies)
	var e1, e2, e3 [][]string
	for _, m := range e1Modes {
		for _, k := range keys {
			e1 = append(e1, []string{m, k, num(r.PerTokenMS[m][k])})
		}
	}
	for _, m := range e2Modes {
		for _, k := range keys {
			e2 = append(e2, []string{m, k, num(r.TTFTMS[m][k])})
		}
	}
	for _, src := range []struct {
		name string
		t    map[string]map[string]float64
	}{{"real", r.RealMS}, {"simulator", r.SimMS}} {
		for _, s := range strategies {
			for _, k := range keys {
				e3 = append(e3, []string{s, k, num(src.t[s][k]), src.name})
			}
		}
	}
	files := []struct {
		name   string
		header []string
		rows   [][]string
	}{
		{"e1.csv", []string{"mode", "latency_ms", "per_token_ms"}, e1},
		{"e2.csv", []string{"mode", "latency_ms", "ttft_ms"}, e2},
		{"e3.csv", []string{"strategy", "latency_ms", "per_token_ms", "source"}, e3},
	}
	for _, f := range files {
		if err := writeCSV(filepath.Join(out, f.name), f.header, f.rows); err != nil {
			return err
		}
	}
	plots := []struct {
		file, title, y string
		series         map[string]map[string]float64
		names          []string
	}{
		{"e1.png", "E1: time per token", "ms per token", r.PerTokenMS, e1Modes},
		{"e2.png", "E2: time to first token", "TTFT (ms)", r.TTFTMS, e2Modes},
		{"e3-real.png", "E3: strategies, real runs", "ms per token", r.RealMS, strategies},
		{"e3-sim.png", "E3: strategies, simulator", "ms per token", r.SimMS, strategies},
	}
	for _, p := range plots {
		if err := plotLines(filepath.Join(out, p.file), p.title, "added one-way latency (ms)", p.y, p.names, p.series, latencies); err != nil {
			return fmt.Errorf("experiments: plot %s: %w", p.file, err)
		}
	}
	return os.WriteFile(filepath.Join(dir, "EXPERIMENTS.md"), []byte(report(keys, r)), 0o644)
}

func latencyKeys(ls []float64) []string {
	keys := make([]string, len(ls))
	for i, l := range ls {
		keys[i] = strconv.FormatFloat(l, 'f', -1, 64)
	}
	return keys
}

func num(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }

// Machine names this machine's CPU and its cores.
func Machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d cores", model, runtime.NumCPU())
}
