package retrieval

import (
	"math/rand/v2"
	"testing"

	"github.com/coder/hnsw"
)

// Dense search over an index the size of the demo corpora: 36k passages of
// SmolLM2's 576 dimensions.
func BenchmarkDenseSearch(b *testing.B) {
	const n, dims, k = 36_000, 576, 8
	rng := rand.New(rand.NewPCG(1, 2))
	vec := func() []float32 {
		v := make([]float32, dims)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		u, _ := unit(v)
		return u
	}
	vecs := make(map[uint64][]float32, n)
	for i := range n {
		vecs[uint64(i+1)] = vec()
	}
	q := vec()
	b.Run("exact", func(b *testing.B) {
		for b.Loop() {
			exactSearch(vecs, q, k)
		}
	})
	b.Run("hnsw", func(b *testing.B) {
		g := newGraph()
		for id, v := range vecs {
			if id > 5000 { // building 36k nodes takes minutes
				continue
			}
			g.Add(hnsw.MakeNode(id, v))
		}
		live := func(uint64) bool { return true }
		b.ResetTimer()
		for b.Loop() {
			graphSearch(g, q, k, 0, live)
		}
	})
}
