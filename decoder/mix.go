package decoder

import (
	"math"
)

// logSumExp of scores, in float64.
func logSumExp(v []float64) float64 {
	if len(v) == 0 {
		return math.Inf(-1)
	}
	m := v[0]
	for _, x := range v {
		m = max(m, x)
	}
	if math.IsInf(m, -1) {
		return m
	}
	var s float64
	for _, x := range v {
		s += math.Exp(x - m)
	}
	return m + math.Log(s)
}

// weights returns softmax(scores) and logsumexp(scores): the document
// weights ω = softmax(R) and the side's h̃ = logsumexp(R) (DRAGON A.1).
func weights(scores []float64) ([]float32, float64) {
	lse := logSumExp(scores)
	w := make([]float32, len(scores))
	for i, s := range scores {
		w[i] = float32(math.Exp(s - lse))
	}
	return w, lse
}
