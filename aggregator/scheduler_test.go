package aggregator

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func costs(cd, cc, rtt, ad, ac float64) Costs {
	return Costs{Decode: [2]float64{cd, cc}, RTT: rtt, Accept: [2]float64{ad, ac}}
}

// TestEq8MatchesEq7 checks the closed form of Eq. (8) against the
// difference of Eq. (7) in each of its four regions, from both sides.
func TestEq8MatchesEq7(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	regions := map[int]int{}
	for range 20000 {
		c := costs(r.Float64()*100, r.Float64()*100, r.Float64()*150, r.Float64(), r.Float64())
		for _, l := range Sides {
			want := c.Latency(l) - c.Latency(l.Other())
			require.InDelta(t, want, c.DeltaZ(l), 1e-9, "%+v from %v", c, l)
		}
		cl, cr := c.Decode[0], c.Decode[1]
		switch {
		case cl <= cr-c.RTT:
			regions[1]++
		case cl <= cr:
			regions[2]++
		case cl <= cr+c.RTT:
			regions[3]++
		default:
			regions[4]++
		}
	}
	for reg := 1; reg <= 4; reg++ {
		assert.Positive(t, regions[reg], "region %d covered", reg)
	}
}

// TestEq8Signs: the sign of Eq. (8) in each region, as §5.1 reads it. A
// side whose decoding is the bottleneck keeps the aggregator; otherwise the
// side whose drafts are accepted more often should not aggregate (its
// drafts would cross the network with nothing to gain).
func TestEq8Signs(t *testing.T) {
	const rtt = 100
	cases := []struct {
		name   string
		c      Costs
		device bool // the device should aggregate (ΔZ from the device ≤ 0)
	}{
		// Region 1: the cloud's decoding is slower by more than a round
		// trip: it is the bottleneck and aggregates, whatever α.
		{"cloud bottleneck", costs(10, 200, rtt, 0.9, 0.1), false},
		// Region 4: the device is the bottleneck and aggregates.
		{"device bottleneck", costs(250, 20, rtt, 0.1, 0.9), true},
		// Regions 2 and 3 with equal decoding: the side with the more
		// acceptable drafts lets the other aggregate.
		{"cloud drafts accepted more", costs(30, 30, rtt, 0.2, 0.9), true},
		{"device drafts accepted more", costs(30, 30, rtt, 0.9, 0.2), false},
		// Region 3: device a little slower, equal acceptance: the slower
		// side aggregates so that its drafts never wait on the network.
		{"device slightly slower", costs(60, 30, rtt, 0.5, 0.5), true},
		{"cloud slightly slower", costs(30, 60, rtt, 0.5, 0.5), false},
	}
	for _, c := range cases {
		dz := c.c.DeltaZ(Device)
		assert.Equal(t, c.device, dz <= 0, "%s: ΔZ = %v", c.name, dz)
		s, err := NewScheduler(SchedulerConfig{Strategy: Greedy, Patience: 1, Margin: 0.01})
		require.NoError(t, err)
		best := Cloud
		if c.device {
			best = Device
		}
		assert.False(t, s.Move(0, best, c.c), "%s: stays on %v", c.name, best)
		assert.True(t, s.Move(0, best.Other(), c.c), "%s: moves to %v", c.name, best)
	}
}

func TestSchedulerHysteresis(t *testing.T) {
	s, err := NewScheduler(SchedulerConfig{Strategy: Greedy, Patience: 3, MinDwell: 10, Margin: 0.1})
	require.NoError(t, err)
	cloudBetter := costs(30, 30, 100, 0.9, 0.2) // ΔZ > 0 from the device: move to the cloud
	nearTie := costs(30, 30, 100, 0.52, 0.5)
	assert.False(t, s.Move(1, Device, nearTie), "within the margin")
	assert.False(t, s.Move(2, Device, cloudBetter))
	assert.False(t, s.Move(3, Device, cloudBetter))
	assert.False(t, s.Move(4, Device, nearTie), "a tie resets the patience")
	assert.False(t, s.Move(5, Device, cloudBetter))
	assert.False(t, s.Move(6, Device, cloudBetter))
	assert.True(t, s.Move(7, Device, cloudBetter), "third decision in a row")
	deviceBetter := costs(30, 30, 100, 0.2, 0.9)
	for step := uint64(8); step < 17; step++ {
		assert.False(t, s.Move(step, Cloud, deviceBetter), "dwell at step %d", step)
	}
	assert.True(t, s.Move(17, Cloud, deviceBetter))
}

func TestStaticAndRandomStrategies(t *testing.T) {
	c := costs(30, 30, 100, 0.2, 0.9)
	dev, err := NewScheduler(SchedulerConfig{Strategy: StaticDevice})
	require.NoError(t, err)
	assert.True(t, dev.Move(0, Cloud, c))
	assert.False(t, dev.Move(0, Device, costs(30, 30, 100, 0.9, 0.2)))
	cld, err := NewScheduler(SchedulerConfig{Strategy: StaticCloud})
	require.NoError(t, err)
	assert.True(t, cld.Move(0, Device, c))
	rnd, err := NewScheduler(SchedulerConfig{Strategy: Random, Seed: 4})
	require.NoError(t, err)
	moves := 0
	for step := range uint64(2000) {
		if rnd.Move(step, Device, c) {
			moves++
		}
	}
	assert.InDelta(t, 1000, moves, 100, "about half the steps")
	_, err = NewScheduler(SchedulerConfig{})
	assert.Error(t, err)
	for _, st := range Strategies {
		got, err := ParseStrategy(st.String())
		require.NoError(t, err)
		assert.Equal(t, st, got)
	}
}
