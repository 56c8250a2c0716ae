package schedbench

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/aggregator"
)

// TestGreedyAgainstStaticAndRandom: on the synthetic trace (the cloud's
// drafts accepted more often) greedy placement is within 2% of the best
// static strategy and beats random and token-wise synchronisation at every
// latency of 100 ms or more.
func TestGreedyAgainstStaticAndRandom(t *testing.T) {
	res, err := Run(Options{LatencyMS: []float64{0, 100, 300}, Runs: 8, Steps: 300, Seed: 1})
	require.NoError(t, err)
	for _, lat := range []string{"0", "100", "300"} {
		g := res.PerTokenMS["greedy"][lat]
		best := min(res.PerTokenMS["device"][lat], res.PerTokenMS["cloud"][lat])
		assert.LessOrEqual(t, g, best*1.02, "latency %s: greedy %.1f, best static %.1f", lat, g, best)
		if lat != "0" {
			assert.Less(t, g, res.PerTokenMS["random"][lat], "latency %s", lat)
			assert.Less(t, g, res.TokenWiseMS[lat], "latency %s", lat)
		}
	}
	assert.Equal(t, "synthetic", res.Trace)
	_, err = Run(Options{Runs: 1, Steps: 10})
	assert.Error(t, err)
	one, err := Run(Options{LatencyMS: []float64{50}, Runs: 1, Steps: 50, Strategies: []aggregator.Strategy{aggregator.Greedy}})
	require.NoError(t, err)
	assert.Len(t, one.PerTokenMS, 1)
}
