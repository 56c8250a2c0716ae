package retrieval

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
)

// RandomEmbedder gives every text a pseudo-random unit vector seeded by the
// text itself: the same text, the same vector. Its cosines mean nothing;
// it stands in for an embedding model where embedding is not what is
// measured (dense search latency and recall against exact search over
// synthetic corpora too large to embed here).
type RandomEmbedder struct{ Dims int }

// Fingerprint implements Fingerprinter.
func (e RandomEmbedder) Fingerprint() string {
	return fmt.Sprintf("random-unit-synthetic/v1|dim=%d", e.Dims)
}

// Embed implements Embedder.
func (e RandomEmbedder) Embed(_ context.Context, texts []string) ([][]float32, error) {
	if e.Dims <= 0 {
		return nil, fmt.Errorf("retrieval: random embedder needs Dims > 0")
	}
	out := make([][]float32, len(texts))
	for i, t := range texts {
		h := fnv.New64a()
		h.Write([]byte(t))
		rng := rand.New(rand.NewPCG(h.Sum64(), 0x2545f4914f6cdd1d))
		v := make([]float32, e.Dims)
		var n float64
		for d := range v {
			x := rng.NormFloat64()
			v[d] = float32(x)
			n += x * x
		}
		n = math.Sqrt(n)
		for d := range v {
			v[d] = float32(float64(v[d]) / n)
		}
		out[i] = v
	}
	return out, nil
}
