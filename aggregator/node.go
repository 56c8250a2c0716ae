package aggregator

import (
	"fmt"
	"math"
	"slices"
)

// Config configures one side's Node.
type Config struct {
	// Self is the side this Node runs on.
	Self Side
	// Aggregator is the side that aggregates first.
	Aggregator Side
	// Greedy decides each step by the argmax of the mixture instead of
	// Algorithm 1's sampling.
	Greedy bool
	// Seed keys Algorithm 1's uniforms; both sides must use the same.
	Seed uint64
	// MaxSteps ends the generation after that many target tokens (0: no
	// bound).
	MaxSteps uint64
	// IsEnd reports whether a target token ends the generation (end of
	// generation); nil: none does.
	IsEnd func(tok int32) bool
	// Confidence > 0 weighs each step's drafts by confidence too: a side's
	// h̃ is lowered by its view's entropy over Confidence (a temperature in
	// nats) before the two are weighed (newPair). 0: DRAGON's weights.
	// Both sides must agree.
	Confidence float64
	// Share has the aggregating side send its own undecided drafts too, so
	// that the other side keeps the aggregator's chain as well and each
	// side sees the peer's drafts (PeerDrafts) whoever aggregates: for
	// greedy drafts beside them (Proposer.ProposeBeside), and so that the
	// side that does not aggregate decides every step it holds both drafts
	// of itself, by the aggregator's rule, instead of waiting a round trip
	// for the verdict (which must then agree). Both sides must agree.
	Share bool
	// Hedges is the most hedges (Draft.WithHedge) a side may have open at
	// once, HedgeDepth the most drafts of each one's branch; 0 turns
	// hedging off, and a peer that hedges anyway breaks the protocol.
	// Hedging needs Share: both Nodes then know both sides' hedges, so
	// they agree on whether a rejection landed on one. Both sides must
	// agree.
	Hedges, HedgeDepth int
}

func (c Config) validate() error {
	if !c.Self.Valid() {
		return fmt.Errorf("aggregator: config: unknown side %v", c.Self)
	}
	if !c.Aggregator.Valid() {
		return fmt.Errorf("aggregator: config: unknown aggregator side %v", c.Aggregator)
	}
	if !ValidConfidence(c.Confidence) {
		return fmt.Errorf("aggregator: config: confidence temperature %v: want 0 (off) or a positive number", c.Confidence)
	}
	switch {
	case c.Hedges < 0 || c.HedgeDepth < 0:
		return fmt.Errorf("aggregator: config: %d hedges of depth %d", c.Hedges, c.HedgeDepth)
	case c.Hedges > 0 && (c.HedgeDepth == 0 || !c.Share):
		return fmt.Errorf("aggregator: config: hedges need a branch depth and shared drafts")
	}
	return nil
}

// ValidConfidence reports whether tau is a confidence temperature
// (Config.Confidence): 0 (off) or a positive finite number.
func ValidConfidence(tau float64) bool { return tau >= 0 && !math.IsInf(tau, 1) }

// Verdict is the decision on one step (Algorithm 1's outputs), which the
// aggregating side sends to the other.
type Verdict struct {
	Step   uint64
	Target int32
	// Accept says whether each side's draft (by Side.index) equals the
	// target.
	Accept [2]bool
	// Epoch is the epoch of each side's draft that this verdict decided.
	Epoch [2]uint32
	// NextEpoch is each side's epoch from Step+1 on: Epoch on accept, a
	// larger one on reject (that side rolls back to Target).
	NextEpoch [2]uint32
	// Expected is Eq. (5)'s acceptance estimate for each side's draft.
	Expected [2]float64
	// Moved is each draft's Meta.Moved: an accepted moved draft is a
	// rejection of the side's own argmax as far as the profiler goes.
	Moved [2]bool
	// Hedged says, for a rejected draft, that the target is the token the
	// side hedged at this step: the side adopts that branch (its drafts
	// become the new epoch's) instead of drafting anew from the target.
	Hedged [2]bool
}

// Accepted reports whether side's draft was accepted.
func (v Verdict) Accepted(side Side) bool { return v.Accept[side.Index()] }

// Handover moves the aggregator to the receiver between two steps.
type Handover struct {
	// NextStep is the first step not yet decided.
	NextStep uint64
	// Epochs of both sides, by Side.index.
	Epochs [2]uint32
	// Queue is the sender's own drafts not yet decided, in step order; the
	// receiver keeps its own.
	Queue []Draft
}

// Events a Node takes.
type (
	// Event is the input of Step.
	Event interface{ isEvent() }
	// LocalDrafts are drafts this side produced, in step order (a burst
	// from one forward pass of local speculative decoding, or one).
	LocalDrafts struct{ Drafts []Draft }
	// RemoteDrafts arrived from the peer.
	RemoteDrafts struct{ Drafts []Draft }
	// RemoteVerdicts arrived from the aggregating peer, in step order.
	RemoteVerdicts struct{ Verdicts []Verdict }
	// RemoteHandover makes this side the aggregator.
	RemoteHandover struct{ Handover Handover }
	// SwitchRequest asks the aggregating Node to hand the role over after
	// the steps it has decided (the scheduler's choice); ignored when this
	// side does not aggregate.
	SwitchRequest struct{}
	// Finish ends the generation: no further step is decided (a stop
	// string matched, the client went away).
	Finish struct{}
)

func (LocalDrafts) isEvent()    {}
func (RemoteDrafts) isEvent()   {}
func (RemoteVerdicts) isEvent() {}
func (RemoteHandover) isEvent() {}
func (SwitchRequest) isEvent()  {}
func (Finish) isEvent()         {}

// Actions a Node asks its session to carry out, in order.
type (
	// Action is an output of Step.
	Action interface{ isAction() }
	// SendDrafts: forward this side's drafts to the aggregating peer.
	SendDrafts struct{ Drafts []Draft }
	// SendVerdicts: tell the peer the steps just decided.
	SendVerdicts struct{ Verdicts []Verdict }
	// SendHandover: the peer aggregates from now on.
	SendHandover struct{ Handover Handover }
	// Decided: the target token of one step, in step order, on both sides.
	Decided struct{ Verdict Verdict }
	// Rollback follows the Decided of a step that rejected this side's
	// draft: continue from the decided answer (Target at Step) and draft
	// Step+1 on under Epoch; anything computed on the old prefix is stale.
	// Hedged: Target is the token this side hedged at Step, and its
	// branch is now the main chain: keep it, and draft on from the end of
	// the branch under Epoch (drafts of the branch still in flight count
	// as Epoch's).
	Rollback struct {
		Step   uint64
		Target int32
		Epoch  uint32
		Hedged bool
	}
	// Done: the generation is over after Steps target tokens (an end token
	// or MaxSteps).
	Done struct{ Steps uint64 }
)

func (SendDrafts) isAction()   {}
func (SendVerdicts) isAction() {}
func (SendHandover) isAction() {}
func (Decided) isAction()      {}
func (Rollback) isAction()     {}
func (Done) isAction()         {}

// Stats are a side's draft counters as this Node saw them.
type Stats struct {
	// Drafts admitted (current epoch) and decided.
	Admitted, Accepted, Rejected uint64
	// Stale drafts carried an epoch older than the side's current one and
	// were dropped; late ones reached this Node after it handed the
	// aggregator over (their side still holds them) or, shared, did not
	// extend the peer's chain.
	Stale, Late uint64
	// SecondChoice counts rejections, decided on this Node, whose target
	// was the rejected side's second most probable token: those a hedge
	// (the side's runner-up, decoded ahead) would have caught.
	SecondChoice uint64
	// LowProb[i] counts decided drafts whose own probability was below
	// HedgeThresholds[i], and LowProbCaught[i] the SecondChoice rejections
	// among them: a side that hedged only such steps would hedge
	// LowProb / (Accepted + Rejected) of its steps and catch
	// LowProbCaught / Rejected of its rejections.
	LowProb, LowProbCaught [len(HedgeThresholds)]uint64
	// Hedges counts hedges declared (Draft.WithHedge), HedgeHits the
	// rejections whose target was the side's hedge: each adopted a branch
	// instead of rolling back.
	Hedges, HedgeHits uint64
}

// HedgeThresholds are the draft probabilities Stats.LowProb is counted
// below.
var HedgeThresholds = [...]float32{0.2, 0.3, 0.5, 0.7}

// sideState is what a Node knows of one side's drafts.
type sideState struct {
	epoch uint32
	// expect is the step the side's next draft of this epoch must carry.
	expect uint64
	// queue holds undecided drafts of the current epoch in step order: both
	// sides' on the aggregating Node, only its own on the other unless
	// drafts are shared (Config.Share). A non-empty queue starts at the
	// first undecided step.
	queue []Draft
	// hedges are the side's open hedges, all of the current epoch, in
	// step order from NextStep on.
	hedges []hedge
	// adopted is the branch the current epoch began from, if it did: that
	// branch's drafts, still arriving, are the epoch's main chain.
	adopted adoption
	stats   Stats
}

// hedge is an open hedge of a side: at step fork it decodes token too, and
// queue holds the drafts of that branch that arrived, in step order.
type hedge struct {
	fork   uint64
	token  int32
	expect uint64
	queue  []Draft
}

// adoption is a branch that became a side's main chain: drafts of the
// branch forked at fork under epoch from are epoch to's.
type adoption struct {
	ok       bool
	from, to uint32
	fork     uint64
}

// hedgeAt is the side's open hedge at step fork, or nil.
func (s *sideState) hedgeAt(fork uint64) *hedge {
	for i := range s.hedges {
		if s.hedges[i].fork == fork {
			return &s.hedges[i]
		}
	}
	return nil
}

// adopts reports whether d is a draft of the branch the side's current
// epoch adopted.
func (s *sideState) adopts(d *Draft) bool {
	f, ok := d.Fork()
	return ok && s.adopted.ok && s.adopted.to == s.epoch && d.epoch == s.adopted.from && f == s.adopted.fork
}

// asMain is a draft of the adopted branch relabelled as the current
// epoch's main chain.
func (s *sideState) asMain(d Draft) Draft {
	d.epoch, d.fork = s.epoch, 0
	return d
}

// Node is one side's view of a generation. It is not safe for concurrent
// use: one goroutine feeds it events and carries out its actions.
type Node struct {
	cfg         Config
	aggregating bool
	next        uint64 // first undecided step
	sides       [2]sideState
	done        bool
	handovers   uint64
	// early counts the steps follow decided.
	early uint64
	// unconfirmed are the steps this Node decided while not aggregating
	// (Config.Share) whose verdicts have not arrived yet, in step order,
	// ending at next.
	unconfirmed []Verdict
	// rule decides a step; tests replace it with broken rules to check that
	// the exactness test can fail.
	rule func(p pair, greedy bool, seed, step uint64) int32
}

// New returns the Node of cfg.Self at step 0, epochs 0.
func New(cfg Config) (*Node, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Node{cfg: cfg, aggregating: cfg.Self == cfg.Aggregator, rule: pair.target}, nil
}

// Aggregating reports whether this side holds the aggregator now.
func (n *Node) Aggregating() bool { return n.aggregating }

// NextStep is the first step not yet decided.
func (n *Node) NextStep() uint64 { return n.next }

// Epoch is side's current epoch as this Node knows it.
func (n *Node) Epoch(side Side) uint32 { return n.sides[side.Index()].epoch }

// Stats are side's draft counters.
func (n *Node) Stats(side Side) Stats { return n.sides[side.Index()].stats }

// Handovers is how many times this Node handed the aggregator over or took
// it.
func (n *Node) Handovers() uint64 { return n.handovers }

// PeerDrafts are the peer's undecided drafts of its current epoch that
// reached this side, in step order from NextStep, each drafted on the
// decided answer followed by the ones before it; empty on the side that
// does not aggregate unless drafts are shared (Config.Share). The slice is
// the caller's.
func (n *Node) PeerDrafts() []Draft {
	return slices.Clone(n.sides[n.cfg.Self.Other().Index()].queue)
}

// Early is how many steps this Node decided without aggregating, on both
// drafts shared with it, before their verdicts came (Config.Share).
func (n *Node) Early() uint64 { return n.early }

// Done reports whether the generation is over.
func (n *Node) Done() bool { return n.done }

// Step applies one event and returns what to do. An error wrapping
// ErrProtocol means the peer (or the local producer) broke the protocol;
// the Node must not be used afterwards.
func (n *Node) Step(ev Event) ([]Action, error) {
	switch ev := ev.(type) {
	case LocalDrafts:
		return n.stepDrafts(n.cfg.Self, ev.Drafts)
	case RemoteDrafts:
		return n.stepDrafts(n.cfg.Self.Other(), ev.Drafts)
	case RemoteVerdicts:
		return n.stepVerdicts(ev.Verdicts)
	case RemoteHandover:
		return n.stepHandover(ev.Handover)
	case SwitchRequest:
		return n.stepSwitch(), nil
	case Finish:
		n.done = true
		return nil, nil
	}
	return nil, fmt.Errorf("aggregator: unknown event %T", ev)
}

// take sorts a draft of side, for this Node to decide, into kept (the
// side's queue, or an open hedge's branch), stale (false) or a protocol
// violation.
func (n *Node) take(side Side, d *Draft) (bool, error) {
	s := &n.sides[side.Index()]
	if d.side != side {
		return false, fmt.Errorf("%w: %v arrived as a %v draft", ErrProtocol, d, side)
	}
	if err := n.checkShape(d); err != nil {
		return false, err
	}
	fork, branch := d.Fork()
	adopted := s.adopts(d)
	switch {
	case d.epoch > s.epoch:
		return false, fmt.Errorf("%w: %v is ahead of the current epoch %d", ErrProtocol, d, s.epoch)
	case branch && !adopted && d.epoch == s.epoch:
		return n.takeBranch(s, d, fork)
	case d.epoch < s.epoch && !adopted:
		s.stats.Stale++
		return false, nil
	case d.step != s.expect:
		return false, fmt.Errorf("%w: %v, but the side's next draft is step %d", ErrProtocol, d, s.expect)
	}
	if tok, ok := d.Hedge(); ok {
		if len(s.hedges) >= n.cfg.Hedges {
			return false, fmt.Errorf("%w: %v opens a hedge beyond the %d the side may have open", ErrProtocol, d, n.cfg.Hedges)
		}
		s.hedges = append(s.hedges, hedge{fork: d.step, token: tok, expect: d.step + 1})
		s.stats.Hedges++
	}
	s.expect++
	s.stats.Admitted++
	if adopted {
		s.queue = append(s.queue, s.asMain(*d))
	} else {
		s.queue = append(s.queue, *d)
	}
	return true, nil
}

// takeBranch keeps a draft of the current epoch's hedge branch forked at
// fork.
func (n *Node) takeBranch(s *sideState, d *Draft, fork uint64) (bool, error) {
	h := s.hedgeAt(fork)
	switch {
	case h == nil && fork < n.next:
		// The step was decided on the main chain's draft: the branch died.
		s.stats.Stale++
		return false, nil
	case h == nil:
		return false, fmt.Errorf("%w: %v, but the side hedged no token at step %d", ErrProtocol, d, fork)
	case d.step != h.expect:
		return false, fmt.Errorf("%w: %v, but the branch's next draft is step %d", ErrProtocol, d, h.expect)
	}
	h.expect++
	h.queue = append(h.queue, *d)
	return true, nil
}

// checkShape refuses hedges and branch drafts the configuration does not
// allow.
func (n *Node) checkShape(d *Draft) error {
	fork, branch := d.Fork()
	_, hedged := d.Hedge()
	switch {
	case (branch || hedged) && n.cfg.Hedges == 0:
		return fmt.Errorf("%w: %v hedges, which this session did not negotiate", ErrProtocol, d)
	case branch && hedged:
		return fmt.Errorf("%w: %v hedges on a branch", ErrProtocol, d)
	case branch && (d.step <= fork || d.step-fork > uint64(n.cfg.HedgeDepth)):
		return fmt.Errorf("%w: %v is beyond the branch depth of %d", ErrProtocol, d, n.cfg.HedgeDepth)
	}
	return nil
}

// pending reports whether a draft this Node kept is still undecided: on
// the queue of side's chain or an open hedge's branch.
func (n *Node) pending(side Side, d *Draft) bool {
	s := &n.sides[side.Index()]
	if fork, ok := d.Fork(); ok && !s.adopts(d) {
		return d.epoch == s.epoch && s.hedgeAt(fork) != nil
	}
	return (d.epoch == s.epoch || s.adopts(d)) && d.step >= n.next
}

func (n *Node) stepDrafts(side Side, drafts []Draft) ([]Action, error) {
	if side != n.cfg.Self && !n.aggregating {
		if err := n.shadow(drafts); err != nil {
			return nil, err
		}
		return n.follow(), nil
	}
	var fresh []Draft
	for i := range drafts {
		ok, err := n.take(side, &drafts[i])
		if err != nil {
			return nil, err
		}
		if ok {
			fresh = append(fresh, drafts[i])
		}
	}
	if n.done {
		return nil, nil
	}
	if !n.aggregating {
		var acts []Action
		if len(fresh) > 0 {
			acts = append(acts, SendDrafts{Drafts: fresh})
		}
		return append(acts, n.follow()...), nil
	}
	acts := n.decide()
	if side == n.cfg.Self && n.cfg.Share && !n.done {
		// The peer needs the fresh drafts still undecided, as they were
		// made (a branch's drafts keep their branch, for the peer to map).
		var left []Draft
		for i := range fresh {
			if n.pending(side, &fresh[i]) {
				left = append(left, fresh[i])
			}
		}
		if len(left) > 0 {
			acts = append(acts, SendDrafts{Drafts: left})
		}
	}
	return acts, nil
}

// shadow keeps the aggregating peer's shared drafts that extend its chain
// under its current epoch; the rest (stale, or sent before a handover) are
// late. They are a view for drafting beside, never decided here.
func (n *Node) shadow(drafts []Draft) error {
	other := n.cfg.Self.Other()
	s := &n.sides[other.Index()]
	for i := range drafts {
		d := &drafts[i]
		if d.side != other {
			return fmt.Errorf("%w: %v arrived as a %v draft", ErrProtocol, d, other)
		}
		if err := n.checkShape(d); err != nil {
			return err
		}
		extends := d.step == n.next+uint64(len(s.queue))
		fork, branch := d.Fork()
		switch {
		case !n.cfg.Share:
		case s.adopts(d) && extends:
			s.queue = append(s.queue, s.asMain(*d))
			continue
		case branch && d.epoch == s.epoch:
			if h := s.hedgeAt(fork); h != nil && d.step == h.expect {
				h.expect++
				h.queue = append(h.queue, *d)
				continue
			}
		case !branch && d.epoch == s.epoch && extends:
			if tok, ok := d.Hedge(); ok && len(s.hedges) < n.cfg.Hedges {
				s.hedges = append(s.hedges, hedge{fork: d.step, token: tok, expect: d.step + 1})
			}
			s.queue = append(s.queue, *d)
			continue
		}
		s.stats.Late++
	}
	return nil
}

// decide runs Algorithm 1 on every step both queues have a draft for.
func (n *Node) decide() []Action {
	var acts []Action
	var sent []Verdict
	for n.ready() {
		v, rollback := n.decideNext(true)
		sent = append(sent, v)
		acts = append(acts, Decided{Verdict: v})
		if rollback != nil {
			acts = append(acts, rollback)
		}
	}
	if len(sent) > 0 {
		acts = append([]Action{SendVerdicts{Verdicts: sent}}, acts...)
	}
	if n.done {
		acts = append(acts, Done{Steps: n.next})
	}
	return acts
}

// follow decides, on the side that does not aggregate, every step for
// which it holds its own draft and the aggregator's shared one. The rule
// and its inputs are the aggregator's, so this is the verdict the
// aggregator sends: a draft of this side that it rejects is rolled back
// as soon as the aggregator's draft of the step arrives, a round trip
// before the verdict would have come back. The verdicts confirm these
// steps (stepVerdicts) or, after a handover, this side sends them.
func (n *Node) follow() []Action {
	if !n.cfg.Share || n.aggregating {
		return nil
	}
	var acts []Action
	for n.ready() {
		v, rollback := n.decideNext(false)
		n.early++
		n.unconfirmed = append(n.unconfirmed, v)
		acts = append(acts, Decided{Verdict: v})
		if rollback != nil {
			acts = append(acts, rollback)
		}
		if n.done {
			acts = append(acts, Done{Steps: n.next})
		}
	}
	return acts
}

// ready reports whether the next step can be decided here: both queues
// hold a draft of it.
func (n *Node) ready() bool {
	return !n.done && len(n.sides[Device.Index()].queue) > 0 && len(n.sides[Cloud.Index()].queue) > 0
}

// decideNext decides step next from the heads of both queues, applies it
// (epochs, queues, counters; hedge counters where counted, on the
// aggregating Node) and returns the verdict and this side's rollback, if
// its draft was rejected.
func (n *Node) decideNext(countHedges bool) (Verdict, Action) {
	dev, cld := &n.sides[Device.Index()], &n.sides[Cloud.Index()]
	p := newPair(&dev.queue[0], &cld.queue[0], n.cfg.Confidence)
	target := n.rule(p, n.cfg.Greedy, n.cfg.Seed, n.next)
	v := Verdict{Step: n.next, Target: target, Expected: p.expectedAcceptance(n.cfg.Greedy)}
	var rollback Action
	for i, side := range Sides {
		st := &n.sides[i]
		v.Epoch[i] = st.epoch
		v.Accept[i] = p.draft[i].token == target
		v.Moved[i] = p.draft[i].Meta.Moved
		if countHedges {
			caught := !v.Accept[i] && secondChoice(&p.draft[i].dist, p.draft[i].token) == target
			prob := p.draft[i].dist.Prob(p.draft[i].token)
			for k, t := range HedgeThresholds {
				if prob < t {
					st.stats.LowProb[k]++
					if caught {
						st.stats.LowProbCaught[k]++
					}
				}
			}
			if caught {
				st.stats.SecondChoice++
			}
		}
		next := st.epoch
		if v.Accept[i] {
			st.stats.Accepted++
		} else {
			st.stats.Rejected++
			next++
			h := st.hedgeAt(n.next)
			v.Hedged[i] = h != nil && h.token == target
			if side == n.cfg.Self {
				rollback = Rollback{Step: n.next, Target: target, Epoch: next, Hedged: v.Hedged[i]}
			}
		}
		st.settle(n.next, v.Accept[i], v.Hedged[i], next)
		v.NextEpoch[i] = st.epoch
	}
	n.advance(target)
	return v, rollback
}

// settle applies the decision of step to the side's state: an accepted
// draft leaves the queue, and the hedge at step, if any, dies; a rejected
// one moves the side to epoch next, on the branch of its hedge at step
// when hedged, else from nothing. The side's queue and hedges need not
// be complete (a shadow of the peer's chain): what is missing stays
// missing.
func (s *sideState) settle(step uint64, accept, hedged bool, next uint32) {
	if accept {
		if len(s.queue) > 0 && s.queue[0].step == step {
			s.queue = s.queue[1:]
		} else {
			s.queue = s.queue[:0]
		}
		if len(s.hedges) > 0 && s.hedges[0].fork == step {
			s.hedges = s.hedges[1:]
		}
		return
	}
	h := s.hedgeAt(step)
	from := s.epoch
	s.epoch, s.queue, s.expect, s.adopted = next, s.queue[:0], step+1, adoption{}
	if hedged {
		s.stats.HedgeHits++
		s.adopted = adoption{ok: true, from: from, to: next, fork: step}
		if h != nil {
			for _, d := range h.queue {
				s.queue = append(s.queue, s.asMain(d))
			}
			s.expect = h.expect
		}
	}
	s.hedges = nil
}

// advance moves past a decided step and notes the end of the generation.
func (n *Node) advance(target int32) {
	n.next++
	if (n.cfg.IsEnd != nil && n.cfg.IsEnd(target)) || (n.cfg.MaxSteps > 0 && n.next >= n.cfg.MaxSteps) {
		n.done = true
	}
}

func (n *Node) stepVerdicts(vs []Verdict) ([]Action, error) {
	if n.aggregating {
		return nil, fmt.Errorf("%w: verdicts from the peer while this side aggregates", ErrProtocol)
	}
	if n.done {
		// Steps decided past the end are ignored, but the verdicts of steps
		// this side decided itself still confirm them: a handover that
		// follows names the first step the peer did not decide.
		for _, v := range vs {
			if len(n.unconfirmed) > 0 && v.Step == n.unconfirmed[0].Step {
				if err := n.confirm(v); err != nil {
					return nil, err
				}
			}
		}
		return nil, nil
	}
	var acts []Action
	self := n.cfg.Self
	me := &n.sides[self.Index()]
	for _, v := range vs {
		if n.done {
			break // steps decided past the end, in the same batch
		}
		if len(n.unconfirmed) > 0 {
			if err := n.confirm(v); err != nil {
				return nil, err
			}
			continue
		}
		if v.Step != n.next {
			return nil, fmt.Errorf("%w: verdict for step %d, expected step %d", ErrProtocol, v.Step, n.next)
		}
		for _, side := range Sides {
			if err := n.checkVerdictEpochs(v, side); err != nil {
				return nil, err
			}
		}
		i := self.Index()
		if len(me.queue) == 0 || me.queue[0].step != v.Step {
			return nil, fmt.Errorf("%w: verdict for step %d, for which this side sent no draft", ErrProtocol, v.Step)
		}
		if v.Accept[i] != (me.queue[0].token == v.Target) {
			return nil, fmt.Errorf("%w: verdict for step %d contradicts the draft it decided", ErrProtocol, v.Step)
		}
		if h := me.hedgeAt(v.Step); v.Hedged[i] != (!v.Accept[i] && h != nil && h.token == v.Target) {
			return nil, fmt.Errorf("%w: verdict for step %d says hedged %v of this side's draft, which hedged %v", ErrProtocol, v.Step, v.Hedged[i], h != nil)
		}
		if v.Hedged[1-i] && v.Accept[1-i] {
			return nil, fmt.Errorf("%w: verdict for step %d accepts the peer's draft and adopts its hedge", ErrProtocol, v.Step)
		}
		var rollback Action
		if !v.Accept[i] {
			rollback = Rollback{Step: v.Step, Target: v.Target, Epoch: v.NextEpoch[i], Hedged: v.Hedged[i]}
		}
		for j := range n.sides {
			st := &n.sides[j]
			if v.Accept[j] {
				st.stats.Accepted++
			} else {
				st.stats.Rejected++
			}
			st.settle(v.Step, v.Accept[j], v.Hedged[j], v.NextEpoch[j])
		}
		acts = append(acts, Decided{Verdict: v})
		if rollback != nil {
			acts = append(acts, rollback)
		}
		n.advance(v.Target)
	}
	if n.done {
		acts = append(acts, Done{Steps: n.next})
		return acts, nil
	}
	return append(acts, n.follow()...), nil
}

// confirm checks the aggregator's verdict on a step this side decided
// itself: the two must agree on everything the rule decided.
func (n *Node) confirm(v Verdict) error {
	u := n.unconfirmed[0]
	if v.Step != u.Step {
		return fmt.Errorf("%w: verdict for step %d, expected step %d", ErrProtocol, v.Step, u.Step)
	}
	if v.Target != u.Target || v.Accept != u.Accept || v.Epoch != u.Epoch || v.NextEpoch != u.NextEpoch || v.Hedged != u.Hedged {
		return fmt.Errorf("%w: verdict for step %d (target %d, accept %v, hedged %v, epochs %v to %v) contradicts this side's own decision (target %d, accept %v, hedged %v, epochs %v to %v)",
			ErrProtocol, v.Step, v.Target, v.Accept, v.Hedged, v.Epoch, v.NextEpoch, u.Target, u.Accept, u.Hedged, u.Epoch, u.NextEpoch)
	}
	n.unconfirmed = n.unconfirmed[1:]
	return nil
}

// checkVerdictEpochs checks a verdict against side's epoch as this Node
// knows it: every epoch change reaches the other side through verdicts, so
// the two must agree, and an epoch moves exactly on a rejection.
func (n *Node) checkVerdictEpochs(v Verdict, side Side) error {
	i := side.Index()
	switch cur := n.sides[i].epoch; {
	case v.Epoch[i] != cur:
		return fmt.Errorf("%w: verdict for step %d decided a %v draft of epoch %d, current is %d", ErrProtocol, v.Step, side, v.Epoch[i], cur)
	case v.Accept[i] && v.NextEpoch[i] != cur:
		return fmt.Errorf("%w: verdict for step %d accepts the %v draft but changes its epoch", ErrProtocol, v.Step, side)
	case !v.Accept[i] && v.NextEpoch[i] <= cur:
		return fmt.Errorf("%w: verdict for step %d rejects the %v draft without a new epoch", ErrProtocol, v.Step, side)
	}
	return nil
}

func (n *Node) stepHandover(h Handover) ([]Action, error) {
	if n.aggregating {
		return nil, fmt.Errorf("%w: handover to a side that already aggregates", ErrProtocol)
	}
	// Every verdict the peer sent came before its handover, so the steps
	// this side decided itself and the peer did not are exactly those from
	// h.NextStep on; their epochs are the handover's.
	at := n.next
	self, other := n.cfg.Self.Index(), n.cfg.Self.Other().Index()
	epochs := [2]uint32{n.sides[0].epoch, n.sides[1].epoch}
	if len(n.unconfirmed) > 0 {
		at, epochs = n.unconfirmed[0].Step, n.unconfirmed[0].Epoch
	}
	if h.NextStep != at {
		return nil, fmt.Errorf("%w: handover at step %d, but this side has decided up to step %d", ErrProtocol, h.NextStep, at)
	}
	if h.Epochs[self] != epochs[self] {
		return nil, fmt.Errorf("%w: handover gives this side epoch %d, current is %d", ErrProtocol, h.Epochs[self], epochs[self])
	}
	if len(n.unconfirmed) > 0 && h.Epochs[other] != epochs[other] {
		return nil, fmt.Errorf("%w: handover gives the peer epoch %d, this side decided step %d with its epoch %d", ErrProtocol, h.Epochs[other], at, epochs[other])
	}
	for i, d := range h.Queue {
		if d.side != n.cfg.Self.Other() || d.epoch != h.Epochs[other] || d.step != h.NextStep+uint64(i) {
			return nil, fmt.Errorf("%w: handover queue entry %d is %v, want %v step %d epoch %d",
				ErrProtocol, i, &d, n.cfg.Self.Other(), h.NextStep+uint64(i), h.Epochs[other])
		}
		_, branch := d.Fork()
		if _, hedged := d.Hedge(); branch || hedged {
			// A side hands the aggregator over only with no hedge of its
			// own open (stepSwitch).
			return nil, fmt.Errorf("%w: handover queue entry %d is %v, which hedges", ErrProtocol, i, &d)
		}
	}
	peer := &n.sides[other]
	peer.hedges = nil
	switch {
	case len(n.unconfirmed) == 0:
		peer.epoch = h.Epochs[other]
		peer.expect = h.NextStep + uint64(len(h.Queue))
		peer.queue = append(peer.queue[:0], h.Queue...)
	case peer.epoch == h.Epochs[other]:
		// This side decided steps h.NextStep.. on the peer's shared drafts,
		// which the queue holds too: keep the rest of its chain.
		decided := int(n.next - h.NextStep)
		if decided > len(h.Queue) {
			return nil, fmt.Errorf("%w: handover queue ends at step %d, but this side decided up to step %d on the peer's drafts",
				ErrProtocol, h.NextStep+uint64(len(h.Queue)), n.next)
		}
		peer.expect = h.NextStep + uint64(len(h.Queue))
		peer.queue = append(peer.queue[:0], h.Queue[decided:]...)
	default:
		// This side rejected a draft of the peer's since: the queue is
		// stale, and the peer drafts anew from the step after it.
		peer.queue = peer.queue[:0]
	}
	if q := n.sides[self].queue; len(q) > 0 && q[0].step != n.next {
		return nil, fmt.Errorf("aggregator: internal error: own queue starts at step %d, next is %d", q[0].step, n.next)
	}
	n.aggregating = true
	n.handovers++
	var acts []Action
	if len(n.unconfirmed) > 0 {
		// The peer learns of these steps from this side now.
		acts = append(acts, SendVerdicts{Verdicts: n.unconfirmed})
		n.unconfirmed = nil
	}
	if n.done {
		return acts, nil
	}
	return append(acts, n.decide()...), nil
}

func (n *Node) stepSwitch() []Action {
	self, other := n.cfg.Self.Index(), n.cfg.Self.Other().Index()
	if !n.aggregating || n.done || len(n.sides[self].hedges) > 0 {
		// With a hedge of its own open the new aggregator would have to
		// learn its branch, which the peer may have only in part: the
		// switch waits until the hedges are decided.
		return nil
	}
	h := Handover{
		NextStep: n.next,
		Epochs:   [2]uint32{n.sides[0].epoch, n.sides[1].epoch},
		Queue:    slices.Clone(n.sides[self].queue),
	}
	// The peer keeps its own drafts; those in flight to us arrive late,
	// unless shared: then the queue goes on as the view of its chain.
	if !n.cfg.Share {
		n.sides[other].queue = n.sides[other].queue[:0]
	}
	n.aggregating = false
	n.handovers++
	return []Action{SendHandover{Handover: h}}
}
