package session

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/aggregator"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// TestRequestReachesBothSidesOptions: what an app asks for reaches the
// device's session options and, through the Begin, the cloud's.
func TestRequestReachesBothSidesOptions(t *testing.T) {
	lim := Limits{MaxTokens: 64, MaxPassages: 4, MaxPrompt: 200}
	def := Defaults{MaxTokens: 16, PassagesDevice: 2, PassagesCloud: 2, Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION}
	for _, g := range []*dragonv1.GenerateRequest{
		{Prompt: "q", SwitchEvery: 3, BlindDrafts: true, Strategy: dragonv1.Strategy_STRATEGY_CLOUD},
		{Prompt: "q", Mode: dragonv1.Mode_MODE_TOKEN_WISE_SYNC, Sampling: &dragonv1.SamplingParams{MaxTokens: 40, Seed: 9}},
	} {
		dev, err := ParseGenerate(g, lim, def)
		require.NoError(t, err)
		cld, err := ParseBegin(dev.Begin(7), lim, def)
		require.NoError(t, err)
		for _, side := range aggregator.Sides {
			r := dev
			if side == aggregator.Cloud {
				r = cld
			}
			o := r.Options(side, 7)
			assert.Equal(t, g.GetBlindDrafts(), o.Blind, "%v", side)
			assert.Equal(t, int(g.GetSwitchEvery()), o.SwitchEvery, "%v", side)
			assert.Equal(t, g.GetSampling().GetSeed(), o.Sampling.Seed, "%v", side)
			assert.Equal(t, max(int(g.GetSampling().GetMaxTokens()), def.MaxTokens), o.MaxTokens, "%v", side)
			assert.Equal(t, g.GetMode() == dragonv1.Mode_MODE_TOKEN_WISE_SYNC, o.Sync == TokenWise, "%v", side)
		}
		assert.Equal(t, dev.Strategy, cld.Strategy)
	}
}
