package decoder

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
	"github.com/dragon-rag/dragon/specdec"
)

func TestProfileVerify(t *testing.T) {
	m := fake.New(fake.Config{Seed: 1, Vocab: 300, CallLatency: time.Millisecond, Latency: 500 * time.Microsecond})
	c, err := m.NewContext(engine.ContextOptions{CtxPerSeq: 256, MaxSeqs: 2, BatchSize: 128})
	require.NoError(t, err)
	defer c.Close()

	table, err := ProfileVerify(context.Background(), c, 20, 2)
	require.NoError(t, err)
	assert.Zero(t, c.SeqLen(0), "sequence 0 is left empty")
	// The fake sleeps 1 ms per call and 0.5 ms per row: 16 rows cost well
	// over twice one row (sleeps only ever run long, so no upper bound).
	one, sixteen := table.At(1), table.At(16)
	assert.GreaterOrEqual(t, one, 1.5)
	assert.Greater(t, sixteen, 2*one)

	for _, tc := range []struct{ rows, reps int }{{0, 2}, {8, 0}} {
		_, err := ProfileVerify(context.Background(), c, tc.rows, tc.reps)
		assert.ErrorIs(t, err, engine.ErrInvalidInput, "rows %d reps %d", tc.rows, tc.reps)
	}
	// A small context is profiled as far as it has room.
	small, err := m.NewContext(engine.ContextOptions{CtxPerSeq: 16, MaxSeqs: 1})
	require.NoError(t, err)
	defer small.Close()
	table, err = ProfileVerify(context.Background(), small, 64, 1)
	require.NoError(t, err)
	assert.Greater(t, table.At(8), table.At(1))
	assert.Zero(t, small.SeqLen(0))
}

func TestNewProfilesOnlyForTheCostModel(t *testing.T) {
	m := fake.New(fake.Config{Seed: 1, Vocab: 300})
	for _, tc := range []struct {
		name     string
		opts     Options
		measured bool
	}{
		{"plain", Options{}, false},
		{"cost model", Options{Spec: specdec.DefaultOptions()}, true},
		{"every draft verified", Options{Spec: specdec.DefaultOptions(), NoCostModel: true}, false},
		{"cost model, small context", Options{Spec: specdec.DefaultOptions(), CtxPerSeq: 24}, true},
	} {
		d, err := New(m, tc.opts)
		require.NoError(t, err, tc.name)
		// An unmeasured table answers in relative units: one row costs 1.
		assert.Equal(t, tc.measured, d.cost.Verify.At(1) != 1, tc.name)
		d.Close()
	}
}

// TestReserveRunsTheWidestVerification: Reserve's pass holds as many rows
// as a verification may (a logits row each), capped by the batch, and
// leaves nothing in the context.
func TestReserveRunsTheWidestVerification(t *testing.T) {
	m := fake.New(fake.Config{Seed: 1, Vocab: 300})
	trees := specdec.DefaultOptions()
	trees.TreeBudget = 16
	for _, tc := range []struct {
		name string
		opts Options
		rows int
	}{
		{"plain, eight passages (the default)", Options{}, 8},
		{"linear", Options{Spec: specdec.DefaultOptions(), NoCostModel: true, MaxPassages: 1}, 9},
		{"trees, two passages", Options{Spec: trees, NoCostModel: true, MaxPassages: 2}, 34},
		{"capped by the batch", Options{Spec: trees, NoCostModel: true, MaxPassages: 2, BatchSize: 20}, 20},
	} {
		d, err := New(m, tc.opts)
		require.NoError(t, err, tc.name)
		require.NoError(t, d.Reserve(context.Background()), tc.name)
		_, err = d.ectx.Logits(tc.rows-1, nil)
		require.NoError(t, err, tc.name)
		_, err = d.ectx.Logits(tc.rows, nil)
		require.Error(t, err, tc.name)
		assert.Zero(t, d.ectx.SeqLen(0), tc.name)
		d.Close()
	}
}
