package profiler

import (
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/aggregator"
)

func TestFitRecoversLine(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var ts, cs []float64
	for t := 100.0; t < 1000; t += 7 {
		ts = append(ts, t)
		cs = append(cs, 0.004*t+9+r.NormFloat64()*0.05)
	}
	f, err := Fit(ts, cs)
	require.NoError(t, err)
	assert.InDelta(t, 0.004, f.Slope(), 2e-4)
	assert.InDelta(t, 9, f.Kc, 0.1)
	assert.InDelta(t, 0.004*500+9, f.At(500), 0.05)

	_, err = Fit([]float64{5, 5, 5}, []float64{1, 2, 3})
	assert.ErrorIs(t, err, ErrTooFewSamples)
	_, err = Fit([]float64{5}, []float64{1})
	assert.ErrorIs(t, err, ErrTooFewSamples)
	_, err = Fit([]float64{1, 2}, []float64{1, math.NaN()})
	assert.Error(t, err)
}

// TestUpdateFollowsSlowdown: the run-time update with the intercept frozen
// moves the slope toward what the side now measures (a busier machine).
func TestUpdateFollowsSlowdown(t *testing.T) {
	f, err := Fit([]float64{100, 200, 300, 400}, []float64{10.4, 10.8, 11.2, 11.6})
	require.NoError(t, err)
	assert.InDelta(t, 0.004, f.Slope(), 1e-9)
	for range 200 {
		f.Update(300, 13.1, 0.05) // now 1.5 ms slower at t = 300
	}
	assert.InDelta(t, 13.1, f.At(300), 0.05, "converges to the observation")
	assert.InDelta(t, 10, f.Kc, 1e-9, "intercept frozen")
	f.Update(0, 100, 0.05) // no context: ignored
	assert.InDelta(t, 13.1, f.At(300), 0.05)
}

func TestProfileSaveLoad(t *testing.T) {
	p := Profile{Fit: DecodeFit{Ka: 1, Kb: 250, Kc: 9}, Passages: 2, Threads: 1, Model: "m", Samples: 40, RMSE: 0.2}
	path := filepath.Join(t.TempDir(), "p.json")
	require.NoError(t, p.Save(path))
	got, err := Load(path)
	require.NoError(t, err)
	assert.Equal(t, p, got)
	require.NoError(t, Profile{}.Save(path))
	_, err = Load(path)
	assert.ErrorContains(t, err, "no valid fit")
	_, err = Load(filepath.Join(t.TempDir(), "missing.json"))
	assert.Error(t, err)
}

func TestEstimatorCosts(t *testing.T) {
	dev := DecodeFit{Ka: 0.01 * 1000, Kb: 1000, Kc: 10} // 10 ms + 0.01 ms per context token
	e := NewEstimator(Config{}, dev, DecodeFit{})
	c := e.Costs()
	assert.Equal(t, [2]float64{0.5, 0.5}, c.Accept, "prior before any verdict")

	e.Decode(aggregator.Device, 200, 12)
	e.Decode(aggregator.Cloud, 300, 25)
	e.Decode(aggregator.Cloud, 310, 27)
	e.RTT(100)
	e.RTT(120)
	e.Message(500)
	e.Bandwidth(64000, 10) // 6400 bytes/ms
	for i := range 10 {
		e.Verdict(aggregator.Verdict{Accept: [2]bool{true, i%2 == 0}, Expected: [2]float64{0.9, 0.4}})
	}
	c = e.Costs()
	assert.InDelta(t, 12, c.Decode[0], 0.01, "the fit, barely moved")
	assert.InDelta(t, 25.2, c.Decode[1], 0.01, "moving average: the cloud has no fit")
	assert.InDelta(t, 102+2*500.0/6400, c.RTT, 1e-9)
	assert.InDelta(t, 1, c.Accept[0], 1e-9)
	assert.InDelta(t, 0.5, c.Accept[1], 0.2, "half the cloud's drafts accepted")
	obs, exp := e.Acceptance(aggregator.Cloud)
	assert.InDelta(t, 0.4, exp, 1e-9)
	assert.NotEqual(t, obs, exp)

	// Accepted drafts moved beside the peer's are rejections of the side's
	// own argmax.
	mv := NewEstimator(Config{}, dev, dev)
	for i := range 10 {
		mv.Verdict(aggregator.Verdict{Accept: [2]bool{true, true}, Moved: [2]bool{i%2 == 0, false}})
	}
	assert.InDelta(t, 0.5, mv.Costs().Accept[0], 0.2)
	assert.InDelta(t, 1, mv.Costs().Accept[1], 1e-9)

	ex := NewEstimator(Config{Expected: true}, dev, dev)
	ex.Verdict(aggregator.Verdict{Accept: [2]bool{true, false}, Expected: [2]float64{0.7, 0.3}})
	assert.Equal(t, [2]float64{0.7, 0.3}, ex.Costs().Accept)
}
