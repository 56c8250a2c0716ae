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
	diskErrs  prometheus.Counter
	diskOn    prometheus.Gauge
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
		diskErrs: f.NewCounter(prometheus.CounterOpts{
			Name: "dragon_kvcache_disk_errors_total", Help: "Writes of an entry to the cache's disk that failed (a full or failing disk); each turns disk writes off for a while.",
		}),
		diskOn: f.NewGauge(prometheus.GaugeOpts{
			Name: "dragon_kvcache_disk_writing", Help: "1 while the cache writes entries to its disk, 0 after a failed write until one works again (and without a cache directory).",
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

// DiskError implements Observer.
func (m *Metrics) DiskError() { m.diskErrs.Inc() }

// DiskOn implements Observer.
func (m *Metrics) DiskOn(on bool) {
	if on {
		m.diskOn.Set(1)
	} else {
		m.diskOn.Set(0)
	}
}
