package aggregator

import "fmt"

// Strategy chooses which side aggregates (DRAGON §5, §7.4).
type Strategy uint8

// Strategies.
const (
	// Greedy minimises the expected per-token latency of Eq. (7) at each
	// step, with hysteresis.
	Greedy Strategy = 1 + iota
	// StaticDevice and StaticCloud never move the aggregator from that side.
	StaticDevice
	StaticCloud
	// Random picks a side uniformly at every step.
	Random
)

// Strategies lists every strategy.
var Strategies = []Strategy{Greedy, StaticDevice, StaticCloud, Random}

func (s Strategy) String() string {
	switch s {
	case Greedy:
		return "greedy"
	case StaticDevice:
		return "device"
	case StaticCloud:
		return "cloud"
	case Random:
		return "random"
	}
	return fmt.Sprintf("Strategy(%d)", uint8(s))
}

// ParseStrategy reads greedy, device, cloud or random.
func ParseStrategy(s string) (Strategy, error) {
	for _, st := range Strategies {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, fmt.Errorf("aggregator: unknown scheduling strategy %q (want greedy, device, cloud or random)", s)
}

// Costs are the quantities the scheduler weighs, all per draft token, in
// milliseconds, indexed by Side.index.
type Costs struct {
	// Decode is each side's decoding latency per draft token (c_dec).
	Decode [2]float64
	// RTT is c^device_trans + c^cloud_trans: one draft there and one
	// verdict back.
	RTT float64
	// Accept is the acceptance rate of each side's drafts (α).
	Accept [2]float64
}

// Latency is Eq. (7): the expected per-token latency while side agg
// aggregates. A rejected draft of the other side costs a round trip and its
// re-decoding; the aggregator's own drafts never wait for the network.
func (c Costs) Latency(agg Side) float64 {
	l, r := agg.Index(), agg.Other().Index()
	cl, cr, ar := c.Decode[l], c.Decode[r], c.Accept[r]
	return ar*max(cl, cr) + (1-ar)*max(cl, cr+c.RTT)
}

// DeltaZ is Eq. (8) in closed form: Latency(l) − Latency(r) for l the
// given side, piecewise in the decoding-latency gap j = c^r − c^l. Side r
// should aggregate when it is positive.
func (c Costs) DeltaZ(l Side) float64 {
	li, ri := l.Index(), l.Other().Index()
	cl, cr, rtt := c.Decode[li], c.Decode[ri], c.RTT
	al, ar := c.Accept[li], c.Accept[ri]
	j := cr - cl
	switch {
	case cl <= cr-rtt:
		return (1 - ar) * rtt
	case cl <= cr:
		return (1-al)*j + (al-ar)*rtt
	case cl <= cr+rtt:
		return (1-ar)*j + (al-ar)*rtt
	default:
		return (al - 1) * rtt
	}
}

// SchedulerConfig tunes a Scheduler.
type SchedulerConfig struct {
	Strategy Strategy
	// Margin: the greedy strategy moves the aggregator only when the other
	// side's expected latency is lower by more than this fraction (0:
	// 0.05)...
	Margin float64
	// Patience: ...at this many consecutive decisions (0: 3)...
	Patience int
	// MinDwell: ...and at least this many steps after the last move (0: 8).
	MinDwell uint64
	// Seed keys the random strategy's choices.
	Seed uint64
}

// Scheduler decides, after the aggregating side decides a step, whether the
// aggregator should move. It is pure: estimates in, a decision out.
type Scheduler struct {
	cfg       SchedulerConfig
	favour    int    // consecutive greedy decisions for the other side
	lastMove  uint64 // step of the last move
	moved     bool
	decisions uint64
}

// NewScheduler returns a scheduler for cfg.
func NewScheduler(cfg SchedulerConfig) (*Scheduler, error) {
	if cfg.Strategy < Greedy || cfg.Strategy > Random {
		return nil, fmt.Errorf("aggregator: unknown scheduling strategy %v", cfg.Strategy)
	}
	if cfg.Margin == 0 {
		cfg.Margin = 0.05
	}
	if cfg.Patience == 0 {
		cfg.Patience = 3
	}
	if cfg.MinDwell == 0 {
		cfg.MinDwell = 8
	}
	if cfg.Margin < 0 || cfg.Patience < 0 {
		return nil, fmt.Errorf("aggregator: negative scheduler margin or patience")
	}
	return &Scheduler{cfg: cfg}, nil
}

// Strategy is the scheduler's strategy.
func (s *Scheduler) Strategy() Strategy { return s.cfg.Strategy }

// Move reports whether the aggregator, now on side cur with next the first
// undecided step, should move to the other side given the estimates c.
func (s *Scheduler) Move(next uint64, cur Side, c Costs) bool {
	move := false
	switch s.cfg.Strategy {
	case StaticDevice:
		move = cur != Device
	case StaticCloud:
		move = cur != Cloud
	case Random:
		move = uniform(s.cfg.Seed, next, streamPick+1) < 0.5
	case Greedy:
		move = s.greedy(next, cur, c)
	}
	if move {
		s.moved, s.lastMove, s.favour = true, next, 0
	}
	return move
}

func (s *Scheduler) greedy(next uint64, cur Side, c Costs) bool {
	here, there := c.Latency(cur), c.Latency(cur.Other())
	if !(there < here*(1-s.cfg.Margin)) {
		s.favour = 0
		return false
	}
	s.favour++
	if s.favour < s.cfg.Patience {
		return false
	}
	return !s.moved || next >= s.lastMove+s.cfg.MinDwell
}
