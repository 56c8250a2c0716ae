package experiments

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/dragon-rag/dragon/bench/aggbench"
	"github.com/dragon-rag/dragon/internal/timing"
)

// CacheResults are E2 with the KV prefix cache on: each E2 mode at each
// latency on fresh daemons, every question asked cold (the first time),
// then again after the others (warm).
type CacheResults struct {
	Meta
	LatencyMS []float64 `json:"latency_ms"`
	// TTFTMS by "cold" or "warm", then mode, then one-way latency in ms:
	// medians over the questions.
	TTFTMS map[string]map[string]map[string]float64 `json:"ttft_ms"`
	// Restored is the share of the passages of the sides that decode
	// (device passages in device-only, context and kv; both sides' in
	// dragon) that warm answers restored from a cache.
	Restored float64 `json:"restored_warm"`
	// Identical counts warm answers equal to the cold answer of the same
	// question, mode and latency, of all warm answers.
	Identical [2]int `json:"greedy_identical_of"`
	Questions int    `json:"questions"`
	Tokens    int    `json:"tokens"`
	Passages  int    `json:"passages"`
}

// cacheTokens is how long the answers of the cache part are: it measures
// the time to the first token.
const cacheTokens = 8

// cacheTTFT measures E2 with the cache.
func cacheTTFT(ctx context.Context, o Options) (*CacheResults, error) {
	if len(o.LatencyMS) == 0 {
		return nil, fmt.Errorf("experiments: need latencies")
	}
	qs := o.Agg.Questions
	res := &CacheResults{
		LatencyMS: o.LatencyMS, Questions: len(qs), Tokens: cacheTokens, Passages: o.Agg.Passages,
		TTFTMS: map[string]map[string]map[string]float64{"cold": {}, "warm": {}},
	}
	var restored, decoding int
	for _, m := range latencyModes {
		if !slices.Contains(e2Modes, m.Name) {
			continue
		}
		for _, state := range []string{"cold", "warm"} {
			res.TTFTMS[state][m.Name] = map[string]float64{}
		}
		for _, lat := range o.LatencyMS {
			// Fresh daemons for each mode and latency, so that "cold" is
			// the first time either side sees the questions' passages.
			agg := o.Agg
			agg.Modes, agg.LatencyMS = []aggbench.Mode{m}, []float64{lat}
			agg.Questions = append(slices.Clone(qs), qs...)
			agg.MaxTokens = cacheTokens
			agg.Log = o.Log
			r, err := aggbench.Run(ctx, agg)
			if err != nil {
				return nil, err
			}
			key := strconv.FormatFloat(lat, 'f', -1, 64)
			ttft, answers := r.PerQuestionTTFTMS[m.Name][key], r.Answers[m.Name][key]
			if len(ttft) != 2*len(qs) || len(answers) != 2*len(qs) {
				return nil, fmt.Errorf("experiments: %s at %s ms: %d answers for %d questions asked twice", m.Name, key, len(answers), len(qs))
			}
			res.TTFTMS["cold"][m.Name][key] = timing.Median(ttft[:len(qs)])
			res.TTFTMS["warm"][m.Name][key] = timing.Median(ttft[len(qs):])
			for i := range qs {
				cold, warm := answers[i], answers[len(qs)+i]
				res.Identical[1]++
				if slices.Equal(cold.Tokens, warm.Tokens) {
					res.Identical[0]++
				}
				s := warm.Summary
				restored += int(s.GetPassagesRestoredDevice())
				decoding += int(s.GetPassagesDevice())
				if m.Name == "dragon" {
					restored += int(s.GetPassagesRestoredCloud())
					decoding += int(s.GetPassagesCloud())
				}
			}
		}
	}
	if decoding > 0 {
		res.Restored = float64(restored) / float64(decoding)
	}
	return res, nil
}

// writeCache writes e2-cache.csv and its plot.
func writeCache(out string, c *CacheResults) error {
	var rows [][]string
	series := map[string]map[string]float64{}
	var names []string
	for _, m := range e2Modes {
		for _, state := range []string{"cold", "warm"} {
			name := m + " " + state
			names = append(names, name)
			series[name] = c.TTFTMS[state][m]
			for _, k := range latencyKeys(c.LatencyMS) {
				rows = append(rows, []string{m, state, k, num(c.TTFTMS[state][m][k])})
			}
		}
	}
	if err := writeCSV(filepath.Join(out, "e2-cache.csv"), []string{"mode", "cache", "latency_ms", "ttft_ms"}, rows); err != nil {
		return err
	}
	if err := plotLines(filepath.Join(out, "e2-cache.png"), "E2 with the KV cache: time to first token", "one-way latency (ms)", "TTFT (ms)", names, series, c.LatencyMS); err != nil {
		return fmt.Errorf("experiments: plot e2-cache.png: %w", err)
	}
	return nil
}

// cacheReport is E2 with the cache, in the report.
func cacheReport(pr func(string, ...any), c *CacheResults) {
	if c == nil {
		pr("#### E2 with the KV cache\n\nNot measured yet (`dragon bench exp --only cache`).\n\n")
		return
	}
	keys := latencyKeys(c.LatencyMS)
	pr("#### E2 with the KV cache\n\n![E2 with the cache](experiments/e2-cache.png)\n\n")
	pr("Measured with `%s` on %s, %s (%.0f minutes). ", c.Command, c.Date, c.Machine, c.Minutes)
	pr("Each mode at each latency on fresh daemons (caches on, the defaults: device 256 MiB, cloud 1024 MiB of host memory), as in E1–E3 otherwise; ")
	pr("each of %d questions asked cold (the first time), then all of them again, warm (greedy, %d tokens, %d passages per side). Medians:\n\n", c.Questions, c.Tokens, c.Passages)
	pr("| | cache |%s\n|---|---|%s\n", " L = "+strings.Join(keys, " | L = ")+" |", strings.Repeat("---|", len(keys)))
	for _, m := range e2Modes {
		for _, state := range []string{"cold", "warm"} {
			pr("| %s | %s |", m, state)
			for _, k := range keys {
				pr(" %s |", num(c.TTFTMS[state][m][k]))
			}
			pr("\n")
		}
	}
	pr("\n")
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return math.NaN()
		}
		return a / b
	}
	pr("- Warm / cold device-only TTFT:")
	for _, k := range keys {
		pr(" %.3f at %s ms;", ratio(c.TTFTMS["warm"]["device-only"][k], c.TTFTMS["cold"]["device-only"][k]), k)
	}
	pr(" (target ≤ 0.3).\n")
	pr("- Warm dragon TTFT − 2L over warm device-only TTFT:")
	for _, k := range keys {
		if ms, err := strconv.ParseFloat(k, 64); err == nil {
			pr(" %.2f at %s ms;", ratio(c.TTFTMS["warm"]["dragon"][k]-2*ms, c.TTFTMS["warm"]["device-only"][k]), k)
		}
	}
	pr(" (target ≤ 1.2 at 0 and 100 ms).\n")
	pr("- Warm answers restored %.0f%% of the passages of the sides that decode them (context mode decodes all passages in one sequence, which counts as one restored passage of the device's two); %d of %d warm greedy answers equal the cold answer of the same question, mode and latency.\n",
		100*c.Restored, c.Identical[0], c.Identical[1])
	pr("- A warm side decides its first token with no forward pass (the logits after each cached prompt are cached too), so warm device-only TTFT is one retrieval and the restores, and what warm dragon adds is the cloud's own retrieval and restores after the question reaches it, the exchange between two one-core daemons (docs/BENCHMARKS.md and the DESIGN-NOTES section on one core measure both) and the link: one round trip and, with jitter of L/5 delivered in order, the wait for the latest of the messages before the first token. The ratio target assumed a warm device-only TTFT near 0.3× cold; in absolute terms warm dragon's first token comes %.0f ms after the question at L = 0, against %.0f ms for a cold device-only one.\n\n",
		c.TTFTMS["warm"]["dragon"][keys[0]], c.TTFTMS["cold"]["device-only"][keys[0]])
}
