package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/internal/testmodel"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// TestQwenPairGreedyDragonEqualsTokenWise: DRAGON's model family, the
// 0.5B on the device and the 1.5B on the cloud (different models, one
// tokenizer), shake hands, and greedy DRAGON with the aggregator moving
// every 3 steps emits exactly greedy token-wise synchronisation's tokens
// over a 15 ms link. Short answers: the 1.5B costs about 4x SmolLM2.
func TestQwenPairGreedyDragonEqualsTokenWise(t *testing.T) {
	// The 1.5B on a loaded 2-core machine can take seconds a step: the
	// device must not give up on it and finish alone.
	client, dev, cld := pairOfModels(t, 15*time.Millisecond, testmodel.QwenCloudPath(t), testmodel.QwenDevicePath(t), nil,
		[]string{"--cloud-timeout", "2m"}, nil)
	var switches uint32
	for i, q := range promptset.Questions[:2] {
		dr := greedyDragonEqualsTW(t, client, dev, cld, i, q, 12)
		assert.Equal(t, uint32(2), dr.Summary.GetPassagesCloud())
		switches += dr.Summary.GetAggregatorSwitches()
		t.Logf("%d: %d tokens, %d switches, acceptance %.2f/%.2f: %q", i, len(dr.Tokens),
			dr.Summary.GetAggregatorSwitches(), dr.Summary.GetAcceptanceRateDevice(), dr.Summary.GetAcceptanceRateCloud(), dr.Text)
	}
	assert.Positive(t, switches, "the aggregator moved")
}

// TestModelsOfAnotherTokenizerRefuseEachOther: a device on SmolLM2 and a
// cloud on Qwen cannot mix distributions; the handshake says so on both
// ends, and the device answers alone.
func TestModelsOfAnotherTokenizerRefuseEachOther(t *testing.T) {
	client, dev, cld := pairOfModels(t, 0, testmodel.QwenDevicePath(t), testmodel.Path(t), nil, nil, nil)
	a, err := ask(t, client, &dragonv1.GenerateRequest{Prompt: "Say hello.", Sampling: &dragonv1.SamplingParams{MaxTokens: 4}})
	require.NoError(t, err, "device log:\n%s", dev.Logs())
	s := a.Summary
	require.True(t, s.GetFallback(), "answered alone")
	assert.Positive(t, s.GetTokens())
	for _, want := range []string{"model mismatch", "different tokenizers", "Qwen2.5 Coder 0.5B"} {
		assert.Contains(t, s.GetFallbackReason(), want)
	}
	require.Eventually(t, func() bool { return strings.Contains(cld.Logs(), "handshake refused") }, 5*time.Second, 50*time.Millisecond)
	assert.Contains(t, cld.Logs(), "different tokenizers", "the cloud's log says why")
}
