package bertonnx_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/bertonnx"
)

// tinyModel is a random two-layer cross-encoder, small enough that its
// GGUF is written and scored in milliseconds.
func tinyModel(seed uint64) (*bertonnx.Model, bertonnx.Vocabulary) {
	r := rand.New(rand.NewPCG(seed, 1))
	m := &bertonnx.Model{Vocab: 12, Hidden: 8, Layers: 2, Heads: 2, FF: 16, MaxPos: 16, TypeVocab: 2, Labels: 1, Eps: 1e-12, W: map[string][]float32{}}
	fill := func(name string, n int, scale float64, offset float32) {
		w := make([]float32, n)
		for i := range w {
			w[i] = float32(r.NormFloat64()*scale) + offset
		}
		m.W[name] = w
	}
	h := m.Hidden
	fill(bertonnx.WordEmbeddings, m.Vocab*h, 1, 0)
	fill(bertonnx.TypeEmbeddings, 2*h, 1, 0)
	fill(bertonnx.PosEmbeddings, m.MaxPos*h, 0.5, 0)
	norm := func(name string) {
		fill(name+".weight", h, 0.2, 1)
		fill(name+".bias", h, 0.2, 0)
	}
	linear := func(name string, in, out int) {
		fill(name+".weight", in*out, 0.5, 0)
		fill(name+".bias", out, 0.2, 0)
	}
	norm(bertonnx.EmbeddingsNorm)
	for l := range m.Layers {
		p := bertonnx.Layer(l)
		linear(p+bertonnx.Query, h, h)
		linear(p+bertonnx.Key, h, h)
		linear(p+bertonnx.Value, h, h)
		linear(p+bertonnx.AttnOut, h, h)
		norm(p + bertonnx.AttnOutNorm)
		linear(p+bertonnx.Intermediate, h, m.FF)
		linear(p+bertonnx.Output, m.FF, h)
		norm(p + bertonnx.OutputNorm)
	}
	linear(bertonnx.Pooler, h, h)
	linear(bertonnx.Classifier, h, 1)
	v := bertonnx.Vocabulary{
		Tokens:  []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "city", "##s", "berlin", "people", "live", "how"},
		Special: map[string]bool{"[PAD]": true, "[UNK]": true, "[CLS]": true, "[SEP]": true, "[MASK]": true},
		Pad:     0, Unknown: 1, CLS: 2, SEP: 3, Mask: 4,
	}
	return m, v
}

// TestConvertedFileScoresAsTheReference writes a random cross-encoder as
// GGUF and checks that llama.cpp's rank-pooled score of each (query,
// passage) pair, the passage's ids moved to the segment-1 copy of the
// vocabulary, is the float64 reference's with real segment embeddings, and
// not the score with every token in segment 0.
func TestConvertedFileScoresAsTheReference(t *testing.T) {
	m, v := tinyModel(7)
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, m.WriteGGUF(f, "tiny", v))
	require.NoError(t, f.Close())

	lm, err := llamacpp.Load(path, llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer lm.Close()
	info := lm.Info()
	assert.Equal(t, "rank", info.Pooling)
	assert.True(t, info.Bidirectional)
	assert.Equal(t, 2*m.Vocab, info.VocabSize)
	c, err := lm.NewContext(engine.ContextOptions{CtxPerSeq: 16, MaxSeqs: 1, Embeddings: true})
	require.NoError(t, err)
	defer c.Close()
	scorer, ok := c.(engine.SeqScorer)
	require.True(t, ok)

	pairs := []struct{ query, passage []int }{
		{[]int{11, 9, 10}, []int{5, 6, 8}},
		{[]int{11, 9, 10}, []int{8, 7, 9, 10, 5}},
		{[]int{8}, []int{6, 7}},
		{[]int{5, 5, 6}, []int{11}},
	}
	var batch engine.Batch
	for i, p := range pairs {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			ids := append(append(append([]int{v.CLS}, p.query...), v.SEP), append(p.passage, v.SEP)...)
			segs := make([]int, len(ids))
			batch.Reset()
			for pos, id := range ids {
				if pos > len(p.query)+1 {
					segs[pos] = 1
					id += m.SegmentOffset()
				}
				batch.Add(engine.Token(id), pos, true, 0)
			}
			require.NoError(t, c.Decode(context.Background(), &batch))
			got, err := scorer.SeqScore(0)
			require.NoError(t, err)
			require.NoError(t, c.Truncate(0, 0))

			want, err := m.Reference(ids, segs)
			require.NoError(t, err)
			flat, err := m.Reference(ids, make([]int, len(ids)))
			require.NoError(t, err)
			t.Logf("llama.cpp %.4f reference %.4f segment-0 %.4f", got, want, flat)
			// ggml's GELU is a tanh approximation read from an f16 table.
			assert.InDelta(t, want, float64(got), 0.005, "llama.cpp %v, reference %v", got, want)
			assert.Greater(t, abs(flat-want), 0.1, "the segment must matter for this check to mean anything")
		})
	}
}

func abs(x float64) float64 { return max(x, -x) }

func TestWriteGGUFRefusesAMismatchedVocabulary(t *testing.T) {
	m, v := tinyModel(1)
	v.Tokens = v.Tokens[:5]
	assert.ErrorIs(t, m.WriteGGUF(nopWriter{}, "tiny", v), bertonnx.ErrModel)
}

type nopWriter struct{}

func (nopWriter) Write(b []byte) (int, error) { return len(b), nil }
