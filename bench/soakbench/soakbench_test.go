package soakbench

import (
	"bytes"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSummarizeRSS: the largest RSS per minute and over the run, and the
// growth of each process after its own warm-up (a restarted daemon is a
// process of its own, warmed up from its first sample).
func TestSummarizeRSS(t *testing.T) {
	s := &soak{o: Options{Duration: 3 * time.Minute}} // a warm-up of 1 minute
	sec := func(n int) time.Duration { return time.Duration(n) * time.Second }
	s.rss = []rssSample{
		{at: sec(0), process: "cloud#0", cloud: true, mb: 900},
		{at: sec(0), process: "device 0#1", mb: 400},
		{at: sec(61), process: "cloud#0", cloud: true, mb: 1000},
		{at: sec(61), process: "device 0#1", mb: 500},
		{at: sec(70), process: "device 0#2", mb: 100},                          // restarted: small, then grows in its warm-up
		{at: sec(120), process: "cloud#0", cloud: true, mb: 1050, cacheMB: 50}, // its cache filled
		{at: sec(125), process: "device 0#2", mb: 450},
		{at: sec(131), process: "device 0#2", mb: 460},
		{at: sec(150), process: "device 0#1", mb: 520},
		{at: sec(0), process: "device 1#1", library: true, mb: 300},
		{at: sec(60), process: "device 1#1", library: true, mb: 300},
		{at: sec(170), process: "device 1#1", library: true, mb: 600}, // its index grew
	}
	s.summarizeRSS()
	r := s.rep.RSSMB
	assert.Equal(t, 60.0, r.WarmupS)
	assert.Equal(t, 1050.0, r.CloudMax)
	assert.Equal(t, 600.0, r.DeviceMax)
	assert.Equal(t, []RSSMinute{{0, 400, 900}, {1, 500, 1000}, {2, 600, 1050}}, r.Minutes)
	// cloud 1050/1000, device 0#1 520/500, device 0#2 460/450: the cloud's
	// 5%; the documents device doubled, and is counted apart.
	assert.InDelta(t, 0.05, r.GrowthAfterWarmup, 1e-9)
	assert.InDelta(t, 1.0, r.GrowthByProcess["device 1#1"], 1e-9)
	assert.InDelta(t, 0.04, r.GrowthByProcess["device 0#1"], 1e-9)
	assert.Len(t, r.GrowthByProcess, 4)
	// Outside its cache, the cloud stayed at 1000: the devices' 4% leads.
	assert.InDelta(t, 0.04, r.OutsideCacheGrowth, 1e-9)
	assert.InDelta(t, 0, r.OutsideCacheGrowthByProcess["cloud#0"], 1e-9)
}

func TestUniqueWordsDiffer(t *testing.T) {
	seen := map[string]bool{}
	for k := range 2000 {
		w := uniqueWord(k)
		assert.False(t, seen[w], "%d: %s again", k, w)
		assert.Regexp(t, `^zq[a-z]+x$`, w)
		seen[w] = true
	}
}

// parkedForSoakTest waits on stop: the goroutine the profile test adds.
func parkedForSoakTest(stop chan struct{}) { <-stop }

// TestGoroutineProfilesShowWhatGrew: of two real goroutine profiles, the
// stack that holds one goroutine more is named, with its counts, and
// nothing else is (totals are not compared: the test binary's own
// goroutines come and go).
func TestGoroutineProfilesShowWhatGrew(t *testing.T) {
	profile := func() goroutineProfile {
		var b bytes.Buffer
		require.NoError(t, pprof.Lookup("goroutine").WriteTo(&b, 1))
		p, err := parseGoroutines(b.String())
		require.NoError(t, err)
		return p
	}
	before := profile()
	stop, done := make(chan struct{}), make(chan struct{})
	defer func() { close(stop); <-done }()
	go func() { parkedForSoakTest(stop); close(done) }()
	time.Sleep(50 * time.Millisecond) // until it parks
	after := profile()
	assert.Positive(t, after.total)
	grown := after.grown(before)
	assert.Contains(t, grown, "0 → 1 in")
	assert.Contains(t, grown, "soakbench.parkedForSoakTest")
	assert.Equal(t, 1, strings.Count(grown, " → "), "one stack grew: %s", grown)
	assert.Empty(t, before.grown(before))
}
