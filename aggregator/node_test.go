package aggregator

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/codec"
)

const vocab = 8

// Tokens of the scripted tests.
const (
	tokA int32 = 2
	tokB int32 = 5
	tokC int32 = 6
)

// oneHot is a distribution with all its mass on tok.
func oneHot(tok int32) []float32 {
	p := make([]float32, vocab)
	p[tok] = 1
	return p
}

// mk makes a greedy draft of tok; the cloud's relevance mass is higher, so
// where the two sides disagree the cloud's token wins.
func mk(t *testing.T, side Side, step uint64, epoch uint32, tok int32) Draft {
	t.Helper()
	p, err := NewProposer(side, 1, true, 1)
	require.NoError(t, err)
	mass := 0.0
	if side == Cloud {
		mass = 1
	}
	d, err := p.Propose(oneHot(tok), step, epoch, mass)
	require.NoError(t, err)
	require.Equal(t, tok, d.Token())
	return d
}

func newNode(t *testing.T, self, agg Side) *Node {
	n, err := New(Config{Self: self, Aggregator: agg, Greedy: true, IsEnd: func(tok int32) bool { return tok == 0 }, MaxSteps: 100})
	require.NoError(t, err)
	return n
}

func step(t *testing.T, n *Node, ev Event) []Action {
	t.Helper()
	acts, err := n.Step(ev)
	require.NoError(t, err)
	return acts
}

func verdictsOf(acts []Action) []Verdict {
	var vs []Verdict
	for _, a := range acts {
		if s, ok := a.(SendVerdicts); ok {
			vs = append(vs, s.Verdicts...)
		}
	}
	return vs
}

// TestStaleDraftsAreDroppedAndCounted follows one generation in which the
// device's draft at step 1 is rejected while its drafts for steps 2 and 3,
// made under the old epoch, are still on their way.
func TestStaleDraftsAreDroppedAndCounted(t *testing.T) {
	n := newNode(t, Device, Device)
	acts := step(t, n, LocalDrafts{Drafts: []Draft{mk(t, Device, 0, 0, tokA), mk(t, Device, 1, 0, tokB), mk(t, Device, 2, 0, tokB)}})
	assert.Empty(t, acts, "nothing to decide without the cloud's drafts")

	acts = step(t, n, RemoteDrafts{Drafts: []Draft{mk(t, Cloud, 0, 0, tokA), mk(t, Cloud, 1, 0, tokA)}})
	vs := verdictsOf(acts)
	require.Len(t, vs, 2, "both steps decided at once")
	assert.Equal(t, Verdict{Step: 0, Target: tokA, Accept: [2]bool{true, true}, Expected: [2]float64{1, 1}}, vs[0])
	assert.Equal(t, tokA, vs[1].Target, "the cloud weighs more")
	assert.Equal(t, [2]bool{false, true}, vs[1].Accept)
	assert.Equal(t, [2]uint32{1, 0}, vs[1].NextEpoch)
	assert.Contains(t, acts, Action(Rollback{Step: 1, Target: tokA, Epoch: 1}))

	// The device's step-2 draft of epoch 0 was queued and is gone; one
	// still in flight from the producer is stale.
	assert.Empty(t, step(t, n, LocalDrafts{Drafts: []Draft{mk(t, Device, 3, 0, tokB)}}))
	assert.Equal(t, uint64(1), n.Stats(Device).Stale)
	assert.Empty(t, step(t, n, LocalDrafts{Drafts: []Draft{mk(t, Device, 2, 1, tokC)}}))

	// Protocol violations.
	_, err := n.Step(LocalDrafts{Drafts: []Draft{mk(t, Device, 4, 1, tokC)}})
	assert.ErrorIs(t, err, ErrProtocol, "a gap")
	_, err = n.Step(RemoteDrafts{Drafts: []Draft{mk(t, Cloud, 3, 0, tokC)}})
	assert.ErrorContains(t, err, "next draft is step 2")
	_, err = n.Step(RemoteDrafts{Drafts: []Draft{mk(t, Cloud, 2, 1, tokC)}})
	assert.ErrorContains(t, err, "ahead of the current epoch 0")
	_, err = n.Step(RemoteDrafts{Drafts: []Draft{mk(t, Device, 2, 1, tokC)}})
	assert.ErrorContains(t, err, "arrived as a cloud draft")
	_, err = n.Step(RemoteVerdicts{Verdicts: vs})
	assert.ErrorContains(t, err, "while this side aggregates")

	st := n.Stats(Device)
	assert.Equal(t, Stats{Admitted: 4, Accepted: 1, Rejected: 1, Stale: 1}, st)
}

// TestFollowerAppliesVerdicts: the cloud forwards its drafts, applies the
// device's verdicts, rolls back on a rejection and checks every verdict.
func TestFollowerAppliesVerdicts(t *testing.T) {
	agg, fol := newNode(t, Device, Device), newNode(t, Cloud, Device)
	d0, d1 := mk(t, Cloud, 0, 0, tokA), mk(t, Cloud, 1, 0, tokB)
	acts := step(t, fol, LocalDrafts{Drafts: []Draft{d0, d1}})
	require.Equal(t, []Action{SendDrafts{Drafts: []Draft{d0, d1}}}, acts)

	step(t, agg, LocalDrafts{Drafts: []Draft{mk(t, Device, 0, 0, tokA), mk(t, Device, 1, 0, tokA)}})
	vs := verdictsOf(step(t, agg, RemoteDrafts{Drafts: []Draft{d0, d1}}))
	require.Len(t, vs, 2)
	require.Equal(t, [2]bool{false, true}, vs[1].Accept, "cloud's B beats device's A")

	bad := vs[0]
	bad.Step = 1
	_, err := fol.Step(RemoteVerdicts{Verdicts: []Verdict{bad}})
	assert.ErrorContains(t, err, "expected step 0")
	bad = vs[0]
	bad.Accept[1] = false
	bad.NextEpoch[1] = 1
	_, err = fol.Step(RemoteVerdicts{Verdicts: []Verdict{bad}})
	assert.ErrorContains(t, err, "contradicts the draft")
	bad = vs[0]
	bad.NextEpoch[0] = 4
	_, err = fol.Step(RemoteVerdicts{Verdicts: []Verdict{bad}})
	assert.ErrorContains(t, err, "changes its epoch")

	acts = step(t, fol, RemoteVerdicts{Verdicts: vs})
	require.Len(t, acts, 2)
	assert.Equal(t, Decided{Verdict: vs[0]}, acts[0])
	assert.Equal(t, Decided{Verdict: vs[1]}, acts[1])
	assert.Equal(t, uint64(2), fol.NextStep())
	assert.Equal(t, uint32(1), fol.Epoch(Device), "the device's rollback is known")

	_, err = fol.Step(RemoteHandover{Handover: Handover{NextStep: 1}})
	assert.ErrorContains(t, err, "decided up to step 2")
	_, err = fol.Step(RemoteHandover{Handover: Handover{NextStep: 2, Epochs: [2]uint32{1, 3}}})
	assert.ErrorContains(t, err, "gives this side epoch 3")
}

// TestHandoverCarriesQueueAndEpochs moves the aggregator mid-generation:
// the new aggregator decides from the old one's queue and its own.
func TestHandoverCarriesQueueAndEpochs(t *testing.T) {
	dev, cld := newNode(t, Device, Device), newNode(t, Cloud, Device)
	step(t, dev, LocalDrafts{Drafts: []Draft{mk(t, Device, 0, 0, tokA), mk(t, Device, 1, 0, tokC), mk(t, Device, 2, 0, tokC)}})
	sent := step(t, cld, LocalDrafts{Drafts: []Draft{mk(t, Cloud, 0, 0, tokA)}})
	vs := verdictsOf(step(t, dev, RemoteDrafts(sent[0].(SendDrafts))))
	step(t, cld, RemoteVerdicts{Verdicts: vs})

	acts := step(t, dev, SwitchRequest{})
	require.Len(t, acts, 1)
	h := acts[0].(SendHandover).Handover
	assert.Equal(t, uint64(1), h.NextStep)
	require.Len(t, h.Queue, 2, "the device's undecided drafts")
	assert.False(t, dev.Aggregating())
	assert.Empty(t, step(t, dev, SwitchRequest{}), "only the aggregator can switch")

	// A cloud draft in flight to the old aggregator arrives late there.
	late := mk(t, Cloud, 1, 0, tokB)
	assert.Empty(t, step(t, dev, RemoteDrafts{Drafts: []Draft{late}}))
	assert.Equal(t, uint64(1), dev.Stats(Cloud).Late)

	// The cloud holds its own step-1 draft and takes the device's queue.
	step(t, cld, LocalDrafts{Drafts: []Draft{late}})
	acts = step(t, cld, RemoteHandover{Handover: h})
	assert.True(t, cld.Aggregating())
	vs = verdictsOf(acts)
	require.Len(t, vs, 1)
	assert.Equal(t, Verdict{Step: 1, Target: tokB, Accept: [2]bool{false, true}, NextEpoch: [2]uint32{1, 0}, Expected: [2]float64{0, 1}}, vs[0])

	// The device applies it, rolls back, and the queue of epoch 0 is gone.
	acts = step(t, dev, RemoteVerdicts{Verdicts: vs})
	assert.Equal(t, Rollback{Step: 1, Target: tokB, Epoch: 1}, acts[1])
	acts = step(t, dev, LocalDrafts{Drafts: []Draft{mk(t, Device, 2, 1, tokA)}})
	require.Len(t, acts, 1, "forwarded to the new aggregator")
	assert.Equal(t, uint64(2), dev.Handovers()+cld.Handovers())
}

func TestEndTokenAndMaxStepsFinish(t *testing.T) {
	n := newNode(t, Device, Device)
	step(t, n, LocalDrafts{Drafts: []Draft{mk(t, Device, 0, 0, tokA), mk(t, Device, 1, 0, 0)}})
	acts := step(t, n, RemoteDrafts{Drafts: []Draft{mk(t, Cloud, 0, 0, tokA), mk(t, Cloud, 1, 0, 0), mk(t, Cloud, 2, 0, tokA)}})
	assert.Equal(t, Done{Steps: 2}, acts[len(acts)-1])
	assert.True(t, n.Done())
	assert.Empty(t, step(t, n, LocalDrafts{Drafts: []Draft{mk(t, Device, 2, 0, tokA)}}), "nothing is decided after the end")

	m, err := New(Config{Self: Cloud, Aggregator: Cloud, Greedy: true, MaxSteps: 1})
	require.NoError(t, err)
	step(t, m, LocalDrafts{Drafts: []Draft{mk(t, Cloud, 0, 0, tokA)}})
	acts = step(t, m, RemoteDrafts{Drafts: []Draft{mk(t, Device, 0, 0, tokB)}})
	assert.Equal(t, Done{Steps: 1}, acts[len(acts)-1])

	f := newNode(t, Device, Device)
	step(t, f, Finish{})
	assert.Empty(t, step(t, f, LocalDrafts{Drafts: []Draft{mk(t, Device, 0, 0, tokA)}}))
}

func TestWeights(t *testing.T) {
	inf := math.Inf(-1)
	cases := []struct {
		hd, hc, wantD float64
	}{
		{0, 0, 0.5},
		{math.Log(3), 0, 0.75},
		{1000, 999, 1 / (1 + math.Exp(-1))}, // no overflow
		{-1000, -1000, 0.5},
		{inf, 2, 0},
		{2, inf, 1},
		{inf, inf, 0.5},
	}
	for _, c := range cases {
		d, cl := Weights(c.hd, c.hc)
		assert.InDelta(t, c.wantD, d, 1e-12, "%v %v", c.hd, c.hc)
		assert.InDelta(t, 1, d+cl, 1e-12)
	}
}

func TestDecodeDraftRejectsBadInput(t *testing.T) {
	dec, err := codec.NewDecoder(vocab)
	require.NoError(t, err)
	good := mk(t, Cloud, 3, 1, tokB)
	w := WireDraft{Side: Cloud, Step: 3, Epoch: 1, Token: tokB, Payload: good.Payload(), LogMass: 1}
	d, err := DecodeDraft(dec, w)
	require.NoError(t, err)
	assert.Equal(t, good.Dist().Tokens, d.Dist().Tokens)
	assert.Equal(t, good.Dist().Probs, d.Dist().Probs, "the receiver holds the sender's distribution bit for bit")

	for name, edit := range map[string]func(*WireDraft){
		"token outside its distribution": func(w *WireDraft) { w.Token = tokA },
		"corrupt payload":                func(w *WireDraft) { w.Payload = []byte{0xff, 1, 2} },
		"unknown side":                   func(w *WireDraft) { w.Side = 0 },
		"NaN relevance":                  func(w *WireDraft) { w.LogMass = math.NaN() },
	} {
		bad := w
		edit(&bad)
		_, err := DecodeDraft(dec, bad)
		assert.ErrorIs(t, err, ErrProtocol, name)
	}
}

func TestSideNames(t *testing.T) {
	for _, s := range Sides {
		got, err := ParseSide(s.String())
		require.NoError(t, err)
		assert.Equal(t, s, got)
		assert.Equal(t, s, s.Other().Other())
	}
	_, err := ParseSide("phone")
	assert.Error(t, err)
	_, err = New(Config{Self: 0, Aggregator: Device})
	assert.Error(t, err)
}

// TestSecondChoiceCounted: a rejection whose target is the rejected side's
// runner-up is counted (what a one-token hedge would have caught), and so
// are decided drafts below each hedge threshold and the caught ones among
// them.
func TestSecondChoiceCounted(t *testing.T) {
	n := newNode(t, Device, Device)
	p, err := NewProposer(Device, 1, true, 1)
	require.NoError(t, err)
	dist := make([]float32, vocab)
	dist[tokB], dist[tokA], dist[tokC] = 0.6, 0.3, 0.1
	d, err := p.Propose(dist, 0, 0, 0)
	require.NoError(t, err)
	require.Equal(t, tokB, d.Token())
	step(t, n, LocalDrafts{Drafts: []Draft{d}})
	vs := verdictsOf(step(t, n, RemoteDrafts{Drafts: []Draft{mk(t, Cloud, 0, 0, tokA)}}))
	require.Len(t, vs, 1)
	require.Equal(t, tokA, vs[0].Target)
	assert.Equal(t, uint64(1), n.Stats(Device).SecondChoice)
	require.Equal(t, []float32{0.2, 0.3, 0.5, 0.7}, HedgeThresholds[:])
	assert.Equal(t, [4]uint64{0, 0, 0, 1}, n.Stats(Device).LowProb, "a draft of probability 0.6")
	assert.Equal(t, [4]uint64{0, 0, 0, 1}, n.Stats(Device).LowProbCaught)

	d, err = p.Propose(dist, 1, 1, 0)
	require.NoError(t, err)
	step(t, n, LocalDrafts{Drafts: []Draft{d}})
	step(t, n, RemoteDrafts{Drafts: []Draft{mk(t, Cloud, 1, 0, tokC)}})
	assert.Equal(t, uint64(2), n.Stats(Device).Rejected)
	assert.Equal(t, uint64(1), n.Stats(Device).SecondChoice, "the third choice is not counted")
	assert.Equal(t, [4]uint64{0, 0, 0, 2}, n.Stats(Device).LowProb)
	assert.Equal(t, [4]uint64{0, 0, 0, 1}, n.Stats(Device).LowProbCaught, "the third choice is not caught")
}

// TestPeerDraftsAreTheUndecidedChain: the aggregating Node shows the peer's
// undecided drafts of its current epoch from the next step on; a rejection
// empties them until the peer drafts under its new epoch; the other Node
// shows none.
func TestPeerDraftsAreTheUndecidedChain(t *testing.T) {
	n := newNode(t, Device, Device)
	step(t, n, RemoteDrafts{Drafts: []Draft{mk(t, Cloud, 0, 0, tokA), mk(t, Cloud, 1, 0, tokB), mk(t, Cloud, 2, 0, tokC)}})
	tokens := func() []int32 {
		var ts []int32
		for _, d := range n.PeerDrafts() {
			ts = append(ts, d.Token())
		}
		return ts
	}
	assert.Equal(t, []int32{tokA, tokB, tokC}, tokens())
	step(t, n, LocalDrafts{Drafts: []Draft{mk(t, Device, 0, 0, tokA)}})
	assert.Equal(t, []int32{tokB, tokC}, tokens(), "step 0 decided")
	assert.Equal(t, uint64(1), n.PeerDrafts()[0].Step())
	// A device draft the cloud's mass outweighs: the cloud wins, nothing is
	// rejected on its side.
	step(t, n, LocalDrafts{Drafts: []Draft{mk(t, Device, 1, 0, tokC)}})
	assert.Equal(t, []int32{tokC}, tokens())

	n = newNode(t, Device, Device)
	step(t, n, RemoteDrafts{Drafts: []Draft{mk(t, Cloud, 0, 0, tokA), mk(t, Cloud, 1, 0, tokB)}})
	// Equal weights would favour the lower id; give the device all the
	// mass so that the cloud's draft is rejected.
	p, err := NewProposer(Device, 1, true, 1)
	require.NoError(t, err)
	d, err := p.Propose(oneHot(tokC), 0, 0, 50)
	require.NoError(t, err)
	step(t, n, LocalDrafts{Drafts: []Draft{d}})
	assert.Empty(t, n.PeerDrafts(), "the cloud's old-epoch drafts are gone")

	assert.Empty(t, newNode(t, Cloud, Device).PeerDrafts(), "only the aggregator sees the peer's drafts")
}

// sharedPair is a greedy device aggregator and cloud follower that share
// their drafts.
func sharedPair(t *testing.T) (agg, fol *Node) {
	var nodes [2]*Node
	for i, side := range Sides {
		var err error
		nodes[i], err = New(Config{Self: side, Aggregator: Device, Greedy: true, Share: true, MaxSteps: 100})
		require.NoError(t, err)
	}
	return nodes[0], nodes[1]
}

// TestFollowerDecidesWhatItHoldsBothDraftsOf: with shared drafts, the
// cloud (not aggregating) decides a step as soon as it holds the device's
// draft of it, rolls its own rejected draft back then, and takes the
// device's verdict, when it comes, as a confirmation; a verdict that
// disagrees is a protocol error.
func TestFollowerDecidesWhatItHoldsBothDraftsOf(t *testing.T) {
	agg, fol := sharedPair(t)
	// The device's drafts outweigh the cloud's where they disagree.
	p, err := NewProposer(Device, 1, true, 1)
	require.NoError(t, err)
	dev := func(s uint64, tok int32) Draft {
		d, err := p.Propose(oneHot(tok), s, 0, 50)
		require.NoError(t, err)
		return d
	}
	c0, c1 := mk(t, Cloud, 0, 0, tokA), mk(t, Cloud, 1, 0, tokB)
	d0, d1 := dev(0, tokA), dev(1, tokC)

	acts := step(t, agg, LocalDrafts{Drafts: []Draft{d0, d1}})
	require.Equal(t, []Action{SendDrafts{Drafts: []Draft{d0, d1}}}, acts, "the aggregator shares its undecided drafts")
	acts = step(t, fol, LocalDrafts{Drafts: []Draft{c0, c1}})
	require.Equal(t, []Action{SendDrafts{Drafts: []Draft{c0, c1}}}, acts)

	// The device's drafts reach the cloud before the verdicts exist.
	acts = step(t, fol, RemoteDrafts{Drafts: []Draft{d0, d1}})
	require.Len(t, acts, 3)
	assert.Equal(t, tokA, acts[0].(Decided).Verdict.Target)
	assert.Equal(t, tokC, acts[1].(Decided).Verdict.Target, "the device's C outweighs the cloud's B")
	assert.Equal(t, Rollback{Step: 1, Target: tokC, Epoch: 1}, acts[2], "the cloud rolls back without waiting for the verdict")
	assert.Equal(t, uint64(2), fol.NextStep())
	assert.Equal(t, uint32(1), fol.Epoch(Cloud))

	// Its next draft carries the new epoch, and the aggregator, which has
	// decided step 1 by then, takes it.
	c2 := mk(t, Cloud, 2, 1, tokA)
	acts = step(t, fol, LocalDrafts{Drafts: []Draft{c2}})
	require.Equal(t, []Action{SendDrafts{Drafts: []Draft{c2}}}, acts)
	vs := verdictsOf(step(t, agg, RemoteDrafts{Drafts: []Draft{c0, c1}}))
	require.Len(t, vs, 2)
	step(t, agg, RemoteDrafts{Drafts: []Draft{c2}})

	bad := vs[1]
	bad.Target = tokB
	_, err = fol.Step(RemoteVerdicts{Verdicts: []Verdict{vs[0], bad}})
	require.ErrorIs(t, err, ErrProtocol)
	assert.ErrorContains(t, err, "contradicts this side's own decision")

	_, fol = sharedPair(t)
	step(t, fol, LocalDrafts{Drafts: []Draft{c0, c1}})
	step(t, fol, RemoteDrafts{Drafts: []Draft{d0, d1}})
	acts = step(t, fol, RemoteVerdicts{Verdicts: vs})
	assert.Empty(t, acts, "the verdicts confirm what the cloud decided")
	assert.Equal(t, uint64(2), fol.NextStep())
	st := fol.Stats(Cloud)
	assert.Equal(t, [2]uint64{1, 1}, [2]uint64{st.Accepted, st.Rejected}, "each step counted once")
}

// TestHandoverToAFollowerThatDecidedAhead: the cloud decided steps the
// device had not when the device hands the aggregator over; the cloud
// sends their verdicts, and the device takes them as its peer's.
func TestHandoverToAFollowerThatDecidedAhead(t *testing.T) {
	agg, fol := sharedPair(t)
	d0, d1 := mk(t, Device, 0, 0, tokA), mk(t, Device, 1, 0, tokA)
	c0, c1 := mk(t, Cloud, 0, 0, tokA), mk(t, Cloud, 1, 0, tokB)
	step(t, agg, LocalDrafts{Drafts: []Draft{d0, d1}})
	step(t, fol, LocalDrafts{Drafts: []Draft{c0, c1}})
	acts := step(t, fol, RemoteDrafts{Drafts: []Draft{d0, d1}})
	require.Len(t, acts, 2, "both steps decided on the cloud; the cloud's B wins step 1")

	// The device hands over before the cloud's drafts reach it.
	acts = step(t, agg, SwitchRequest{})
	require.Len(t, acts, 1)
	h := acts[0].(SendHandover).Handover
	require.Equal(t, uint64(0), h.NextStep)

	bad := h
	bad.Epochs[Device.Index()] = 3
	_, err := fol.Step(RemoteHandover{Handover: bad})
	assert.ErrorContains(t, err, "gives the peer epoch 3")

	acts = step(t, fol, RemoteHandover{Handover: h})
	require.True(t, fol.Aggregating())
	vs := verdictsOf(acts)
	require.Len(t, vs, 2, "the cloud sends the steps it decided")
	assert.Equal(t, [2]bool{false, true}, vs[1].Accept)

	// The device, now following, holds the cloud's drafts (in flight) and
	// the verdicts: whichever way they arrive, it agrees.
	acts = step(t, agg, RemoteDrafts{Drafts: []Draft{c0, c1}})
	require.Len(t, acts, 3, "decided both steps itself, and rolled its draft of step 1 back")
	assert.Equal(t, Rollback{Step: 1, Target: tokB, Epoch: 1}, acts[2])
	assert.Empty(t, step(t, agg, RemoteVerdicts{Verdicts: vs}))
	assert.Equal(t, uint64(2), agg.NextStep())
}

// TestConfidenceConfigChecked: a confidence temperature is 0 (off) or a
// positive number.
func TestConfidenceConfigChecked(t *testing.T) {
	for _, tau := range []float64{-0.5, math.NaN(), math.Inf(1)} {
		_, err := New(Config{Self: Device, Aggregator: Device, Confidence: tau})
		assert.ErrorContains(t, err, "confidence temperature", "%v", tau)
	}
	_, err := New(Config{Self: Device, Aggregator: Device, Confidence: 0.5})
	assert.NoError(t, err)
}

// TestConfidenceWeightsFavourTheSurerSide: of two sides with the same h̃,
// the one with the peaked distribution gets the larger weight, the more so
// the lower the temperature; 0 leaves DRAGON's weights.
func TestConfidenceWeightsFavourTheSurerSide(t *testing.T) {
	peaked := []float32{0.9, 0.05, 0.05, 0, 0, 0, 0, 0}
	flat := []float32{0.2, 0.2, 0.2, 0.2, 0.2, 0, 0, 0}
	draft := func(side Side, probs []float32) Draft {
		p, err := NewProposer(side, 1, true, 1)
		require.NoError(t, err)
		d, err := p.Propose(probs, 0, 0, 0)
		require.NoError(t, err)
		return d
	}
	dev, cld := draft(Device, peaked), draft(Cloud, flat)
	assert.InDelta(t, 0.5, newPair(&dev, &cld, 0).eta[0], 1e-12)
	hot, cold := newPair(&dev, &cld, 1).eta[0], newPair(&dev, &cld, 0.25).eta[0]
	assert.Greater(t, hot, 0.5)
	assert.Greater(t, cold, hot)
	// e^{(H_flat - H_peaked)/τ} / (1 + e^{…}) with the views' entropies.
	dh := Entropy(&cld.dist) - Entropy(&dev.dist)
	assert.InDelta(t, 1/(1+math.Exp(-dh)), hot, 1e-9)
	assert.InDelta(t, math.Log(5), Entropy(&cld.dist), 1e-3)
}
