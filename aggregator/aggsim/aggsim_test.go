package aggsim

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/internal/timing"
)

// constTrace decodes in fixed times; acceptance follows a Bernoulli draw
// per step with the given rates (seeded).
func constTrace(cd, cc, ad, ac float64, n int, seed uint64) Trace {
	r := rand.New(rand.NewPCG(seed, 1))
	t := Trace{DecodeMS: PerSide[[]float64]{Device: []float64{cd}, Cloud: []float64{cc}}}
	for range n {
		t.Accept.Device = append(t.Accept.Device, r.Float64() < ad)
		t.Accept.Cloud = append(t.Accept.Cloud, r.Float64() < ac)
	}
	return t
}

func static(side aggregator.Side) aggregator.SchedulerConfig {
	if side == aggregator.Cloud {
		return aggregator.SchedulerConfig{Strategy: aggregator.StaticCloud}
	}
	return aggregator.SchedulerConfig{Strategy: aggregator.StaticDevice}
}

// TestTable1 forces each acceptance scenario at every step, with the device
// aggregating, and compares the steady-state time between target tokens
// with Table 1 once φ is eliminated (§5.1): a side whose drafts keep being
// accepted decodes continuously, so only the cloud's rejections cost a
// round trip.
func TestTable1(t *testing.T) {
	const cl, cr, oneWay = 20.0, 35.0, 40.0
	rtt := 2 * oneWay
	cases := []struct {
		device, cloud bool // accepted
		want          float64
	}{
		{false, true, max(cl, cr)},
		{true, false, max(cl, rtt+cr)},
		{true, true, max(cl, cr)},
		{false, false, max(cl, rtt+cr)},
	}
	for _, c := range cases {
		name := fmt.Sprintf("device accepted %v, cloud accepted %v", c.device, c.cloud)
		tr := Trace{
			DecodeMS: PerSide[[]float64]{Device: []float64{cl}, Cloud: []float64{cr}},
			Accept:   PerSide[[]bool]{Device: []bool{c.device}, Cloud: []bool{c.cloud}},
		}
		res, err := Run(Config{Steps: 400, Trace: tr, Link: Constant(oneWay), Scheduler: static(aggregator.Device)})
		require.NoError(t, err, name)
		assert.InDelta(t, c.want, timing.Median(res.Intervals[50:]), c.want*0.02, name)
		assert.Zero(t, res.Switches)
	}
}

// TestTheorem62 compares DRAGON with token-wise synchronisation (the same
// run with one undecided draft per side) for constant latencies, the device
// aggregating: the simulated speedup must match Eq. (9) within 5%.
func TestTheorem62(t *testing.T) {
	type tc struct{ cl, cr, oneWay, ar float64 }
	cases := []tc{
		{20, 30, 50, 0.7},  // c^l ≤ c^r
		{10, 40, 150, 0.9}, // c^l ≤ c^r, long round trip
		{50, 30, 50, 0.8},  // c^r < c^l ≤ c^r + rtt
		{90, 20, 20, 0.6},  // c^r < c^l ≤ c^r + rtt
		{200, 20, 30, 0.8}, // c^l > c^r + rtt: no speedup
	}
	for _, c := range cases {
		rtt := 2 * c.oneWay
		var inv float64 // 1/S, Eq. (9)
		switch {
		case c.cl <= c.cr:
			inv = 1 - c.ar/(1+c.cr/rtt)
		case c.cl <= c.cr+rtt:
			inv = 1 - (1-c.cl/(c.cr+rtt))*c.ar
		default:
			inv = 1
		}
		tr := constTrace(c.cl, c.cr, 0.5, c.ar, 4000, 9)
		base := Config{Steps: 4000, Trace: tr, Link: Constant(c.oneWay), Scheduler: static(aggregator.Device)}
		dragon, err := Run(base)
		require.NoError(t, err)
		tw := base
		tw.Lookahead = 1
		sync, err := Run(tw)
		require.NoError(t, err)
		assert.InDelta(t, max(c.cl, c.cr+rtt), sync.PerTokenMS, 0.01, "token-wise: max(c^l, c^r + rtt)")
		got := sync.PerTokenMS / dragon.PerTokenMS
		t.Logf("%+v: speedup %.3f, Eq. (9) %.3f", c, got, 1/inv)
		assert.InEpsilon(t, 1/inv, got, 0.05, "%+v: speedup %.3f, Eq. (9) %.3f", c, got, 1/inv)
	}
}

// TestSchedulingStrategies: with the cloud's drafts accepted far more often
// than the device's, the device should aggregate (the paper's Corollary
// 6.4), and the greedy scheduler finds that from either start, with the
// estimates it observes itself.
func TestSchedulingStrategies(t *testing.T) {
	tr := constTrace(25, 25, 0.3, 0.9, 3000, 4)
	run := func(sc aggregator.SchedulerConfig, first aggregator.Side, est Estimates) Result {
		res, err := Run(Config{Steps: 3000, Trace: tr, Link: Sinusoid(100, 20, 2000), Scheduler: sc, First: first, Estimates: est})
		require.NoError(t, err)
		return res
	}
	dev := run(static(aggregator.Device), aggregator.Device, Oracle)
	cld := run(static(aggregator.Cloud), aggregator.Device, Oracle)
	require.Less(t, dev.PerTokenMS, cld.PerTokenMS)
	for _, est := range []Estimates{Oracle, Observed} {
		for _, first := range aggregator.Sides {
			g := run(aggregator.SchedulerConfig{Strategy: aggregator.Greedy}, first, est)
			t.Logf("greedy from %v, estimates %d: %.1f ms/token (device %.1f, cloud %.1f), %d switches", first, est, g.PerTokenMS, dev.PerTokenMS, cld.PerTokenMS, g.Switches)
			assert.InEpsilon(t, dev.PerTokenMS, g.PerTokenMS, 0.03, "greedy from %v (estimates %d)", first, est)
			assert.LessOrEqual(t, g.Switches, 2, "no flapping")
		}
	}
	rnd := run(aggregator.SchedulerConfig{Strategy: aggregator.Random, Seed: 1}, aggregator.Device, Oracle)
	assert.Greater(t, rnd.PerTokenMS, dev.PerTokenMS)
	assert.Greater(t, rnd.Switches, 500)
	assert.InDelta(t, 0.9, dev.Accepted[1], 0.03)
}

func TestRunRejectsBadConfig(t *testing.T) {
	_, err := Run(Config{Steps: 1})
	assert.Error(t, err)
	_, err = Run(Config{Steps: 10, Link: Constant(1)})
	assert.ErrorContains(t, err, "no device decode times")
}
