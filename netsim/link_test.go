package netsim

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBandwidth measures on loopback how long a rate-limited, delayed
// direction takes to carry a payload: size/rate + latency, within 5%; the
// throughput, size / (elapsed − latency), is within 5% of the rate.
func TestBandwidth(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rate    string
		latency time.Duration
		size    int
	}{
		{"1MB/s", "1MB/s", 0, 1_500_000},
		{"8mbit with 50ms", "8mbit", 50 * time.Millisecond, 1_000_000},
		{"4MB/s with 20ms", "4MB/s", 20 * time.Millisecond, 4_000_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rate, err := ParseRate(tc.rate)
			require.NoError(t, err)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer ln.Close()
			type result struct {
				data []byte
				last time.Time
			}
			got := make(chan result, 1)
			go func() {
				var r result
				defer func() { got <- r }()
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				buf := make([]byte, 64<<10)
				for len(r.data) < tc.size {
					n, err := c.Read(buf)
					r.data = append(r.data, buf[:n]...)
					r.last = time.Now()
					if err != nil {
						return
					}
				}
			}()
			raw, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			dir, err := NewDirection(Shape{Latency: tc.latency, Rate: rate}, 1)
			require.NoError(t, err)
			c := Wrap(raw, dir)
			payload := make([]byte, tc.size)
			rng := rand.New(rand.NewPCG(1, 2))
			for i := range payload {
				payload[i] = byte(rng.Uint32())
			}
			start := time.Now()
			for b := payload; len(b) > 0; {
				n := min(len(b), 32<<10)
				_, err := c.Write(b[:n])
				require.NoError(t, err)
				b = b[n:]
			}
			r := <-got
			require.NoError(t, c.Close())
			require.True(t, bytes.Equal(payload, r.data), "the payload arrives whole and in order")
			elapsed := r.last.Sub(start)
			want := time.Duration(tc.size)*time.Second/time.Duration(rate) + tc.latency
			thr := float64(tc.size) / (elapsed - tc.latency).Seconds()
			t.Logf("%d B in %v for %v asked (%+.2f%%); throughput %.0f B/s for %d (%+.2f%%)",
				tc.size, elapsed, want, 100*(float64(elapsed)/float64(want)-1), thr, rate, 100*(thr/float64(rate)-1))
			assert.InEpsilon(t, float64(want), float64(elapsed), 0.05)
			assert.InEpsilon(t, float64(rate), thr, 0.05)
		})
	}
}

// TestStalls: with probability 1 every reply stalls for StallFor, with 0
// none does.
func TestStalls(t *testing.T) {
	const stall = 80 * time.Millisecond
	for _, tc := range []struct {
		prob float64
		want float64 // median round trip, ms
	}{
		{0, 0},
		{1, 80},
	} {
		dir, err := NewDirection(Shape{StallProb: tc.prob, StallFor: stall}, 1)
		require.NoError(t, err)
		rtts := roundTrips(t, shapedEcho(t, dir), 5)
		if tc.want == 0 {
			assert.Less(t, median(rtts), 10.0, "no stalls: %v", rtts)
		} else {
			within(t, tc.want, median(rtts), "stalled round trip")
		}
	}
}

// TestReplayOnLoopback: a replayed trace changes the delay of a live
// connection when its time comes.
func TestReplayOnLoopback(t *testing.T) {
	dir, err := NewDirection(Shape{Latency: time.Second}, 1)
	require.NoError(t, err)
	c := shapedEcho(t, dir)
	start := time.Now()
	require.NoError(t, dir.Replay([]TracePoint{{0, 10 * time.Millisecond}, {300 * time.Millisecond, 40 * time.Millisecond}}))
	within(t, 10, median(roundTrips(t, c, 5)), "first point")
	time.Sleep(time.Until(start.Add(320 * time.Millisecond)))
	within(t, 40, median(roundTrips(t, c, 5)), "second point")
}

// TestProxyReset: Reset cuts the live connections with a TCP reset at both
// ends and leaves the proxy serving new ones.
func TestProxyReset(t *testing.T) {
	upstream, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer upstream.Close()
	upErr := make(chan error, 1)
	go func() {
		for first := true; ; first = false {
			c, err := upstream.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, err := io.Copy(c, c)
				if first {
					upErr <- err
				}
			}()
		}
	}()
	link, err := NewLink(Shape{Latency: time.Millisecond}, 1)
	require.NoError(t, err)
	p, err := NewProxy("127.0.0.1:0", upstream.Addr().String(), link, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Serve(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	roundTrips(t, c, 2)
	assert.Equal(t, 1, p.Reset())
	_, err = c.Read(make([]byte, 1))
	assert.True(t, errors.Is(err, syscall.ECONNRESET), "client: %v", err)
	assert.True(t, errors.Is(<-upErr, syscall.ECONNRESET), "upstream sees a reset too")

	c2, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c2.Close()
	roundTrips(t, c2, 2)
}
