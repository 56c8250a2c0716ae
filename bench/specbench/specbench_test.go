package specbench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
	"github.com/dragon-rag/dragon/specdec"
)

func TestTokensPerPass(t *testing.T) {
	m := fake.New(fake.Config{Seed: 3, Vocab: 300, Copy: 6, CopyOrder: 1})
	p := promptset.Prompt{Query: "Repeat: the lamp, the lamp, the lamp at dusk", Passages: []decoder.Passage{{Text: "the lamp at dusk, the lamp at dawn", Score: 1}}}
	plain, err := decoder.New(m, decoder.Options{MaxPassages: 1, CtxPerSeq: 256})
	require.NoError(t, err)
	defer plain.Close()
	fast, err := decoder.New(m, decoder.Options{MaxPassages: 1, CtxPerSeq: 256, Spec: specdec.DefaultOptions(), NoCostModel: true})
	require.NoError(t, err)
	defer fast.Close()

	a, err := generateOne(context.Background(), plain, p, 40)
	require.NoError(t, err)
	b, err := generateOne(context.Background(), fast, p, 40)
	require.NoError(t, err)
	// Plain decoding: one token per pass (the last pass may decide only the
	// end of the answer).
	assert.InDelta(t, 1, tokensPerPass([]run{a}), 0.05)
	assert.Greater(t, tokensPerPass([]run{b}), 1.2, "accepted drafts add tokens to passes")
	assert.Zero(t, tokensPerPass(nil))
}

func TestAblateCountsAddUp(t *testing.T) {
	m := fake.New(fake.Config{Seed: 5, Vocab: 300, Copy: 6, CopyOrder: 1})
	ps := []promptset.Prompt{
		{Query: "Repeat: the lamp, the lamp, the lamp at dusk", Passages: []decoder.Passage{{Text: "the lamp at dusk, the lamp at dawn", Score: 1}}},
		{Query: "Say it again: a red door, a red door", Passages: []decoder.Passage{{Text: "a red door and a blue door and a red door", Score: 1}}},
	}
	rows, err := Ablate(context.Background(), m, AblateOptions{MaxTokens: 32, Prompts: ps, Configs: AblationConfigs(specdec.DefaultOptions()), Repeats: 2, MaxPassages: 1})
	require.NoError(t, err)
	require.Len(t, rows, 7)
	require.Equal(t, Plain, rows[0].Config)
	assert.Zero(t, rows[0].Drafts)
	assert.InDelta(t, 1, rows[0].Speedup, 1e-9)
	for _, r := range rows {
		assert.Equal(t, len(ps), r.Identical, "%s: greedy speculation emits plain decoding's answer", r.Config)
		assert.Equal(t, rows[0].Tokens, r.Tokens, r.Config)
		var drafts, drafted, accepted int
		for _, o := range r.ByOrigin {
			drafts += o.Drafts
			drafted += o.DraftedTokens
			accepted += o.AcceptedTokens
		}
		assert.Equal(t, []int{r.Drafts, r.DraftedTokens, r.AcceptedTokens}, []int{drafts, drafted, accepted}, "%s: origins add up", r.Config)
		assert.InDelta(t, float64(r.Tokens)/float64(r.Passes), r.TokensPerPass, 1e-9)
		for o, d := range r.Displaced {
			assert.LessOrEqual(t, d.Accepted, r.ByOrigin[o].AcceptedTokens, "%s %s: judged against the answer", r.Config, o)
			assert.Equal(t, r.ByOrigin[o].Drafts, d.Drafts)
		}
	}
	lookup := rows[1]
	assert.Positive(t, lookup.Drafts)
	assert.Equal(t, lookup.Drafts, lookup.ByOrigin["lookup"].Drafts, "lookup alone makes only lookup drafts")
	assert.Greater(t, lookup.TokensPerPass, rows[0].TokensPerPass, "accepted drafts add tokens to passes")
}

func TestJudge(t *testing.T) {
	answer := []engine.Token{1, 2, 3, 4}
	assert.Equal(t, 2, judge([]engine.Token{2, 3, 9}, answer, 1))
	assert.Equal(t, 1, judge([]engine.Token{4, 5}, answer, 3), "cut where the answer ends")
	assert.Zero(t, judge(nil, answer, 0))
	assert.Zero(t, judge([]engine.Token{1}, answer, 4))
}
