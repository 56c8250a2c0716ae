// Package experiments runs the evaluation that `make experiments` publishes
// (after DRAGON §7): per-token latency and TTFT of each mode over added
// network latency with two live daemons (E1, E2), and the aggregator
// placement strategies on real runs and in the simulator (E3), the
// perplexity of held-out text (E4) and the ablation of local speculative
// decoding on held-out prompts (E5). Each
// experiment writes a CSV and a PNG plot under docs/experiments, and the
// whole run regenerates docs/EXPERIMENTS.md with the command, the machine
// and the date beside every table.
package experiments

import (
	"cmp"
	"context"
	"encoding/json"
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
	// Latency runs E1–E3, Cache E2 with the KV cache, Quality E4, Spec
	// E5; what is not run keeps the results of the last run that did
	// (dir/experiments/results.json).
	Latency, Cache, Quality, Spec bool
	QualityOpts                   QualityOptions
	// Family runs E4 as DRAGON's Figure 5: its model family on both sides,
	// held-out Wikipedia, up to 16 passages per side, the paper's methods.
	Family     bool
	FamilyOpts QualityOptions
	SpecOpts   SpecOptions
	// SpecFamily runs E5 once per model of SpecFamilyOpts (DRAGON's model
	// family: the Qwen pair), on the held-out prompts and their follow-ups,
	// with the configurations the cost model drafts under.
	SpecFamily     bool
	SpecFamilyOpts []SpecOptions
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

// hedgeSlots are the hedge branches each daemon reserves for E1's
// dragon-hedged.
const hedgeSlots = 2

// The modes of E1 and E2, and the strategies of E3 (dragon mode).
var (
	latencyModes = []aggbench.Mode{
		{Name: "dragon", Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION},
		{Name: "dragon-blind", Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION, Blind: true},
		// Hedged drafts where the measured rule says they pay (both daemons
		// reserve hedgeSlots branches).
		{Name: "dragon-hedged", Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION, Hedges: hedgeSlots, HedgeDepth: 256},
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
	e1Modes    = []string{"dragon", "dragon-hedged", "dragon-blind", "tw", "sw", "device-only", "cloud-only"}
	e2Modes    = []string{"dragon", "context", "kv", "device-only"}
	strategies = []string{"greedy", "device", "cloud", "random"}
)

// Results are the measured tables, keyed by mode (or strategy) and then
// by one-way latency in ms (E4: by method, then passages per side).
type Results struct {
	// Latency is E1–E3 (nil: never run).
	Latency *LatencyResults `json:"latency,omitempty"`
	// Cache is E2 with the KV cache, cold and warm (nil: never run).
	Cache *CacheResults `json:"cache,omitempty"`
	// Quality is E4 (nil: never run).
	Quality *QualityResults `json:"quality,omitempty"`
	// Spec is E5 (nil: never run).
	Spec *SpecResults `json:"spec,omitempty"`
	// Family is E4 on DRAGON's model family, as its Figure 5 (nil: never
	// run).
	Family *QualityResults `json:"family,omitempty"`
	// SpecFamily is E5 on that family, one per model (nil: never run).
	SpecFamily []*SpecResults `json:"spec_family,omitempty"`
}

// Meta says how a part was measured.
type Meta struct {
	Command string  `json:"command"`
	Machine string  `json:"machine"`
	Date    string  `json:"date"`
	Minutes float64 `json:"minutes"`
}

// LatencyResults are E1–E3.
type LatencyResults struct {
	Meta
	LatencyMS  []float64                     `json:"latency_ms"`
	PerTokenMS map[string]map[string]float64 `json:"per_token_ms"`
	TTFTMS     map[string]map[string]float64 `json:"ttft_ms"`
	// Strategy per-token latency, real runs and simulator.
	RealMS     map[string]map[string]float64 `json:"real_ms"`
	SimMS      map[string]map[string]float64 `json:"sim_ms"`
	Acceptance map[string]float64            `json:"acceptance"`
	// PerQuestionMS: each question's time per token by mode (strategies
	// as strategy/NAME) and latency, for ratios paired by question.
	PerQuestionMS map[string]map[string][]float64 `json:"per_question_ms,omitempty"`
	Identical     [2]int                          `json:"greedy_identical_of"` // greedy speculative-aggregation answers = greedy tw's, of answers
	Questions     int                             `json:"questions"`
	Tokens        int                             `json:"tokens"`
	Passages      int                             `json:"passages"`
	SimRuns       int                             `json:"sim_runs"`
	SimSteps      int                             `json:"sim_steps"`
	// DeviceModel and CloudModel, by file name (empty: the default model
	// on both sides, as runs before them).
	DeviceModel string `json:"device_model,omitempty"`
	CloudModel  string `json:"cloud_model,omitempty"`
}

// QualityResults are E4.
type QualityResults struct {
	Meta
	PPL      map[string]map[string]float64 `json:"ppl"`
	Passages []int                         `json:"passages_per_side"`
	Windows  int                           `json:"windows"`
	Words    int                           `json:"words"`
	// Methods measured (empty: qualityMethods, as runs before it said).
	Methods []string `json:"methods,omitempty"`
	// Model and Corpus, by file and folder name (empty: the default model
	// and the State of the Union).
	Model  string `json:"model,omitempty"`
	Corpus string `json:"corpus,omitempty"`
	// Split is QualityOptions.Split (empty: SplitFiles, as runs before it).
	Split string `json:"split,omitempty"`
	// OwnArticle is QualityOptions.OwnArticle.
	OwnArticle bool `json:"own_article,omitempty"`
}

// keys are the passages per side as the PPL tables key them.
func (q *QualityResults) keys() []string {
	keys := make([]string, len(q.Passages))
	for i, k := range q.Passages {
		keys[i] = strconv.Itoa(k)
	}
	return keys
}

// methods is what a part measured.
func (q *QualityResults) methods() []string {
	if len(q.Methods) == 0 {
		return qualityMethods
	}
	return q.Methods
}

// Run measures, then writes the CSVs, plots and the report.
func Run(ctx context.Context, o Options) (Results, error) {
	if o.Dir == "" {
		return Results{}, errors.New("experiments: need an output folder")
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	res, err := Load(o.Dir)
	if err != nil {
		return res, err
	}
	meta := func(start time.Time) Meta {
		return Meta{Command: o.Command, Machine: Machine(), Date: start.Format("2006-01-02"), Minutes: time.Since(start).Minutes()}
	}
	if o.Latency {
		start := time.Now()
		if res.Latency, err = latency(ctx, o); err != nil {
			return res, err
		}
		res.Latency.Meta = meta(start)
	}
	if o.Cache {
		start := time.Now()
		if res.Cache, err = cacheTTFT(ctx, o); err != nil {
			return res, err
		}
		res.Cache.Meta = meta(start)
	}
	if o.Quality {
		start := time.Now()
		q := o.QualityOpts
		q.Log = o.Log
		ppl, windows, err := Quality(ctx, q)
		if err != nil {
			return res, err
		}
		res.Quality = &QualityResults{PPL: ppl, Passages: q.Passages, Windows: windows, Words: q.Words}
		res.Quality.Meta = meta(start)
	}
	if o.Family {
		start := time.Now()
		q := o.FamilyOpts
		q.Log = o.Log
		if len(q.Methods) == 0 {
			q.Methods = append(slices.Clone(familyMethods[1:]), methodPosterior)
			if q.Reranker != nil {
				q.Methods = append(q.Methods, methodRerank, methodDynamic, methodRerankPosterior)
			}
		}
		ppl, windows, err := Quality(ctx, q)
		if err != nil {
			return res, err
		}
		res.Family = &QualityResults{PPL: ppl, Passages: q.Passages, Windows: windows, Words: q.Words,
			Methods: append([]string{"none"}, q.Methods...), Model: filepath.Base(q.Model.Info().Path), Corpus: q.Corpus, Split: cmp.Or(q.Split, SplitFiles), OwnArticle: q.OwnArticle}
		res.Family.Meta = meta(start)
	}
	if o.Spec {
		start := time.Now()
		s := o.SpecOpts
		s.Log = o.Log
		if res.Spec, err = Spec(ctx, s); err != nil {
			return res, err
		}
		res.Spec.Meta = meta(start)
	}
	if o.SpecFamily {
		res.SpecFamily = nil
		for _, s := range o.SpecFamilyOpts {
			start := time.Now()
			s.Log = o.Log
			r, err := Spec(ctx, s)
			if err != nil {
				return res, err
			}
			r.Meta = meta(start)
			res.SpecFamily = append(res.SpecFamily, r)
		}
	}
	return res, Write(o.Dir, res)
}

// latency measures E1–E3.
func latency(ctx context.Context, o Options) (*LatencyResults, error) {
	if len(o.LatencyMS) == 0 {
		return nil, errors.New("experiments: need latencies")
	}
	res := &LatencyResults{
		LatencyMS: o.LatencyMS, Questions: len(o.Agg.Questions), Tokens: o.Agg.MaxTokens, Passages: o.Agg.Passages,
		SimRuns: o.SimRuns, SimSteps: o.SimSteps,
		DeviceModel: filepath.Base(o.Agg.Model), CloudModel: filepath.Base(cmp.Or(o.Agg.CloudModel, o.Agg.Model)),
	}
	agg := o.Agg
	agg.LatencyMS = o.LatencyMS
	agg.Modes = append(slices.Clone(latencyModes), strategyModes...)
	// Every mode asks every question: with KV caches the modes after the
	// first would find its passages prefilled. E1–E3 compare the modes
	// themselves, so the caches are off; E2 with the cache is its own part.
	agg.DaemonFlags = append(slices.Clone(agg.DaemonFlags), "--kv-cache-mb", "0", "--hedges", strconv.Itoa(hedgeSlots))
	agg.Log = o.Log
	real, err := aggbench.Run(ctx, agg)
	if err != nil {
		return nil, err
	}
	res.PerTokenMS, res.TTFTMS, res.Acceptance, res.PerQuestionMS = real.PerTokenMS, real.TTFTMS, real.Acceptance, real.PerQuestionMS
	res.Identical = [2]int{real.GreedyIdentical, real.GreedyPrompts}
	res.RealMS = map[string]map[string]float64{"greedy": real.PerTokenMS["dragon"]}
	for _, m := range strategyModes {
		res.RealMS[strings.TrimPrefix(m.Name, "strategy/")] = real.PerTokenMS[m.Name]
	}
	var sts []aggregator.Strategy
	for _, name := range strategies {
		st, err := aggregator.ParseStrategy(name)
		if err != nil {
			return nil, err
		}
		sts = append(sts, st)
	}
	sim, err := schedbench.Run(schedbench.Options{LatencyMS: o.LatencyMS, Runs: o.SimRuns, Steps: o.SimSteps, Seed: 1, Strategies: sts})
	if err != nil {
		return nil, err
	}
	res.SimMS = sim.PerTokenMS
	return res, nil
}

const resultsFile = "results.json"

// Load reads the results a previous run left in dir (none: empty).
func Load(dir string) (Results, error) {
	var r Results
	b, err := os.ReadFile(filepath.Join(dir, "experiments", resultsFile))
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("experiments: %s: %w", resultsFile, err)
	}
	return r, nil
}

// Write puts the results, the CSVs and plots under dir/experiments and
// the report in dir/EXPERIMENTS.md.
func Write(dir string, r Results) error {
	out := filepath.Join(dir, "experiments")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, resultsFile), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if l := r.Latency; l != nil {
		if err := writeLatency(out, l); err != nil {
			return err
		}
	}
	if c := r.Cache; c != nil {
		if err := writeCache(out, c); err != nil {
			return err
		}
	}
	if q := r.Quality; q != nil {
		if err := writeQuality(out, "e4", "E4: perplexity of held-out text", q); err != nil {
			return err
		}
	}
	if q := r.Family; q != nil {
		if err := writeQuality(out, "e4-family", "E4 (Fig. 5): "+q.Model+" on held-out Wikipedia", q); err != nil {
			return err
		}
	}
	if r.Spec != nil {
		if err := writeSpec(out, "e5", r.Spec); err != nil {
			return err
		}
	}
	for _, s := range r.SpecFamily {
		if err := writeSpec(out, specFamilyName(s), s); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, "EXPERIMENTS.md"), []byte(report(r)), 0o644)
}

// writeQuality writes an E4 part's NAME.csv and NAME.png.
func writeQuality(out, name, title string, q *QualityResults) error {
	var rows [][]string
	for _, m := range q.methods() {
		for _, k := range q.Passages {
			rows = append(rows, []string{m, strconv.Itoa(k), strconv.FormatFloat(q.PPL[m][strconv.Itoa(k)], 'f', 2, 64)})
		}
	}
	if err := writeCSV(filepath.Join(out, name+".csv"), []string{"method", "passages_per_side", "ppl"}, rows); err != nil {
		return err
	}
	xs := make([]float64, len(q.Passages))
	for i, k := range q.Passages {
		xs[i] = float64(k)
	}
	if err := plotLines(filepath.Join(out, name+".png"), title, "passages per side", "perplexity", q.methods(), q.PPL, xs); err != nil {
		return fmt.Errorf("experiments: plot %s.png: %w", name, err)
	}
	return nil
}

func writeLatency(out string, r *LatencyResults) error {
	keys := latencyKeys(r.LatencyMS)
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
		if err := plotLines(filepath.Join(out, p.file), p.title, "added one-way latency (ms)", p.y, p.names, p.series, r.LatencyMS); err != nil {
			return fmt.Errorf("experiments: plot %s: %w", p.file, err)
		}
	}
	return nil
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
