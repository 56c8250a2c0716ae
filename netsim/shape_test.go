package netsim

import (
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeClock is a Clock that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestSineJitter: the delay is latency + jitter·sin(2π t / period), t from
// the direction's creation, never below zero.
func TestSineJitter(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		latency, jitter, period time.Duration
	}{
		{"4s period", 100 * time.Millisecond, 20 * time.Millisecond, 4 * time.Second},
		{"default period", 150 * time.Millisecond, 50 * time.Millisecond, 0},
		{"clamped at zero", 10 * time.Millisecond, 30 * time.Millisecond, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			d, err := NewDirection(Shape{Latency: tc.latency, Jitter: tc.jitter, Dist: Sine, Period: tc.period}, 1, WithClock(clk))
			require.NoError(t, err)
			period := tc.period
			if period == 0 {
				period = DefaultPeriod
			}
			step := period / 16
			for i := range 40 { // two and a half periods
				at := time.Duration(i) * step
				want := float64(tc.latency) + float64(tc.jitter)*math.Sin(2*math.Pi*float64(at)/float64(period))
				assert.InDelta(t, math.Max(0, want), float64(d.Delay()), 1, "t=%v", at)
				clk.Advance(step)
			}
		})
	}
}

// TestSendComposes checks the schedule of a direction against its
// formula: a chunk leaves at max(write time, previous departure) (plus a
// stall), takes size/rate to leave, then the latency.
func TestSendComposes(t *testing.T) {
	const ms = time.Millisecond
	type write struct {
		after time.Duration // clock advance before the write
		n     int
		take  int           // bytes taken
		at    time.Duration // arrival after the write
	}
	for _, tc := range []struct {
		name   string
		shape  Shape
		writes []write
	}{
		{"latency only: whole writes", Shape{Latency: 10 * ms}, []write{
			{0, 1 << 20, 1 << 20, 10 * ms},
			{5 * ms, 100, 100, 10 * ms},
		}},
		{"rate: MTU segments queue", Shape{Latency: 10 * ms, Rate: 1_000_000}, []write{
			{0, 4000, 1500, 11500 * time.Microsecond},
			{0, 2500, 1500, 13 * ms},                           // behind the first
			{time.Second, 1000, 1000, 11 * ms},                 // the queue drained
			{0, 100_000, 1500, 12500 * time.Microsecond},       // behind 1000 B
			{ms, 100_000, 1500, 13 * ms},                       // 1 ms later, behind 2500 B
			{20 * ms, 100_000, 1500, 11500 * time.Microsecond}, // drained again
		}},
		{"fast rate: a millisecond per segment", Shape{Rate: 10_000_000}, []write{
			{0, 1 << 20, 10_000, ms},
		}},
		{"stall before leaving", Shape{Latency: 10 * ms, Rate: 1_000_000, StallProb: 1, StallFor: 100 * ms}, []write{
			{0, 1500, 1500, 111500 * time.Microsecond},
			{0, 1500, 1500, 213 * ms}, // stalls again behind the first
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			d, err := NewDirection(tc.shape, 1, WithClock(clk))
			require.NoError(t, err)
			for i, w := range tc.writes {
				clk.Advance(w.after)
				n, at := d.send(w.n)
				assert.Equal(t, w.take, n, "write %d", i)
				assert.Equal(t, w.at, at.Sub(clk.Now()), "write %d", i)
			}
		})
	}
}

// TestStallProbability: chunks stall with the shape's probability.
func TestStallProbability(t *testing.T) {
	for _, p := range []float64{0, 0.1, 0.5, 1} {
		clk := newFakeClock()
		d, err := NewDirection(Shape{StallProb: p, StallFor: 100 * time.Millisecond}, 7, WithClock(clk))
		require.NoError(t, err)
		const n = 10000
		stalls := 0
		for range n {
			clk.Advance(time.Second) // past any earlier stall
			if _, at := d.send(1); at.Sub(clk.Now()) == 100*time.Millisecond {
				stalls++
			}
		}
		assert.InDelta(t, p, float64(stalls)/n, 0.015, "stall probability %v", p)
	}
}

func TestValidate(t *testing.T) {
	for _, s := range []Shape{
		{Latency: -1},
		{Jitter: -1},
		{Dist: Sine + 1},
		{Period: -time.Second},
		{Rate: -1},
		{StallProb: -0.1},
		{StallProb: 1.1},
		{StallProb: math.NaN()},
		{StallFor: -time.Second},
	} {
		assert.Error(t, s.Validate(), "%+v", s)
	}
	assert.NoError(t, Shape{Latency: time.Second, Jitter: time.Millisecond, Dist: Sine, Period: time.Second, Rate: 1, StallProb: 1, StallFor: time.Second}.Validate())
}

func TestParseJitter(t *testing.T) {
	for s, want := range map[string]Jitter{"": Normal, "normal": Normal, "Uniform": Uniform, "sine": Sine} {
		got, err := ParseJitter(s)
		require.NoError(t, err)
		assert.Equal(t, want, got)
		if s != "" {
			assert.True(t, strings.EqualFold(s, want.String()), "%q names %v", s, want)
		}
	}
	_, err := ParseJitter("pareto")
	assert.ErrorContains(t, err, `"pareto"`)
}
