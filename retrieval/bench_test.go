package retrieval

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
)

// Dense search over MiniLM's 384 dimensions at about one and ten times
// make run's mailbox: every vector scored from the file, against the
// codes and a rescoring of the nearest.
func BenchmarkDenseSearch(b *testing.B) {
	const dims, k = 384, 8
	rng := rand.New(rand.NewPCG(1, 2))
	vec := func() []float32 {
		v := make([]float32, dims)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		u, _ := unit(v)
		return u
	}
	for _, n := range []int{36_000, 360_000} {
		s := newVectorStore(dims)
		for i := range n {
			s.set(uint64(i+1), vec())
		}
		s, err := s.write(filepath.Join(b.TempDir(), vectorsFile))
		if err != nil {
			b.Fatal(err)
		}
		q := vec()
		b.Run(fmt.Sprintf("exact/%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := s.search(q, k, nil, exactOnly); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("codes/%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := s.search(q, k, nil, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
		s.close()
	}
}
