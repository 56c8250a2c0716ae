package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/aggbench"
	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/bench/soakbench"
	"github.com/dragon-rag/dragon/internal/testmodel"
)

// TestSoak is make test's short soak (issue 58): a cloud and two devices
// as processes, two minutes of links that change shape, stall and reset,
// a device killed mid-answer, the cloud restarted and its KV-cache disk
// broken. No token decided with the cloud may differ from the fault-free
// answer's, every answer ends in a state with its reason, and no session
// or goroutine is left over.
func TestSoak(t *testing.T) {
	rep, err := soakbench.Run(context.Background(), soakbench.Options{
		Start: func(name string, args []string) (*aggbench.Daemon, error) {
			return aggbench.StartDaemon(name, "", []string{"DRAGON_CHILD_ARGS=" + strings.Join(args, "\n")}, os.Args[0])
		},
		Devices: 2, Duration: 2 * time.Minute, Model: testmodel.Path(t),
		CloudIndex: testmodel.IndexDir(t, "cloud"), DeviceIndex: testmodel.IndexDir(t, "device"),
		Questions: promptset.Questions[:4], MaxTokens: 8, CloudTimeout: 3 * time.Second, Seed: 1,
		Work: t.TempDir(), Log: t.Logf,
	})
	require.NoError(t, err)
	t.Logf("%+v", rep)
	assert.Zero(t, rep.WrongTokens, "tokens decided with the cloud that differ from the fault-free answer's: %v", rep.Wrong)
	assert.Zero(t, rep.SessionsOpenAtEnd)
	assert.LessOrEqual(t, rep.Goroutines.End, rep.Goroutines.Start, "goroutines left over")
	assert.Positive(t, rep.WithCloud, "answers with the cloud despite the faults")
	fallbacks := 0
	for _, n := range rep.Fallback {
		fallbacks += n
	}
	assert.Positive(t, fallbacks, "the faults made devices answer alone")
	// Each fallback is counted by its device with a reason (a killed
	// device's counters are read just before the kill, so one answer may
	// slip between).
	assert.InDelta(t, rep.Answers-rep.WithCloud, fallbacks, 1)
	for _, kind := range []string{"kill_device", "restart_cloud", "cloud_disk", "reset", "stall_long"} {
		assert.Positive(t, rep.Faults[kind], kind)
	}
	assert.Positive(t, rep.CacheDiskErrors, "the broken disk was written to and counted")
}
