package kvcache

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics export a cache's events to Prometheus; use as Config.Observer.
type Metrics struct {
	hits      *prometheus.CounterVec
	misses    prometheus.Counter
	evictions *prometheus.CounterVec
	bytes     *prometheus.GaugeVec
	restore   prometheus.Histogram
}

// NewMetrics registers the cache's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	return &Metrics{
		hits: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dragon_kvcache_hits_total", Help: "Passage sequences whose prompt prefix came from the KV cache, by tier (context, memory, disk).",
		}, []string{"tier"}),
		misses: f.NewCounter(prometheus.CounterOpts{
			Name: "dragon_kvcache_misses_total", Help: "Passage sequences prefilled from the start: no cached prefix of a block or more.",
		}),
		evictions: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dragon_kvcache_evictions_total", Help: "Entries evicted to keep a tier's budget, by tier (memory, disk).",
		}, []string{"tier"}),
		bytes: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dragon_kvcache_bytes", Help: "Bytes of KV state the cache holds, by tier (memory, disk).",
		}, []string{"tier"}),
		restore: f.NewHistogram(prometheus.HistogramOpts{
			Name: "dragon_kvcache_restore_seconds", Help: "Time to restore one cached prefix into a sequence.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14), // 0.1 ms … 0.8 s
		}),
	}
}

// Hit implements Observer.
func (m *Metrics) Hit(t Tier) { m.hits.WithLabelValues(t.String()).Inc() }

// Miss implements Observer.
func (m *Metrics) Miss() { m.misses.Inc() }

// Evict implements Observer.
func (m *Metrics) Evict(t Tier) { m.evictions.WithLabelValues(t.String()).Inc() }

// Bytes implements Observer.
func (m *Metrics) Bytes(t Tier, n int64) { m.bytes.WithLabelValues(t.String()).Set(float64(n)) }

// Restore implements Observer.
func (m *Metrics) Restore(seconds float64) { m.restore.Observe(seconds) }
