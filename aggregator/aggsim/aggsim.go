// Package aggsim simulates Speculative Aggregation between two sides on a
// virtual clock: the real aggregator.Node on each side, the real
// Scheduler, decoders that take a given time per draft token, drafts
// accepted or rejected as a trace or an acceptance rate says, and a link
// with a given one-way latency (FIFO per direction, as a gRPC stream). A
// run of thousands of tokens takes milliseconds, so strategies can be
// compared over many runs (DRAGON §7.4) and the analysis of §5–§6 checked.
package aggsim

import (
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/profiler"
)

// Trace is what a real generation records: each side's decoding time per
// draft token and whether its drafts were accepted, by step. Replays cycle
// through it.
type Trace struct {
	DecodeMS PerSide[[]float64] `json:"decode_ms"`
	Accept   PerSide[[]bool]    `json:"accept"`
}

// PerSide holds one value per side.
type PerSide[T any] struct {
	Device T `json:"device"`
	Cloud  T `json:"cloud"`
}

// Get is side's value.
func (p *PerSide[T]) Get(s aggregator.Side) T {
	if s == aggregator.Cloud {
		return p.Cloud
	}
	return p.Device
}

// LoadTrace reads a JSON trace.
func LoadTrace(path string) (Trace, error) {
	var t Trace
	b, err := os.ReadFile(path)
	if err != nil {
		return t, fmt.Errorf("aggsim: %w", err)
	}
	if err := json.Unmarshal(b, &t); err != nil {
		return t, fmt.Errorf("aggsim: %s: %w", path, err)
	}
	for _, s := range aggregator.Sides {
		if len(t.DecodeMS.Get(s)) == 0 || len(t.Accept.Get(s)) == 0 {
			return t, fmt.Errorf("aggsim: %s: no %v decode times or acceptance flags", path, s)
		}
	}
	return t, nil
}

// Link is the one-way latency, in ms, of a message sent at time now.
type Link func(now float64) float64

// Constant is a link of fixed one-way latency.
func Constant(ms float64) Link { return func(float64) float64 { return ms } }

// Sinusoid is DRAGON §7.4's latency: base plus a sinusoidal jitter of
// amplitude amp and the given period.
func Sinusoid(base, amp, periodMS float64) Link {
	return func(now float64) float64 {
		return max(0, base+amp*math.Sin(2*math.Pi*now/periodMS))
	}
}

// Estimates says what the scheduler knows.
type Estimates uint8

const (
	// Oracle: the true mean decoding times and acceptance rates, and the
	// link's current round trip.
	Oracle Estimates = iota
	// Observed: what a profiler.Estimator learns from the run itself, as
	// a live session does.
	Observed
)

// Config is one simulated generation.
type Config struct {
	Steps int
	// Trace gives decoding times and acceptance (cycled).
	Trace Trace
	// Link of each direction (by Side.index of the sender); both the same
	// when Back is nil.
	Link, Back Link
	// Scheduler picks the aggregating side; First holds it at the start.
	Scheduler aggregator.SchedulerConfig
	First     aggregator.Side
	// Lookahead is how many undecided drafts a side may have: 1 is
	// token-wise synchronisation (DRDG/TW), a few dozen lets the sides
	// draft freely (0: 64).
	Lookahead int
	Estimates Estimates
	// Context is the context length at step 0, for the profiler's fit.
	Context float64
}

// Result summarises a run.
type Result struct {
	// PerTokenMS is the time between the first and the last target token
	// at the device, per token.
	PerTokenMS float64
	// Intervals are the times between consecutive target tokens at the
	// device.
	Intervals []float64
	Switches  int
	// Accepted is the fraction of each side's decided drafts accepted.
	Accepted [2]float64
	Stale    [2]uint64
}

type eventKind uint8

const (
	passDone eventKind = iota
	arrive
)

type event struct {
	at   float64
	seq  uint64
	kind eventKind
	side aggregator.Side // whose pass, or the receiver
	pass uint64
	ev   aggregator.Event
}

type queue []event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type producer struct {
	prop   *aggregator.Proposer
	epoch  uint32
	next   uint64 // step of the next draft
	busy   bool
	pass   uint64 // id of the pass in flight; a rollback bumps it
	start  float64
	cursor int // position in the decode trace
}

type sim struct {
	cfg      Config
	now      float64
	seq      uint64
	q        queue
	nodes    [2]*aggregator.Node
	prods    [2]*producer
	linkLast [2]float64 // arrival time of the last message on each link
	sched    *aggregator.Scheduler
	est      *profiler.Estimator
	decided  []float64 // times of the device's target tokens
	switches int
}

// Engineered distributions: token 0 is every step's target; a rejected
// draft is the side's own wrong token, which the mixture never prefers.
var dists = map[bool][2][]float32{
	true:  {{1, 0, 0}, {1, 0, 0}},
	false: {{0.4, 0.6, 0}, {0.4, 0, 0.6}},
}

// Run simulates one generation.
func Run(cfg Config) (Result, error) {
	if cfg.Steps < 2 {
		return Result{}, errors.New("aggsim: need at least 2 steps")
	}
	for _, s := range aggregator.Sides {
		if len(cfg.Trace.DecodeMS.Get(s)) == 0 || len(cfg.Trace.Accept.Get(s)) == 0 {
			return Result{}, fmt.Errorf("aggsim: no %v decode times or acceptance flags", s)
		}
	}
	if cfg.Link == nil {
		return Result{}, errors.New("aggsim: no link")
	}
	if cfg.Back == nil {
		cfg.Back = cfg.Link
	}
	if cfg.Lookahead <= 0 {
		cfg.Lookahead = 64
	}
	if !cfg.First.Valid() {
		cfg.First = aggregator.Device
	}
	sched, err := aggregator.NewScheduler(cfg.Scheduler)
	if err != nil {
		return Result{}, err
	}
	s := &sim{cfg: cfg, sched: sched, est: profiler.NewEstimator(profiler.Config{}, profiler.DecodeFit{}, profiler.DecodeFit{})}
	for i, side := range aggregator.Sides {
		n, err := aggregator.New(aggregator.Config{Self: side, Aggregator: cfg.First, Greedy: true, MaxSteps: uint64(cfg.Steps)})
		if err != nil {
			return Result{}, err
		}
		p, err := aggregator.NewProposer(side, 0, true, 1)
		if err != nil {
			return Result{}, err
		}
		s.nodes[i], s.prods[i] = n, &producer{prop: p}
	}
	for _, side := range aggregator.Sides {
		s.tryStart(side)
	}
	for len(s.decided) < cfg.Steps {
		if s.q.Len() == 0 {
			return Result{}, errors.New("aggsim: deadlock")
		}
		e := heap.Pop(&s.q).(event)
		s.now = e.at
		if err := s.handle(e); err != nil {
			return Result{}, err
		}
	}
	return s.result(), nil
}

func (s *sim) push(e event) {
	s.seq++
	e.seq = s.seq
	heap.Push(&s.q, e)
}

func (s *sim) tryStart(side aggregator.Side) {
	p := s.prods[side-1]
	n := s.nodes[side-1]
	if p.busy || p.next >= n.NextStep()+uint64(s.cfg.Lookahead) || p.next >= uint64(s.cfg.Steps) {
		return
	}
	p.busy = true
	p.pass++
	p.start = s.now
	trace := s.cfg.Trace.DecodeMS.Get(side)
	ms := trace[p.cursor%len(trace)]
	p.cursor++
	s.push(event{at: s.now + ms, kind: passDone, side: side, pass: p.pass})
}

func (s *sim) handle(e event) error {
	i := e.side - 1
	switch e.kind {
	case passDone:
		p := s.prods[i]
		if e.pass != p.pass || !p.busy {
			return nil // aborted by a rollback
		}
		p.busy = false
		flags := s.cfg.Trace.Accept.Get(e.side)
		ok := flags[int(p.next)%len(flags)]
		d, err := p.prop.Propose(dists[ok][i], p.next, p.epoch, 0)
		if err != nil {
			return err
		}
		d.Meta.DecodeMicros = uint32((s.now - p.start) * 1000)
		s.est.Decode(e.side, s.cfg.Context+float64(p.next), s.now-p.start)
		p.next++
		if err := s.step(e.side, aggregator.LocalDrafts{Drafts: []aggregator.Draft{d}}); err != nil {
			return err
		}
	case arrive:
		if err := s.step(e.side, e.ev); err != nil {
			return err
		}
	}
	for _, side := range aggregator.Sides {
		s.tryStart(side)
	}
	return nil
}

func (s *sim) link(from aggregator.Side) Link {
	if from == aggregator.Cloud {
		return s.cfg.Back
	}
	return s.cfg.Link
}

// send puts ev on the link from side to the other, behind what is already
// on it.
func (s *sim) send(from aggregator.Side, ev aggregator.Event) {
	i := from - 1
	at := max(s.now+s.link(from)(s.now), s.linkLast[i])
	s.linkLast[i] = at
	s.push(event{at: at, kind: arrive, side: from.Other(), ev: ev})
}

func (s *sim) step(side aggregator.Side, ev aggregator.Event) error {
	n := s.nodes[side-1]
	acts, err := n.Step(ev)
	if err != nil {
		return err
	}
	decided := false
	for _, a := range acts {
		switch a := a.(type) {
		case aggregator.SendDrafts:
			s.send(side, aggregator.RemoteDrafts(a))
		case aggregator.SendVerdicts:
			s.send(side, aggregator.RemoteVerdicts(a))
		case aggregator.SendHandover:
			s.switches++
			s.send(side, aggregator.RemoteHandover(a))
		case aggregator.Decided:
			decided = true
			if n.Aggregating() {
				s.est.Verdict(a.Verdict)
			}
			if side == aggregator.Device {
				s.decided = append(s.decided, s.now)
			}
		case aggregator.Rollback:
			p := s.prods[side-1]
			p.epoch, p.next, p.busy = a.Epoch, a.Step+1, false
			p.pass++
		}
	}
	if decided && n.Aggregating() && !n.Done() {
		if s.sched.Move(n.NextStep(), side, s.costs()) {
			return s.step(side, aggregator.SwitchRequest{})
		}
	}
	return nil
}

// costs are the scheduler's estimates.
func (s *sim) costs() aggregator.Costs {
	rtt := s.cfg.Link(s.now) + s.cfg.Back(s.now)
	if s.cfg.Estimates == Observed {
		s.est.RTT(rtt) // a ping per decision
		return s.est.Costs()
	}
	var c aggregator.Costs
	for i, side := range aggregator.Sides {
		c.Decode[i] = mean(s.cfg.Trace.DecodeMS.Get(side))
		flags := s.cfg.Trace.Accept.Get(side)
		acc := 0
		for _, f := range flags {
			if f {
				acc++
			}
		}
		c.Accept[i] = float64(acc) / float64(len(flags))
	}
	c.RTT = rtt
	return c
}

func (s *sim) result() Result {
	r := Result{Switches: s.switches}
	for i := 1; i < len(s.decided); i++ {
		r.Intervals = append(r.Intervals, s.decided[i]-s.decided[i-1])
	}
	r.PerTokenMS = (s.decided[len(s.decided)-1] - s.decided[0]) / float64(len(s.decided)-1)
	// Every Node sees every decided step (deciding it or through a
	// verdict); stale drafts are dropped wherever they arrive.
	for i, side := range aggregator.Sides {
		st := s.nodes[0].Stats(side)
		if d := st.Accepted + st.Rejected; d > 0 {
			r.Accepted[i] = float64(st.Accepted) / float64(d)
		}
		for _, n := range s.nodes {
			r.Stale[i] += n.Stats(side).Stale
		}
	}
	return r
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
