package sampling

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var scores = []float32{2, 1, 0.5, 3, -1}

func nonZero(p []float32) int {
	n := 0
	for _, v := range p {
		if v > 0 {
			n++
		}
	}
	return n
}

func total(p []float32) float64 {
	var s float64
	for _, v := range p {
		s += float64(v)
	}
	return s
}

func TestDist(t *testing.T) {
	tests := []struct {
		name    string
		p       Params
		history []int32
		keep    int
		top     int
	}{
		{"greedy", Params{}, nil, 1, 3},
		{"greedy with penalty moves the argmax", Params{RepeatPenalty: 2}, []int32{3}, 1, 0},
		{"temperature keeps all", Params{Temperature: 1}, nil, 5, 3},
		{"top-k", Params{Temperature: 1, TopK: 2}, nil, 2, 3},
		{"top-p", Params{Temperature: 1, TopP: 0.7}, nil, 2, 3},
		{"min-p", Params{Temperature: 1, MinP: 0.3}, nil, 2, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NoError(t, tt.p.Validate())
			d := tt.p.Dist(scores, tt.history, nil)
			assert.Equal(t, tt.keep, nonZero(d))
			assert.InDelta(t, 1, total(d), 1e-6)
			assert.Equal(t, tt.top, Argmax(d))
		})
	}
}

func TestTemperatureSoftmax(t *testing.T) {
	d := Params{Temperature: 2}.Dist(scores, nil, nil)
	var z float64
	for _, s := range scores {
		z += math.Exp(float64(s) / 2)
	}
	for i, s := range scores {
		assert.InDelta(t, math.Exp(float64(s)/2)/z, float64(d[i]), 1e-6)
	}
}

func TestDrawFollowsTheDistribution(t *testing.T) {
	p := []float32{0.1, 0, 0.6, 0.3}
	rng := Params{Seed: 9}.NewRand()
	counts := make([]int, len(p))
	const n = 20000
	for range n {
		counts[Draw(p, rng)]++
	}
	assert.Zero(t, counts[1])
	for i, v := range p {
		assert.InDelta(t, float64(v), float64(counts[i])/n, 0.015)
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []Params{
		{Temperature: -1}, {TopK: -1}, {TopP: 1.5}, {MinP: -0.1}, {RepeatPenalty: -2}, {RepeatLastN: -1},
		{Temperature: math.NaN()},
	} {
		assert.Error(t, p.Validate(), "%+v", p)
	}
}

func TestSeedIsDeterministic(t *testing.T) {
	a, b := Params{Seed: 5}.NewRand(), Params{Seed: 5}.NewRand()
	for range 10 {
		assert.Equal(t, a.Uint64(), b.Uint64())
	}
}

func TestUniformPerPosition(t *testing.T) {
	p := Params{Seed: 3}
	seen := map[float64]bool{}
	var sum float64
	const n = 20000
	for pos := range n {
		u := p.Uniform(pos)
		require.GreaterOrEqual(t, u, 0.0)
		require.Less(t, u, 1.0)
		assert.Equal(t, u, p.Uniform(pos), "deterministic")
		seen[u] = true
		sum += u
	}
	assert.Len(t, seen, n, "positions get distinct numbers")
	assert.InDelta(t, 0.5, sum/n, 0.01)
	assert.NotEqual(t, p.Uniform(0), Params{Seed: 4}.Uniform(0))
	assert.Equal(t, int32(2), DrawU([]float32{0.1, 0, 0.6, 0.3}, 0.65))
	assert.Equal(t, int32(0), DrawU([]float32{0.1, 0, 0.6, 0.3}, 0.05))
}
