package device

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/dragon-rag/dragon/engine/fake"
	"github.com/dragon-rag/dragon/library"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/retrieval"
	"github.com/dragon-rag/dragon/sources"
)

// docServer is the document API over a real BM25 index in a temporary
// folder, on loopback.
type docServer struct {
	url     string
	ix      *retrieval.Index
	removed [][]retrieval.Passage
}

func newDocServer(t *testing.T, lim library.Limits) *docServer {
	t.Helper()
	ix, _, err := retrieval.Build(t.Context(), filepath.Join(t.TempDir(), "index"), retrieval.Options{Tokenizer: fake.New(fake.Config{Vocab: 300})})
	require.NoError(t, err)
	t.Cleanup(func() { ix.Close() })
	ds := &docServer{ix: ix}
	lib := library.New(ix, library.Options{Limits: lim, OnRemove: func(ps []retrieval.Passage) { ds.removed = append(ds.removed, ps) }})
	mux := http.NewServeMux()
	NewDocuments(lib, "secret", nil).Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	ds.url = srv.URL
	return ds
}

// part is one part of a multipart upload.
type part struct {
	field, filename string
	body            []byte
}

func multipartBody(t *testing.T, parts ...part) (*bytes.Buffer, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		switch {
		case p.field == "file" && p.filename == "":
			h.Set("Content-Disposition", `form-data; name="file"; filename*=UTF-8''nul%00name.txt`)
		case p.filename != "":
			// Written by hand: multipart's CreateFormFile escapes the name,
			// and a hostile client would not.
			h.Set("Content-Disposition", fmt.Sprintf(`form-data; name=%q; filename="%s"`, p.field, p.filename))
		default:
			h.Set("Content-Disposition", fmt.Sprintf(`form-data; name=%q`, p.field))
		}
		w, err := mw.CreatePart(h)
		require.NoError(t, err)
		_, err = w.Write(p.body)
		require.NoError(t, err)
	}
	require.NoError(t, mw.Close())
	return &buf, mw.FormDataContentType()
}

func (ds *docServer) do(t *testing.T, method, path string, body io.Reader, contentType string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, ds.url+path, body)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer secret")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

func docsOf(t *testing.T, v map[string]any) []map[string]any {
	t.Helper()
	raw, ok := v["documents"].([]any)
	require.True(t, ok, "documents in %v", v)
	var out []map[string]any
	for _, d := range raw {
		out = append(out, d.(map[string]any))
	}
	return out
}

const testMail = "From: Ann <ann@example.com>\r\nSubject: the cabin gate\r\nDate: Mon, 1 Jan 2001 00:00:00 +0000\r\n\r\nThe gate code of the cabin is 4417.\r\n"

func TestDocumentsHTTP(t *testing.T) {
	ds := newDocServer(t, library.Limits{FileBytes: 4 << 10})
	body, ct := multipartBody(t,
		part{"metadata", "", []byte(`{"folder": "inbox"}`)},
		part{"file", "mail/gate.eml", []byte(testMail)},
		part{"file", "notes/otters.md", []byte("# Otters\n\nSea otters hold hands while they sleep.")},
		part{"file", "../../etc/passwd", []byte("root:x:0:0")},
		part{"file", "", []byte("text")}, // filename*=UTF-8''nul%00name.txt below
		part{"file", "empty.txt", nil},
		part{"file", "photo.png", []byte{0x89, 'P', 'N', 'G', 0, 0, 0, 13}},
		part{"file", "big.txt", bytes.Repeat([]byte("a"), 5<<10)},
	)
	code, out := ds.do(t, "POST", "/v1/documents", body, ct)
	require.Equal(t, http.StatusOK, code, "%v", out)
	docs := docsOf(t, out)
	require.Len(t, docs, 7, "one outcome per file, in order")
	assert.Equal(t, "indexed", docs[0]["status"])
	assert.Equal(t, sources.DocumentID("mail/gate.eml"), docs[0]["id"])
	assert.Equal(t, "the cabin gate", docs[0]["title"])
	assert.Equal(t, "inbox", docs[0]["meta"].(map[string]any)["folder"])
	assert.Equal(t, "indexed", docs[1]["status"])
	assert.Equal(t, "Otters", docs[1]["title"])
	for i, want := range map[int]string{2: `".."`, 3: "control character", 4: "empty", 5: "unsupported file type", 6: "over the 4096 bytes"} {
		assert.Equal(t, "failed", docs[i]["status"], "file %d", i)
		assert.Contains(t, docs[i]["error"], want, "file %d", i)
	}
	hits, err := ds.ix.Search(t.Context(), "gate code", 1, retrieval.ModeBM25)
	require.NoError(t, err)
	require.Len(t, hits, 1)
	assert.Equal(t, "mail/gate.eml", hits[0].Passage.Source, "searchable once acknowledged")
	assert.Equal(t, "inbox", hits[0].Passage.Meta["folder"])

	code, out = ds.do(t, "GET", "/v1/documents?limit=2", nil, "")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, 5.0, out["total"], "the failed files with a name are listed too")
	assert.Len(t, docsOf(t, out), 2)
	code, out = ds.do(t, "GET", "/v1/documents?limit=2&page_token="+out["next_page_token"].(string), nil, "")
	require.Equal(t, http.StatusOK, code)
	assert.Len(t, docsOf(t, out), 2)

	code, out = ds.do(t, "GET", "/v1/documents/search?q=gate+code&k=2", nil, "")
	require.Equal(t, http.StatusOK, code, "%v", out)
	found := out["hits"].([]any)
	require.NotEmpty(t, found)
	assert.Equal(t, "mail/gate.eml", found[0].(map[string]any)["source"])
	assert.Contains(t, found[0].(map[string]any)["text"], "4417")
	code, _ = ds.do(t, "GET", "/v1/documents/search?k=2", nil, "")
	assert.Equal(t, http.StatusBadRequest, code, "no query")

	id := docs[0]["id"].(string)
	code, out = ds.do(t, "GET", "/v1/documents/"+id, nil, "")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "mail/gate.eml", out["source"])
	code, out = ds.do(t, "DELETE", "/v1/documents/"+id, nil, "")
	require.Equal(t, http.StatusOK, code, "%v", out)
	assert.Equal(t, 1.0, out["passages_removed"])
	require.Len(t, ds.removed, 1, "the KV cache is told")
	assert.Contains(t, ds.removed[0][0].Text, "4417")
	hits, err = ds.ix.Search(t.Context(), "gate code", 1, retrieval.ModeBM25)
	require.NoError(t, err)
	assert.Empty(t, hits, "deleted, gone from retrieval at once")
	code, out = ds.do(t, "GET", "/v1/documents/"+id, nil, "")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, out["error"].(map[string]any)["message"], "no document has id")
	code, _ = ds.do(t, "DELETE", "/v1/documents/"+id, nil, "")
	assert.Equal(t, http.StatusNotFound, code)

	code, out = ds.do(t, "GET", "/v1/documents/stats", nil, "")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, 4.0, out["documents"])
	assert.Equal(t, 3.0, out["failed"])
}

func TestDocumentsHTTPRefusals(t *testing.T) {
	ds := newDocServer(t, library.Limits{})
	errOf := func(v map[string]any) string {
		e, _ := v["error"].(map[string]any)
		m, _ := e["message"].(string)
		return m
	}

	code, out := ds.do(t, "POST", "/v1/documents", strings.NewReader(`{"file": "x"}`), "application/json")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, errOf(out), "multipart/form-data")

	body, ct := multipartBody(t, part{"file", "empty.txt", nil})
	code, out = ds.do(t, "POST", "/v1/documents", body, ct)
	assert.Equal(t, http.StatusUnprocessableEntity, code, "nothing accepted")
	assert.Contains(t, errOf(out), "empty.txt: the file is empty")

	// A raw NUL in a part's header makes the rest of the body unreadable:
	// the files before it are kept, and the answer says what happened.
	var raw bytes.Buffer
	raw.WriteString("--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"ok.txt\"\r\n\r\nkept text\r\n")
	raw.WriteString("--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\x00b.txt\"\r\n\r\nx\r\n--b--\r\n")
	code, out = ds.do(t, "POST", "/v1/documents", &raw, "multipart/form-data; boundary=b")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, errOf(out), "malformed multipart body")
	require.Len(t, docsOf(t, out), 1)
	assert.Equal(t, "indexed", docsOf(t, out)[0]["status"])

	// A declared gigabyte is refused before a byte of it is read.
	conn, err := net.Dial("tcp", strings.TrimPrefix(ds.url, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/documents HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: %d\r\n\r\n--b\r\n", 1<<30)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	msg, _ := io.ReadAll(resp.Body)
	assert.Contains(t, string(msg), "declares 1073741824 bytes")

	// 10,000 files in one request: the first 1000 are added in a few
	// batches, the rest fail with the reason, and the daemon goes on.
	var parts []part
	for i := range 10000 {
		parts = append(parts, part{"file", fmt.Sprintf("n/%05d.txt", i), []byte(fmt.Sprintf("note %d", i))})
	}
	body, ct = multipartBody(t, parts...)
	code, out = ds.do(t, "POST", "/v1/documents", body, ct)
	require.Equal(t, http.StatusOK, code)
	docs := docsOf(t, out)
	require.Len(t, docs, 10000)
	assert.Equal(t, "indexed", docs[999]["status"])
	assert.Equal(t, "failed", docs[1000]["status"])
	assert.Contains(t, docs[1000]["error"], "over the 1000 files a request may carry")
	code, out = ds.do(t, "GET", "/v1/documents?limit=1", nil, "")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, 1002.0, out["total"], "and empty.txt, failed, and ok.txt")

	req, err := http.NewRequest("GET", ds.url+"/v1/documents", nil)
	require.NoError(t, err)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the daemon's token guards the API")
}

func TestDocumentServiceGRPC(t *testing.T) {
	ix, _, err := retrieval.Build(t.Context(), filepath.Join(t.TempDir(), "index"), retrieval.Options{Tokenizer: fake.New(fake.Config{Vocab: 300})})
	require.NoError(t, err)
	defer ix.Close()
	lib := library.New(ix, library.Options{Limits: library.Limits{FileBytes: 1 << 10, Files: 3}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	dragonv1.RegisterDocumentServiceServer(g, NewDocuments(lib, "", nil))
	go g.Serve(ln)
	defer g.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	c := dragonv1.NewDocumentServiceClient(conn)

	stream, err := c.AddDocuments(t.Context())
	require.NoError(t, err)
	send := func(name string, size uint64, chunks ...string) {
		require.NoError(t, stream.Send(&dragonv1.AddDocumentsRequest{Part: &dragonv1.AddDocumentsRequest_File{File: &dragonv1.FileHeader{Name: name, Size: size}}}))
		for _, ch := range chunks {
			require.NoError(t, stream.Send(&dragonv1.AddDocumentsRequest{Part: &dragonv1.AddDocumentsRequest_Data{Data: []byte(ch)}}))
		}
	}
	send("mail/gate.eml", 0, testMail[:40], testMail[40:])
	send("huge.txt", 1<<30, "declared too big")
	send("grew.txt", 0, strings.Repeat("a", 600), strings.Repeat("b", 600))
	send("fourth.txt", 0, "one too many")
	resp, err := stream.CloseAndRecv()
	require.NoError(t, err)
	docs := resp.GetDocuments()
	require.Len(t, docs, 4)
	assert.Equal(t, dragonv1.DocumentStatus_DOCUMENT_STATUS_INDEXED, docs[0].GetStatus())
	assert.Equal(t, "the cabin gate", docs[0].GetTitle())
	assert.Contains(t, docs[1].GetError(), "declared 1073741824 bytes")
	assert.Contains(t, docs[2].GetError(), "over the 1024 bytes")
	assert.Contains(t, docs[3].GetError(), "over the 3 files")

	list, err := c.ListDocuments(t.Context(), &dragonv1.ListDocumentsRequest{})
	require.NoError(t, err)
	var listed []string
	for _, d := range list.GetDocuments() {
		listed = append(listed, d.GetSource()+"="+strings.TrimPrefix(d.GetStatus().String(), "DOCUMENT_STATUS_"))
	}
	assert.Equal(t, []string{"grew.txt=FAILED", "huge.txt=FAILED", "mail/gate.eml=INDEXED"}, listed, "failed files are listed, not the one past the count")
	got, err := c.GetDocument(t.Context(), &dragonv1.GetDocumentRequest{Id: docs[0].GetId()})
	require.NoError(t, err)
	assert.Equal(t, "mail/gate.eml", got.GetSource())
	del, err := c.DeleteDocument(t.Context(), &dragonv1.DeleteDocumentRequest{Document: &dragonv1.DeleteDocumentRequest_Source{Source: "mail/gate.eml"}})
	require.NoError(t, err)
	assert.Equal(t, uint32(1), del.GetPassagesRemoved())
	_, err = c.DeleteDocument(t.Context(), &dragonv1.DeleteDocumentRequest{Document: &dragonv1.DeleteDocumentRequest_Id{Id: docs[0].GetId()}})
	assert.Equal(t, codes.NotFound, status.Code(err))

	// Data before any header is the client's mistake, said so.
	stream, err = c.AddDocuments(t.Context())
	require.NoError(t, err)
	require.NoError(t, stream.Send(&dragonv1.AddDocumentsRequest{Part: &dragonv1.AddDocumentsRequest_Data{Data: []byte("x")}}))
	_, err = stream.CloseAndRecv()
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "data before any file header")
}

// FuzzUpload: any body posted to /v1/documents gets a JSON answer that
// accepts or refuses it (never a crash or a server error), and each file
// it lists has a status.
func FuzzUpload(f *testing.F) {
	body, _ := multipartBody(&testing.T{}, part{"file", "a.txt", []byte("hello there")}, part{"metadata", "", []byte(`{"k":"v"}`)})
	f.Add(body.Bytes())
	f.Add([]byte("--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.eml\"\r\n\r\nFrom: a\r\n\r\nhi\r\n--b--\r\n"))
	f.Add([]byte("--b\r\nContent-Disposition: form-data; name=\"path\"\r\n\r\n/nonexistent\r\n--b--\r\n"))
	ix, _, err := retrieval.Build(context.Background(), filepath.Join(f.TempDir(), "index"), retrieval.Options{Tokenizer: fake.New(fake.Config{Vocab: 300})})
	require.NoError(f, err)
	defer ix.Close()
	mux := http.NewServeMux()
	NewDocuments(library.New(ix, library.Options{Limits: library.Limits{FileBytes: 1 << 12, Files: 8}}), "", nil).Register(mux)
	f.Fuzz(func(t *testing.T, data []byte) {
		boundary := "b"
		if m := bytes.Index(data, []byte("\r\n")); m > 2 && bytes.HasPrefix(data, []byte("--")) {
			boundary = string(data[2:m])
		}
		req := httptest.NewRequest("POST", "/v1/documents", bytes.NewReader(data))
		req.Header.Set("Content-Type", "multipart/form-data; boundary="+boundary)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		require.Contains(t, []int{200, 400, 413, 422}, rec.Code, "%s", rec.Body.String())
		var out addResponse
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), "%s", rec.Body.String())
		for _, d := range out.Documents {
			require.Contains(t, []string{retrieval.StatusIndexed, retrieval.StatusFailed, retrieval.StatusEmbedding}, d.Status)
		}
	})
}
