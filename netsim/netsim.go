// Package netsim is a userspace link emulator for latency experiments on
// machines where tc/netem is unavailable: it delays the bytes of a TCP
// connection by a one-way latency per direction, with jitter, keeping their
// order (a TCP stream never reorders). It works in-process, wrapping a
// net.Conn or a net.Listener, and as a TCP proxy (`dragon netsim`).
//
// A Link holds the shape of each direction and can be changed while
// connections run; bandwidth limits, loss-like stalls, resets and trace
// replay grow from the same Direction type.
package netsim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
)

// Jitter is the distribution of the extra delay around the latency.
type Jitter uint8

// Jitter distributions.
const (
	// Normal: latency + N(0, jitter²), never below zero.
	Normal Jitter = iota
	// Uniform: latency + U(−jitter, +jitter), never below zero.
	Uniform
)

func (j Jitter) String() string {
	if j == Uniform {
		return "uniform"
	}
	return "normal"
}

// ParseJitter reads "normal" or "uniform".
func ParseJitter(s string) (Jitter, error) {
	switch strings.ToLower(s) {
	case "normal", "":
		return Normal, nil
	case "uniform":
		return Uniform, nil
	}
	return 0, fmt.Errorf("netsim: unknown jitter distribution %q (want normal or uniform)", s)
}

// Shape is what one direction of a link does to the data crossing it.
type Shape struct {
	// Latency is the one-way delay.
	Latency time.Duration
	// Jitter is the spread of the delay: the standard deviation (Normal)
	// or the half-width (Uniform).
	Jitter time.Duration
	Dist   Jitter
}

// Validate rejects shapes that make no sense.
func (s Shape) Validate() error {
	if s.Latency < 0 || s.Jitter < 0 {
		return fmt.Errorf("netsim: negative latency %v or jitter %v", s.Latency, s.Jitter)
	}
	if s.Dist > Uniform {
		return fmt.Errorf("netsim: unknown jitter distribution %d", s.Dist)
	}
	return nil
}

// Direction is one direction of a link: its shape, which may change at
// run time, and the seeded randomness of its jitter.
type Direction struct {
	mu    sync.Mutex
	shape Shape
	rng   *rand.Rand
}

// NewDirection returns a direction of the given shape, its jitter drawn
// from seed.
func NewDirection(s Shape, seed uint64) (*Direction, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &Direction{shape: s, rng: rand.New(rand.NewPCG(seed, 0x5eed))}, nil
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

// Delay draws the one-way delay of data sent now.
func (d *Direction) Delay() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.shape
	if s.Jitter == 0 {
		return s.Latency
	}
	var extra float64
	switch s.Dist {
	case Uniform:
		extra = (2*d.rng.Float64() - 1) * float64(s.Jitter)
	default:
		extra = d.rng.NormFloat64() * float64(s.Jitter)
	}
	return time.Duration(math.Max(0, float64(s.Latency)+extra))
}

// Link is the two directions between a client and a server.
type Link struct {
	// Up carries client → server, Down server → client.
	Up, Down *Direction
}

// NewLink shapes both directions alike (independent jitter).
func NewLink(s Shape, seed uint64) (*Link, error) {
	up, err := NewDirection(s, seed)
	if err != nil {
		return nil, err
	}
	down, err := NewDirection(s, seed+1)
	if err != nil {
		return nil, err
	}
	return &Link{Up: up, Down: down}, nil
}
