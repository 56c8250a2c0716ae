package session

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/codec"
)

// TestDraftsAndVerdictsCrossTheWire: what the profiler needs of a draft
// and a verdict survives the wire form.
func TestDraftsAndVerdictsCrossTheWire(t *testing.T) {
	mine, err := aggregator.NewProposer(aggregator.Cloud, 1, true, 1)
	require.NoError(t, err)
	theirs, err := aggregator.NewProposer(aggregator.Device, 1, true, 1)
	require.NoError(t, err)
	peer, err := theirs.Propose([]float32{0.1, 0.8, 0.1}, 4, 2, 0)
	require.NoError(t, err)
	d, err := mine.ProposeBeside([]float32{0.6, 0.3, 0.1}, 4, 1, 0, &peer)
	require.NoError(t, err)
	require.True(t, d.Meta.Moved)
	d.Meta.DecodeMicros, d.Meta.Context = 3100, 250

	dec, err := codec.NewDecoder(3)
	require.NoError(t, err)
	back, err := fromDrafts(dec, toDrafts([]aggregator.Draft{d}))
	require.NoError(t, err)
	require.Len(t, back, 1)
	assert.Equal(t, d.Meta, back[0].Meta)
	assert.Equal(t, d.Token(), back[0].Token())
	assert.Equal(t, d.Dist(), back[0].Dist())

	v := aggregator.Verdict{
		Step: 4, Target: 1, Accept: [2]bool{true, true}, Epoch: [2]uint32{2, 1}, NextEpoch: [2]uint32{2, 1},
		Expected: [2]float64{1, 1}, Moved: [2]bool{false, true},
	}
	assert.Equal(t, v, fromVerdict(toVerdict(v)))
	v.Accept, v.NextEpoch, v.Hedged = [2]bool{true, false}, [2]uint32{2, 2}, [2]bool{false, true}
	assert.Equal(t, v, fromVerdict(toVerdict(v)))
}

// TestHedgesCrossTheWire: a hedge and a branch's draft keep what makes
// them one, and a draft without a hedge does not gain one (token 0 is a
// token).
func TestHedgesCrossTheWire(t *testing.T) {
	p, err := aggregator.NewProposer(aggregator.Cloud, 1, true, 1)
	require.NoError(t, err)
	main, err := p.Propose([]float32{0.3, 0.6, 0.1}, 4, 1, 0)
	require.NoError(t, err)
	hedged, err := main.WithHedge(0)
	require.NoError(t, err)
	branch, err := p.ProposeBranch([]float32{0.1, 0.1, 0.8}, 5, 1, 0, 4)
	require.NoError(t, err)

	dec, err := codec.NewDecoder(3)
	require.NoError(t, err)
	back, err := fromDrafts(dec, toDrafts([]aggregator.Draft{main, hedged, branch}))
	require.NoError(t, err)
	require.Len(t, back, 3)
	_, ok := back[0].Hedge()
	assert.False(t, ok)
	tok, ok := back[1].Hedge()
	assert.True(t, ok)
	assert.Equal(t, int32(0), tok)
	fork, ok := back[2].Fork()
	assert.True(t, ok)
	assert.Equal(t, uint64(4), fork)
	assert.Equal(t, int32(2), back[2].Token())
}
