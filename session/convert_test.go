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
}
