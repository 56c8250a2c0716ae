package session

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dragon-rag/dragon/aggregator"
)

// Metrics are what a daemon exports about its generations, for
// Prometheus. A nil *Metrics records nothing.
type Metrics struct {
	ttft         prometheus.Histogram
	tokenLatency prometheus.Histogram
	tokens       prometheus.Counter
	drafts       *prometheus.CounterVec
	beside       prometheus.Counter
	switches     prometheus.Counter
	bytes        *prometheus.CounterVec
	compression  prometheus.Histogram
	rtt          prometheus.Gauge
	bandwidth    prometheus.Gauge
	generations  *prometheus.CounterVec
	active       prometheus.Gauge
	aborted      prometheus.Counter
	queue        prometheus.Gauge
	batchRows    prometheus.Histogram
	batchSlots   prometheus.Histogram
	fallbacks    *prometheus.CounterVec
	refusals     *prometheus.CounterVec
	stalls       prometheus.Counter
}

// NewMetrics registers the generation metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	latency := prometheus.ExponentialBuckets(0.005, 2, 12) // 5 ms … 10 s
	return &Metrics{
		ttft: f.NewHistogram(prometheus.HistogramOpts{
			Name: "dragon_ttft_seconds", Help: "Time from the start of a generation to its first token.",
			Buckets: prometheus.ExponentialBuckets(0.05, 1.6, 14),
		}),
		tokenLatency: f.NewHistogram(prometheus.HistogramOpts{
			Name: "dragon_token_latency_seconds", Help: "Time between consecutive tokens of an answer.", Buckets: latency,
		}),
		tokens: f.NewCounter(prometheus.CounterOpts{Name: "dragon_tokens_total", Help: "Answer tokens decided."}),
		drafts: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dragon_drafts_total", Help: "Drafts by side and outcome (accepted, rejected, stale).",
		}, []string{"side", "outcome"}),
		beside: f.NewCounter(prometheus.CounterOpts{
			Name: "dragon_drafts_beside_total", Help: "This side's greedy drafts that took the mixture's argmax from the peer's draft of the same step.",
		}),
		switches: f.NewCounter(prometheus.CounterOpts{Name: "dragon_aggregator_switches_total", Help: "Times the aggregator moved between sides."}),
		bytes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dragon_peer_bytes_total", Help: "Bytes of peer messages by direction (sent, received).",
		}, []string{"direction"}),
		compression: f.NewHistogram(prometheus.HistogramOpts{
			Name: "dragon_codec_compression_ratio", Help: "Size of a full-vocabulary float32 distribution over its encoded size.",
			Buckets: prometheus.ExponentialBuckets(8, 2, 12),
		}),
		rtt:       f.NewGauge(prometheus.GaugeOpts{Name: "dragon_rtt_seconds", Help: "Last round-trip estimate to the peer."}),
		bandwidth: f.NewGauge(prometheus.GaugeOpts{Name: "dragon_bandwidth_bytes_per_second", Help: "Last bandwidth estimate to the peer (0: unknown)."}),
		generations: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dragon_generations_total", Help: "Generations by mode and outcome (ok, fallback, error).",
		}, []string{"mode", "outcome"}),
		active:  f.NewGauge(prometheus.GaugeOpts{Name: "dragon_sessions", Help: "Generations in progress."}),
		aborted: f.NewCounter(prometheus.CounterOpts{Name: "dragon_aborted_passes_total", Help: "Forward passes stopped because a rejection made their drafts stale."}),
		queue:   f.NewGauge(prometheus.GaugeOpts{Name: "dragon_queue_depth", Help: "Sessions waiting for a decoding slot."}),
		batchRows: f.NewHistogram(prometheus.HistogramOpts{
			Name: "dragon_batch_rows", Help: "Rows of one shared forward pass (all sessions' rows in a tick).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		batchSlots: f.NewHistogram(prometheus.HistogramOpts{
			Name: "dragon_batch_sessions", Help: "Sessions whose rows shared one forward pass.",
			Buckets: prometheus.LinearBuckets(1, 1, 16),
		}),
		fallbacks: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dragon_fallbacks_total", Help: "Answers the device finished without the cloud, by reason (" + strings.Join(fallbackReasons, ", ") + ").",
		}, []string{"reason"}),
		refusals: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dragon_refusals_total", Help: "Requests (on the cloud: sessions) that ended in an error status, by gRPC code (RESOURCE_EXHAUSTED: the queue was full or its wait too long).",
		}, []string{"code"}),
		stalls: f.NewCounter(prometheus.CounterOpts{
			Name: "dragon_stalls_survived_total", Help: "Waits for the cloud's next decided step longer than half the stall timeout that still ended in one, not a fallback.",
		}),
	}
}

// Fallback counts an answer finished without the peer because of cause.
func (m *Metrics) Fallback(cause error) {
	if m == nil {
		return
	}
	m.fallbacks.WithLabelValues(FallbackReason(cause)).Inc()
}

// Refusal counts a request or session that ended in err, unless the
// client went away (Canceled) or there is no error.
func (m *Metrics) Refusal(err error) {
	if m == nil {
		return
	}
	if c := status.Code(err); c != codes.OK && c != codes.Canceled {
		m.refusals.WithLabelValues(strings.ToUpper(snake(c.String()))).Inc()
	}
}

// snake turns a code's Go name (ResourceExhausted) into its words
// (Resource_Exhausted): RESOURCE_EXHAUSTED once upper-cased, as gRPC's
// documentation names them.
func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// fallbackReasons are FallbackReason's values.
var fallbackReasons = []string{"busy", "refused", "stalled", "expired", "disconnected", "error"}

// FallbackReason is the bounded kind of why the device went on without
// the cloud: busy (the cloud's sessions were all taken), refused (the
// handshake or the request: another model or protocol, a bad token),
// stalled (nothing came for the stall timeout), expired (the answer
// outlasted the cloud's session timeout), disconnected (the link or the
// cloud went away), or error (the cloud failed otherwise).
func FallbackReason(cause error) string {
	if errors.Is(cause, errStalled) || errors.Is(cause, context.DeadlineExceeded) {
		return "stalled"
	}
	if errors.Is(cause, io.EOF) || errors.Is(cause, io.ErrUnexpectedEOF) {
		return "disconnected"
	}
	switch status.Code(cause) {
	case codes.ResourceExhausted:
		return "busy"
	case codes.FailedPrecondition, codes.InvalidArgument, codes.Unauthenticated, codes.PermissionDenied, codes.Unimplemented, codes.OutOfRange:
		return "refused"
	case codes.DeadlineExceeded:
		return "expired"
	case codes.Unavailable, codes.Canceled, codes.Aborted:
		return "disconnected"
	}
	return "error"
}

// Tick records one shared forward pass.
func (m *Metrics) Tick(rows, sessions int) {
	if m == nil {
		return
	}
	m.batchRows.Observe(float64(rows))
	m.batchSlots.Observe(float64(sessions))
}

// Queue records how many sessions wait for a slot.
func (m *Metrics) Queue(n int) {
	if m == nil {
		return
	}
	m.queue.Set(float64(max(n, 0)))
}

// Begin counts a generation in progress; call the returned func when it
// ends.
func (m *Metrics) Begin() func() {
	if m == nil {
		return func() {}
	}
	m.active.Inc()
	return m.active.Dec
}

// Observe records a finished generation that started at start.
func (m *Metrics) Observe(mode string, start time.Time, sum Summary, err error) {
	if m == nil {
		return
	}
	outcome := "ok"
	switch {
	case err != nil:
		outcome = "error"
	case sum.Fallback:
		outcome = "fallback"
	}
	m.generations.WithLabelValues(mode, outcome).Inc()
	if len(sum.TokenTimes) > 0 {
		m.ttft.Observe(sum.TokenTimes[0].Sub(start).Seconds())
	}
	for i := 1; i < len(sum.TokenTimes); i++ {
		m.tokenLatency.Observe(sum.TokenTimes[i].Sub(sum.TokenTimes[i-1]).Seconds())
	}
	m.tokens.Add(float64(len(sum.Tokens)))
	for i, side := range aggregator.Sides {
		m.drafts.WithLabelValues(side.String(), "accepted").Add(float64(sum.Accepted[i]))
		m.drafts.WithLabelValues(side.String(), "rejected").Add(float64(sum.Rejected[i]))
		m.drafts.WithLabelValues(side.String(), "stale").Add(float64(sum.Stale[i]))
	}
	m.beside.Add(float64(sum.Beside))
	m.switches.Add(float64(sum.Switches))
	m.bytes.WithLabelValues("sent").Add(float64(sum.BytesSent))
	m.bytes.WithLabelValues("received").Add(float64(sum.BytesReceived))
	m.aborted.Add(float64(sum.AbortedPasses))
	m.stalls.Add(float64(sum.StallsSurvived))
	if sum.RTT > 0 {
		m.rtt.Set(sum.RTT.Seconds())
	}
}

// draftSent records the compression of one encoded distribution.
func (m *Metrics) draftSent(vocab, payload int) {
	if m == nil || payload == 0 {
		return
	}
	m.compression.Observe(float64(4*vocab) / float64(payload))
}

// link records the link estimates.
func (m *Metrics) link(rtt time.Duration, bytesPerSecond float64) {
	if m == nil {
		return
	}
	m.rtt.Set(rtt.Seconds())
	m.bandwidth.Set(bytesPerSecond)
}
