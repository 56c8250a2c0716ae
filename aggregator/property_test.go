package aggregator

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNoTargetLostDuplicatedOrReordered runs many random worlds (burst
// sizes, lookahead, handover rate, stale submissions, interleavings, first
// aggregator, greedy or sampled, shared drafts) and checks each against a reference run
// with one draft at a time and no handover: the targets are a function of
// the seed alone, so any lost, duplicated or reordered target, or a draft
// verified on the wrong prefix, shows up as a difference.
func TestNoTargetLostDuplicatedOrReordered(t *testing.T) {
	r := rand.New(rand.NewPCG(2026, 11))
	for i := range 300 {
		base := worldConfig{
			seed:    r.Uint64(),
			greedy:  r.IntN(2) == 0,
			topP:    []float64{1, 0.9, 0.8}[r.IntN(3)],
			dist:    disagreeing(r.Uint64()),
			logMass: logMass(0.05 + 0.9*r.Float64()),
			steps:   uint64(50 + r.IntN(150)),
		}
		ref := base
		ref.maxBurst, ref.lookahead, ref.first = 1, 1, Device
		rw := newWorld(t, ref)
		rw.run()
		want := rw.agreed()[:base.steps]

		cfg := base
		cfg.maxBurst = 1 + r.IntN(6)
		cfg.lookahead = cfg.maxBurst + r.IntN(12)
		cfg.switchProb = []float64{0, 0.05, 0.3, 0.9}[r.IntN(4)]
		cfg.staleProb = r.Float64()
		cfg.first = Sides[r.IntN(2)]
		cfg.share = r.IntN(2) == 0
		w := newWorld(t, cfg)
		w.run()
		got := w.agreed()
		require.Equal(t, want, got[:base.steps], "world %d: %v", i, cfg)
		require.Equal(t, w.truth[:len(got)], got, "both sides emit what the aggregators decided, each step once")
	}
}

// TestAnswerDoesNotDependOnSchedule: the same seed gives the same answer
// whatever the bursts, lookahead and handovers, because drafts and
// Algorithm 1 draw their randomness from (seed, side, step).
func TestAnswerDoesNotDependOnSchedule(t *testing.T) {
	dist := disagreeing(3)
	var answers [][]int32
	for _, c := range exactCases {
		w := newWorld(t, worldConfig{
			seed: 42, topP: 0.8, dist: dist, logMass: logMass(0.3), maxBurst: c.maxBurst,
			lookahead: c.lookahead, switchProb: c.switchProb, staleProb: 0.3, first: Cloud, steps: 2000,
		})
		w.run()
		answers = append(answers, w.agreed()[:2000])
	}
	for _, a := range answers[1:] {
		require.Equal(t, answers[0], a)
	}
}
