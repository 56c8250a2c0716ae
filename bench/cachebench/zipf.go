package cachebench

import (
	"errors"
	"math"
	"math/rand/v2"
	"sort"
)

// Zipf draws ranks 1..n with probability proportional to 1/k^s, by the
// inverse of the cumulative distribution over the ranks: any s ≥ 0,
// s = 1 included (math/rand's Zipf needs s > 1, and math/rand/v2 has
// none).
type Zipf struct {
	cdf []float64 // cdf[k-1] = P(rank ≤ k); the last is 1
	rng *rand.Rand
}

// NewZipf is a sampler of ranks 1..n drawing from rng.
func NewZipf(rng *rand.Rand, s float64, n int) (*Zipf, error) {
	if n < 1 || s < 0 || math.IsNaN(s) || math.IsInf(s, 0) || rng == nil {
		return nil, errors.New("cachebench: Zipf needs n ≥ 1, a finite s ≥ 0 and a source")
	}
	cdf := make([]float64, n)
	sum := 0.0
	for k := 1; k <= n; k++ {
		sum += math.Pow(float64(k), -s)
		cdf[k-1] = sum
	}
	for i := range cdf {
		cdf[i] /= sum
	}
	cdf[n-1] = 1
	return &Zipf{cdf: cdf, rng: rng}, nil
}

// Prob is the probability of rank k (1-based).
func (z *Zipf) Prob(k int) float64 {
	if k < 1 || k > len(z.cdf) {
		return 0
	}
	if k == 1 {
		return z.cdf[0]
	}
	return z.cdf[k-1] - z.cdf[k-2]
}

// Rank draws one rank, 1..n.
func (z *Zipf) Rank() int {
	u := z.rng.Float64() // [0, 1)
	return sort.SearchFloat64s(z.cdf, math.Nextafter(u, 2)) + 1
}

// NewRand is the deterministic source every draw of the benchmark uses.
func NewRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}
