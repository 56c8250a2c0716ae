package retrieval

import (
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func randomUnitVecs(t testing.TB, n, dims int, seed uint64) map[uint64][]float32 {
	rng := rand.New(rand.NewPCG(seed, 7))
	vecs := make(map[uint64][]float32, n)
	for i := range n {
		v := make([]float32, dims)
		for j := range v {
			v[j] = float32(rng.NormFloat64())
		}
		u, err := unit(v)
		require.NoError(t, err)
		vecs[uint64(i+1)] = u
	}
	return vecs
}

// bruteForce is the n best of vecs by cosine to q, ties by id.
func bruteForce(vecs map[uint64][]float32, q []float32, n int) []scored {
	var all []scored
	for id, v := range vecs {
		all = append(all, scored{id, float64(dot(q, v))})
	}
	return topScored(all, n)
}

func TestVectorStoreScansExactly(t *testing.T) {
	vecs := randomUnitVecs(t, 500, 16, 1)
	vecs[1000] = vecs[7] // a tie: broken by id
	s := storeOf(t, filepath.Join(t.TempDir(), vectorsFile), vecs)
	// Some in the file, some only in memory, some removed.
	more := randomUnitVecs(t, 40, 16, 9)
	for id, v := range more {
		s.set(id+2000, v)
		vecs[id+2000] = v
	}
	for _, id := range []uint64{3, 2010} {
		s.remove(id)
		delete(vecs, id)
	}
	q := vecs[7]
	for _, n := range []int{1, 2, 8, 50, 600} {
		got, err := s.search(q, n, nil, exactOnly)
		require.NoError(t, err)
		assert.Equal(t, bruteForce(vecs, q, n), got, "n=%d", n)
	}
	got, err := s.search(q, 2, nil, exactOnly)
	require.NoError(t, err)
	assert.Equal(t, []uint64{7, 1000}, []uint64{got[0].id, got[1].id})

	odd := func(id uint64) bool { return id%2 == 1 }
	got, err = s.search(q, 5, odd, exactOnly)
	require.NoError(t, err)
	assert.Equal(t, bruteForce(maps.Collect(func(yield func(uint64, []float32) bool) {
		for id, v := range vecs {
			if odd(id) && !yield(id, v) {
				return
			}
		}
	}), q, 5), got)
}

// clusteredVecs are n unit vectors around 100 random directions, as
// embeddings of texts on a hundred subjects would be: the nearest
// neighbours of one are its subject's, not chance's.
func clusteredVecs(t *testing.T, n, dims int) map[uint64][]float32 {
	centers := randomUnitVecs(t, 100, dims, 3)
	noise := randomUnitVecs(t, n, dims, 4)
	vecs := make(map[uint64][]float32, n)
	for id, e := range noise {
		c := centers[id%100+1]
		v := make([]float32, dims)
		for j := range v {
			v[j] = c[j] + e[j]/2
		}
		u, err := unit(v)
		require.NoError(t, err)
		vecs[id] = u
	}
	return vecs
}

// TestVectorStoreCodes checks search through the codes: a stored vector
// finds itself, removed ones and those the filter keeps out never show,
// what is returned carries its exact cosine, and the top 10 of a query
// near a stored vector are nearly all the exact top 10.
func TestVectorStoreCodes(t *testing.T) {
	const n, dims = 5000, 64
	vecs := clusteredVecs(t, n, dims)
	s := storeOf(t, filepath.Join(t.TempDir(), vectorsFile), vecs)
	for id := uint64(1); id <= 100; id++ {
		s.remove(id)
		delete(vecs, id)
	}
	rng := rand.New(rand.NewPCG(5, 5))
	var found, want int
	for id := uint64(101); id <= 300; id++ {
		got, err := s.search(vecs[id], 3, nil, 0)
		require.NoError(t, err)
		require.Len(t, got, 3)
		assert.Equal(t, id, got[0].id)
		assert.InDelta(t, 1, got[0].score, 1e-5)
		for _, h := range got {
			assert.Greater(t, h.id, uint64(100), "a removed vector")
			assert.InDelta(t, dot(vecs[id], vecs[h.id]), h.score, 1e-6)
		}

		even := func(x uint64) bool { return x%2 == 0 }
		got, err = s.search(vecs[id], 5, even, 0)
		require.NoError(t, err)
		for _, h := range got {
			assert.True(t, even(h.id))
		}

		// A query between a stored vector and a random direction.
		q := make([]float32, dims)
		for j := range q {
			q[j] = vecs[id][j] + float32(rng.NormFloat64())/8
		}
		q, err = unit(q)
		require.NoError(t, err)
		got, err = s.search(q, 10, nil, 0)
		require.NoError(t, err)
		exact := bruteForce(vecs, q, 10)
		for _, e := range exact {
			want++
			if slices.ContainsFunc(got, func(g scored) bool { return g.id == e.id }) {
				found++
			}
		}
	}
	recall := float64(found) / float64(want)
	t.Logf("recall@10 through the codes: %.3f", recall)
	assert.GreaterOrEqual(t, recall, 0.95)
}

func TestUnitRefusesZero(t *testing.T) {
	_, err := unit(make([]float32, 4))
	assert.Error(t, err, "the zero vector has no direction")
}
