package experiments

import (
	"encoding/csv"
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWrite: the CSVs have the columns the report promises and a row per
// mode (strategy, source) and latency, the plots are PNG images, and the
// report checks each target against the numbers it was given.
func TestWrite(t *testing.T) {
	lat := []float64{0, 300}
	tab := func(names []string, at0, at300 float64) map[string]map[string]float64 {
		m := map[string]map[string]float64{}
		for i, n := range names {
			m[n] = map[string]float64{"0": at0 + float64(i), "300": at300 + float64(i)}
		}
		return m
	}
	l := &LatencyResults{
		Meta:       Meta{Machine: "test CPU, 2 cores", Date: "2026-11-23", Command: "dragon bench exp"},
		LatencyMS:  lat,
		PerTokenMS: tab([]string{"dragon", "tw", "sw", "device-only", "cloud-only", "context", "kv", "dragon-blind"}, 30, 60),
		TTFTMS:     tab([]string{"dragon", "context", "kv", "device-only"}, 1000, 1300),
		RealMS:     tab(strategies, 30, 50), SimMS: tab(strategies, 25, 40),
		Acceptance: map[string]float64{"device": 0.75, "cloud": 0.9},
		Questions:  2, Tokens: 8, Passages: 2, SimRuns: 3, SimSteps: 16,
	}
	l.PerTokenMS["tw"]["300"] = 600
	l.PerQuestionMS = map[string]map[string][]float64{
		"dragon":          {"0": {30, 40, 50}, "300": {60, 60, 60}},
		"device-only":     {"0": {30, 20, 50}, "300": {30, 30, 30}},
		"strategy/device": {"0": {25, 40, 40}, "300": {60, 50, 66}},
		"strategy/cloud":  {"0": {90, 90, 90}, "300": {90, 90, 90}},
	}
	dir := t.TempDir()
	require.NoError(t, Write(dir, Results{Latency: l}))

	for name, want := range map[string]struct {
		header []string
		rows   int
	}{
		"e1.csv": {[]string{"mode", "latency_ms", "per_token_ms"}, len(e1Modes) * 2},
		"e2.csv": {[]string{"mode", "latency_ms", "ttft_ms"}, len(e2Modes) * 2},
		"e3.csv": {[]string{"strategy", "latency_ms", "per_token_ms", "source"}, len(strategies) * 2 * 2},
	} {
		f, err := os.Open(filepath.Join(dir, "experiments", name))
		require.NoError(t, err)
		recs, err := csv.NewReader(f).ReadAll()
		f.Close()
		require.NoError(t, err, name)
		assert.Equal(t, want.header, recs[0], name)
		assert.Len(t, recs[1:], want.rows, name)
	}
	for _, name := range []string{"e1.png", "e2.png", "e3-real.png", "e3-sim.png"} {
		f, err := os.Open(filepath.Join(dir, "experiments", name))
		require.NoError(t, err)
		img, err := png.Decode(f)
		f.Close()
		require.NoError(t, err, name)
		assert.Greater(t, img.Bounds().Dx(), 100, name)
	}
	md, err := os.ReadFile(filepath.Join(dir, "EXPERIMENTS.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "dragon / tw = 0.10 (target ≤ 0.5)", "60 against 600 ms at 300 ms")
	assert.Contains(t, string(md), "dragon / device-only = 0.91 (target ≤ 1.15)", "30 against 33 ms at 0 ms")
	assert.Contains(t, string(md), "test CPU, 2 cores")
	assert.Contains(t, string(md), "dragon / dragon-blind: 0.81 at 0 ms; 0.90 at 300 ms;", "30 against 37, 60 against 67 ms")
	assert.Contains(t, string(md), "dragon TTFT − 2L: 1000 at 0 ms; 700 at 300 ms;", "1300 ms at 300 ms less a 600 ms round trip")
	assert.Contains(t, string(md), "real: greedy against the best static strategy: -3.2% at 0 ms", "30 against 31 ms")
	assert.Contains(t, string(md), "the median of the per-question ratios is 1.00", "30/30, 40/20, 50/50")
	assert.Contains(t, string(md), "same question): +20.0% at 0 ms; +0.0% at 300 ms; greedy / random:", "median of 1.2, 1, 1.25 and of 1, 1.2, 0.91")
	assert.Contains(t, string(md), "## E4: quality (DRAGON Fig. 5)\n\nNot measured yet.")
	assert.NotContains(t, string(md), "different models", "one model on both sides")

	// A pair of models is named, with dragon against the slower side.
	pair := *l
	pair.DeviceModel, pair.CloudModel = "small.gguf", "large.gguf"
	pairDir := t.TempDir()
	require.NoError(t, Write(pairDir, Results{Latency: &pair}))
	md, err = os.ReadFile(filepath.Join(pairDir, "EXPERIMENTS.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "Models: the device's small.gguf, the cloud's large.gguf.")
	assert.Contains(t, string(md), "dragon / cloud-only: 0.88 at 0 ms; 0.94 at 300 ms;", "30 against 34, 60 against 64 ms")

	// A later quality-only run keeps E1–E3 and adds E4.
	back, err := Load(dir)
	require.NoError(t, err)
	require.NotNil(t, back.Latency)
	assert.Equal(t, l.PerTokenMS, back.Latency.PerTokenMS)
	back.Quality = &QualityResults{Passages: []int{0, 4}, Windows: 3, Words: 96, PPL: map[string]map[string]float64{}}
	for i, m := range qualityMethods {
		back.Quality.PPL[m] = map[string]float64{"0": 20, "4": 18 - float64(i)}
	}
	require.NoError(t, Write(dir, back))
	md, err = os.ReadFile(filepath.Join(dir, "EXPERIMENTS.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "dragon / tw = 0.10", "E1 kept")
	assert.Contains(t, string(md), "best of device-only, cloud-only and none: 0.875 at k = 4", "dragon 14 against cloud-only 16")
	f, err := os.Open(filepath.Join(dir, "experiments", "e4.csv"))
	require.NoError(t, err)
	recs, err := csv.NewReader(f).ReadAll()
	f.Close()
	require.NoError(t, err)
	assert.Equal(t, []string{"method", "passages_per_side", "ppl"}, recs[0])
	assert.Len(t, recs[1:], len(qualityMethods)*2)

	// E4 as Fig. 5 is a part of its own, beside E4, with the gain ratio.
	back.Family = &QualityResults{Passages: []int{0, 16}, Windows: 2, Words: 96, Methods: familyMethods,
		Model: "qwen.gguf", Corpus: "wiki/articles", PPL: map[string]map[string]float64{
			"none": {"0": 20, "16": 20}, "cloud-context": {"0": 20, "16": 19}, "context": {"0": 20, "16": 18}, "dragon": {"0": 20, "16": 16},
		}}
	require.NoError(t, Write(dir, back))
	md, err = os.ReadFile(filepath.Join(dir, "EXPERIMENTS.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "best of device-only, cloud-only and none: 0.875 at k = 4", "E4 kept")
	assert.Contains(t, string(md), "| 16 | yes | yes | 4.00 | 2.00 | 2.00× |", "dragon's gain 4 against context's 2")

	// Centralised methods that lose to the model alone have no ratio.
	back.Family.PPL["context"]["16"], back.Family.PPL["cloud-context"]["16"] = 21, 22
	require.NoError(t, Write(dir, back))
	md, err = os.ReadFile(filepath.Join(dir, "EXPERIMENTS.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "| 16 | yes | yes | 4.00 | -1.00 | none gains |")
	assert.FileExists(t, filepath.Join(dir, "experiments", "e4-family.png"))
	f, err = os.Open(filepath.Join(dir, "experiments", "e4-family.csv"))
	require.NoError(t, err)
	recs, err = csv.NewReader(f).ReadAll()
	f.Close()
	require.NoError(t, err)
	assert.Len(t, recs[1:], len(familyMethods)*2)
}

func TestQualityRefusesMethodsItCannotMeasure(t *testing.T) {
	for _, methods := range [][]string{{"dragon", "dragn"}, {methodDynamic}} {
		_, _, err := Quality(t.Context(), QualityOptions{Methods: methods})
		assert.Error(t, err, "%v", methods)
	}
}
