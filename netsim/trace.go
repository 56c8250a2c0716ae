package netsim

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// TracePoint is one sample of a latency trace: from At after the start of
// the replay until the next point, the one-way latency is Latency.
type TracePoint struct {
	At      time.Duration
	Latency time.Duration
}

// ParseTrace reads a CSV trace of "time,latency_ms" lines: the time in
// seconds from the start of the replay (fractions allowed), increasing
// from line to line; the one-way latency in milliseconds, not negative. A
// header first (a first field that is not a number, like "time") is
// skipped, as are blank lines and lines starting with #. Errors name the
// line.
func ParseTrace(r io.Reader) ([]TracePoint, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = 2
	cr.Comment = '#'
	cr.TrimLeadingSpace = true
	var pts []TracePoint
	for first := true; ; first = false {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("netsim: trace: %w", err)
		}
		line, _ := cr.FieldPos(0)
		if first && isHeader(rec[0]) {
			continue
		}
		at, err := number(rec[0], "time", "seconds", time.Second)
		if err != nil {
			return nil, fmt.Errorf("netsim: trace line %d: %w", line, err)
		}
		lat, err := number(rec[1], "latency", "milliseconds", time.Millisecond)
		if err != nil {
			return nil, fmt.Errorf("netsim: trace line %d: %w", line, err)
		}
		p := TracePoint{At: at, Latency: lat}
		if err := checkPoint(p, pts); err != nil {
			return nil, fmt.Errorf("netsim: trace line %d: %w", line, err)
		}
		pts = append(pts, p)
	}
	if len(pts) == 0 {
		return nil, errors.New("netsim: trace has no points")
	}
	return pts, nil
}

// isHeader tells a header's first field from a number, even a bad one.
func isHeader(field string) bool {
	f := strings.TrimSpace(field)
	return f != "" && !strings.ContainsAny(f[:1], "0123456789+-.")
}

// number reads a field of a trace as a finite, in-range count of unit.
func number(field, what, units string, unit time.Duration) (time.Duration, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(field), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%s %q is not a number of %s", what, field, units)
	}
	d := v * float64(unit)
	if math.Abs(d) >= math.MaxInt64 {
		return 0, fmt.Errorf("%s %q is too large", what, field)
	}
	return time.Duration(d), nil
}

// checkPoint rejects a point that cannot follow those before it.
func checkPoint(p TracePoint, before []TracePoint) error {
	switch {
	case p.At < 0:
		return fmt.Errorf("time %v is negative", p.At)
	case p.Latency < 0:
		return fmt.Errorf("latency %v is negative", p.Latency)
	case len(before) > 0 && p.At <= before[len(before)-1].At:
		return fmt.Errorf("time %v is not after the previous point's %v (times must increase)", p.At, before[len(before)-1].At)
	}
	return nil
}

// Replay makes the direction's base latency follow trace from now on, as
// a step function: each point's latency holds from its time until the
// next point's (the first's before it), and the last one's holds after
// the end, rather than looping, so that a run longer than the trace ends
// at a known latency. Jitter still adds to it. An empty trace stops the
// replay, returning to Shape.Latency.
func (d *Direction) Replay(trace []TracePoint) error {
	for i, p := range trace {
		if err := checkPoint(p, trace[:i]); err != nil {
			return fmt.Errorf("netsim: trace point %d: %w", i, err)
		}
	}
	d.mu.Lock()
	d.trace = replay{points: slices.Clone(trace), start: d.clock.Now()}
	d.mu.Unlock()
	return nil
}

// replay is the trace a direction replays, from start.
type replay struct {
	points []TracePoint
	start  time.Time
}

// latency is the trace's latency at now, or def when none replays.
func (r replay) latency(now time.Time, def time.Duration) time.Duration {
	if len(r.points) == 0 {
		return def
	}
	t := now.Sub(r.start)
	next := sort.Search(len(r.points), func(i int) bool { return r.points[i].At > t })
	return r.points[max(next-1, 0)].Latency
}
