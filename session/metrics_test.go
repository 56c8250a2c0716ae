package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	done := m.Begin()
	assert.Equal(t, 1.0, testutil.ToFloat64(m.active))
	start := time.Now()
	sum := Summary{
		Tokens:     []int32{5, 6, 7},
		TokenTimes: []time.Time{start.Add(time.Second), start.Add(1100 * time.Millisecond), start.Add(1200 * time.Millisecond)},
		Accepted:   [2]uint64{3, 2}, Rejected: [2]uint64{0, 1}, Stale: [2]uint64{1, 0},
		Switches: 2, BytesSent: 100, BytesReceived: 200, RTT: 30 * time.Millisecond, Beside: 4,
	}
	m.Observe("dragon", start, sum, nil)
	m.Observe("tw", start, Summary{Fallback: true}, nil)
	m.Observe("tw", start, Summary{}, errors.New("boom"))
	m.draftSent(49152, 300)
	done()

	assert.Equal(t, 0.0, testutil.ToFloat64(m.active))
	assert.Equal(t, 3.0, testutil.ToFloat64(m.tokens))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.drafts.WithLabelValues("cloud", "rejected")))
	assert.Equal(t, 4.0, testutil.ToFloat64(m.beside))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.generations.WithLabelValues("tw", "fallback")))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.generations.WithLabelValues("tw", "error")))
	assert.InDelta(t, 0.03, testutil.ToFloat64(m.rtt), 1e-9)
	require.NoError(t, testutil.CollectAndCompare(m.bytes, strings.NewReader(`
# HELP dragon_peer_bytes_total Bytes of peer messages by direction (sent, received).
# TYPE dragon_peer_bytes_total counter
dragon_peer_bytes_total{direction="received"} 200
dragon_peer_bytes_total{direction="sent"} 100
`)))
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems, "metric names and help pass promlint")

	var nilMetrics *Metrics
	nilMetrics.Observe("dragon", start, sum, nil) // records nothing, does not panic
	nilMetrics.Begin()()
}

func TestModeNames(t *testing.T) {
	for m := range dragonv1.Mode_name {
		mode := dragonv1.Mode(m)
		if mode == dragonv1.Mode_MODE_UNSPECIFIED {
			continue
		}
		got, err := ParseModeName(ModeName(mode))
		require.NoError(t, err)
		assert.Equal(t, mode, got)
	}
	_, err := ParseModeName("telepathy")
	assert.ErrorContains(t, err, "dragon, tw, sw")
}

func TestFallbackReason(t *testing.T) {
	for want, causes := range map[string][]error{
		"busy": {status.Error(codes.ResourceExhausted, "cloud sessions exhausted (4 of 4 in use) for 5s; retry later")},
		"refused": {
			status.Error(codes.FailedPrecondition, "handshake: model mismatch"),
			fmt.Errorf("cloud: %w", status.Error(codes.Unauthenticated, "bad token")),
		},
		"stalled": {
			fmt.Errorf("session: %w", errStalled),
			fmt.Errorf("handshake: %w", context.DeadlineExceeded),
		},
		"expired": {status.Error(codes.DeadlineExceeded, "peer: cloud: the answer outlasted the session timeout (5m0s)")},
		"disconnected": {
			status.Error(codes.Unavailable, "connection refused"),
			fmt.Errorf("handshake: %w", status.Error(codes.Unavailable, "closing")),
			fmt.Errorf("recv: %w", io.EOF),
		},
		"error": {errors.New("boom"), status.Error(codes.Internal, "the cloud broke")},
	} {
		for _, cause := range causes {
			assert.Equal(t, want, FallbackReason(cause), "%v", cause)
		}
	}
}

// TestFallbackAndRefusalMetrics: fallbacks count by reason, refusals by
// code; a client gone and no error are not refusals; an answer's stalls
// survived add up.
func TestFallbackAndRefusalMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.Fallback(status.Error(codes.ResourceExhausted, "full"))
	m.Fallback(errStalled)
	m.Fallback(errStalled)
	m.Refusal(status.Error(codes.ResourceExhausted, "full"))
	m.Refusal(status.Error(codes.InvalidArgument, "empty prompt"))
	m.Refusal(status.Error(codes.Canceled, "gone"))
	m.Refusal(nil)
	require.NoError(t, testutil.CollectAndCompare(m.fallbacks, strings.NewReader(`
# HELP dragon_fallbacks_total Answers the device finished without the cloud, by reason (busy, refused, stalled, expired, disconnected, error).
# TYPE dragon_fallbacks_total counter
dragon_fallbacks_total{reason="busy"} 1
dragon_fallbacks_total{reason="stalled"} 2
`)))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.refusals.WithLabelValues("RESOURCE_EXHAUSTED")))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.refusals.WithLabelValues("INVALID_ARGUMENT")))
	n, err := testutil.GatherAndCount(reg, "dragon_refusals_total")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "no series for Canceled or nil")
	m.Observe("dragon", time.Now(), Summary{StallsSurvived: 2}, nil)
	assert.Equal(t, 2.0, testutil.ToFloat64(m.stalls), "the answer's stalls survived are counted")
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
	var nilMetrics *Metrics
	nilMetrics.Fallback(errStalled)
	nilMetrics.Refusal(errStalled)
}
