package main

import (
	"bytes"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/testmodel"
	"github.com/dragon-rag/dragon/internal/weaviatetest"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/retrieval"
	"github.com/dragon-rag/dragon/retrieval/weaviate"
)

// warmCollection starts a Weaviate node and pushes the warm index's
// passages into its collection Public, returning the node and the
// collection's URL.
func warmCollection(t *testing.T) (*weaviatetest.Cluster, string) {
	t.Helper()
	m, err := llamacpp.Load(testmodel.Path(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	dir, _ := warmIndex(t, m)
	m.Close()
	cl := weaviatetest.Start(t, 1)
	url := "weaviate://" + strings.TrimPrefix(cl.URL(0), "http://") + "/Public"
	_, err = runIndex(t, "push", "--dir", dir, "--to", url, "-q")
	require.NoError(t, err)
	return cl, url
}

// A cloud serving its corpus from Weaviate answers with the device; when
// the engine hangs (paused) the cloud gives up on it at the URL's timeout
// and the device answers alone, and with the cloud again once the engine
// goes on; when the engine dies, the cloud's /readyz says so and the
// device answers alone, promptly, instead of hanging.
func TestCloudOnWeaviateAndItsOutage(t *testing.T) {
	cl, url := warmCollection(t)

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

	// A node that hangs rather than dies: its connections stay open.
	require.NoError(t, cl.Pause(0))
	start := time.Now()
	a, err = ask(t, client, req)
	require.NoError(t, err, "device log:\n%s", dev.Logs())
	assert.True(t, a.Summary.GetFallback(), "the device answered alone")
	assert.Less(t, time.Since(start), 9*time.Second, "the cloud's search timeout (3 s), not the device's stall timeout (10 s), ended it")
	require.NoError(t, cl.Resume(0))
	require.Eventually(t, func() bool {
		a, err := ask(t, client, req)
		return err == nil && !a.Summary.GetFallback()
	}, 20*time.Second, 100*time.Millisecond, "the cloud answers again once the engine goes on:\n%s", cld.Logs())
	assert.Eventually(t, func() bool { return metric(t, cld.HTTPAddr(), "dragon_sessions") == 0 },
		5*time.Second, 50*time.Millisecond, "no cloud session left over from the hung search")

	cl.Kill(0)
	assert.Equal(t, http.StatusServiceUnavailable, ready(), "readiness follows the engine")
	start = time.Now()
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

// adminDo sends an admin API request to a cloud, with a multipart body of
// files when any are given, and decodes its JSON answer.
func adminDo(t *testing.T, method, url string, files ...[2]string) (int, map[string]any) {
	t.Helper()
	body, ctype := &bytes.Buffer{}, ""
	if len(files) > 0 {
		body, ctype = multipartFiles(t, files)
	}
	req, err := http.NewRequest(method, url, body)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer admin-token")
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	return sendJSON(t, req)
}

// A cloud on Weaviate with the admin API: what the operator adds is kept
// in the admin index at the ack and written into the collection, where
// the cloud retrieves it; an add acknowledged just before a kill -9 gets
// there after the restart; a delete takes it out of the collection.
func TestCloudDocumentsIntoWeaviate(t *testing.T) {
	_, url := warmCollection(t)
	store, err := weaviate.Open(url)
	require.NoError(t, err)
	defer store.Close()
	inCollection := func(query string) []string {
		r, err := retrieval.OpenRemote(t.Context(), store, nil)
		require.NoError(t, err)
		hits, err := r.Search(t.Context(), query, 3, retrieval.ModeBM25)
		require.NoError(t, err)
		var out []string
		for _, h := range hits {
			out = append(out, h.Passage.Source)
		}
		return out
	}

	ledger := filepath.Join(t.TempDir(), "admin")
	args := []string{"cloud", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", testmodel.Path(t), "--threads", "1",
		"--index", url, "--profile", "", "--rerank-model", "", "--admin-token", "admin-token"}
	msg, err := dragonCLI(t, nil, args...)
	require.Error(t, err)
	assert.Contains(t, msg, "--admin-index DIR", "a Weaviate corpus needs a local index for the admin API")
	cld := startDaemon(t, "cloud", append(args, "--admin-index", ledger)...)
	docsURL := "http://" + cld.HTTPAddr() + "/v1/documents"

	code, out := adminDo(t, "POST", docsURL, [2]string{"public/almanac.txt", "The Zanzibar lighthouse almanac lists the first keeper as Mariam Okafor."})
	require.Equal(t, http.StatusOK, code, "%v", out)
	id := out["documents"].([]any)[0].(map[string]any)["id"].(string)
	require.Eventually(t, func() bool {
		_, d := adminDo(t, "GET", docsURL+"/"+id)
		return d["status"] == "indexed"
	}, 20*time.Second, 100*time.Millisecond, "written into the collection:\n%s", cld.Logs())
	assert.Equal(t, []string{"public/almanac.txt"}, inCollection("Zanzibar lighthouse keeper Okafor"))

	// The device's question retrieves it from the cloud's collection.
	dev := startDaemon(t, "device", "device", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", testmodel.Path(t), "--threads", "1",
		"--index", testmodel.IndexCopy(t, "device"), "--cloud", cld.Addr, "--profile", "", "--rerank-model", "")
	assert.Contains(t, sideSources(t, dialDevice(t, dev), "Who was the first keeper of the Zanzibar lighthouse?", dragonv1.Side_SIDE_CLOUD),
		"public/almanac.txt")

	// Acknowledged, then kill -9 before the collection could have it:
	// after the restart it is written there.
	code, out = adminDo(t, "POST", docsURL, [2]string{"public/tides.txt", "The Quillon harbour tide table was drawn by Ezekiel Brandvold."})
	require.Equal(t, http.StatusOK, code, "%v", out)
	require.NoError(t, cld.Kill())
	cld = startDaemon(t, "cloud", append(args, "--admin-index", ledger)...)
	docsURL = "http://" + cld.HTTPAddr() + "/v1/documents"
	assert.Eventually(t, func() bool {
		return slices.Contains(inCollection("Quillon harbour tide Brandvold"), "public/tides.txt")
	}, 20*time.Second, 100*time.Millisecond, "%s", cld.Logs())

	// A delete takes it out of the collection.
	code, out = adminDo(t, "DELETE", docsURL+"/"+id)
	require.Equal(t, http.StatusOK, code, "%v", out)
	assert.Eventually(t, func() bool {
		return !slices.Contains(inCollection("Zanzibar lighthouse keeper Okafor"), "public/almanac.txt")
	}, 20*time.Second, 100*time.Millisecond, "%s", cld.Logs())
	require.NotEmpty(t, inCollection("Etna volcano Sicily"), "the pushed corpus stays")
	assert.Equal(t, "volcano.txt", filepath.Base(inCollection("Etna volcano Sicily")[0]))
}
