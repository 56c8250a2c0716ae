// Package netsim is a userspace link emulator for latency experiments on
// machines where tc/netem is unavailable: it delays the bytes of a TCP
// connection by a one-way latency per direction, with jitter, keeping their
// order (a TCP stream never reorders). It works in-process, wrapping a
// net.Conn or a net.Listener, and as a TCP proxy (`dragon netsim`).
//
// A Link holds the shape of each direction (latency, jitter, bandwidth,
// loss-like stalls), which can change while connections run, by hand, from
// a replayed latency trace or through the HTTP control API; a Proxy can
// also reset its connections.
package netsim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
)

// Jitter is the kind of variation of the delay around the latency.
type Jitter uint8

// Jitter kinds.
const (
	// Normal: latency + N(0, jitter²), never below zero.
	Normal Jitter = iota
	// Uniform: latency + U(−jitter, +jitter), never below zero.
	Uniform
	// Sine: latency + jitter·sin(2π t / period), t from the direction's
	// creation, never below zero: the slow swing DRAGON's experiments use.
	Sine
)

var jitterNames = [...]string{Normal: "normal", Uniform: "uniform", Sine: "sine"}

func (j Jitter) String() string {
	if int(j) < len(jitterNames) {
		return jitterNames[j]
	}
	return fmt.Sprintf("Jitter(%d)", j)
}

// ParseJitter reads "normal", "uniform" or "sine" ("" is normal).
func ParseJitter(s string) (Jitter, error) {
	if s == "" {
		return Normal, nil
	}
	for j, name := range jitterNames {
		if strings.EqualFold(s, name) {
			return Jitter(j), nil
		}
	}
	return 0, fmt.Errorf("netsim: unknown jitter kind %q (want normal, uniform or sine)", s)
}

// MarshalText writes the kind's name.
func (j Jitter) MarshalText() ([]byte, error) { return []byte(j.String()), nil }

// UnmarshalText reads a name ParseJitter accepts.
func (j *Jitter) UnmarshalText(b []byte) error {
	v, err := ParseJitter(string(b))
	if err != nil {
		return err
	}
	*j = v
	return nil
}

// DefaultPeriod is the period of Sine jitter when Shape.Period is zero.
const DefaultPeriod = 10 * time.Second

// Shape is what one direction of a link does to the data crossing it.
type Shape struct {
	// Latency is the one-way delay (ignored while a trace replays: the
	// trace gives it).
	Latency time.Duration
	// Jitter is the spread of the delay: the standard deviation (Normal),
	// the half-width (Uniform) or the amplitude (Sine).
	Jitter time.Duration
	Dist   Jitter
	// Period is the period of Sine jitter; zero is DefaultPeriod.
	Period time.Duration
	// Rate is the bandwidth; zero is unlimited.
	Rate Rate
	// StallProb is the probability that a chunk (a write, or a segment of
	// one on a rate-limited direction) stalls the direction for StallFor
	// before it leaves, holding back everything behind it, as a lost
	// segment holds a TCP stream until its retransmission.
	StallProb float64
	StallFor  time.Duration
}

// Validate rejects shapes that make no sense.
func (s Shape) Validate() error {
	switch {
	case s.Latency < 0:
		return fmt.Errorf("netsim: negative latency %v", s.Latency)
	case s.Jitter < 0:
		return fmt.Errorf("netsim: negative jitter %v", s.Jitter)
	case s.Dist > Sine:
		return fmt.Errorf("netsim: unknown jitter kind %d", s.Dist)
	case s.Period < 0:
		return fmt.Errorf("netsim: negative sine period %v", s.Period)
	case s.Rate < 0:
		return fmt.Errorf("netsim: negative rate %d B/s", s.Rate)
	case !(s.StallProb >= 0 && s.StallProb <= 1): // NaN too
		return fmt.Errorf("netsim: stall probability %v is outside [0, 1]", s.StallProb)
	case s.StallFor < 0:
		return fmt.Errorf("netsim: negative stall duration %v", s.StallFor)
	}
	return nil
}

func (s Shape) period() time.Duration {
	if s.Period == 0 {
		return DefaultPeriod
	}
	return s.Period
}

// Clock is where a Direction reads the time: the phase of Sine jitter, the
// position in a replayed trace and the queue of a rate-limited direction.
// Connections wait in real time, so a direction that carries them keeps
// the real clock (the default); a fake one serves tests of Delay.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Option configures a Direction.
type Option func(*Direction)

// WithClock makes the direction read the time from c.
func WithClock(c Clock) Option { return func(d *Direction) { d.clock = c } }

// Direction is one direction of a link: its shape, which may change at
// run time, the seeded randomness of its jitter and stalls, the queue of
// its bandwidth and the trace it replays.
type Direction struct {
	clock Clock
	start time.Time // origin of the Sine phase

	mu    sync.Mutex
	shape Shape
	rng   *rand.Rand
	free  time.Time // when the direction can send again: bandwidth and stalls
	trace replay
}

// NewDirection returns a direction of the given shape, its jitter and
// stalls drawn from seed.
func NewDirection(s Shape, seed uint64, opts ...Option) (*Direction, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	d := &Direction{clock: realClock{}, shape: s, rng: rand.New(rand.NewPCG(seed, 0x5eed))}
	for _, o := range opts {
		o(d)
	}
	d.start = d.clock.Now()
	return d, nil
}

// Shape is the current shape.
func (d *Direction) Shape() Shape {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.shape
}

// SetShape changes the shape of data sent from now on.
func (d *Direction) SetShape(s Shape) error {
	if err := s.Validate(); err != nil {
		return err
	}
	d.mu.Lock()
	d.shape = s
	d.mu.Unlock()
	return nil
}

// Delay draws the one-way delay of data sent now (without bandwidth or
// stalls, which depend on what was sent before).
func (d *Direction) Delay() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.delayLocked(d.clock.Now())
}

func (d *Direction) delayLocked(now time.Time) time.Duration {
	s := d.shape
	base := float64(d.trace.latency(now, s.Latency))
	if s.Jitter == 0 {
		return time.Duration(base)
	}
	var extra float64
	switch s.Dist {
	case Uniform:
		extra = (2*d.rng.Float64() - 1) * float64(s.Jitter)
	case Sine:
		extra = float64(s.Jitter) * math.Sin(2*math.Pi*float64(now.Sub(d.start))/float64(s.period()))
	default:
		extra = d.rng.NormFloat64() * float64(s.Jitter)
	}
	return time.Duration(math.Max(0, base+extra))
}

// mtu is the smallest segment of a rate-limited direction.
const mtu = 1500

// send schedules up to n bytes written now: it returns how many it takes
// and when they arrive. A rate-limited direction takes a segment of about
// an MTU, or a millisecond of data on fast links, so that a large write
// trickles out at the rate instead of arriving at once at its end; a
// segment leaves after those before it (of any connection: the bandwidth
// is the direction's), takes size/rate to serialise, then the delay.
func (d *Direction) send(n int) (int, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.clock.Now()
	s := d.shape
	leave := now
	if d.free.After(leave) {
		leave = d.free
	}
	if s.StallProb > 0 && d.rng.Float64() < s.StallProb {
		leave = leave.Add(s.StallFor)
	}
	if s.Rate > 0 {
		n = min(n, max(mtu, int(s.Rate/1000)))
		leave = leave.Add(s.Rate.serialize(n))
	}
	d.free = leave
	return n, leave.Add(d.delayLocked(now))
}

// Bounds of the bytes a connection holds in flight.
const (
	maxBuffered = 8 << 20
	minWindow   = 64 << 10
)

// window is how many bytes a connection may hold in flight before its
// writer waits, as on a full socket buffer. On a rate-limited direction it
// is what the latency holds plus about a second of queue, so that a writer
// feels the bottleneck as TCP's would instead of queueing minutes of data.
func (d *Direction) window() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.shape
	if s.Rate == 0 {
		return maxBuffered
	}
	w := float64(s.Rate) * (time.Second + d.trace.latency(d.clock.Now(), s.Latency)).Seconds()
	return int(min(max(w, minWindow), maxBuffered))
}

func (d *Direction) now() time.Time { return d.clock.Now() }

// Link is the two directions between a client and a server.
type Link struct {
	// Up carries client → server, Down server → client.
	Up, Down *Direction
}

// NewLink shapes both directions alike (independent jitter and stalls).
func NewLink(s Shape, seed uint64, opts ...Option) (*Link, error) {
	up, err := NewDirection(s, seed, opts...)
	if err != nil {
		return nil, err
	}
	down, err := NewDirection(s, seed+1, opts...)
	if err != nil {
		return nil, err
	}
	return &Link{Up: up, Down: down}, nil
}
