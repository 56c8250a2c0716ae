package aggregator

import (
	"errors"
	"fmt"
	"math"

	"github.com/dragon-rag/dragon/codec"
)

// ErrProtocol marks a message that breaks the protocol: a draft from the
// future, a gap in a side's drafts, a verdict for the wrong step, ... The
// session that gets it ends with an error; test with errors.Is.
var ErrProtocol = errors.New("aggregator: protocol violation")

// Draft is one drafted token together with the distribution it was drawn
// from. Only Propose (on the drafting side) and DecodeDraft (on the
// receiving side, from the same bytes) make one, so the token always comes
// from exactly the distribution the aggregator uses for its side.
type Draft struct {
	side    Side
	step    uint64
	epoch   uint32
	token   int32
	dist    codec.Sparse
	logMass float64
	payload []byte
	// fork is 0 for a draft of the side's main chain and s+1 for one of
	// the hedge branch forked at step s (Proposer.ProposeBranch); a Node
	// that adopts a branch relabels its drafts as the new epoch's main
	// chain.
	fork uint64
	// hedge, when hedged, is the alternative token at this step whose
	// branch the side decodes beside its main chain (Draft.WithHedge).
	hedge  int32
	hedged bool
	// origin is the epoch and fork the draft was made with, kept through
	// relabelling (for tests that trace a draft to its prefix).
	origin origin
	// Meta is for the profiler; it does not take part in aggregation.
	Meta Meta
}

type origin struct {
	epoch uint32
	fork  uint64
}

// Meta is what a draft tells the profiler about how it was made.
type Meta struct {
	// DecodeMicros is the sender's decoding time per token of the forward
	// pass that produced the draft.
	DecodeMicros uint32
	// Context is the length of the sender's longest sequence when it
	// decoded the token (the t of c_dec(t), DRAGON §5.2).
	Context uint32
	// Moved: the token is the mixture's argmax drafted beside the peer's
	// draft (ProposeBeside) instead of the side's own argmax, so its
	// verdict says nothing of the side's own acceptance.
	Moved bool
}

// Side is the side that drafted.
func (d *Draft) Side() Side { return d.side }

// Step is the answer position of the token, from 0.
func (d *Draft) Step() uint64 { return d.step }

// Epoch is the drafting side's epoch when it drafted.
func (d *Draft) Epoch() uint32 { return d.epoch }

// Token is the drafted token.
func (d *Draft) Token() int32 { return d.token }

// Dist is the distribution the token was drawn from; callers must not
// modify it.
func (d *Draft) Dist() *codec.Sparse { return &d.dist }

// LogMass is h̃ = logsumexp of the side's relevance scores (Appendix A.1);
// -Inf for a side without passages.
func (d *Draft) LogMass() float64 { return d.logMass }

// Payload is Dist encoded by package codec: what travels on the wire.
func (d *Draft) Payload() []byte { return d.payload }

// Fork is the step the draft's hedge branch forked at; ok is false for a
// draft of the main chain.
func (d *Draft) Fork() (step uint64, ok bool) { return d.fork - 1, d.fork != 0 }

// WireFork is Fork as the wire carries it: 0 for the main chain, the fork
// step + 1 for a branch.
func (d *Draft) WireFork() uint64 { return d.fork }

// Hedge is the alternative token the side hedged at this step; ok is
// false when it hedged none.
func (d *Draft) Hedge() (tok int32, ok bool) { return d.hedge, d.hedged }

// WithHedge is d declaring a hedge on tok: the side also decodes the
// branch that continues the answer with tok instead of d's token at this
// step, and sends that branch's drafts (ProposeBranch), so that when the
// aggregator decides tok here the side's next distributions are already
// on their way instead of a round trip later. tok must be another token
// of d's distribution; a branch draft cannot hedge (branches do not nest).
func (d Draft) WithHedge(tok int32) (Draft, error) {
	if err := checkHedge(&d, tok); err != nil {
		return Draft{}, err
	}
	d.hedge, d.hedged = tok, true
	return d, nil
}

func checkHedge(d *Draft, tok int32) error {
	switch {
	case d.fork != 0:
		return fmt.Errorf("aggregator: %v is on a branch and cannot hedge", d)
	case tok == d.token:
		return fmt.Errorf("aggregator: %v hedges its own token", d)
	case d.dist.Prob(tok) <= 0:
		return fmt.Errorf("aggregator: %v hedges token %d, which its distribution does not hold", d, tok)
	}
	return nil
}

// RunnerUp is the most probable token of d's distribution other than its
// own (the lowest id on ties); ok is false when there is none. Rejected
// drafts' targets were mostly this token (Stats.SecondChoice).
func (d *Draft) RunnerUp() (tok int32, ok bool) {
	t := secondChoice(&d.dist, d.token)
	return t, t >= 0
}

func (d *Draft) String() string {
	if f, ok := d.Fork(); ok {
		return fmt.Sprintf("%v draft step %d epoch %d token %d on the branch forked at step %d", d.side, d.step, d.epoch, d.token, f)
	}
	return fmt.Sprintf("%v draft step %d epoch %d token %d", d.side, d.step, d.epoch, d.token)
}

// Proposer makes one side's drafts. It is not safe for concurrent use.
type Proposer struct {
	side   Side
	seed   uint64
	greedy bool
	enc    *codec.Encoder
	view   codec.Sparse
	// confidence is Config.Confidence, for drafts beside the peer's.
	confidence float64
}

// SetConfidence weighs the mixture that drafts beside the peer's take the
// argmax of as the aggregator does (Config.Confidence).
func (p *Proposer) SetConfidence(tau float64) { p.confidence = tau }

// NewProposer makes drafts for side: greedy ones (the most probable token)
// or sampled ones (inverse CDF at DraftUniform(seed, side, step)), from
// distributions compressed to their top-p set.
func NewProposer(side Side, seed uint64, greedy bool, topP float64) (*Proposer, error) {
	if !side.Valid() {
		return nil, fmt.Errorf("aggregator: proposer for unknown side %v", side)
	}
	enc, err := codec.NewEncoder(topP)
	if err != nil {
		return nil, err
	}
	return &Proposer{side: side, seed: seed, greedy: greedy, enc: enc}, nil
}

// Propose drafts the token at step from probs, a full-vocabulary
// probability vector: it encodes probs and draws the token from the encoded
// view, which is the draft's distribution on both sides.
func (p *Proposer) Propose(probs []float32, step uint64, epoch uint32, logMass float64) (Draft, error) {
	if math.IsNaN(logMass) || math.IsInf(logMass, 1) {
		return Draft{}, fmt.Errorf("aggregator: relevance mass %v", logMass)
	}
	payload, err := p.enc.Encode(nil, probs, codec.NoToken, &p.view)
	if err != nil {
		return Draft{}, fmt.Errorf("aggregator: encode the distribution of step %d: %w", step, err)
	}
	var tok int32
	if p.greedy {
		tok = argmax(&p.view)
	} else {
		tok = drawU(&p.view, DraftUniform(p.seed, p.side, step))
	}
	return Draft{side: p.side, step: step, epoch: epoch, token: tok, dist: p.view.Clone(), logMass: logMass, payload: payload,
		origin: origin{epoch: epoch}}, nil
}

// ProposeBranch drafts step on the hedge branch forked at step fork (<
// step) under epoch, the main chain's epoch when the hedge was declared:
// probs were decoded on the answer with the hedged token at fork. It
// drafts as Propose does (the token a side that rolled back to the hedged
// token would draft), never beside the peer's drafts, which are on the
// main chain.
func (p *Proposer) ProposeBranch(probs []float32, step uint64, epoch uint32, logMass float64, fork uint64) (Draft, error) {
	if step <= fork {
		return Draft{}, fmt.Errorf("aggregator: branch draft of step %d forked at step %d", step, fork)
	}
	d, err := p.Propose(probs, step, epoch, logMass)
	if err != nil {
		return Draft{}, err
	}
	d.fork = fork + 1
	d.origin.fork = d.fork
	return d, nil
}

// ProposeBeside is Propose for a step whose peer draft, drafted on the
// same answer prefix, is already at hand. A greedy draft is then the
// argmax of the two sides' mixture, the token the aggregator will decide,
// so it is accepted where the side's own argmax would have been rejected.
// When this side's top-p set lacks that token, the distribution is encoded
// with the token kept (codec.Encoder.Encode's drafted), which only raises
// its mixture weight, and the draft stays the side's own argmax in the
// rare case where rounding made another token win. Either way the step's
// target is the argmax of the mixture of the blind distributions, so the
// answer stays exactly the greedy one. Sampled drafts must be drawn from
// the side's own distribution (Algorithm 1), so they ignore the peer.
// Meta.Moved marks a token other than the side's own argmax.
func (p *Proposer) ProposeBeside(probs []float32, step uint64, epoch uint32, logMass float64, peer *Draft) (Draft, error) {
	if peer.side != p.side.Other() || peer.step != step {
		return Draft{}, fmt.Errorf("aggregator: %v drafting step %d beside %v", p.side, step, peer)
	}
	d, err := p.Propose(probs, step, epoch, logMass)
	if err != nil || !p.greedy {
		return d, err
	}
	t := p.mixtureArgmax(&d, peer)
	switch {
	case t == d.token:
		return d, nil
	case d.dist.Prob(t) > 0:
		d.token, d.Meta.Moved = t, true
		return d, nil
	}
	payload, err := p.enc.Encode(nil, probs, t, &p.view)
	if err != nil {
		return Draft{}, fmt.Errorf("aggregator: encode the distribution of step %d with token %d: %w", step, t, err)
	}
	kept := Draft{side: p.side, step: step, epoch: epoch, token: t, dist: p.view.Clone(), logMass: logMass, payload: payload,
		origin: origin{epoch: epoch}, Meta: Meta{Moved: true}}
	if kept.dist.Prob(t) <= 0 || p.mixtureArgmax(&kept, peer) != t {
		return d, nil
	}
	return kept, nil
}

// mixtureArgmax is the target the aggregator decides for a greedy draft d
// of this side and the peer's of the same step.
func (p *Proposer) mixtureArgmax(d, peer *Draft) int32 {
	if p.side == Device {
		return newPair(d, peer, p.confidence).mixtureArgmax()
	}
	return newPair(peer, d, p.confidence).mixtureArgmax()
}

// WireDraft is a draft as it arrives from the peer.
type WireDraft struct {
	Side    Side
	Step    uint64
	Epoch   uint32
	Token   int32
	Payload []byte
	LogMass float64
	Meta    Meta
	// Fork is Draft.WireFork: 0 for the main chain, s+1 for the branch
	// forked at step s.
	Fork uint64
	// Hedge is the hedged token when Hedged (Draft.Hedge).
	Hedge  int32
	Hedged bool
}

// DecodeDraft rebuilds a peer's draft from its wire form. A payload the
// codec refuses, a token outside its own distribution or a malformed
// relevance mass is a protocol violation.
func DecodeDraft(dec *codec.Decoder, w WireDraft) (Draft, error) {
	if !w.Side.Valid() {
		return Draft{}, fmt.Errorf("%w: draft from unknown side %v", ErrProtocol, w.Side)
	}
	if math.IsNaN(w.LogMass) || math.IsInf(w.LogMass, 1) {
		return Draft{}, fmt.Errorf("%w: %v draft for step %d has relevance mass %v", ErrProtocol, w.Side, w.Step, w.LogMass)
	}
	d := Draft{side: w.Side, step: w.Step, epoch: w.Epoch, token: w.Token, logMass: w.LogMass, payload: w.Payload, Meta: w.Meta,
		fork: w.Fork, origin: origin{epoch: w.Epoch, fork: w.Fork}}
	if err := dec.Decode(w.Payload, &d.dist); err != nil {
		return Draft{}, fmt.Errorf("%w: %v draft for step %d: %w", ErrProtocol, w.Side, w.Step, err)
	}
	if d.dist.Prob(w.Token) <= 0 {
		return Draft{}, fmt.Errorf("%w: %v draft for step %d: token %d is outside the distribution it was drawn from", ErrProtocol, w.Side, w.Step, w.Token)
	}
	if f, ok := d.Fork(); ok && w.Step <= f {
		return Draft{}, fmt.Errorf("%w: %v draft for step %d on a branch forked at step %d", ErrProtocol, w.Side, w.Step, f)
	}
	if w.Hedged {
		if err := checkHedge(&d, w.Hedge); err != nil {
			return Draft{}, fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		d.hedge, d.hedged = w.Hedge, true
	}
	return d, nil
}

// argmax is the most probable token, the lowest id on ties.
func argmax(s *codec.Sparse) int32 {
	best := 0
	for i, p := range s.Probs {
		if p > s.Probs[best] {
			best = i
		}
	}
	return s.Tokens[best]
}

// secondChoice is the most probable token of s other than tok (-1 when s
// has no other), the lowest id on ties.
func secondChoice(s *codec.Sparse, tok int32) int32 {
	best, bestP := int32(-1), float32(-1)
	for i, p := range s.Probs {
		if s.Tokens[i] != tok && p > bestP {
			best, bestP = s.Tokens[i], p
		}
	}
	return best
}

// drawU is the inverse-CDF sample of s at u.
func drawU(s *codec.Sparse, u float64) int32 {
	var total float64
	for _, p := range s.Probs {
		total += float64(p)
	}
	target := u * total
	var cum float64
	for i, p := range s.Probs {
		cum += float64(p)
		if target < cum {
			return s.Tokens[i]
		}
	}
	return s.Tokens[len(s.Tokens)-1]
}
