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

// TestSoak is make test's short soak (issue 58): a cloud searching a
// Weaviate node and two devices, as processes, two minutes of links that
// change shape, stall and reset, a device killed mid-answer, the cloud
// restarted, its KV-cache disk filled, its search engine slowed and
// paused, and a third device given documents and killed among them. No
// token decided with the cloud may differ from the fault-free answer's,
// every answer ends in a state with its reason, no acknowledged add or
// delete is lost, and no session or goroutine is left over.
func TestSoak(t *testing.T) {
	cl, url := warmCollection(t)
	host, collection, _ := strings.Cut(strings.TrimPrefix(url, "weaviate://"), "/")
	rep, err := soakbench.Run(context.Background(), soakbench.Options{
		Start: func(name string, args []string) (*aggbench.Daemon, error) {
			return aggbench.StartDaemon(name, "", []string{"DRAGON_CHILD_ARGS=" + strings.Join(args, "\n")}, os.Args[0])
		},
		Devices: 2, Duration: 2 * time.Minute, Model: testmodel.Path(t),
		CloudIndex: testmodel.IndexDir(t, "cloud"), DeviceIndex: testmodel.IndexDir(t, "device"),
		Questions: promptset.Questions[:4], MaxTokens: 8, CloudTimeout: 3 * time.Second, Seed: 1,
		Work: t.TempDir(), Log: t.Logf, Documents: true,
		Backend: &soakbench.Backend{HTTP: host, GRPC: cl.GRPC(0), Collection: collection,
			Pause: func() error { return cl.Pause(0) }, Resume: func() error { return cl.Resume(0) }},
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
	// Each fallback is counted by its device with a reason: every answer
	// that fell back, and an answer a kill cut off after its device fell
	// back (so at most Cut more); a killed device's counters are read just
	// before the kill, so one answer may slip between (one fewer).
	extra := fallbacks - (rep.Answers - rep.WithCloud)
	assert.True(t, extra >= -1 && extra <= rep.Cut, "%d fallbacks counted by the devices, %d answers fell back, %d cut", fallbacks, rep.Answers-rep.WithCloud, rep.Cut)
	for _, kind := range []string{"kill_device", "kill_documents_device", "restart_cloud", "reset", "stall_long", "backend_slow", "pause_backend"} {
		assert.Positive(t, rep.Faults[kind], kind)
	}
	assert.Positive(t, rep.Faults["cloud_disk_full"]+rep.Faults["cloud_disk_broken"], "the cloud's disk failed")
	assert.Positive(t, rep.CacheDiskErrors, "the failed disk was written to and counted")
	assert.Zero(t, rep.LostAcks, "acknowledged adds and deletes of the documents device")
	assert.Greater(t, rep.Documents.Added, 50)
	assert.Positive(t, rep.Documents.Deleted)
	assert.NotEmpty(t, rep.RSSMB.Minutes)
}
