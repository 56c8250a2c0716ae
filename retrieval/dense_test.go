package retrieval

import (
	"math/rand/v2"
	"testing"

	"github.com/coder/hnsw"
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

func TestExactSearchIsTopOfAll(t *testing.T) {
	vecs := randomUnitVecs(t, 500, 16, 1)
	vecs[1000] = vecs[7] // a tie: broken by id
	q := vecs[7]
	var all []scored
	for id, v := range vecs {
		all = append(all, scored{id, float64(dot(q, v))})
	}
	want := topScored(all, len(all))
	for _, n := range []int{1, 2, 8, 50, 600} {
		got := exactSearch(vecs, q, n)
		assert.Equal(t, want[:min(n, len(want))], got, "n=%d", n)
	}
	assert.Equal(t, uint64(7), exactSearch(vecs, q, 2)[0].id)
	assert.Equal(t, uint64(1000), exactSearch(vecs, q, 2)[1].id)
}

func TestGraphSearchSkipsDeadAndFindsSelf(t *testing.T) {
	vecs := randomUnitVecs(t, 300, 16, 2)
	g := rebuildGraph(vecs)
	require.Equal(t, 300, g.Len())
	dead := map[uint64]bool{5: true, 6: true}
	live := func(id uint64) bool { return !dead[id] }
	got := graphSearch(g, vecs[9], 5, len(dead), live)
	require.Len(t, got, 5)
	assert.Equal(t, uint64(9), got[0].id)
	assert.InDelta(t, 1, got[0].score, 1e-5)
	for _, s := range got {
		assert.False(t, dead[s.id])
	}
	assert.Empty(t, graphSearch(hnsw.NewGraph[uint64](), vecs[9], 5, 0, live))
	_, err := unit(make([]float32, 4))
	assert.Error(t, err, "the zero vector has no direction")
}
