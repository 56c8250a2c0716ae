package specbench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/decoder"
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
