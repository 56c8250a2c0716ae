package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/testmodel"
)

// smol is SmolLM2-135M-Instruct Q8_0's footprint (engine/llamacpp's
// TestFootprint reads it from the file).
var smol = llamacpp.Footprint{Weights: 143_025_984, KVPerToken: 23_040, Vocab: 49_152, Heads: 9}

func TestPlanMemory(t *testing.T) {
	// Compute at ctx 1024: 512 × (49152 + 9·1024) × 4 = 119,537,664 bytes;
	// streamed, in passes of 64 tokens, an eighth of it.
	const compute, streamedCompute = 119_537_664, 14_942_208
	const layer = 4 << 20
	perSeq := int64(1024 * 23_040)
	fixed := smol.Weights + compute
	window := int64(2*layer + streamSlack)
	cases := []struct {
		name        string
		budget      int64
		maxPassages int
		cache       int64
		want        int // sequences; 0: an error
		streamed    bool
	}{
		{"room for all", fixed + 8*perSeq, 8, 0, 8, false},
		{"room for three", fixed + 3*perSeq + perSeq/2, 8, 0, 3, false},
		{"exactly one", fixed + perSeq, 8, 0, 1, false},
		{"one byte short: the weights are streamed", fixed + perSeq - 1, 8, 0, 8, true},
		{"the prefix cache counts", fixed + 3*perSeq, 8, perSeq, 2, false},
		{"max-passages caps", fixed + 100*perSeq, 4, 0, 4, false},
		{"less than the weights", smol.Weights * 3 / 4, 8, 0, 1, true},
		{"the least that streams", streamedCompute + window + perSeq, 8, 0, 1, true},
		{"one byte below it", streamedCompute + window + perSeq - 1, 8, 0, 0, true},
		{"the cache counts when streamed", streamedCompute + window + perSeq, 8, 1, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := planMemory(c.budget, smol, llamacpp.Footprint{}, 1024, c.maxPassages, c.cache, streamShape{LargestLayer: layer})
			if c.want == 0 {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "cannot hold one passage sequence even with the weights (137 MiB) streamed")
				assert.Contains(t, err.Error(), fmt.Sprintf("at least --memory-mb %d", mib(streamedCompute+window+c.cache+perSeq)))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, p.Sequences)
			assert.Equal(t, c.streamed, p.Streamed)
			assert.Equal(t, int64(c.want)*perSeq, p.KV)
			if !c.streamed {
				assert.Equal(t, int64(compute), p.Compute)
				assert.Equal(t, planUbatch, p.Ubatch)
				assert.LessOrEqual(t, p.Weights+p.Compute+p.Cache+p.KV, c.budget)
				return
			}
			assert.Equal(t, int64(streamedCompute), p.Compute)
			assert.Equal(t, streamUbatch, p.Ubatch)
			assert.Equal(t, window, p.Window)
			assert.GreaterOrEqual(t, p.Pinned, int64(0))
			assert.LessOrEqual(t, p.Pinned, p.Weights)
			assert.Equal(t, c.budget, p.Compute+p.Cache+p.KV+p.Window+p.Pinned, "what is not spent otherwise is pinned")
		})
	}
}

// TestPlanMemoryWithDraft: a draft model (--draft-model) is kept whole
// beside the target, its KV a sequence beside the target's, and a budget
// that cannot hold it with one streamed sequence is refused with the least
// that can, which then plans.
func TestPlanMemoryWithDraft(t *testing.T) {
	// A target shaped as Qwen2.5-1.5B, SmolLM2 as its draft.
	target := llamacpp.Footprint{Weights: 1_000 << 20, KVPerToken: 28_672, Vocab: 151_936, Heads: 12}
	const ctx, layer = 1024, 30 << 20
	draftCompute := func(ubatch int64) int64 { return ubatch * (49_152 + 9*ctx) * 4 }
	draftSeq := int64(ctx) * smol.KVPerToken
	t.Run("everything fits", func(t *testing.T) {
		p, err := planMemory(4<<30, target, smol, ctx, 4, 0, streamShape{LargestLayer: layer})
		require.NoError(t, err)
		assert.False(t, p.Streamed)
		assert.Equal(t, 4, p.Sequences)
		assert.Equal(t, smol.Weights+draftCompute(planUbatch)+4*draftSeq, p.Draft)
		assert.LessOrEqual(t, p.Weights+p.Compute+p.Cache+p.KV+p.Draft, int64(4<<30))
	})
	t.Run("the target streamed beside it", func(t *testing.T) {
		budget := int64(600 << 20)
		p, err := planMemory(budget, target, smol, ctx, 4, 0, streamShape{LargestLayer: layer})
		require.NoError(t, err)
		require.True(t, p.Streamed)
		assert.Equal(t, smol.Weights+draftCompute(streamUbatch)+int64(p.Sequences)*draftSeq, p.Draft)
		assert.Equal(t, budget, p.Compute+p.Cache+p.KV+p.Window+p.Pinned+p.Draft, "what is not spent otherwise is pinned")
		alone, err := planMemory(budget, target, llamacpp.Footprint{}, ctx, 4, 0, streamShape{LargestLayer: layer})
		require.NoError(t, err)
		assert.Less(t, p.Pinned, alone.Pinned-smol.Weights, "the draft's memory comes out of the target's pinned weights")
	})
	t.Run("too small for the draft", func(t *testing.T) {
		_, err := planMemory(200<<20, target, smol, ctx, 4, 0, streamShape{LargestLayer: layer})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "the draft model kept whole")
		var least int64
		_, err = fmt.Sscanf(err.Error()[strings.Index(err.Error(), "at least --memory-mb "):], "at least --memory-mb %d", &least)
		require.NoError(t, err)
		p, err := planMemory(least<<20, target, smol, ctx, 4, 0, streamShape{LargestLayer: layer})
		require.NoError(t, err, "the least named plans")
		assert.Equal(t, 1, p.Sequences)
		_, err = planMemory(200<<20, target, llamacpp.Footprint{}, ctx, 4, 0, streamShape{LargestLayer: layer})
		assert.NoError(t, err, "without the draft it fits")
	})
}

// TestPlanMemoryLeavesRoomForAnUnpinnedHead: when what is pinned cannot
// hold the output head, up to HeadFaults of it is left to the page cache
// for the head's readahead; the least budget does not change.
func TestPlanMemoryLeavesRoomForAnUnpinnedHead(t *testing.T) {
	target := llamacpp.Footprint{Weights: 1_000 << 20, KVPerToken: 28_672, Vocab: 151_936, Heads: 12}
	shape := streamShape{LargestLayer: 30 << 20, Head: 182 << 20, HeadFaults: 32 << 20}
	layersOnly := streamShape{LargestLayer: shape.LargestLayer}
	const ctx = 1024
	for _, c := range []struct {
		name     string
		budgetMB int64
		room     int64 // bytes of the layers-only plan's pin left to the page cache; -1: all of it
	}{
		{"the head pinned", 600, 0},
		{"the head from the page cache", 300, shape.HeadFaults},
		{"near the least, all of it", 190, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			budget := c.budgetMB << 20
			p, err := planMemory(budget, target, llamacpp.Footprint{}, ctx, 1, 0, shape)
			require.NoError(t, err)
			require.True(t, p.Streamed)
			without, err := planMemory(budget, target, llamacpp.Footprint{}, ctx, 1, 0, layersOnly)
			require.NoError(t, err)
			if c.room < 0 {
				require.Less(t, without.Pinned, shape.HeadFaults)
				c.room = without.Pinned
			}
			assert.Equal(t, without.Pinned-c.room, p.Pinned)
			assert.Equal(t, without.Window+c.room, p.Window)
			assert.Equal(t, c.room, p.HeadRoom)
			assert.Equal(t, budget, p.Compute+p.Cache+p.KV+p.Window+p.Pinned)
		})
	}
	_, err := planMemory(100<<20, target, llamacpp.Footprint{}, ctx, 1, 0, shape)
	require.Error(t, err)
	_, errLayersOnly := planMemory(100<<20, target, llamacpp.Footprint{}, ctx, 1, 0, layersOnly)
	assert.Equal(t, errLayersOnly.Error(), err.Error(), "the same least")
}

// cpuTree writes a fake /sys/devices/system/cpu: one cpuinfo_max_freq per
// core ("" leaves the core without cpufreq, "x" writes garbage).
func cpuTree(t *testing.T, freqs ...string) string {
	t.Helper()
	dir := t.TempDir()
	for i, f := range freqs {
		d := filepath.Join(dir, fmt.Sprintf("cpu%d", i), "cpufreq")
		require.NoError(t, os.MkdirAll(d, 0o755))
		if f != "" {
			require.NoError(t, os.WriteFile(filepath.Join(d, "cpuinfo_max_freq"), []byte(f+"\n"), 0o644))
		}
	}
	// Entries that are not cores.
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "cpufreq", "policy0"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "cpuidle"), 0o755))
	return dir
}

func TestDefaultThreads(t *testing.T) {
	rep := func(n int, f string) []string { return strings.Split(strings.Repeat(f+" ", n)[:n*(len(f)+1)-1], " ") }
	cat := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	cases := []struct {
		name  string
		freqs []string
		ncpu  int
		want  int
	}{
		{"a VM without cpufreq", nil, 2, 1},
		{"cpufreq dirs without max freq", rep(4, ""), 4, 1},
		{"homogeneous 8 cores", rep(8, "2400000"), 8, 1},
		{"4 big + 4 little", cat(rep(4, "1800000"), rep(4, "2800000")), 8, 4},
		{"1 prime + 3 big + 4 little", cat(rep(4, "1800000"), rep(3, "2400000"), rep(1, "3200000")), 8, 4},
		{"2 big + 6 little", cat(rep(6, "2000000"), rep(2, "2600000")), 8, 2},
		{"7 big + 1 little leaves a core", cat(rep(1, "1000000"), rep(7, "2000000")), 8, 7},
		{"1 big + 1 little", []string{"1000000", "2000000"}, 2, 1},
		{"an unreadable core is skipped", cat([]string{"x"}, rep(2, "1800000"), rep(2, "2800000")), 5, 2},
		{"affinity narrower than the CPU", cat(rep(4, "1800000"), rep(4, "2800000")), 3, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, defaultThreads(cpuTree(t, c.freqs...), c.ncpu))
		})
	}
	assert.Equal(t, 1, defaultThreads(filepath.Join(t.TempDir(), "missing"), 8))
}

func TestResidentMemoryMetrics(t *testing.T) {
	status := filepath.Join(t.TempDir(), "status")
	require.NoError(t, os.WriteFile(status, []byte("Name:\tdragon\nVmPeak:\t  900000 kB\nVmHWM:\t  412345 kB\nVmRSS:\t  301000 kB\nThreads:\t9\n"), 0o644))
	reg := prometheus.NewRegistry()
	registerResidentMemory(reg, status)
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
	want := `
# HELP dragon_resident_memory_bytes Resident memory of the daemon (VmRSS), mapped model pages included.
# TYPE dragon_resident_memory_bytes gauge
dragon_resident_memory_bytes 3.08224e+08
# HELP dragon_resident_memory_peak_bytes Peak resident memory of the daemon since it started (VmHWM).
# TYPE dragon_resident_memory_peak_bytes gauge
dragon_resident_memory_peak_bytes 4.2224128e+08
`
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want)))
}

// TestMemoryBudgetTooSmall: a budget that cannot hold one passage sequence
// even with the weights streamed stops the device daemon at start-up,
// saying what would fit.
func TestMemoryBudgetTooSmall(t *testing.T) {
	cmd := newDeviceCmd()
	cmd.SetArgs([]string{"--model", testmodel.Path(t), "--index", "", "--cloud", "", "--profile", "", "--kv-cache-mb", "0",
		"--listen", "127.0.0.1:0", "--http", "", "--memory-mb", "60"})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--memory-mb 60 cannot hold one passage sequence even with the weights (93 MiB) streamed")
	assert.Contains(t, err.Error(), "at least --memory-mb 89")
}
