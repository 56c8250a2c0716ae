package experiments

import (
	"encoding/csv"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/specbench"
)

// TestWriteSpec: an E5-only run keeps what results.json held of the other
// parts, writes e5.csv with the promised columns and e5.png, and reports
// E5 with its finding.
func TestWriteSpec(t *testing.T) {
	dir := t.TempDir()
	q := &QualityResults{Meta: Meta{Command: "dragon bench exp"}, Passages: []int{0}, Windows: 1, Words: 8, PPL: map[string]map[string]float64{}}
	for _, m := range qualityMethods {
		q.PPL[m] = map[string]float64{"0": 20}
	}
	require.NoError(t, Write(dir, Results{Quality: q}))

	back, err := Load(dir)
	require.NoError(t, err)
	back.Spec = &SpecResults{
		Meta: Meta{Command: "dragon bench exp --only spec", Machine: "test CPU, 2 cores", Date: "2026-11-23"},
		Set:  "held-out", Prompts: 2, Passages: 1, MaxTokens: 8, Repeats: 1, Defaults: "calibration true, reuse false",
		Rows: []specbench.Counted{
			{Config: specbench.Plain, Tokens: 14, Passes: 15, TokensPerPass: 14.0 / 15, TokS: 90, Speedup: 1, Identical: 2, Prompts: 2},
			{Config: "+lookup", Tokens: 14, Passes: 10, Drafts: 6, DraftedTokens: 30, AcceptedTokens: 5, MeanAccepted: 5.0 / 6, TokensPerPass: 1.4, TokS: 50, Speedup: 0.556, Identical: 2, Prompts: 2,
				ByOrigin: map[string]specbench.OriginCount{"lookup": {Drafts: 6, DraftedTokens: 30, AcceptedTokens: 5}}},
			{Config: "+calibration", Tokens: 14, Passes: 9, Drafts: 6, DraftedTokens: 28, AcceptedTokens: 6, MeanAccepted: 1, TokensPerPass: 14.0 / 9, TokS: 52, Speedup: 0.58, Identical: 2, Prompts: 2,
				ByOrigin:  map[string]specbench.OriginCount{"lookup": {Drafts: 4, DraftedTokens: 20, AcceptedTokens: 3}, "calibrated": {Drafts: 2, DraftedTokens: 8, AcceptedTokens: 3}},
				Displaced: map[string]specbench.Displacement{"calibrated": {Drafts: 2, Accepted: 3, AltAccepted: 1, Better: 2}}},
		},
	}
	require.NoError(t, Write(dir, back))

	b, err := os.ReadFile(filepath.Join(dir, "experiments", resultsFile))
	require.NoError(t, err)
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(b, &raw))
	assert.Contains(t, raw, "quality", "E4 kept")
	assert.Contains(t, raw, "spec")

	f, err := os.Open(filepath.Join(dir, "experiments", "e5.csv"))
	require.NoError(t, err)
	recs, err := csv.NewReader(f).ReadAll()
	f.Close()
	require.NoError(t, err)
	assert.Equal(t, []string{"config", "drafts", "drafted_tokens", "accepted_tokens", "mean_accepted_per_draft", "tokens_per_pass", "tok_s", "speedup"}, recs[0])
	require.Len(t, recs[1:], 3)
	assert.Equal(t, []string{"+calibration", "6", "28", "6", "1.000", "1.556", "52.0", "0.580"}, recs[3])

	f, err = os.Open(filepath.Join(dir, "experiments", "e5.png"))
	require.NoError(t, err)
	_, err = png.Decode(f)
	f.Close()
	require.NoError(t, err)

	md, err := os.ReadFile(filepath.Join(dir, "EXPERIMENTS.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "## E4: quality")
	assert.Contains(t, string(md), "## E5: local speculative decoding ablation")
	assert.Contains(t, string(md), "Measured with `dragon bench exp --only spec` on 2026-11-23, test CPU, 2 cores")
	assert.Contains(t, string(md), "the 2 drafts calibration changed got 3 tokens accepted against 1 for the lookup drafts they displaced")
	assert.Contains(t, string(md), "| +calibration | 6 | 28 | 6 | 1.00 | 1.556 | – | 52.0 | 0.58 | 0 | lookup 4 (3/20), calibrated 2 (3/8) |")
	assert.NotContains(t, string(md), "Not measured yet; the earlier ablation")
}

// TestWriteSpecFamily: E5 on the family writes one CSV and plot per model,
// keeps E5's own results, and reports the follow-ups' tokens per pass
// (every other prompt's) beside the whole set's.
func TestWriteSpecFamily(t *testing.T) {
	dir := t.TempDir()
	per := func(counts ...int) []specbench.PromptCount {
		var out []specbench.PromptCount
		for i := 0; i < len(counts); i += 2 {
			out = append(out, specbench.PromptCount{Tokens: counts[i], Passes: counts[i+1]})
		}
		return out
	}
	fam := func(model string) *SpecResults {
		return &SpecResults{
			Meta: Meta{Command: "dragon bench exp --only spec-family", Machine: "test CPU, 2 cores", Date: "2026-12-02"},
			Set:  "held-out, each followed by its question in other words,", Prompts: 4, Passages: 1, MaxTokens: 8, Repeats: 1,
			Model: model, FollowUps: true,
			Rows: []specbench.Counted{
				{Config: specbench.Plain, Tokens: 28, Passes: 28, TokensPerPass: 1, Speedup: 1, Identical: 4, Prompts: 4, PerPrompt: per(7, 7, 7, 7, 7, 7, 7, 7)},
				{Config: "lookup, cost model", Tokens: 28, Passes: 20, TokensPerPass: 1.4, Speedup: 1.2, Identical: 4, Prompts: 4, PerPrompt: per(7, 5, 7, 5, 7, 5, 7, 5)},
				{Config: "lookup trees, cost model", Tokens: 28, Passes: 18, TokensPerPass: 28.0 / 18, Speedup: 1.1, Identical: 4, Prompts: 4, PerPrompt: per(7, 5, 7, 4, 7, 5, 7, 4)},
				{Config: "lookup+history, cost model", Tokens: 28, Passes: 16, TokensPerPass: 1.75, Speedup: 1.3, Identical: 4, Prompts: 4, PerPrompt: per(7, 5, 7, 3, 7, 5, 7, 3)},
			},
		}
	}
	require.NoError(t, Write(dir, Results{Spec: &SpecResults{Meta: Meta{Command: "dragon bench exp --only spec"}, Set: "held-out", Prompts: 1, Passages: 1, MaxTokens: 8, Repeats: 1,
		Rows: []specbench.Counted{{Config: specbench.Plain, Identical: 1, Prompts: 1}}}}))
	back, err := Load(dir)
	require.NoError(t, err)
	back.SpecFamily = []*SpecResults{fam("Qwen-small.gguf"), fam("Qwen-large.gguf")}
	require.NoError(t, Write(dir, back))

	again, err := Load(dir)
	require.NoError(t, err)
	require.NotNil(t, again.Spec, "E5 kept")
	require.Len(t, again.SpecFamily, 2)
	for _, name := range []string{"e5-Qwen-small", "e5-Qwen-large"} {
		for _, ext := range []string{".csv", ".png"} {
			assert.FileExists(t, filepath.Join(dir, "experiments", name+ext))
		}
	}
	md, err := os.ReadFile(filepath.Join(dir, "EXPERIMENTS.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "## E5 on the Qwen pair")
	assert.Contains(t, string(md), "### Qwen-large.gguf")
	// Follow-ups: history 14 tokens in 6 passes, lookup 14 in 10.
	assert.Contains(t, string(md), "| lookup+history, cost model | 0 | 0 | 0 | 0.00 | 1.750 | 2.333 |")
	assert.Contains(t, string(md), "drafts from earlier answers give 2.333 tokens per pass against lookup's 1.400 (1.67×)")
}
