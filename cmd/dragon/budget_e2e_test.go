package main

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/aggbench"
	"github.com/dragon-rag/dragon/engine/residency"
	"github.com/dragon-rag/dragon/internal/memcgroup"
	"github.com/dragon-rag/dragon/internal/testmodel"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// TestStreamedWeightsAnswerAlike: a device given --memory-mb below its
// model's weights streams them from the file (issue 57) and answers with
// the tokens of the same device unbudgeted. Where this process may make
// cgroup v1 memory groups (root), the budgeted daemon runs in one limited
// to the budget plus the process's own share (the binary, the Go runtime):
// it reached the limit, and the kernel killed nothing.
func TestStreamedWeightsAnswerAlike(t *testing.T) {
	// A copy of its own: its page cache is charged to the group, not
	// shared with the other tests' daemons, which map the same file.
	model := t.TempDir() + "/model.gguf"
	src, err := os.ReadFile(testmodel.Path(t))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(model, src, 0o644))
	require.NoError(t, memcgroup.DropFromPageCache(model), "written, its pages are charged to this test")
	weightsMB := len(src) >> 20
	// ownMB: the binary, the Go runtime and, under -race, its shadow.
	const budgetMB, ownMB = 85, 40 + raceShareMB
	require.Less(t, budgetMB, weightsMB, "a budget below the weights")

	args := func(budget int) []string {
		return []string{"device", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", model, "--threads", "1",
			"--index", "", "--cloud", "", "--profile", "", "--kv-cache-mb", "0", "--ctx", "256", "--max-passages", "1", "--passages", "1", "--cloud-passages", "1", "--memory-mb", strconv.Itoa(budget)}
	}
	req := &dragonv1.GenerateRequest{Prompt: "What is the capital of France?", Sampling: &dragonv1.SamplingParams{MaxTokens: 8}}
	answer := func(dev *aggbench.Daemon) []int32 {
		a, err := ask(t, dialDevice(t, dev), req)
		require.NoError(t, err, "%s", dev.Logs())
		require.NotEmpty(t, a.Tokens)
		return a.Tokens
	}
	free := startDaemon(t, "device", args(0)...)
	want := answer(free)
	require.NoError(t, free.Stop(30*time.Second), "its mapping would keep the file's pages cached")

	var group *memcgroup.Group
	argv := []string{os.Args[0]}
	if memcgroup.Available() {
		group, err = memcgroup.New(fmt.Sprintf("dragon-test-%d", os.Getpid()))
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, group.Remove()) })
		require.NoError(t, group.Limit((budgetMB+ownMB)<<20))
		argv = group.Argv(argv...)
		// The unbudgeted daemon read it into the page cache.
		require.NoError(t, memcgroup.DropFromPageCache(model))
	} else {
		t.Log("no cgroup v1 memory groups here (not root): the budgeted daemon runs without a limit")
	}
	dev, err := aggbench.StartDaemon("device", "", []string{"DRAGON_CHILD_ARGS=" + strings.Join(args(budgetMB), "\n")}, argv...)
	if err != nil && group != nil {
		t.Fatalf("%v\n(processes the kernel killed at the group's limit: %d)", err, group.OOMKills())
	}
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, dev.Stop(30*time.Second)) })
	got := answer(dev)
	assert.Equal(t, want, got, "greedy under the budget equals greedy without it")
	assert.Contains(t, dev.Logs(), "streamed=true")
	assert.Contains(t, dev.Logs(), "the streamed layers are read into layer buffers", "--stream-readers' default")
	if group == nil {
		return
	}
	pinned := regexp.MustCompile(`the weights are streamed from the file.*pinned_mb=([0-9]+).*head_readahead_mb=([0-9]+)`).FindStringSubmatch(dev.Logs())
	require.NotNil(t, pinned, "the part the budget holds is locked:\n%s", dev.Logs())
	mb, _ := strconv.Atoi(pinned[1])
	headRoom, _ := strconv.Atoi(pinned[2])
	// The head (28 MiB) is not pinned: up to residency.FaultRoom (32 MiB
	// where the disk reads 8 MiB ahead) of what would be is left to its
	// readahead, and the rest locked.
	assert.Positive(t, mb+headRoom, "what the budget holds beside the window is locked or left to the head's readahead")
	assert.LessOrEqual(t, int64(headRoom), residency.FaultRoom(model)>>20+1)
	assert.Less(t, mb, weightsMB)
	peak, err := group.Peak()
	require.NoError(t, err)
	t.Logf("pinned %d MiB of %d, %d MiB left to the head's readahead; the group's peak %d MiB of %d", mb, weightsMB, headRoom, peak>>20, budgetMB+ownMB)
	assert.GreaterOrEqual(t, peak, int64(budgetMB+ownMB-4)<<20, "the daemon reached the limit: the weights did not all stay")
	assert.Zero(t, group.OOMKills(), "nothing was killed at the limit")
	// The kernel enforces the limit, but charges what may not fail (page
	// tables, some kernel allocations) past it rather than fail it, and
	// the peak records those: once one page over, under -race with the
	// layers' readers on (make test, 2026-12-07).
	const forced = 64 << 10
	assert.LessOrEqual(t, peak, int64(budgetMB+ownMB)<<20+forced)
}
