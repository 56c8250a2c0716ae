package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/dragon-rag/dragon/bench/aggbench"
	"github.com/dragon-rag/dragon/internal/testmodel"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
)

// uploadFiles posts files (name → content) to a device's /v1/documents
// and returns the documents it answers with.
func uploadFiles(t *testing.T, httpAddr string, files ...[2]string) []map[string]any {
	t.Helper()
	body, ctype := multipartFiles(t, files)
	resp, err := http.Post("http://"+httpAddr+"/v1/documents", ctype, body)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out struct {
		Documents []map[string]any `json:"documents"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	require.Equal(t, http.StatusOK, resp.StatusCode, "%v", out)
	return out.Documents
}

// multipartFiles is an upload's body of files (name → content) and its
// content type.
func multipartFiles(t *testing.T, files [][2]string) (*bytes.Buffer, string) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, f := range files {
		w, err := mw.CreateFormFile("file", f[0])
		require.NoError(t, err)
		_, err = w.Write([]byte(f[1]))
		require.NoError(t, err)
	}
	require.NoError(t, mw.Close())
	return &body, mw.FormDataContentType()
}

func httpDo(t *testing.T, method, url string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	return sendJSON(t, req)
}

// sendJSON sends a request and decodes its JSON answer.
func sendJSON(t *testing.T, req *http.Request) (int, map[string]any) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// deviceSources asks a question and returns the sources of the device's
// side of the answer.
func deviceSources(t *testing.T, c dragonv1.DeviceServiceClient, q string) []string {
	t.Helper()
	return sideSources(t, c, q, dragonv1.Side_SIDE_DEVICE)
}

// sideSources asks a question and returns the sources of one side of the
// answer.
func sideSources(t *testing.T, c dragonv1.DeviceServiceClient, q string, side dragonv1.Side) []string {
	t.Helper()
	a, err := ask(t, c, &dragonv1.GenerateRequest{Prompt: q, Sampling: &dragonv1.SamplingParams{MaxTokens: 6}})
	require.NoError(t, err)
	var out []string
	for _, s := range a.Summary.GetSources() {
		if s.GetSide() == side {
			out = append(out, s.GetSource())
		}
	}
	return out
}

// dialDevice is a client of a device daemon's gRPC port.
func dialDevice(t *testing.T, dev *aggbench.Daemon) dragonv1.DeviceServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(dev.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return dragonv1.NewDeviceServiceClient(conn)
}

const gateMail = "From: Ann Halvorsen <ann@halvorsen.example>\r\nSubject: Halvorsen cabin gate code\r\n" +
	"Date: Mon, 7 Dec 2026 09:00:00 +0000\r\n\r\nThe gate code of the Halvorsen cabin is 4417; the key is under the blue flowerpot.\r\n"

// TestDocumentAPIEndToEnd: both daemons as processes. Documents added to
// the running device over HTTP (a real PDF, a mail, Markdown, an HTML page)
// are retrieved at once, and a damaged PDF fails alone; a deleted one is
// not; one acknowledged just before a kill -9 is there after the restart;
// questions are answered while files are being added; a filter narrows
// each side's retrieval; and the link to the cloud carries nothing of the
// documents nor the device's filter (the dragon_leak_sources build's
// device sends its sources and its filter, which the tap must then find).
func TestDocumentAPIEndToEnd(t *testing.T) {
	model := testmodel.Path(t)
	cld := startDaemon(t, "cloud", "cloud", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", model, "--threads", "1",
		"--index", testmodel.IndexDir(t, "cloud"), "--profile", "", "--rerank-model", "")
	link := newTap(t, cld.Addr)
	devArgs := []string{"device", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", model, "--threads", "1",
		"--index", testmodel.IndexCopy(t, "device"), "--cloud", link.ln.Addr().String(), "--profile", "", "--rerank-model", ""}
	startDevice := func() (*aggbench.Daemon, dragonv1.DeviceServiceClient) {
		dev := startDaemon(t, "device", devArgs...)
		require.Eventually(t, func() bool { return dev.HTTPAddr() != "" }, 30*time.Second, 20*time.Millisecond)
		conn, err := grpc.NewClient(dev.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return dev, dragonv1.NewDeviceServiceClient(conn)
	}
	dev, client := startDevice()

	paper, err := os.ReadFile(filepath.Join(testmodel.FormatsDir(t), "pdf", "r-sandwich-CL.pdf"))
	require.NoError(t, err)
	cut, err := os.ReadFile(filepath.Join(testmodel.FormatsDir(t), "damaged", "truncated.pdf"))
	require.NoError(t, err)
	docs := uploadFiles(t, dev.HTTPAddr(),
		[2]string{"papers/sandwich-CL.pdf", string(paper)},
		[2]string{"papers/cut.pdf", string(cut)},
		[2]string{"mail/gate.eml", gateMail},
		[2]string{"notes/quokka.md", "# Quokka trip\n\nOn Rottnest Island the quokkas followed us to the lighthouse at Wadjemup."},
		[2]string{"web/ferry.html", `<html><head><title>Orkney ferry times</title><script>track()</script></head><body><nav>Home</nav>` +
			`<main><p>The Stromness ferry to Scrabster leaves at 09:00 from pier four.</p></main></body></html>`})
	require.Len(t, docs, 5)
	assert.Equal(t, "notes/quokka.md", docs[3]["source"])
	assert.Equal(t, "pdf", docs[0]["kind"])
	assert.Equal(t, "failed", docs[1]["status"], "a real PDF cut in half fails alone")
	assert.Contains(t, docs[1]["error"], "damaged")
	assert.Equal(t, "Orkney ferry times", docs[4]["title"])
	for _, d := range append([]map[string]any{docs[0]}, docs[2:]...) {
		assert.Equal(t, "indexed", d["status"], "%v", d)
	}
	assert.Contains(t, deviceSources(t, client, "What is the gate code of the Halvorsen cabin?"), "mail/gate.eml", "retrieved once acknowledged")
	assert.Contains(t, deviceSources(t, client, "Where did the quokkas follow us on Rottnest Island?"), "notes/quokka.md")
	assert.Contains(t, deviceSources(t, client, "When does the Stromness ferry to Scrabster leave?"), "web/ferry.html")
	a, err := ask(t, client, &dragonv1.GenerateRequest{Prompt: "How does the sandwich package estimate clustered covariances?",
		Sampling: &dragonv1.SamplingParams{MaxTokens: 4}})
	require.NoError(t, err)
	var pages []string
	for _, s := range a.Summary.GetSources() {
		if s.GetSource() == "papers/sandwich-CL.pdf" {
			pages = append(pages, s.GetMetadata()["page"])
		}
	}
	require.NotEmpty(t, pages, "the real PDF is retrieved")
	for _, p := range pages {
		assert.Regexp(t, `^[0-9]+$`, p, "its passages say their page")
	}

	// A filter narrows the device's retrieval and stays on the device; the
	// cloud's narrows the cloud's.
	q := "What is the gate code of the Halvorsen cabin?"
	a, err = ask(t, client, &dragonv1.GenerateRequest{Prompt: q, Sampling: &dragonv1.SamplingParams{MaxTokens: 4}})
	require.NoError(t, err)
	var cloudSource string
	for _, s := range a.Summary.GetSources() {
		if s.GetSide() == dragonv1.Side_SIDE_CLOUD && cloudSource == "" {
			cloudSource = s.GetSource()
		}
	}
	require.NotEmpty(t, cloudSource)
	a, err = ask(t, client, &dragonv1.GenerateRequest{Prompt: q, Sampling: &dragonv1.SamplingParams{MaxTokens: 4},
		Filter: &dragonv1.RetrievalFilter{From: "ann halvorsen"}, CloudFilter: &dragonv1.RetrievalFilter{SourcePrefix: cloudSource}})
	require.NoError(t, err)
	for _, s := range a.Summary.GetSources() {
		want := "mail/gate.eml"
		if s.GetSide() == dragonv1.Side_SIDE_CLOUD {
			want = cloudSource
		}
		assert.Equal(t, want, s.GetSource(), "%v", s.GetSide())
	}

	// Deleted: no longer retrieved.
	code, out := httpDo(t, "DELETE", "http://"+dev.HTTPAddr()+"/v1/documents/"+docs[3]["id"].(string))
	require.Equal(t, http.StatusOK, code, "%v", out)
	assert.NotContains(t, deviceSources(t, client, "Where did the quokkas follow us on Rottnest Island?"), "notes/quokka.md")

	// Questions are answered while files are being added.
	var wg sync.WaitGroup
	for b := range 4 {
		wg.Go(func() {
			var files [][2]string
			for i := range 25 {
				files = append(files, [2]string{fmt.Sprintf("bulk/%d-%02d.txt", b, i), fmt.Sprintf("Bulk note %d of batch %d about tide tables.", i, b)})
			}
			for _, d := range uploadFiles(t, dev.HTTPAddr(), files...) {
				assert.Equal(t, "indexed", d["status"])
			}
		})
	}
	a, err = ask(t, client, &dragonv1.GenerateRequest{Prompt: q, Sampling: &dragonv1.SamplingParams{MaxTokens: 12}})
	require.NoError(t, err, "answered during ingestion")
	assert.NotEmpty(t, a.Tokens)
	wg.Wait()

	// Everything of the documents stays off the link (checked before the
	// restart, while the tap holds one connection it can parse).
	secrets := []string{"mail/gate.eml", "Halvorsen cabin gate code", "ann@halvorsen.example", "flowerpot", "notes/quokka.md", "Quokka trip", "Wadjemup", "bulk/", "ann halvorsen", "web/ferry.html", "Orkney ferry times", "pier four", "papers/sandwich-CL.pdf", "Clustered Covariances"}
	up, rawUp := link.messages(t, true)
	var leaked []string
	for _, s := range secrets {
		if tapFound(t, rawUp, up, s) {
			leaked = append(leaked, s)
		}
	}
	if session.LeaksSources() {
		assert.Contains(t, leaked, "mail/gate.eml", "the control build sends the device's sources: the tap must find them")
		assert.Contains(t, leaked, "ann halvorsen", "and its filter")
	} else {
		assert.Empty(t, leaked, "nothing of the device's documents crosses the link")
	}

	// Acknowledged, then kill -9: there after the restart.
	docs = uploadFiles(t, dev.HTTPAddr(), [2]string{"notes/kayak.txt", "The kayak paddles hang in the boathouse behind the sauna."})
	require.NoError(t, dev.Kill())
	dev, client = startDevice()
	code, out = httpDo(t, "GET", "http://"+dev.HTTPAddr()+"/v1/documents/"+docs[0]["id"].(string))
	require.Equal(t, http.StatusOK, code, "%v\n%s", out, dev.Logs())
	assert.Equal(t, "indexed", out["status"])
	assert.Contains(t, deviceSources(t, client, "Where do the kayak paddles hang?"), "notes/kayak.txt")
	code, out = httpDo(t, "GET", "http://"+dev.HTTPAddr()+"/v1/documents/"+docs[0]["id"].(string)[:8])
	assert.Equal(t, http.StatusNotFound, code, "%v", out)
	if !session.LeaksSources() {
		link.mu.Lock()
		raw := bytes.Clone(link.toCloud.Bytes())
		link.mu.Unlock()
		for _, s := range []string{"notes/kayak.txt", "boathouse"} {
			assert.False(t, bytes.Contains(raw, []byte(s)), "%q crossed the link", s)
		}
	}
}

// dragonCLI runs `dragon argv...` from this test binary and returns its
// combined output and error.
func dragonCLI(t *testing.T, env []string, argv ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(append(os.Environ(), env...), "DRAGON_CHILD_ARGS="+strings.Join(argv, "\n"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestDocsCLIAndReflection: a running device with a token serves gRPC
// reflection behind it (so stock tools list and call every service),
// dragon docs add|ls|rm is its client, and dragon index on its folder
// says to use dragon docs.
func TestDocsCLIAndReflection(t *testing.T) {
	index := testmodel.IndexCopy(t, "device")
	dev := startDaemon(t, "device", "device", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", testmodel.Path(t),
		"--threads", "1", "--index", index, "--cloud", "", "--profile", "", "--rerank-model", "", "--token", "s3cret")
	conn, err := grpc.NewClient(dev.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	listServices := func(ctx context.Context) ([]string, error) {
		stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
		if err != nil {
			return nil, err
		}
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
			// io.EOF: the server ended the stream; Recv says why.
			_, err = stream.Recv()
			return nil, err
		}
		resp, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		var out []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			out = append(out, s.GetName())
		}
		return out, nil
	}
	_, err = listServices(t.Context())
	assert.Equal(t, codes.Unauthenticated, status.Code(err), "reflection is behind the token: %v", err)
	authed := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer s3cret")
	services, err := listServices(authed)
	require.NoError(t, err)
	assert.Subset(t, services, []string{"dragon.v1.DeviceService", "dragon.v1.DocumentService", "grpc.health.v1.Health"})

	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "notes"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes", "fern.md"), []byte("# Ferns\n\nThe fern by the window needs water on Sundays."), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes", "blob.bin"), []byte{0, 1, 2, 3, 0, 0}, 0o644))
	env := []string{"DRAGON_TOKEN=s3cret"}
	out, err := dragonCLI(t, env, "docs", "add", "--device", dev.Addr, "--json", filepath.Join(dir, "notes"))
	require.Error(t, err, "one file failed: the command says so")
	var added dragonv1.AddDocumentsResponse
	require.NoError(t, protojson.Unmarshal([]byte(out[strings.Index(out, "{"):strings.LastIndex(out, "}")+1]), &added), out)
	require.Len(t, added.GetDocuments(), 2)
	assert.Equal(t, "notes/blob.bin", added.GetDocuments()[0].GetSource())
	assert.Equal(t, dragonv1.DocumentStatus_DOCUMENT_STATUS_FAILED, added.GetDocuments()[0].GetStatus())
	assert.Equal(t, "notes/fern.md", added.GetDocuments()[1].GetSource())
	assert.Equal(t, dragonv1.DocumentStatus_DOCUMENT_STATUS_INDEXED, added.GetDocuments()[1].GetStatus())

	out, err = dragonCLI(t, env, "docs", "ls", "--device", dev.Addr)
	require.NoError(t, err, out)
	assert.Regexp(t, `[0-9a-f]{16}\s+indexed\s+1\s+notes/fern.md\s+Ferns`, out)
	out, err = dragonCLI(t, nil, "docs", "ls", "--device", dev.Addr)
	require.Error(t, err)
	assert.Contains(t, out, "missing bearer token")

	out, err = dragonCLI(t, env, "docs", "rm", "--device", dev.Addr, "notes/fern.md")
	require.NoError(t, err, out)
	assert.Contains(t, out, "removed notes/fern.md (1 passages)")
	out, err = dragonCLI(t, env, "docs", "rm", "--device", dev.Addr, "notes/fern.md")
	require.Error(t, err)
	assert.Contains(t, out, "NotFound")

	out, err = dragonCLI(t, nil, "index", "add", "--dir", index, dir)
	require.Error(t, err)
	assert.Contains(t, out, "dragon docs add")
	out, err = dragonCLI(t, nil, "index", "build", "--dir", index, dir)
	require.Error(t, err)
	assert.Contains(t, out, "dragon docs add")
}

// TestCloudDocumentsBehindAdminToken: the cloud serves the document API of
// its public corpus behind an admin token of its own, which the devices'
// peer token does not open; what the operator adds, the cloud retrieves.
func TestCloudDocumentsBehindAdminToken(t *testing.T) {
	model := testmodel.Path(t)
	cld := startDaemon(t, "cloud", "cloud", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", model, "--threads", "1",
		"--index", testmodel.IndexCopy(t, "cloud"), "--profile", "", "--rerank-model", "", "--token", "peer-token", "--admin-token", "admin-token")
	conn, err := grpc.NewClient(cld.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	docs := dragonv1.NewDocumentServiceClient(conn)
	with := func(token string) context.Context {
		return metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+token)
	}
	_, err = docs.DocumentStats(t.Context(), &dragonv1.DocumentStatsRequest{})
	assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	_, err = docs.DocumentStats(with("peer-token"), &dragonv1.DocumentStatsRequest{})
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "the devices' token does not change the corpus: %v", err)

	stream, err := docs.AddDocuments(with("admin-token"))
	require.NoError(t, err)
	require.NoError(t, stream.Send(&dragonv1.AddDocumentsRequest{Part: &dragonv1.AddDocumentsRequest_File{File: &dragonv1.FileHeader{Name: "public/almanac.txt"}}}))
	require.NoError(t, stream.Send(&dragonv1.AddDocumentsRequest{Part: &dragonv1.AddDocumentsRequest_Data{Data: []byte("The Zanzibar lighthouse almanac lists the first keeper as Mariam Okafor.")}}))
	resp, err := stream.CloseAndRecv()
	require.NoError(t, err)
	require.Len(t, resp.GetDocuments(), 1)
	assert.Equal(t, dragonv1.DocumentStatus_DOCUMENT_STATUS_INDEXED, resp.GetDocuments()[0].GetStatus())

	// HTTP: the same API, the same admin token.
	req, err := http.NewRequest("GET", "http://"+cld.HTTPAddr()+"/v1/documents/"+resp.GetDocuments()[0].GetId(), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer peer-token")
	r, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	r.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, r.StatusCode)
	req.Header.Set("Authorization", "Bearer admin-token")
	r, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	r.Body.Close()
	assert.Equal(t, http.StatusOK, r.StatusCode)

	dev := startDaemon(t, "device", "device", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", model, "--threads", "1",
		"--index", testmodel.IndexCopy(t, "device"), "--cloud", cld.Addr, "--cloud-token", "peer-token", "--profile", "", "--rerank-model", "")
	assert.Contains(t, sideSources(t, dialDevice(t, dev), "Who was the first keeper of the Zanzibar lighthouse?", dragonv1.Side_SIDE_CLOUD),
		"public/almanac.txt", "the cloud retrieves what its operator added")
}
