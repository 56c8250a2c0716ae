package retrieval

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/testmodel"
)

var minilmTexts = []string{
	"A man is eating food.",
	"A man is eating a piece of bread.",
	"The café's naïve résumé: isn't it 12,345 unbelievably (over-)priced?!",
	"Mr. President, Mr. Speaker, Members of Congress: the state of our Union is strong.",
	"From: ken.lay@enron.com\nSubject: California power prices\n\nThe ISO expects rolling blackouts.",
	// Longer than the model's 256 tokens: truncated, [SEP] kept.
	strings.Repeat("Electricity deregulation raised wholesale prices across the western grid. ", 30),
}

// The GGUF that `make embed-model` converts, run through llama.cpp, gives
// the vectors of an independent float32 forward pass of the original
// checkpoint (bertref_test.go), from the same tokens: closely as converted
// (f16 matrices), within quantization as run (Q8_0).
func TestMiniLMMatchesReference(t *testing.T) {
	ref, err := loadRefBERT(testmodel.EmbedCheckpoint(t))
	require.NoError(t, err)
	// The reference's vectors, once for both files (a plain forward pass is
	// slow under the race detector).
	refVecs := make([][]float32, len(minilmTexts))
	for i, text := range minilmTexts {
		refVecs[i] = ref.embed(ref.tokenize(text))
	}
	for _, tc := range []struct {
		name            string
		path            string
		minCos, maxDiff float64
	}{
		{"f16", testmodel.EmbedF16Path(t), 0.9999, 1e-3},
		{"q8_0", testmodel.EmbedPath(t), 0.999, 1e-2},
	} {
		t.Run(tc.name, func(t *testing.T) { checkAgainstReference(t, ref, refVecs, tc.path, tc.minCos, tc.maxDiff) })
	}
}

// checkAgainstReference embeds minilmTexts with the GGUF at path and
// compares them with refVecs, the reference's vectors of the same texts.
func checkAgainstReference(t *testing.T, ref *refBERT, refVecs [][]float32, path string, minCos, maxAbs float64) {
	m, err := llamacpp.Load(path, llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	info := m.Info()
	require.Equal(t, "mean", info.Pooling)
	require.True(t, info.Bidirectional)
	require.Equal(t, 384, info.EmbedDim)

	emb := NewEngineEmbedder(m, EngineEmbedderOptions{Threads: 1})
	defer emb.Close()
	got, err := emb.Embed(t.Context(), minilmTexts)
	require.NoError(t, err)
	for i, text := range minilmTexts {
		want := ref.tokenize(text)
		toks, err := emb.tokenize(text)
		require.NoError(t, err)
		ids := make([]int, len(toks))
		for j, tk := range toks {
			ids[j] = int(tk)
		}
		require.Equal(t, want, ids, "tokens of %q", text)

		wv := refVecs[i]
		cos := dot(got[i], wv)
		maxDiff := 0.0
		for d := range wv {
			maxDiff = max(maxDiff, float64(abs32(got[i][d]-wv[d])))
		}
		t.Logf("text %d: %d tokens, cosine to reference %.6f, max |diff| %.2e", i, len(ids), cos, maxDiff)
		assert.Greater(t, float64(cos), minCos, "text %d", i)
		assert.Less(t, maxDiff, maxAbs, "text %d", i)
	}
	// A control: the reference tells texts apart by far more than that.
	assert.Less(t, dot(got[0], refVecs[3]), float32(0.5))
}

// Texts batched together embed as they do alone, within rounding (the
// masked attention sums over the whole batch in another order): each
// sequence attends only to its own tokens, though attention is
// bidirectional. On the f16 file: Q8_0's matrix kernels differ by pass
// size (1e-3), which would hide a small leak.
func TestMiniLMBatchedEqualsAlone(t *testing.T) {
	m, err := llamacpp.Load(testmodel.EmbedF16Path(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	emb := NewEngineEmbedder(m, EngineEmbedderOptions{Threads: 1, MaxSeqs: 8})
	defer emb.Close()
	together, err := emb.Embed(t.Context(), minilmTexts[:5])
	require.NoError(t, err)
	for i, text := range minilmTexts[:5] {
		alone, err := emb.Embed(t.Context(), []string{text})
		require.NoError(t, err)
		assert.InDeltaSlice(t, toF64(alone[0]), toF64(together[i]), 1e-4, "text %d", i)
	}

	chat, err := llamacpp.Load(testmodel.Path(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer chat.Close()
	assert.NotEqual(t, emb.Fingerprint(), NewEngineEmbedder(chat, EngineEmbedderOptions{}).Fingerprint())
	assert.Contains(t, emb.Fingerprint(), "model-mean")

	c, err := m.NewContext(engine.ContextOptions{CtxPerSeq: 16, MaxSeqs: 1, Embeddings: true})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.(*llamacpp.Context).SeqState(0)
	assert.ErrorIs(t, err, engine.ErrInvalidInput, "an encoder keeps no KV state")
}

func abs32(x float32) float32 {
	if x < 0 {
		return -x
	}
	return x
}

func toF64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// Embedding throughput of the embedding model at one thread, one text to a
// pass against eight: `go test -run '^$' -bench MiniLM ./retrieval`.
func BenchmarkMiniLMEmbed(b *testing.B) {
	m, err := llamacpp.Load(testmodel.EmbedPath(b), llamacpp.Options{Threads: 1})
	require.NoError(b, err)
	defer m.Close()
	// 32 passages of 48 words (about 64 tokens).
	texts := make([]string, 32)
	for i := range texts {
		words := strings.Fields(strings.Repeat(minilmTexts[i%5]+" ", 48))
		texts[i] = strings.Join(words[:48], " ")
	}
	for _, seqs := range []int{1, 8} {
		b.Run(fmt.Sprintf("seqs=%d", seqs), func(b *testing.B) {
			e := NewEngineEmbedder(m, EngineEmbedderOptions{Threads: 1, MaxSeqs: seqs})
			defer e.Close()
			_, err := e.Embed(b.Context(), texts[:2])
			require.NoError(b, err)
			for b.Loop() {
				_, err := e.Embed(b.Context(), texts)
				require.NoError(b, err)
			}
			b.ReportMetric(float64(len(texts)*b.N)/b.Elapsed().Seconds(), "passages/s")
		})
	}
}
