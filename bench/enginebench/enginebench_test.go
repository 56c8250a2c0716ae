package enginebench

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
)

func TestRunReportsEveryFigure(t *testing.T) {
	res, err := Run(context.Background(), fake.New(fake.Config{}), Options{CtxTokens: 32, Reps: 2})
	require.NoError(t, err)
	for _, k := range VerifySizes {
		assert.Contains(t, res.VerifyMS, itoa(k))
		assert.Contains(t, res.PromptMS, itoa(k))
	}
	for _, k := range MultiseqSizes {
		assert.Contains(t, res.MultiseqMS, itoa(k))
	}
	assert.Positive(t, res.PrefillTokS)
	assert.Equal(t, res.VerifyMS["1"], res.DecodeMS)
}

func TestRepeat(t *testing.T) {
	m := fake.New(fake.Config{})
	ms, err := Repeat(context.Background(), m, Options{CtxTokens: 32}, 4, 2, 5*time.Millisecond)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, ms, 0.0)

	for _, rows := range []int{0, -1, 33} {
		_, err := Repeat(context.Background(), m, Options{CtxTokens: 32}, rows, 1, time.Millisecond)
		assert.ErrorIs(t, err, engine.ErrInvalidInput, "rows %d", rows)
	}
	_, err = Repeat(context.Background(), m, Options{CtxTokens: 32}, 1, 0, time.Millisecond)
	assert.ErrorIs(t, err, engine.ErrInvalidInput, "no sequences")
}

func itoa(k int) string { return strconv.Itoa(k) }
