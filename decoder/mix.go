package decoder

import (
	"math"
)

// softmaxMix adds w·softmax(logits) into acc and returns log Σ exp(logits)
// (the log partition). This is the decoder's hot loop (every vocabulary
// entry, per passage, per position). Entries more than negligibleNats
// below the maximum contribute under 1e-13 each, below float32 resolution
// of a distribution whose top entry is near 1, so they are skipped without
// an exponential.
func softmaxMix(acc, logits, scratch []float32, w float32) float64 {
	maxv := logits[0]
	for _, v := range logits {
		if v > maxv {
			maxv = v
		}
	}
	floor := maxv - negligibleNats
	var sum float32
	for i, v := range logits {
		e := float32(0)
		if v > floor {
			e = expf(v - maxv)
		}
		scratch[i] = e
		sum += e
	}
	scale := w / sum
	for i, e := range scratch[:len(logits)] {
		acc[i] += scale * e
	}
	return float64(maxv) + math.Log(float64(sum))
}

const negligibleNats = 30

// expf is e^x for x ≤ 0 in float32, accurate to a few ulps: 2^(x·log2 e)
// split into an integer power (built in the exponent bits) and a degree-6
// polynomial for the fraction. Below -87 it flushes to 0. Relative error is
// below 1e-5 (float32 rounding of x·log2 e dominates near -87).
func expf(x float32) float32 {
	if x < -87 {
		return 0
	}
	t := x * 1.4426950408889634  // log2(e)
	n := float32(int32(t - 0.5)) // round to nearest (t ≤ 0)
	f := t - n                   // [-0.5, 0.5]
	// 2^f = e^g with |g| ≤ ln2/2: the Taylor tail is below 2e-7.
	g := f * 0.6931471805599453
	p := 1 + g*(1+g*(0.5+g*(0.16666667+g*(0.041666668+g*(0.008333334+g*0.0013888889)))))
	return p * math.Float32frombits(uint32(int32(n)+127)<<23)
}

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
