package session

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/aggregator"
)

// TestHedgeRule: a branch pays where P(hit | q)·c exceeds its rows' cost;
// P(hit | q) starts at the prior and follows this side's decided drafts,
// per probability bucket; a draft above every threshold is never hedged;
// --hedge-below replaces the rule.
func TestHedgeRule(t *testing.T) {
	p, err := aggregator.NewProposer(aggregator.Cloud, 1, true, 1)
	require.NoError(t, err)
	draft := func(step uint64, probs []float32) aggregator.Draft {
		d, err := p.Propose(probs, step, 0, 0)
		require.NoError(t, err)
		return d
	}
	h := newHedger(0)
	prior := float64(hedgePriorHits) / hedgePriorSeen
	assert.InDelta(t, prior, h.hitRate(0.1), 1e-12)
	assert.Zero(t, h.hitRate(0.9), "above every threshold")
	// c = 8 ms: hedge when a branch's rows cost less than 8·P(hit).
	assert.True(t, h.should(0.1, 8, 8*prior*0.9))
	assert.False(t, h.should(0.1, 8, 8*prior*1.1))
	assert.False(t, h.should(0.9, 8, 0.001), "a confident draft")

	// Uncertain drafts (0.4 on token 0, 0.35 on 1) whose runner-up wins
	// every time push the bucket below 0.5 up; a confident one's
	// acceptance counts in no bucket.
	for step := range uint64(20) {
		d := draft(step, []float32{0.4, 0.35, 0.25})
		h.drafted(&d)
		h.decided(aggregator.Verdict{Step: step, Target: 1, Accept: [2]bool{true, false}, NextEpoch: [2]uint32{0, 1}}, aggregator.Cloud)
	}
	conf := draft(20, []float32{0.95, 0.05, 0})
	h.drafted(&conf)
	h.decided(aggregator.Verdict{Step: 20, Target: 0, Accept: [2]bool{true, true}}, aggregator.Cloud)
	assert.InDelta(t, (20.0+hedgePriorHits)/(20+hedgePriorSeen), h.hitRate(0.45), 1e-12)
	assert.InDelta(t, prior, h.hitRate(0.25), 1e-12, "the bucket below 0.3 saw none")
	assert.True(t, h.should(0.45, 8, 4), "a branch costing half a pass pays at a hit rate of %.2f", h.hitRate(0.45))

	// A verdict on another epoch's draft, or a branch draft, counts nothing.
	d := draft(21, []float32{0.4, 0.35, 0.25})
	h.drafted(&d)
	h.decided(aggregator.Verdict{Step: 21, Target: 1, Epoch: [2]uint32{0, 3}}, aggregator.Cloud)
	b, err := p.ProposeBranch([]float32{0.4, 0.35, 0.25}, 23, 0, 0, 22)
	require.NoError(t, err)
	h.drafted(&b)
	assert.InDelta(t, (20.0+hedgePriorHits)/(20+hedgePriorSeen), h.hitRate(0.45), 1e-12)
	assert.Empty(t, h.sent, "decided and branch drafts are not kept")

	forced := newHedger(0.5)
	assert.True(t, forced.should(0.45, 8, 1000))
	assert.False(t, forced.should(0.55, 8, 0))
}
