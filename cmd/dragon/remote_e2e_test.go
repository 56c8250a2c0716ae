package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/testmodel"
	"github.com/dragon-rag/dragon/internal/weaviatetest"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// A cloud serving its corpus from Weaviate answers with the device; when
// the engine dies, the cloud's /readyz says so and the device answers
// alone, promptly, instead of hanging.
func TestCloudOnWeaviateAndItsOutage(t *testing.T) {
	m, err := llamacpp.Load(testmodel.Path(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	dir, _ := warmIndex(t, m)
	m.Close()
	cl := weaviatetest.Start(t, 1)
	url := "weaviate://" + strings.TrimPrefix(cl.URL(0), "http://") + "/Public"
	_, err = runIndex(t, "push", "--dir", dir, "--to", url, "-q")
	require.NoError(t, err)

	// The cloud searches over the engine's gRPC port.
	client, dev, cld := pairWith(t, 0, []string{"--index", url + "?timeout=3s&grpc=" + cl.GRPC(0)}, nil, nil)
	ready := func() int {
		resp, err := http.Get("http://" + cld.HTTPAddr() + "/readyz")
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	req := &dragonv1.GenerateRequest{Prompt: "Which volcano is on Sicily?", Sampling: &dragonv1.SamplingParams{MaxTokens: 8}}
	a, err := ask(t, client, req)
	require.NoError(t, err, "device log:\n%s\ncloud log:\n%s", dev.Logs(), cld.Logs())
	assert.False(t, a.Summary.GetFallback(), "cloud log:\n%s", cld.Logs())
	assert.Equal(t, uint32(2), a.Summary.GetPassagesCloud())
	assert.Equal(t, http.StatusOK, ready())

	cl.Kill(0)
	assert.Equal(t, http.StatusServiceUnavailable, ready(), "readiness follows the engine")
	start := time.Now()
	a, err = ask(t, client, req)
	require.NoError(t, err, "device log:\n%s", dev.Logs())
	assert.True(t, a.Summary.GetFallback(), "the device answered alone")
	assert.NotEmpty(t, strings.TrimSpace(a.Text))
	assert.Less(t, time.Since(start), 20*time.Second)
	// The cause is in the cloud's log (the device may only have seen the
	// stream end, depending on which of its sends and reads came first).
	assert.Eventually(t, func() bool {
		return strings.Contains(cld.Logs(), "retrieval failed") && strings.Contains(cld.Logs(), "unavailable")
	},
		5*time.Second, 50*time.Millisecond, "cloud log:\n%s", cld.Logs())
}
