package retrieval

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRandomEmbedder(t *testing.T) {
	e := RandomEmbedder{Dims: 384}
	vs, err := e.Embed(t.Context(), []string{"a", "b", "a"})
	require.NoError(t, err)
	for _, v := range vs {
		require.Len(t, v, 384)
		var n float64
		for _, x := range v {
			n += float64(x) * float64(x)
		}
		assert.InDelta(t, 1, math.Sqrt(n), 1e-5)
	}
	assert.Equal(t, vs[0], vs[2], "the same text, the same vector")
	assert.Less(t, math.Abs(float64(dot(vs[0], vs[1]))), 0.25, "unrelated texts are near orthogonal")
	assert.Contains(t, e.Fingerprint(), "synthetic")
	_, err = RandomEmbedder{}.Embed(t.Context(), []string{"a"})
	assert.Error(t, err)
}
