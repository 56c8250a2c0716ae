package decoder_test

import (
	"context"
	"log/slog"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/testmodel"
	"github.com/dragon-rag/dragon/promptset"
	"github.com/dragon-rag/dragon/spec"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	os.Exit(m.Run())
}

// TestRealSpeculativeGreedyIsPlainGreedy: with the real model, speculative
// decoding must give plain greedy output token for token, over prompts of
// both corpora with 1 and 4 passages. A mismatch is reported with the
// prompt, never tolerated.
func TestRealSpeculativeGreedyIsPlainGreedy(t *testing.T) {
	m, err := llamacpp.Load(testmodel.Path(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	ctx := context.Background()
	for _, n := range []int{1, 4} {
		prompts, err := promptset.BuiltIn(testmodel.CorpusDir(t), 20, n)
		require.NoError(t, err)
		plain, err := decoder.New(m, decoder.Options{MaxPassages: 4, CtxPerSeq: 512})
		require.NoError(t, err)
		fast, err := decoder.New(m, decoder.Options{MaxPassages: 4, CtxPerSeq: 512, Spec: spec.DefaultOptions()})
		require.NoError(t, err)
		var accepted uint64
		for i, p := range prompts {
			req := decoder.Request{Query: p.Query, Passages: p.Passages, MaxTokens: 32}
			a, err := plain.Generate(ctx, req, nil)
			require.NoError(t, err)
			b, err := fast.Generate(ctx, req, nil)
			require.NoError(t, err)
			if !assert.Equal(t, a.Tokens, b.Tokens, "prompt %d (%s, %d passages): %q", i, p.Corpus, n, p.Query) {
				t.Logf("plain: %q\nspec:  %q", a.Text, b.Text)
			}
			accepted += b.Spec.AcceptedTokens
		}
		t.Logf("%d passages: %d draft tokens accepted over %d prompts", n, accepted, len(prompts))
		assert.Positive(t, accepted, "speculation happened")
		plain.Close()
		fast.Close()
	}
}
