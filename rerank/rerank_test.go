package rerank

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/bertonnx"
	"github.com/dragon-rag/dragon/internal/testmodel"
)

// berlin is the example the cross-encoder's model card scores, with four
// more passages of our own.
var berlin = struct {
	query    string
	passages []string
}{
	"how many people live in berlin?",
	[]string{
		"Berlin has a population of 3,520,031 registered inhabitants in an area of 891.82 square kilometers.",
		"New York City is famous for the Metropolitan Museum of Art.",
		"Berlin is the capital and largest city of Germany, both by area and by population.",
		"The population of Berlin grew quickly in the 19th century.",
		"Paris is the capital of France.",
		"Bananas are rich in potassium.",
	},
}

func loadReranker(t *testing.T) (*Reranker, *llamacpp.Model) {
	t.Helper()
	m, err := llamacpp.Load(testmodel.RerankPath(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	r, err := New(m, Options{Threads: 1})
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	return r, m
}

// TestScoresMatchTheONNXReference scores the pairs through llama.cpp and
// with bertonnx's float64 forward pass of the ONNX file's dequantized
// weights, which reads the passage's segment from the real segment
// embeddings: they agree within 0.02 logits, and the reference with every
// token in segment 0 would not.
func TestScoresMatchTheONNXReference(t *testing.T) {
	r, m := loadReranker(t)
	got, err := r.Score(context.Background(), berlin.query, berlin.passages)
	require.NoError(t, err)

	ref, err := bertonnx.ReadFile(testmodel.RerankONNX(t))
	require.NoError(t, err)
	assert.Equal(t, 12, ref.Layers)
	assert.Equal(t, 12, ref.Heads)
	q, err := m.Tokenize(berlin.query, true, false)
	require.NoError(t, err)
	var worstFlat float64
	checked := []int{0, 1, 2, 3, 4, 5}
	if raceDetector {
		checked = []int{0, 3} // the float64 reference runs 10× slower
	}
	for _, i := range checked {
		p := berlin.passages[i]
		pt, err := m.Tokenize(p, false, false)
		require.NoError(t, err)
		var ids, segs []int
		for _, tk := range q {
			ids, segs = append(ids, int(tk)), append(segs, 0)
		}
		for _, tk := range append(pt, r.sep) {
			ids, segs = append(ids, int(tk)), append(segs, 1)
		}
		want, err := ref.Reference(ids, segs)
		require.NoError(t, err)
		t.Logf("passage %d: llama.cpp %.3f, reference %.3f", i, got[i], want)
		assert.InDelta(t, want, float64(got[i]), 0.02, "passage %d", i)
		if i == 2 || i == 3 {
			flat, err := ref.Reference(ids, make([]int, len(ids)))
			require.NoError(t, err)
			t.Logf("passage %d with every token in segment 0: %.3f", i, flat)
			worstFlat = max(worstFlat, abs(flat-want))
		}
	}
	assert.Greater(t, worstFlat, 0.5, "segment ids must change some score for this test to check them")
	// The relevant passages first, the model card's order.
	assert.Greater(t, got[0], got[3])
	assert.Greater(t, got[3], got[4])
	assert.Greater(t, got[2], got[1])
	assert.Greater(t, got[0], float32(5))
	assert.Less(t, got[5], float32(-5))
}

func abs(x float64) float64 { return max(x, -x) }

func TestRepeatedPairsComeFromTheCache(t *testing.T) {
	r, _ := loadReranker(t)
	ctx := context.Background()
	first, err := r.Score(ctx, berlin.query, berlin.passages[:3])
	require.NoError(t, err)
	assert.Equal(t, 3, r.order.Len())
	again, err := r.Score(ctx, berlin.query, berlin.passages[:3])
	require.NoError(t, err)
	assert.Equal(t, first, again)
	assert.Equal(t, 3, r.order.Len(), "nothing new scored")
	other, err := r.Score(ctx, "what is the capital of france?", berlin.passages[:3])
	require.NoError(t, err)
	assert.Equal(t, 6, r.order.Len())
	assert.NotEqual(t, first, other)

	r.cacheSize = 4
	_, err = r.Score(ctx, "bananas", berlin.passages[5:])
	require.NoError(t, err)
	assert.Equal(t, 4, r.order.Len(), "the least recently used go")
}

func TestLongPairsAreCutToTheModel(t *testing.T) {
	r, _ := loadReranker(t)
	long := strings.Repeat("Berlin is a city with many people living in it. ", 200)
	s, err := r.Score(context.Background(), strings.Repeat("how many people live in berlin? ", 100), []string{long})
	require.NoError(t, err)
	assert.Greater(t, s[0], float32(0), "a cut pair still scores as relevant")
}

func TestNewRefusesModelsThatDoNotRank(t *testing.T) {
	m, err := llamacpp.Load(testmodel.EmbedPath(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	_, err = New(m, Options{})
	assert.ErrorIs(t, err, ErrNotRanker)
	assert.Contains(t, fmt.Sprint(err), "make rerank-model")
}

func TestScoreStopsWithItsContext(t *testing.T) {
	r, _ := loadReranker(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := r.Score(ctx, berlin.query, berlin.passages[:1])
	assert.ErrorIs(t, err, engine.ErrAborted)
	// The reranker still works afterwards.
	s, err := r.Score(context.Background(), berlin.query, berlin.passages[:1])
	require.NoError(t, err)
	assert.Greater(t, s[0], float32(5))
}

// BenchmarkRepeatedQuestion is what a repeated question's re-ranking of 16
// candidates costs once its pairs are cached.
func BenchmarkRepeatedQuestion(b *testing.B) {
	m, err := llamacpp.Load(testmodel.RerankPath(b), llamacpp.Options{Threads: 1})
	require.NoError(b, err)
	defer m.Close()
	r, err := New(m, Options{Threads: 1})
	require.NoError(b, err)
	defer r.Close()
	var passages []string
	for i := range 16 {
		passages = append(passages, fmt.Sprintf("%s (%d) %s", berlin.passages[i%len(berlin.passages)], i, strings.Repeat("more words of the passage ", 8)))
	}
	ctx := context.Background()
	_, err = r.Score(ctx, berlin.query, passages)
	require.NoError(b, err)
	b.ResetTimer()
	for range b.N {
		if _, err := r.Score(ctx, berlin.query, passages); err != nil {
			b.Fatal(err)
		}
	}
}
