package decoder

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestExpfAccuracy(t *testing.T) {
	for x := float32(-87); x <= 0; x += 0.001 {
		want := math.Exp(float64(x))
		got := float64(expf(x))
		// float32 rounding of x·log2(e) bounds the error near -87.
		assert.InDelta(t, 0, (got-want)/want, 1e-5, "x=%v", x)
	}
	assert.Equal(t, float32(0), expf(-100))
	assert.Equal(t, float32(1), expf(0))
}

func TestSoftmaxMixIsAWeightedDistribution(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, 1000)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 5)
	}
	acc := make([]float32, len(logits))
	logZ := softmaxMix(acc, logits, make([]float32, len(logits)), 0.25)
	var sum float64
	for i, p := range acc {
		sum += float64(p)
		want := 0.25 * math.Exp(float64(logits[i])-logZ)
		assert.InDelta(t, want, float64(p), 1e-9+1e-5*want)
	}
	assert.InDelta(t, 0.25, sum, 1e-5)
}

func BenchmarkSoftmaxMix(b *testing.B) {
	logits := make([]float32, 49152)
	for i := range logits {
		logits[i] = float32(i%97) / 7
	}
	acc := make([]float32, len(logits))
	scratch := make([]float32, len(logits))
	for b.Loop() {
		softmaxMix(acc, logits, scratch, 0.5)
	}
}
