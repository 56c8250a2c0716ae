package decoder

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestWeightsAreSoftmaxAndLogSumExp(t *testing.T) {
	tests := []struct {
		name   string
		scores []float64
		want   []float64
		lse    float64
	}{
		{"one passage", []float64{3}, []float64{1}, 3},
		{"equal", []float64{0, 0}, []float64{0.5, 0.5}, math.Ln2},
		{"large scores do not overflow", []float64{1000, 1000 + math.Ln2}, []float64{1.0 / 3, 2.0 / 3}, 1000 + math.Log(3)},
		{"masked passage", []float64{math.Inf(-1), 1}, []float64{0, 1}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, lse := weights(tt.scores)
			assert.InDelta(t, tt.lse, lse, 1e-9)
			assert.InDeltaSlice(t, tt.want, toF64(w), 1e-6)
		})
	}
	assert.True(t, math.IsInf(logSumExp(nil), -1))
}

func toF64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}
