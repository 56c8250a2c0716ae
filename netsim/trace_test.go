package netsim

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseTrace(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name, in string
		want     []TracePoint
		err      string
	}{
		{"header", "time,latency_ms\n0,100\n1.5,150.5\n", []TracePoint{{0, 100 * ms}, {1500 * ms, 150500 * time.Microsecond}}, ""},
		{"no header, spaces, comments, blank lines", "# recorded on LTE\n0, 20\n\n 2 ,30 \n", []TracePoint{{0, 20 * ms}, {2 * time.Second, 30 * ms}}, ""},
		{"not from zero", "5,10\n", []TracePoint{{5 * time.Second, 10 * ms}}, ""},
		{"empty", "", nil, "no points"},
		{"header only", "time,latency_ms\n", nil, "no points"},
		{"bad time", "0,10\n1x,10\n", nil, `line 2: time "1x" is not a number`},
		{"bad latency", "time,latency\n0,fast\n", nil, `line 2: latency "fast" is not a number`},
		{"header later", "0,10\ntime,latency_ms\n", nil, `line 2: time "time" is not a number`},
		{"not a finite number", "0,NaN\n", nil, "line 1: latency"},
		{"negative latency", "0,10\n1,-5\n", nil, "line 2: latency -5ms is negative"},
		{"negative time", "-1,10\n", nil, "line 1: time -1s is negative"},
		{"times go back", "0,10\n2,10\n1,10\n", nil, "line 3: time 1s is not after the previous point's 2s"},
		{"times repeat", "0,10\n0,20\n", nil, "line 2: time 0s is not after"},
		{"too many fields", "0,10\n1,10,3\n", nil, "line 2"},
		{"too large", "1e300,10\n", nil, "too large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTrace(strings.NewReader(tc.in))
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestReplay: the base latency steps from point to point, holds the last
// value after the end, and jitter adds to it; an empty trace stops it.
func TestReplay(t *testing.T) {
	const ms = time.Millisecond
	clk := newFakeClock()
	created := clk.Now()
	d, err := NewDirection(Shape{Latency: 500 * ms}, 1, WithClock(clk))
	require.NoError(t, err)
	clk.Advance(3 * time.Second) // the replay starts later than the direction
	require.NoError(t, d.Replay([]TracePoint{{time.Second, 100 * ms}, {2 * time.Second, 200 * ms}, {4 * time.Second, 50 * ms}}))
	for _, step := range []struct {
		after, want time.Duration
	}{
		{0, 100 * ms}, // before the first point: the first's
		{time.Second, 100 * ms},
		{999 * ms, 100 * ms},
		{ms, 200 * ms},
		{2 * time.Second, 50 * ms},
		{time.Hour, 50 * ms}, // held
	} {
		clk.Advance(step.after)
		assert.Equal(t, step.want, d.Delay(), "%v into the replay", clk.Now().Sub(created)-3*time.Second)
	}

	require.NoError(t, d.SetShape(Shape{Latency: 500 * ms, Jitter: 10 * ms, Dist: Sine, Period: 7 * time.Second}))
	clk.Advance(time.Second)
	sine := 10 * ms * time.Duration(1e6*math.Sin(2*math.Pi*clk.Now().Sub(created).Seconds()/7)) / 1e6
	assert.InDelta(t, float64(50*ms+sine), float64(d.Delay()), 1e3, "jitter adds to the trace")

	require.NoError(t, d.Replay(nil))
	assert.InDelta(t, float64(500*ms+sine), float64(d.Delay()), 1e3, "back to the shape's latency")
	assert.ErrorContains(t, d.Replay([]TracePoint{{0, ms}, {0, ms}}), "point 1")
	assert.ErrorContains(t, d.Replay([]TracePoint{{0, -ms}}), "point 0")
}
