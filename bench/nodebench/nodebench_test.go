package nodebench

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine/fake"
)

func TestNLLDynamic(t *testing.T) {
	m := fake.New(fake.Config{Seed: 5, Vocab: 300})
	d, err := decoder.New(m, decoder.Options{MaxPassages: 2, CtxPerSeq: 256})
	require.NoError(t, err)
	defer d.Close()
	ctx := context.Background()
	prefixes := []string{"the lamp at dusk. ", "tides twice a day. "}
	scores := []float64{1, 0}
	const cont = "the keeper lit the lamp and the tides rose over the harbour wall"
	static, n, err := NLL(ctx, d, prefixes, scores, cont)
	require.NoError(t, err)

	var answers []string
	same := func(_ context.Context, answer string) ([]float64, error) {
		answers = append(answers, answer)
		return scores, nil
	}
	got, n2, err := NLLDynamic(ctx, d, prefixes, scores, cont, 5, same)
	require.NoError(t, err)
	assert.Equal(t, n, n2)
	assert.InDelta(t, static, got, 1e-9, "unchanged scores: the NLL of one pass")
	require.Len(t, answers, (n-1)/5)
	assert.Len(t, answers[0], 5, "the fake's tokens are one byte each")

	flipped := func(context.Context, string) ([]float64, error) { return []float64{0, 3}, nil }
	moved, _, err := NLLDynamic(ctx, d, prefixes, scores, cont, 5, flipped)
	require.NoError(t, err)
	assert.NotEqual(t, static, moved, "new weights from token 5 on")

	_, _, err = NLLDynamic(ctx, d, prefixes, scores, cont, 0, same)
	assert.Error(t, err)
}

// TestNLLPosterior: with posterior weights every token the continuation's
// NLL is that of the mixture of whole sequences, −log Σ_d ω(d) e^{L(d)},
// where L(d) is each prompt's own log-likelihood of the continuation; the
// mixture of tokens (static weights) is another number.
func TestNLLPosterior(t *testing.T) {
	m := fake.New(fake.Config{Seed: 5, Vocab: 300, Order: 1 << 20})
	d, err := decoder.New(m, decoder.Options{MaxPassages: 2, CtxPerSeq: 256})
	require.NoError(t, err)
	defer d.Close()
	ctx := context.Background()
	prefixes := []string{"the lamp at dusk. ", "tides twice a day. "}
	scores := []float64{1, 0}
	const cont = "the keeper lit the lamp"
	var lls []float64
	for i := range prefixes {
		nll, _, err := NLL(ctx, d, prefixes[i:i+1], []float64{0}, cont)
		require.NoError(t, err)
		lls = append(lls, -nll)
	}
	w := []float64{math.Exp(1) / (math.Exp(1) + 1), 1 / (math.Exp(1) + 1)}
	want := -math.Log(w[0]*math.Exp(lls[0]) + w[1]*math.Exp(lls[1]))
	got, _, err := NLLPosterior(ctx, d, prefixes, scores, cont, 1)
	require.NoError(t, err)
	assert.InDelta(t, want, got, 1e-3*want)
	static, _, err := NLL(ctx, d, prefixes, scores, cont)
	require.NoError(t, err)
	assert.Greater(t, math.Abs(static-want), 1e-2, "the mixture of tokens is another model")
	_, _, err = NLLPosterior(ctx, d, prefixes, scores, cont, 0)
	assert.Error(t, err)
}
