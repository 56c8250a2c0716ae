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
	Rollback struct {
		Step   uint64
		Target int32
		Epoch  uint32
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
	stats Stats
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

// admit sorts a draft of side, for this Node to decide, into current (true),
// stale (false) or a protocol violation.
func (n *Node) admit(side Side, d *Draft) (bool, error) {
	s := &n.sides[side.Index()]
	switch {
	case d.side != side:
		return false, fmt.Errorf("%w: %v arrived as a %v draft", ErrProtocol, d, side)
	case d.epoch < s.epoch:
		s.stats.Stale++
		return false, nil
	case d.epoch > s.epoch:
		return false, fmt.Errorf("%w: %v is ahead of the current epoch %d", ErrProtocol, d, s.epoch)
	case d.step != s.expect:
		return false, fmt.Errorf("%w: %v, but the side's next draft is step %d", ErrProtocol, d, s.expect)
	}
	s.expect++
	s.stats.Admitted++
	return true, nil
}

func (n *Node) stepDrafts(side Side, drafts []Draft) ([]Action, error) {
	if side != n.cfg.Self && !n.aggregating {
		if err := n.shadow(drafts); err != nil {
			return nil, err
		}
		return n.follow(), nil
	}
	s := &n.sides[side.Index()]
	var fresh []Draft
	for i := range drafts {
		ok, err := n.admit(side, &drafts[i])
		if err != nil {
			return nil, err
		}
		if ok {
			s.queue = append(s.queue, drafts[i])
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
		// The fresh drafts still undecided: the tail of the queue (a
		// rejection emptied it).
		if left := s.queue[max(0, len(s.queue)-len(fresh)):]; len(left) > 0 {
			acts = append(acts, SendDrafts{Drafts: slices.Clone(left)})
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
		if n.cfg.Share && d.epoch == s.epoch && d.step == n.next+uint64(len(s.queue)) {
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
		if v.Accept[i] {
			st.stats.Accepted++
			st.queue = st.queue[1:]
		} else {
			st.stats.Rejected++
			st.epoch++
			st.expect = n.next + 1
			st.queue = st.queue[:0]
			if side == n.cfg.Self {
				rollback = Rollback{Step: n.next, Target: target, Epoch: st.epoch}
			}
		}
		v.NextEpoch[i] = st.epoch
	}
	n.advance(target)
	return v, rollback
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
		return nil, nil // steps decided past the end
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
		var rollback Action
		if v.Accept[i] {
			me.queue = me.queue[1:]
		} else {
			me.queue = me.queue[:0]
			me.expect = v.Step + 1
			rollback = Rollback{Step: v.Step, Target: v.Target, Epoch: v.NextEpoch[i]}
		}
		if peer := &n.sides[self.Other().Index()]; v.Accept[1-i] && len(peer.queue) > 0 && peer.queue[0].step == v.Step {
			peer.queue = peer.queue[1:]
		} else {
			peer.queue = peer.queue[:0]
		}
		for j := range n.sides {
			st := &n.sides[j]
			st.epoch = v.NextEpoch[j]
			if v.Accept[j] {
				st.stats.Accepted++
			} else {
				st.stats.Rejected++
			}
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
	if v.Target != u.Target || v.Accept != u.Accept || v.Epoch != u.Epoch || v.NextEpoch != u.NextEpoch {
		return fmt.Errorf("%w: verdict for step %d (target %d, accept %v, epochs %v to %v) contradicts this side's own decision (target %d, accept %v, epochs %v to %v)",
			ErrProtocol, v.Step, v.Target, v.Accept, v.Epoch, v.NextEpoch, u.Target, u.Accept, u.Epoch, u.NextEpoch)
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
	}
	peer := &n.sides[other]
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
	if !n.aggregating || n.done {
		return nil
	}
	self, other := n.cfg.Self.Index(), n.cfg.Self.Other().Index()
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
