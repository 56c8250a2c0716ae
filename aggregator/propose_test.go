package aggregator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decide is the verdict a greedy aggregator gives two drafts of step 0.
func decide(t *testing.T, mine, peer Draft) Verdict {
	t.Helper()
	n, err := New(Config{Self: mine.Side(), Aggregator: mine.Side(), Greedy: true})
	require.NoError(t, err)
	_, err = n.Step(RemoteDrafts{Drafts: []Draft{peer}})
	require.NoError(t, err)
	acts, err := n.Step(LocalDrafts{Drafts: []Draft{mine}})
	require.NoError(t, err)
	for _, a := range acts {
		if d, ok := a.(Decided); ok {
			return d.Verdict
		}
	}
	t.Fatal("no step decided")
	return Verdict{}
}

// TestProposeBesideDraftsTheMixtureArgmax: a greedy draft made beside the
// peer's draft of the same step is the token the aggregator decides, so it
// is accepted, and the target is the one blind drafts would have got.
// Sampled drafts ignore the peer.
func TestProposeBesideDraftsTheMixtureArgmax(t *testing.T) {
	own := []float32{0.5, 0.3, 0.1, 0.05, 0.05} // argmax 0
	for _, c := range []struct {
		name   string
		self   Side
		greedy bool
		topP   float64
		peer   []float32
		want   int32 // -1: the side's own draft
		forced bool  // the token was outside the side's top-p set
	}{
		{"device", Device, true, 1, []float32{0.05, 0.9, 0.05, 0, 0}, 1, false},
		{"cloud", Cloud, true, 1, []float32{0.05, 0.9, 0.05, 0, 0}, 1, false},
		{"own argmax wins", Device, true, 1, []float32{0.6, 0.1, 0.1, 0.1, 0.1}, 0, false},
		{"outside the top-p set", Device, true, 0.8, []float32{0, 0, 0, 0.05, 0.95}, 4, true},
		{"sampled", Device, false, 1, []float32{0.05, 0.9, 0.05, 0, 0}, -1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			mine, err := NewProposer(c.self, 1, c.greedy, c.topP)
			require.NoError(t, err)
			theirs, err := NewProposer(c.self.Other(), 1, true, 1)
			require.NoError(t, err)
			peer, err := theirs.Propose(c.peer, 0, 0, 0)
			require.NoError(t, err)
			alone, err := mine.Propose(own, 0, 0, 0)
			require.NoError(t, err)
			d, err := mine.ProposeBeside(own, 0, 0, 0, &peer)
			require.NoError(t, err)
			assert.Equal(t, alone.Token() != d.Token(), d.Meta.Moved)
			if c.want < 0 {
				assert.Equal(t, alone.Token(), d.Token(), "sampled drafts ignore the peer")
				assert.Equal(t, alone.Payload(), d.Payload())
				return
			}
			assert.Equal(t, c.want, d.Token())
			if c.forced {
				assert.Zero(t, alone.Dist().Prob(c.want))
				assert.Positive(t, d.Dist().Prob(c.want), "the token is kept in the distribution sent")
			} else {
				assert.Equal(t, alone.Payload(), d.Payload(), "the distribution sent is the side's own")
			}
			v, blind := decide(t, d, peer), decide(t, alone, peer)
			assert.Equal(t, blind.Target, v.Target, "the step's target does not depend on the draft")
			assert.Equal(t, c.want, v.Target)
			assert.True(t, v.Accepted(c.self))
			assert.Equal(t, d.Meta.Moved, v.Moved[c.self.Index()], "the verdict tells the profiler")
		})
	}
}

func TestProposeBesideRefusesAnotherStepsDraft(t *testing.T) {
	mine, err := NewProposer(Device, 1, true, 1)
	require.NoError(t, err)
	theirs, err := NewProposer(Cloud, 1, true, 1)
	require.NoError(t, err)
	probs := []float32{0.6, 0.4}
	peer, err := theirs.Propose(probs, 2, 0, 0)
	require.NoError(t, err)
	_, err = mine.ProposeBeside(probs, 3, 0, 0, &peer)
	assert.Error(t, err)
	own, err := mine.Propose(probs, 2, 0, 0)
	require.NoError(t, err)
	_, err = mine.ProposeBeside(probs, 2, 0, 0, &own)
	assert.Error(t, err, "a side's own draft is no peer draft")
}
