package main

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dragon-rag/dragon/internal/testmodel"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// httpGet returns the status and body of GET url.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// metric reads one unlabelled sample from a daemon's /metrics.
func metric(t *testing.T, addr, name string) float64 {
	t.Helper()
	_, body := httpGet(t, "http://"+addr+"/metrics")
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

// TestIdleUnloadRealModel: a device daemon within --memory-mb answers,
// frees the model and its context after --idle-unload (its resident
// memory drops, /readyz stays ready and says so), and answers the same
// again after loading them back.
func TestIdleUnloadRealModel(t *testing.T) {
	dev := startDaemon(t, "device", "device", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", testmodel.Path(t),
		"--threads", "1", "--index", "", "--cloud", "", "--profile", "", "--kv-cache-mb", "0",
		"--memory-mb", "320", "--idle-unload", "1s")
	conn, err := grpc.NewClient(dev.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := dragonv1.NewDeviceServiceClient(conn)
	require.Eventually(t, func() bool { return dev.HTTPAddr() != "" }, 10*time.Second, 10*time.Millisecond)
	assert.Contains(t, dev.Logs(), "--memory-mb lowers --max-passages", "320 MiB holds fewer than 8 sequences")

	req := &dragonv1.GenerateRequest{Prompt: "What is the capital of France?", Sampling: &dragonv1.SamplingParams{MaxTokens: 4}}
	timed := func() ([]int32, time.Duration) {
		start := time.Now()
		a, err := ask(t, client, req)
		require.NoError(t, err, "device log:\n%s", dev.Logs())
		require.NotEmpty(t, a.Tokens)
		return a.Tokens, time.Since(start)
	}
	want, _ := timed()
	_, warm := timed()
	loaded := metric(t, dev.HTTPAddr(), "dragon_resident_memory_bytes")

	require.Eventually(t, func() bool {
		code, body := httpGet(t, "http://"+dev.HTTPAddr()+"/readyz")
		return code == http.StatusOK && strings.Contains(body, "model: unloaded")
	}, 20*time.Second, 50*time.Millisecond, "unloaded after idling, and still ready")
	idle := metric(t, dev.HTTPAddr(), "dragon_resident_memory_bytes")
	assert.Greater(t, loaded-idle, float64(100<<20), "the weights' pages and the context went back to the OS: %.0f MiB → %.0f MiB", loaded/(1<<20), idle/(1<<20))

	got, cold := timed()
	assert.Equal(t, want, got, "loaded back: the same answer")
	peak := metric(t, dev.HTTPAddr(), "dragon_resident_memory_peak_bytes")
	t.Logf("resident %.0f MiB loaded, %.0f MiB unloaded, peak %.0f MiB; a 4-token answer: %v warm, %v after loading back",
		loaded/(1<<20), idle/(1<<20), peak/(1<<20), warm, cold)
	assert.Contains(t, dev.Logs(), "model loaded back after idling")
}
