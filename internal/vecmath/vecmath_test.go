package vecmath

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// reference is w·softmax(logits) and the log partition in float64.
func reference(logits []float32, w float64) ([]float64, float64) {
	m := math.Inf(-1)
	for _, v := range logits {
		m = max(m, float64(v))
	}
	var s float64
	for _, v := range logits {
		s += math.Exp(float64(v) - m)
	}
	logZ := m + math.Log(s)
	p := make([]float64, len(logits))
	for i, v := range logits {
		p[i] = w * math.Exp(float64(v)-logZ)
	}
	return p, logZ
}

func TestSoftmaxMixMatchesFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// Lengths around the 8- and 16-wide loops and their scalar tails.
	for _, n := range []int{1, 2, 7, 8, 9, 15, 16, 17, 31, 1000, 49152} {
		for _, spread := range []float64{0.1, 5, 40} {
			logits := make([]float32, n)
			for i := range logits {
				logits[i] = float32(rng.NormFloat64()*spread + 3)
			}
			acc := make([]float32, n)
			for i := range acc {
				acc[i] = 0.125
			}
			logZ, err := SoftmaxMix(acc, logits, 0.25)
			require.NoError(t, err)
			want, wantZ := reference(logits, 0.25)
			assert.InDelta(t, wantZ, logZ, 1e-5*math.Abs(wantZ)+1e-5, "n=%d spread=%v", n, spread)
			for i := range acc {
				got := float64(acc[i]) - 0.125
				if want[i] < 1e-13*0.25 {
					// Negligible entries may be flushed to zero.
					assert.InDelta(t, 0, got, 1e-7, "n=%d i=%d", n, i)
					continue
				}
				assert.InDelta(t, want[i], got, 1e-7+2e-6*want[i], "n=%d spread=%v i=%d", n, spread, i)
			}
		}
	}
}

func TestSoftmaxMixSumsToWeight(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	logits := make([]float32, 49152)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 4)
	}
	acc := make([]float32, len(logits))
	for _, w := range []float32{0.5, 0.3, 0.2} {
		_, err := SoftmaxMix(acc, logits, w)
		require.NoError(t, err)
	}
	var sum float64
	for _, p := range acc {
		sum += float64(p)
	}
	assert.InDelta(t, 1, sum, 1e-5)
}

func TestSoftmaxMixMaskedEntries(t *testing.T) {
	inf := float32(math.Inf(-1))
	logits := []float32{inf, 0, inf, 0, inf, inf, inf, inf, inf, inf, inf, inf, inf, inf, inf, inf, inf, 0}
	acc := make([]float32, len(logits))
	logZ, err := SoftmaxMix(acc, logits, 1)
	require.NoError(t, err)
	assert.InDelta(t, math.Log(3), logZ, 1e-6)
	for i, v := range logits {
		if v == inf {
			assert.Zero(t, acc[i], "i=%d", i)
		} else {
			assert.InDelta(t, 1.0/3, acc[i], 1e-6, "i=%d", i)
		}
	}
}

func TestSoftmaxMixRejectsBadInput(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	row := func(n, at int, v float32) []float32 {
		r := make([]float32, n)
		r[at] = v
		return r
	}
	allNegInf := make([]float32, 20)
	for i := range allNegInf {
		allNegInf[i] = float32(math.Inf(-1))
	}
	for name, logits := range map[string][]float32{
		"NaN in the vector body": row(64, 13, nan),
		"NaN in the 8-wide loop": row(24, 19, nan),
		"NaN in the scalar tail": row(21, 20, nan),
		"NaN first":              row(5, 0, nan),
		"+Inf":                   row(40, 7, inf),
		"all -Inf":               allNegInf,
	} {
		acc := make([]float32, len(logits))
		_, err := SoftmaxMix(acc, logits, 1)
		assert.Error(t, err, name)
		assert.Equal(t, make([]float32, len(logits)), acc, "%s: acc must be untouched", name)
	}
	_, err := SoftmaxMix(nil, nil, 1)
	assert.Error(t, err)
	_, err = SoftmaxMix(make([]float32, 2), make([]float32, 3), 1)
	assert.Error(t, err)
}

// LogSumExp is the log partition SoftmaxMix returns, bit for bit, and
// refuses what SoftmaxMix refuses.
func TestLogSumExpIsSoftmaxMixPartition(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1, 7, 8, 17, 1000, 151936} {
		logits := make([]float32, n)
		for i := range logits {
			logits[i] = float32(rng.NormFloat64()*6 - 2)
		}
		want, err := SoftmaxMix(make([]float32, n), logits, 0.5)
		require.NoError(t, err)
		got, err := LogSumExp(logits)
		require.NoError(t, err)
		assert.Equal(t, want, got, "n=%d", n)
		_, ref := reference(logits, 1)
		assert.InDelta(t, ref, got, 1e-5*math.Abs(ref)+1e-5, "n=%d", n)
	}
	for name, logits := range map[string][]float32{
		"NaN":      {0, float32(math.NaN()), 1},
		"+Inf":     {0, float32(math.Inf(1))},
		"all -Inf": {float32(math.Inf(-1)), float32(math.Inf(-1))},
		"empty":    nil,
	} {
		_, err := LogSumExp(logits)
		assert.Error(t, err, name)
	}
}

func BenchmarkSoftmaxMix(b *testing.B) {
	logits := make([]float32, 49152)
	for i := range logits {
		logits[i] = float32(i%97) / 7
	}
	acc := make([]float32, len(logits))
	for b.Loop() {
		if _, err := SoftmaxMix(acc, logits, 0.5); err != nil {
			b.Fatal(err)
		}
	}
}
