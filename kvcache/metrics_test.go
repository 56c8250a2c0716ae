package kvcache_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/kvcache"
)

// metric is the value of the series name{labels} that g gathers (a
// histogram's sample count); ok is false when there is no such series.
func metric(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) (v float64, ok bool) {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if want, ok := labels[l.GetName()]; !ok || want != l.GetValue() {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func requireMetric(t *testing.T, g prometheus.Gatherer, want float64, name string, labels map[string]string) {
	t.Helper()
	v, ok := metric(t, g, name, labels)
	require.True(t, ok, "no series %s%v", name, labels)
	assert.Equal(t, want, v, "%s%v", name, labels)
}

func tier(t string) map[string]string { return map[string]string{"tier": t} }

func TestMetricsMemory(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := newCache(t, kvcache.Config{MemoryBytes: 640, Observer: kvcache.NewMetrics(reg)})
	c.Put(seq(1, 32), stateFor(32))
	c.Put(seq(2, 32), stateFor(32))
	for range 2 {
		_, ok := look(c, seq(1, 32))
		require.True(t, ok)
	}
	_, ok := c.Lookup(branch(1, 20, 1, 40), 0, 32) // a hit counted as a miss
	require.True(t, ok)
	_, ok = look(c, seq(7, 32)) // no hit: counts nothing
	require.False(t, ok)
	c.CountMiss()
	c.CountContextHit()
	c.Put(seq(3, 32), stateFor(32)) // evicts seq(2, 32), used least
	require.False(t, c.Has(seq(2, 32)))
	c.ObserveRestore(3 * time.Millisecond)
	c.ObserveRestore(time.Second)

	st := c.Stats()
	requireMetric(t, reg, 2, "dragon_kvcache_hits_total", tier("memory"))
	requireMetric(t, reg, 1, "dragon_kvcache_hits_total", tier("context"))
	requireMetric(t, reg, 2, "dragon_kvcache_misses_total", nil)
	requireMetric(t, reg, 1, "dragon_kvcache_evictions_total", tier("memory"))
	requireMetric(t, reg, 640, "dragon_kvcache_bytes", tier("memory"))
	requireMetric(t, reg, 0, "dragon_kvcache_bytes", tier("disk"))
	requireMetric(t, reg, 2, "dragon_kvcache_restore_seconds", nil)
	// The metrics agree with the counters.
	assert.Equal(t, 2.0, float64(st.Hits[kvcache.Memory]))
	assert.Equal(t, 1.0, float64(st.Hits[kvcache.Context]))
	assert.Equal(t, 2.0, float64(st.Misses))
	assert.Equal(t, 1.0, float64(st.Evictions[kvcache.Memory]))
	assert.Equal(t, 640.0, float64(st.MemoryBytes))
	_, ok = metric(t, reg, "dragon_kvcache_hits_total", tier("disk"))
	assert.False(t, ok, "no disk hits, no series")

	n, err := testutil.GatherAndCount(reg, "dragon_kvcache_hits_total")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "context and memory")
	n, err = testutil.GatherAndCount(reg, "dragon_kvcache_bytes")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "memory and disk")
	n, err = testutil.GatherAndCount(reg)
	require.NoError(t, err)
	assert.Equal(t, 9, n, "every series: 2 hits, misses, evictions, 2 bytes, restore, disk errors, disk writing")
	requireMetric(t, reg, 0, "dragon_kvcache_disk_writing", nil)

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

func TestMetricsDisk(t *testing.T) {
	dir := t.TempDir()
	size := fileSize(ns, 32, 320)
	reg1 := prometheus.NewRegistry()
	c1 := newCache(t, kvcache.Config{Dir: dir, DiskBytes: 2 * size, Observer: kvcache.NewMetrics(reg1)})
	for f := 1; f <= 3; f++ {
		c1.Put(seq(f, 32), stateFor(32))
	}
	requireMetric(t, reg1, 1, "dragon_kvcache_evictions_total", tier("disk"))
	requireMetric(t, reg1, float64(2*size), "dragon_kvcache_bytes", tier("disk"))
	requireMetric(t, reg1, 0, "dragon_kvcache_bytes", tier("memory"))
	assert.Equal(t, 2*size, c1.Stats().DiskBytes)

	// A restart publishes what it found, then disk hits and promotions.
	reg := prometheus.NewRegistry()
	c := newCache(t, kvcache.Config{Dir: dir, MemoryBytes: 1 << 20, DiskBytes: 2 * size, Observer: kvcache.NewMetrics(reg)})
	requireMetric(t, reg, float64(2*size), "dragon_kvcache_bytes", tier("disk"))
	requireMetric(t, reg, 0, "dragon_kvcache_bytes", tier("memory"))
	hits := 0
	for f := 1; f <= 3; f++ {
		if hit, ok := look(c, seq(f, 32)); ok {
			hits++
			assert.Equal(t, kvcache.Disk, hit.Tier)
		}
	}
	require.Equal(t, 2, hits)
	requireMetric(t, reg, 2, "dragon_kvcache_hits_total", tier("disk"))
	requireMetric(t, reg, 640, "dragon_kvcache_bytes", tier("memory"))
	requireMetric(t, reg, float64(2*size), "dragon_kvcache_bytes", tier("disk"))

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestMetricsAfterRefusal: the disk bytes published drop with an entry
// refused at Lookup.
func TestMetricsAfterRefusal(t *testing.T) {
	dir := t.TempDir()
	newCache(t, kvcache.Config{Dir: dir, DiskBytes: 1 << 20}).Put(seq(1, 32), stateFor(32))
	path := onlyFile(t, dir)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[len(b)-1] ^= 0xff
	require.NoError(t, os.WriteFile(path, b, 0o644))

	reg := prometheus.NewRegistry()
	c := newCache(t, kvcache.Config{Dir: dir, DiskBytes: 1 << 20, Observer: kvcache.NewMetrics(reg)})
	requireMetric(t, reg, float64(len(b)), "dragon_kvcache_bytes", tier("disk"))
	_, ok := look(c, seq(1, 32))
	require.False(t, ok)
	assert.Zero(t, c.Stats().DiskBytes)
	requireMetric(t, reg, 0, "dragon_kvcache_bytes", tier("disk"))
}

// TestMetricsDiskErrors: a failed write counts and turns the writing
// gauge off; the write that works after the retry turns it on.
func TestMetricsDiskErrors(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kv")
	reg := prometheus.NewRegistry()
	c := newCache(t, kvcache.Config{Dir: dir, MemoryBytes: 1 << 20, DiskBytes: 1 << 20, Observer: kvcache.NewMetrics(reg)})
	now := time.Unix(1_800_000_000, 0)
	kvcache.SetClock(c, func() time.Time { return now })
	requireMetric(t, reg, 1, "dragon_kvcache_disk_writing", nil)
	requireMetric(t, reg, 0, "dragon_kvcache_disk_errors_total", nil)

	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.WriteFile(dir, nil, 0o644))
	c.Put(seq(1, 32), stateFor(32))
	c.Put(seq(2, 32), stateFor(32))
	requireMetric(t, reg, 1, "dragon_kvcache_disk_errors_total", nil)
	requireMetric(t, reg, 0, "dragon_kvcache_disk_writing", nil)

	require.NoError(t, os.Remove(dir))
	require.NoError(t, os.Mkdir(dir, 0o755))
	now = now.Add(kvcache.DiskRetry)
	c.Put(seq(3, 32), stateFor(32))
	requireMetric(t, reg, 1, "dragon_kvcache_disk_errors_total", nil)
	requireMetric(t, reg, 1, "dragon_kvcache_disk_writing", nil)
}
