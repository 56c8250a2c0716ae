package cachebench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/loadbench"
	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/retrieval"
)

// TestZipfFrequencies: with s = 1 the ranks' frequencies fit 1/k (chi
// square over 20 ranks, far under the 0.1% critical value), rank 1 comes
// about twice as often as rank 2 and ten times as often as rank 10, and
// the same seed draws the same ranks.
func TestZipfFrequencies(t *testing.T) {
	const n, draws = 20, 200_000
	z, err := NewZipf(NewRand(7), 1, n)
	require.NoError(t, err)
	h := 0.0
	for k := 1; k <= n; k++ {
		h += 1 / float64(k)
	}
	sum := 0.0
	for k := 1; k <= n; k++ {
		assert.InDelta(t, 1/(float64(k)*h), z.Prob(k), 1e-12, "P(rank %d)", k)
		sum += z.Prob(k)
	}
	assert.InDelta(t, 1, sum, 1e-12)
	assert.Zero(t, z.Prob(0))
	assert.Zero(t, z.Prob(n+1))

	counts := make([]int, n+1)
	for range draws {
		k := z.Rank()
		require.True(t, k >= 1 && k <= n, "rank %d", k)
		counts[k]++
	}
	chi := 0.0
	for k := 1; k <= n; k++ {
		want := draws * z.Prob(k)
		chi += (float64(counts[k]) - want) * (float64(counts[k]) - want) / want
	}
	// 19 degrees of freedom: P(χ² > 43.82) = 0.001.
	assert.Less(t, chi, 43.82, "chi-square of the ranks' counts against 1/k")
	assert.InDelta(t, 2, float64(counts[1])/float64(counts[2]), 0.1, "rank 1 over rank 2")
	assert.InDelta(t, 10, float64(counts[1])/float64(counts[10]), 0.6, "rank 1 over rank 10")

	// A control: uniform draws fail the same test.
	u, err := NewZipf(NewRand(7), 0, n)
	require.NoError(t, err)
	uc := make([]int, n+1)
	for range draws {
		uc[u.Rank()]++
	}
	chiU := 0.0
	for k := 1; k <= n; k++ {
		want := draws * z.Prob(k)
		chiU += (float64(uc[k]) - want) * (float64(uc[k]) - want) / want
	}
	assert.Greater(t, chiU, 1000.0, "uniform draws do not fit 1/k")
	for k := 1; k <= n; k++ {
		assert.InDelta(t, 1.0/n, u.Prob(k), 1e-12)
	}

	a, _ := NewZipf(NewRand(3), 1, 200)
	b, _ := NewZipf(NewRand(3), 1, 200)
	for range 1000 {
		require.Equal(t, a.Rank(), b.Rank())
	}
}

func TestZipfRefusesBadParameters(t *testing.T) {
	for _, c := range []struct {
		s float64
		n int
	}{{1, 0}, {-1, 10}, {math.NaN(), 10}, {math.Inf(1), 10}} {
		_, err := NewZipf(NewRand(1), c.s, c.n)
		assert.Error(t, err, "s=%v n=%d", c.s, c.n)
	}
	_, err := NewZipf(nil, 1, 10)
	assert.Error(t, err)
	one, err := NewZipf(NewRand(1), 1, 1)
	require.NoError(t, err)
	for range 10 {
		assert.Equal(t, 1, one.Rank())
	}
}

func TestDrawRequests(t *testing.T) {
	draw := func() Draws {
		z, err := NewZipf(NewRand(1), 1, 50)
		require.NoError(t, err)
		return DrawRequests(z, []int{1, 8}, 6)
	}
	d := draw()
	require.Len(t, d[1], 1)
	require.Len(t, d[8], 8)
	for _, per := range d {
		for _, reqs := range per {
			require.Len(t, reqs, 6)
			for _, i := range reqs {
				assert.True(t, i >= 0 && i < 50)
			}
		}
	}
	assert.Equal(t, d, draw(), "the same seed draws the same requests")
	distinct, total := d.Distinct()
	assert.Equal(t, 54, total)
	assert.True(t, distinct >= 1 && distinct <= 50)
	assert.Equal(t, 3, len(map[int]bool{0: true, 4: true, 7: true}))
	distinct, total = Draws{2: {{0, 4}, {4, 7}}}.Distinct()
	assert.Equal(t, [2]int{3, 4}, [2]int{distinct, total})
}

func TestExcerpt(t *testing.T) {
	words := make([]string, 40)
	for i := range words {
		words[i] = fmt.Sprintf("w%d", i)
	}
	text := strings.Join(words, " ")
	assert.Equal(t, strings.Join(words[10:26], " "), Excerpt(text, 16, 12), "16 words a quarter in")
	assert.Equal(t, strings.Join(words[:13], " "), Excerpt(strings.Join(words[:13], "\n "), 16, 12), "a short passage whole")
	assert.Equal(t, strings.Join(words[2:18], " "), Excerpt(strings.Join(words[:18], " "), 16, 12), "ends at the end")
	assert.Empty(t, Excerpt(strings.Join(words[:11], " "), 16, 12), "too short")
}

// TestBuildPool: evenly spaced passages, kept when their excerpt
// retrieves them (or an identical text) first, ranked in order; short
// passages, duplicates of an excerpt and passages another one outranks are
// dropped.
func TestBuildPool(t *testing.T) {
	var passages []retrieval.Passage
	for i := range 100 {
		text := fmt.Sprintf("passage %d says %s", i, strings.Repeat(fmt.Sprintf("word%d ", i), 20))
		switch {
		case i == 30:
			text = "too short"
		case i == 40:
			text = passages[10].Text // a duplicate: its excerpt finds passage 10 first
		}
		passages = append(passages, retrieval.Passage{ID: uint64(1000 + i), Source: fmt.Sprintf("doc%d", i/10), Text: text})
	}
	byQuery := map[string]retrieval.Passage{}
	for i := len(passages) - 1; i >= 0; i-- {
		byQuery[Excerpt(passages[i].Text, 16, 12)] = passages[i]
	}
	var searched []string
	search := func(_ context.Context, q string, k int) ([]retrieval.Hit, error) {
		searched = append(searched, q)
		require.Equal(t, 1, k)
		if strings.Contains(q, "word50 ") { // another passage ranks first
			return []retrieval.Hit{{Passage: passages[51]}}, nil
		}
		p, ok := byQuery[q]
		if !ok {
			return nil, nil
		}
		return []retrieval.Hit{{Passage: p, Score: 1}}, nil
	}
	pool, dropped, err := BuildPool(context.Background(), passages, 10, search)
	require.NoError(t, err)
	// Passages 0, 10, ..., 90: 30 is short, 40's excerpt is 10's (a
	// duplicate query), 50 is outranked.
	var ids []uint64
	for i, e := range pool {
		assert.Equal(t, i+1, e.Rank)
		assert.NotEmpty(t, e.Query)
		ids = append(ids, e.PassageID)
	}
	assert.Equal(t, []uint64{1000, 1010, 1020, 1060, 1070, 1080, 1090}, ids)
	assert.Equal(t, 3, dropped)
	assert.Len(t, searched, 8, "no search for a short passage nor a duplicate excerpt")

	// An identical text under another id counts as retrieved first.
	dup := []retrieval.Passage{{ID: 1, Text: passages[0].Text}}
	pool, dropped, err = BuildPool(context.Background(), dup, 5, func(context.Context, string, int) ([]retrieval.Hit, error) {
		return []retrieval.Hit{{Passage: retrieval.Passage{ID: 99, Text: passages[0].Text}}}, nil
	})
	require.NoError(t, err)
	assert.Len(t, pool, 1)
	assert.Zero(t, dropped)

	_, _, err = BuildPool(context.Background(), passages[30:31], 1, search)
	assert.Error(t, err, "an empty pool")
	_, _, err = BuildPool(context.Background(), nil, 1, search)
	assert.Error(t, err)
}

const exposition = `# HELP dragon_kvcache_hits_total Passage sequences whose prompt prefix came from the KV cache, by tier (context, memory, disk).
# TYPE dragon_kvcache_hits_total counter
dragon_kvcache_hits_total{tier="context"} 3
dragon_kvcache_hits_total{tier="memory"} 12
# TYPE dragon_kvcache_misses_total counter
dragon_kvcache_misses_total 9
# TYPE dragon_kvcache_restore_seconds histogram
dragon_kvcache_restore_seconds_bucket{le="0.0001"} 1
dragon_kvcache_restore_seconds_sum 0.004
dragon_kvcache_restore_seconds_count 12
dragon_kvcache_hits_total_other 5
dragon_batch_sessions_count 100
`

// TestHitRates reads cumulative cache metrics after each concurrency, as
// loadbench.ParseMetrics picks them out of a cloud's /metrics.
func TestHitRates(t *testing.T) {
	m, err := loadbench.ParseMetrics(exposition, []string{metricHits, metricMisses, "dragon_kvcache_restore_seconds"})
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{
		`dragon_kvcache_hits_total{tier="context"}`: 3, `dragon_kvcache_hits_total{tier="memory"}`: 12, "dragon_kvcache_misses_total": 9,
		`dragon_kvcache_restore_seconds_bucket{le="0.0001"}`: 1, "dragon_kvcache_restore_seconds_sum": 0.004, "dragon_kvcache_restore_seconds_count": 12,
	}, m)

	first, err := loadbench.ParseMetrics("dragon_kvcache_misses_total 4\n", []string{metricHits, metricMisses})
	require.NoError(t, err)
	rate, by, hits, misses := HitRates(map[string]map[string]float64{"1": first, "8": m}, []int{1, 8})
	assert.InDelta(t, 15.0/24, rate, 1e-12)
	assert.Equal(t, map[string]float64{"1": 0, "8": 15.0 / 20}, by)
	assert.Equal(t, map[string]float64{"context": 3, "memory": 12}, hits)
	assert.Equal(t, 9.0, misses)

	rate, by, _, _ = HitRates(nil, []int{1})
	assert.Zero(t, rate)
	assert.Empty(t, by)

	_, err = loadbench.ParseMetrics("dragon_kvcache_misses_total x\n", []string{metricMisses})
	assert.Error(t, err)
}

func TestConfigs(t *testing.T) {
	cs := Configs([]float64{0, 100, 12.5}, 0.2)
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
	}
	assert.Equal(t, []string{"device-only", "dragon@0", "dragon@100", "dragon@12.5"}, names)
	assert.Equal(t, dragonv1.Mode_MODE_DEVICE_ONLY, cs[0].Mode)
	assert.Equal(t, dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION, cs[2].Mode)
	assert.Equal(t, 100.0, cs[2].LatencyMS)
	assert.InDelta(t, 20.0, cs[2].JitterMS, 1e-9)
	assert.Zero(t, Configs([]float64{100}, 0)[1].JitterMS)
}

// TestSummarize: medians over the questions, the restored share of the
// decoding sides' passages, and warm answers compared with cold ones.
func TestSummarize(t *testing.T) {
	cfgs := Configs([]float64{0}, 0)
	dev := func(ms float64, restored int, toks ...int32) Asked {
		return Asked{Tokens: toks, TTFTMS: ms, Passages: [2]int{2, 0}, Restored: [2]int{restored, 0}}
	}
	both := func(ms float64, rd, rc int, toks ...int32) Asked {
		return Asked{Tokens: toks, TTFTMS: ms, Passages: [2]int{2, 2}, Restored: [2]int{rd, rc}}
	}
	passes := map[string]Pass{
		"device-only": {Cold: []Asked{dev(300, 0, 1, 2), dev(100, 1, 3), dev(200, 0, 4)}, Warm: []Asked{dev(10, 2, 1, 2), dev(30, 2, 3), dev(20, 2, 4)}},
		"dragon@0":    {Cold: []Asked{both(500, 0, 0, 5), both(700, 0, 0, 6)}, Warm: []Asked{both(50, 2, 2, 5), both(90, 2, 1, 7)}},
	}
	r := Summarize(cfgs, []string{"a?", "b?", "c?"}, passes)
	assert.Equal(t, map[string]float64{"cold": 200, "warm": 20}, r.TTFTMS["device-only"])
	assert.Equal(t, map[string]float64{"cold": 600, "warm": 70}, r.TTFTMS["dragon@0"])
	assert.Equal(t, []float64{300, 100, 200}, r.PerQuestionTTFTMS["device-only"]["cold"])
	assert.InDelta(t, 1.0/6, r.RestoredFraction["device-only"]["cold"], 1e-12)
	assert.Equal(t, 1.0, r.RestoredFraction["device-only"]["warm"])
	assert.Equal(t, 0.875, r.RestoredFraction["dragon@0"]["warm"])
	assert.Equal(t, []string{"4/4", "3/4"}, r.PerQuestionRestored["dragon@0"]["warm"])
	assert.Equal(t, []int{2, 1, 1}, r.Tokens["device-only"])
	assert.Equal(t, 5, r.GreedyPrompts)
	assert.Equal(t, 4, r.GreedyIdentical)
	require.Len(t, r.Mismatches, 1)
	assert.Contains(t, r.Mismatches[0], "dragon@0 q1")
	assert.NotContains(t, r.TTFTMS, "dragon@100", "a configuration without answers is left out")
}

// TestResultJSON: the object `dragon bench cache --json` prints has the
// fields the issue names, where it names them.
func TestResultJSON(t *testing.T) {
	ttft := Summarize(Configs([]float64{0, 100}, 0), []string{"q"}, map[string]Pass{
		"device-only": {Cold: []Asked{{TTFTMS: 100}}, Warm: []Asked{{TTFTMS: 10}}},
		"dragon@0":    {Cold: []Asked{{TTFTMS: 200}}, Warm: []Asked{{TTFTMS: 20}}},
		"dragon@100":  {Cold: []Asked{{TTFTMS: 400}}, Warm: []Asked{{TTFTMS: 40}}},
	})
	res := Result{
		TTFTMS: ttft.TTFTMS, TTFT: &ttft, PrefillMS: 100, RestoreMS: 1, RestoreOverPrefill: 0.01,
		Restore: &RestoreResult{PrefillMS: 100, RestoreMS: 1, Ratio: 0.01, Passages: 16, Repeats: 5, PromptTokens: 120},
		Load: &LoadResult{
			TokSOff: map[string]float64{"1": 10, "8": 40}, TokSOn: map[string]float64{"1": 12, "8": 50}, HitRate: 0.4,
			HitRateBy: map[string]float64{"1": 0.2, "8": 0.45}, ZipfS: 1, Pool: 200, Requests: 6, MaxTokens: 32,
		},
		GreedyIdentical: ttft.GreedyIdentical, GreedyPrompts: ttft.GreedyPrompts, Machine: ThisMachine(), Date: "2026-11-25T12:00:00Z",
	}
	raw, err := json.Marshal(res)
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(raw, &got))
	for _, name := range []string{"device-only", "dragon@0", "dragon@100"} {
		for _, state := range []string{"cold", "warm"} {
			assert.IsType(t, 0.0, got["ttft_ms"].(map[string]any)[name].(map[string]any)[state], "ttft_ms.%s.%s", name, state)
		}
	}
	assert.Equal(t, 40.0, got["ttft_ms"].(map[string]any)["dragon@100"].(map[string]any)["warm"])
	assert.Equal(t, 100.0, got["prefill_ms_per_passage"])
	assert.Equal(t, 1.0, got["restore_ms_per_passage"])
	load := got["load"].(map[string]any)
	assert.Equal(t, map[string]any{"1": 10.0, "8": 40.0}, load["tok_s_off"])
	assert.Equal(t, map[string]any{"1": 12.0, "8": 50.0}, load["tok_s_on"])
	assert.Equal(t, 0.4, load["hit_rate"])
	assert.Equal(t, 3.0, got["greedy_identical"])
	assert.Equal(t, 3.0, got["greedy_prompts"])
	assert.Contains(t, got, "machine")
	assert.Contains(t, got, "date")

	var table bytes.Buffer
	require.NoError(t, WriteTable(&table, res))
	for _, want := range []string{"device-only", "dragon@0", "dragon@100", "3/3", "restore / prefill", "8 clients"} {
		assert.Contains(t, table.String(), want)
	}
	assert.Less(t, strings.Index(table.String(), "dragon@0 "), strings.Index(table.String(), "dragon@100"), "configurations in order")
}

// TestMeasureRestore on the fake engine, whose decodes cost time per
// token: the passage prompts are the decoder's, and a restore, which
// computes nothing, costs far less than a prefill.
func TestMeasureRestore(t *testing.T) {
	m := fake.New(fake.Config{Seed: 1, Latency: 50 * time.Microsecond})
	prompts := []promptset.Prompt{
		{Query: "What is it?", Passages: []decoder.Passage{{Text: "The first passage, about rivers.", Score: 1}, {Text: "The second one, about hills.", Score: 0.5}}},
		{Query: "Who?", Passages: []decoder.Passage{{Text: "A third passage.", Score: 1}}},
	}
	toks, err := PassagePrompts(context.Background(), m, prompts)
	require.NoError(t, err)
	require.Len(t, toks, 3)
	for i, want := range []string{"The first passage, about rivers.", "The second one, about hills.", "A third passage."} {
		text := string(detok(m, toks[i]))
		assert.Contains(t, text, want, "prompt %d", i)
		assert.Contains(t, text, decoder.DefaultSystem, "prompt %d", i)
	}
	assert.Contains(t, string(detok(m, toks[2])), "Who?")

	r, err := MeasureRestore(context.Background(), m, toks, 3, 1)
	require.NoError(t, err)
	assert.Equal(t, 3, r.Passages)
	assert.Equal(t, 3, r.Repeats)
	assert.Len(t, r.PrefillPerPassageMS, 3)
	assert.Len(t, r.RestorePerPassageMS, 3)
	assert.GreaterOrEqual(t, r.PrefillMS, 0.05*r.PromptTokens, "a prefill costs at least its tokens' latency")
	assert.Less(t, r.RestoreMS, r.PrefillMS)
	assert.InDelta(t, r.RestoreMS/r.PrefillMS, r.Ratio, 1e-12)
	assert.Positive(t, r.StateBytes)

	_, err = MeasureRestore(context.Background(), m, nil, 1, 1)
	assert.Error(t, err)
	_, err = MeasureRestore(context.Background(), m, toks, 0, 1)
	assert.Error(t, err)
}

func detok(m engine.Model, toks []engine.Token) []byte {
	var out []byte
	for _, t := range toks {
		out = append(out, m.Piece(t)...)
	}
	return out
}
