package aggregator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/codec"
)

// The scripted hedge tests: both sides weigh the same, the device drafts
// one-hot tokens, and the cloud's step-0 draft puts 0.6 on tokA and 0.4 on
// tokB, so a device draft of tokB rejects the cloud's tokA (the mixture
// gives tokB 0.7) and lands on the cloud's hedge of tokB.

func hedgeConfig(self, agg Side) Config {
	return Config{Self: self, Aggregator: agg, Greedy: true, Share: true, Hedges: 2, HedgeDepth: 3, MaxSteps: 100}
}

func newHedgeNode(t *testing.T, self, agg Side) *Node {
	t.Helper()
	n, err := New(hedgeConfig(self, agg))
	require.NoError(t, err)
	return n
}

// draftOf drafts the argmax of probs for side at step, mass 0.
func draftOf(t *testing.T, side Side, step uint64, epoch uint32, probs []float32) Draft {
	t.Helper()
	p, err := NewProposer(side, 1, true, 1)
	require.NoError(t, err)
	d, err := p.Propose(probs, step, epoch, 0)
	require.NoError(t, err)
	return d
}

func eq(t *testing.T, side Side, step uint64, epoch uint32, tok int32) Draft {
	t.Helper()
	return draftOf(t, side, step, epoch, oneHot(tok))
}

// hedgedA is the cloud's draft of tokA at step 0 that hedges tokB.
func hedgedA(t *testing.T) Draft {
	t.Helper()
	probs := make([]float32, vocab)
	probs[tokA], probs[tokB] = 0.6, 0.4
	d := draftOf(t, Cloud, 0, 0, probs)
	require.Equal(t, tokA, d.Token())
	alt, ok := d.RunnerUp()
	require.True(t, ok)
	require.Equal(t, tokB, alt)
	d, err := d.WithHedge(alt)
	require.NoError(t, err)
	return d
}

// branchDraft is the cloud's draft of tok at step on the branch of its
// epoch-0 hedge at step 0.
func branchDraft(t *testing.T, step uint64, tok int32) Draft {
	t.Helper()
	p, err := NewProposer(Cloud, 1, true, 1)
	require.NoError(t, err)
	d, err := p.ProposeBranch(oneHot(tok), step, 0, 0, 0)
	require.NoError(t, err)
	return d
}

func rollbacksOf(acts []Action) []Rollback {
	var rs []Rollback
	for _, a := range acts {
		if r, ok := a.(Rollback); ok {
			rs = append(rs, r)
		}
	}
	return rs
}

// TestRejectionOnAHedgeAdoptsTheBranch: the device aggregates; the
// cloud's rejected draft at step 0 was hedged, so steps 1 and 2 are
// decided on the branch's drafts without the cloud drafting anew, and the
// branch's drafts still arriving count as the new epoch's.
func TestRejectionOnAHedgeAdoptsTheBranch(t *testing.T) {
	n := newHedgeNode(t, Device, Device)
	step(t, n, RemoteDrafts{Drafts: []Draft{hedgedA(t), branchDraft(t, 1, tokC), branchDraft(t, 2, tokC)}})
	vs := verdictsOf(step(t, n, LocalDrafts{Drafts: []Draft{eq(t, Device, 0, 0, tokB), eq(t, Device, 1, 0, tokC), eq(t, Device, 2, 0, tokC)}}))
	require.Len(t, vs, 3, "the branch decides steps 1 and 2 at once")
	assert.Equal(t, tokB, vs[0].Target)
	assert.Equal(t, [2]bool{true, false}, vs[0].Accept)
	assert.Equal(t, [2]bool{false, true}, vs[0].Hedged)
	assert.Equal(t, [2]uint32{0, 1}, vs[0].NextEpoch)
	for _, v := range vs[1:] {
		assert.Equal(t, tokC, v.Target)
		assert.Equal(t, [2]bool{true, true}, v.Accept)
		assert.Equal(t, [2]uint32{0, 1}, v.Epoch, "the branch's drafts are epoch 1's")
	}
	// The rest of the branch, then the cloud's own epoch-1 drafts.
	step(t, n, RemoteDrafts{Drafts: []Draft{branchDraft(t, 3, tokA), mk(t, Cloud, 4, 1, tokA)}})
	vs = verdictsOf(step(t, n, LocalDrafts{Drafts: []Draft{eq(t, Device, 3, 0, tokA), eq(t, Device, 4, 0, tokA)}}))
	require.Len(t, vs, 2)
	assert.Equal(t, [2]bool{true, true}, vs[1].Accept)
	st := n.Stats(Cloud)
	assert.Equal(t, uint64(1), st.Hedges)
	assert.Equal(t, uint64(1), st.HedgeHits)
	assert.Zero(t, st.Stale)
}

// TestHedgeOutcomes: a hedge whose step accepts the main draft dies and
// its branch's later drafts are dropped as stale; an adopted branch whose
// own draft is rejected rolls back as any draft does; a rejection whose
// target is not the hedged token rolls back too.
func TestHedgeOutcomes(t *testing.T) {
	t.Run("unused", func(t *testing.T) {
		n := newHedgeNode(t, Device, Device)
		step(t, n, RemoteDrafts{Drafts: []Draft{hedgedA(t), branchDraft(t, 1, tokC)}})
		vs := verdictsOf(step(t, n, LocalDrafts{Drafts: []Draft{eq(t, Device, 0, 0, tokA)}}))
		require.Len(t, vs, 1)
		assert.Equal(t, [2]bool{true, true}, vs[0].Accept)
		assert.Equal(t, [2]bool{}, vs[0].Hedged)
		step(t, n, RemoteDrafts{Drafts: []Draft{branchDraft(t, 2, tokC), mk(t, Cloud, 1, 0, tokA)}})
		assert.Equal(t, uint64(1), n.Stats(Cloud).Stale, "the dead branch's draft")
		assert.Len(t, verdictsOf(step(t, n, LocalDrafts{Drafts: []Draft{eq(t, Device, 1, 0, tokA)}})), 1, "the main chain goes on")
	})
	t.Run("branch rejected too", func(t *testing.T) {
		n := newHedgeNode(t, Device, Device)
		step(t, n, RemoteDrafts{Drafts: []Draft{hedgedA(t), branchDraft(t, 1, tokC)}})
		vs := verdictsOf(step(t, n, LocalDrafts{Drafts: []Draft{eq(t, Device, 0, 0, tokB), eq(t, Device, 1, 0, tokA)}}))
		require.Len(t, vs, 2)
		assert.Equal(t, [2]bool{false, true}, vs[0].Hedged)
		// Equal weights and one-hot drafts tie; the lowest id wins.
		assert.Equal(t, tokA, vs[1].Target)
		assert.Equal(t, [2]bool{true, false}, vs[1].Accept)
		assert.Equal(t, [2]bool{}, vs[1].Hedged, "the branch hedged nothing")
		assert.Equal(t, [2]uint32{0, 2}, vs[1].NextEpoch)
		step(t, n, RemoteDrafts{Drafts: []Draft{branchDraft(t, 2, tokC), mk(t, Cloud, 2, 2, tokA)}})
		assert.Equal(t, uint64(1), n.Stats(Cloud).Stale)
	})
	t.Run("rejection elsewhere", func(t *testing.T) {
		n := newHedgeNode(t, Device, Device)
		step(t, n, RemoteDrafts{Drafts: []Draft{hedgedA(t), branchDraft(t, 1, tokC)}})
		vs := verdictsOf(step(t, n, LocalDrafts{Drafts: []Draft{eq(t, Device, 0, 0, tokC)}}))
		require.Len(t, vs, 1)
		assert.Equal(t, tokC, vs[0].Target)
		assert.Equal(t, [2]bool{}, vs[0].Hedged)
		assert.Equal(t, [2]uint32{0, 1}, vs[0].NextEpoch)
		step(t, n, RemoteDrafts{Drafts: []Draft{branchDraft(t, 2, tokC)}})
		assert.Equal(t, uint64(1), n.Stats(Cloud).Stale)
	})
}

// TestTheHedgingSideFollowsItsBranch: the cloud does not aggregate. It
// decides step 0 itself on the device's shared draft, adopts its branch
// (a Rollback marked Hedged), and the device's verdict confirms it; a
// verdict that ignored the hedge would contradict the cloud's own
// decision.
func TestTheHedgingSideFollowsItsBranch(t *testing.T) {
	setup := func() *Node {
		n := newHedgeNode(t, Cloud, Device)
		acts := step(t, n, LocalDrafts{Drafts: []Draft{hedgedA(t), branchDraft(t, 1, tokC)}})
		require.Len(t, acts, 1)
		assert.Len(t, acts[0].(SendDrafts).Drafts, 2, "the branch goes out with the chain")
		return n
	}
	n := setup()
	acts := step(t, n, RemoteDrafts{Drafts: []Draft{eq(t, Device, 0, 0, tokB)}})
	rs := rollbacksOf(acts)
	require.Len(t, rs, 1)
	assert.Equal(t, Rollback{Step: 0, Target: tokB, Epoch: 1, Hedged: true}, rs[0])
	confirmed := Verdict{Step: 0, Target: tokB, Accept: [2]bool{true, false}, NextEpoch: [2]uint32{0, 1}, Hedged: [2]bool{false, true}}
	step(t, n, RemoteVerdicts{Verdicts: []Verdict{confirmed}})
	// The branch's next draft, made before the cloud's producer learned,
	// is the new epoch's; it goes to the device as it was made.
	acts = step(t, n, LocalDrafts{Drafts: []Draft{branchDraft(t, 2, tokC)}})
	require.Len(t, acts, 1)
	_, onBranch := acts[0].(SendDrafts).Drafts[0].Fork()
	assert.True(t, onBranch)

	n = setup()
	step(t, n, RemoteDrafts{Drafts: []Draft{eq(t, Device, 0, 0, tokB)}})
	ignored := confirmed
	ignored.Hedged = [2]bool{}
	_, err := n.Step(RemoteVerdicts{Verdicts: []Verdict{ignored}})
	assert.ErrorIs(t, err, ErrProtocol)

	// Without shared drafts the verdict decides, and says so.
	n = setup()
	rs = rollbacksOf(step(t, n, RemoteVerdicts{Verdicts: []Verdict{confirmed}}))
	require.Len(t, rs, 1)
	assert.True(t, rs[0].Hedged)
	n = setup()
	_, err = n.Step(RemoteVerdicts{Verdicts: []Verdict{ignored}})
	assert.ErrorIs(t, err, ErrProtocol, "a verdict that ignores this side's hedge")
}

// TestASideWithOpenHedgesKeepsTheAggregator: the switch waits until the
// aggregating side's own hedges are decided.
func TestASideWithOpenHedgesKeepsTheAggregator(t *testing.T) {
	n := newHedgeNode(t, Cloud, Cloud)
	step(t, n, LocalDrafts{Drafts: []Draft{hedgedA(t)}})
	assert.Empty(t, step(t, n, SwitchRequest{}), "a hedge is open")
	step(t, n, RemoteDrafts{Drafts: []Draft{eq(t, Device, 0, 0, tokA)}})
	acts := step(t, n, SwitchRequest{})
	require.Len(t, acts, 1)
	assert.IsType(t, SendHandover{}, acts[0])
}

// TestMalformedHedgesEndTheStream: hedges the session did not negotiate,
// a branch without a hedge, a branch beyond the negotiated depth, more
// hedges than allowed, a gap in a branch, and (from the wire) a hedge of
// the draft's own token, of a token its distribution lacks, or on a
// branch: each is a protocol error, never a decided token.
func TestMalformedHedgesEndTheStream(t *testing.T) {
	enc := func(t *testing.T, w WireDraft) error {
		dec, err := codec.NewDecoder(vocab)
		require.NoError(t, err)
		_, err = DecodeDraft(dec, w)
		return err
	}
	h := hedgedA(t)
	wireOf := func(d Draft) WireDraft {
		tok, hedged := d.Hedge()
		return WireDraft{Side: d.Side(), Step: d.Step(), Epoch: d.Epoch(), Token: d.Token(), Payload: d.Payload(), Fork: d.WireFork(), Hedge: tok, Hedged: hedged}
	}
	dec, err := codec.NewDecoder(vocab)
	require.NoError(t, err)
	back, err := DecodeDraft(dec, wireOf(h))
	require.NoError(t, err, "a well-formed hedge crosses the wire")
	tok, ok := back.Hedge()
	require.True(t, ok)
	assert.Equal(t, tokB, tok)
	bd, err := DecodeDraft(dec, wireOf(branchDraft(t, 2, tokC)))
	require.NoError(t, err)
	f, ok := bd.Fork()
	require.True(t, ok)
	assert.Zero(t, f)

	for _, c := range []struct {
		name   string
		cfg    func(*Config)
		drafts []Draft
	}{
		{"not negotiated", func(c *Config) { c.Hedges, c.HedgeDepth = 0, 0 }, []Draft{hedgedA(t)}},
		{"branch without a hedge", nil, []Draft{mk(t, Cloud, 0, 0, tokA), branchDraft(t, 1, tokC)}},
		{"wrong parent", nil, []Draft{hedgedA(t), mk(t, Cloud, 1, 0, tokA), func() Draft {
			p, _ := NewProposer(Cloud, 1, true, 1)
			d, err := p.ProposeBranch(oneHot(tokC), 2, 0, 0, 1)
			require.NoError(t, err)
			return d
		}()}},
		{"beyond the depth", nil, []Draft{hedgedA(t), branchDraft(t, 1, tokC), branchDraft(t, 2, tokC), branchDraft(t, 3, tokC), branchDraft(t, 4, tokC)}},
		{"gap in the branch", nil, []Draft{hedgedA(t), branchDraft(t, 2, tokC)}},
		{"too many hedges", func(c *Config) { c.Hedges = 1 }, func() []Draft {
			probs := make([]float32, vocab)
			probs[tokA], probs[tokC] = 0.7, 0.3
			second, err := draftOf(t, Cloud, 1, 0, probs).WithHedge(tokC)
			require.NoError(t, err)
			return []Draft{hedgedA(t), second}
		}()},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := hedgeConfig(Device, Device)
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			n, err := New(cfg)
			require.NoError(t, err)
			_, err = n.Step(RemoteDrafts{Drafts: c.drafts})
			assert.ErrorIs(t, err, ErrProtocol)
		})
	}

	own := wireOf(h)
	own.Hedge = own.Token
	assert.ErrorIs(t, enc(t, own), ErrProtocol, "a hedge of the draft's own token")
	absent := wireOf(h)
	absent.Hedge = tokC
	assert.ErrorIs(t, enc(t, absent), ErrProtocol, "a hedge outside the distribution")
	nested := wireOf(branchDraft(t, 1, tokC))
	nested.Hedge, nested.Hedged = tokA, true
	assert.ErrorIs(t, enc(t, nested), ErrProtocol, "a hedge on a branch")
	early := wireOf(branchDraft(t, 1, tokC))
	early.Step = 0
	assert.ErrorIs(t, enc(t, early), ErrProtocol, "a branch draft at its fork")

	_, err = New(Config{Self: Device, Aggregator: Device, Hedges: 1, HedgeDepth: 2})
	assert.Error(t, err, "hedges need shared drafts")
	_, err = New(Config{Self: Device, Aggregator: Device, Share: true, Hedges: 1})
	assert.Error(t, err, "hedges need a depth")
}

// TestAFinishedFollowerConfirmsAndTakesTheAggregator: the side that does
// not aggregate decided the last steps itself and is done; the
// aggregator's verdicts of some of them still confirm them, and its
// handover at the first step it did not decide is taken (the rest of the
// verdicts go back) rather than refused as a gap (found with 80-token
// sampled answers moving the aggregator every 5 steps).
func TestAFinishedFollowerConfirmsAndTakesTheAggregator(t *testing.T) {
	cfg := hedgeConfig(Cloud, Device)
	cfg.MaxSteps = 3
	n, err := New(cfg)
	require.NoError(t, err)
	step(t, n, LocalDrafts{Drafts: []Draft{eq(t, Cloud, 0, 0, tokA), eq(t, Cloud, 1, 0, tokA), eq(t, Cloud, 2, 0, tokA)}})
	dev := []Draft{eq(t, Device, 0, 0, tokA), eq(t, Device, 1, 0, tokA), eq(t, Device, 2, 0, tokA)}
	step(t, n, RemoteDrafts{Drafts: dev})
	require.True(t, n.Done())
	step(t, n, RemoteVerdicts{Verdicts: []Verdict{{Step: 0, Target: tokA, Accept: [2]bool{true, true}}}})
	acts := step(t, n, RemoteHandover{Handover: Handover{NextStep: 1, Queue: dev[1:]}})
	vs := verdictsOf(acts)
	require.Len(t, vs, 2)
	assert.Equal(t, uint64(1), vs[0].Step)
	assert.Equal(t, uint64(2), vs[1].Step)
	_, err = n.Step(RemoteVerdicts{Verdicts: []Verdict{{Step: 1, Target: tokB, Accept: [2]bool{false, false}, NextEpoch: [2]uint32{1, 1}}}})
	assert.ErrorIs(t, err, ErrProtocol, "an aggregator now")
}
