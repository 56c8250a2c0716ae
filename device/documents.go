package device

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dragon-rag/dragon/library"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/retrieval"
	"github.com/dragon-rag/dragon/sources"
)

// Documents serves a library: the document API over HTTP (/v1/documents)
// and gRPC (dragon.v1.DocumentService), behind the daemon's token.
type Documents struct {
	dragonv1.UnimplementedDocumentServiceServer
	lib   *library.Library
	token string
	// checkGRPC: the gRPC calls check token themselves, as the cloud's
	// admin API does, which its peer token's interceptor lets through.
	checkGRPC bool
	log       *slog.Logger
	// maxRequest bounds an upload request's body.
	maxRequest int64
}

// NewDocuments serves lib; token, when set, is the API key HTTP requests
// must carry (gRPC's interceptors check the same token).
func NewDocuments(lib *library.Library, token string, log *slog.Logger) *Documents {
	if log == nil {
		log = slog.Default()
	}
	lim := lib.Limits()
	// Room for a few files at the limit, or many small ones.
	return &Documents{lib: lib, token: token, log: log, maxRequest: max(4*lim.FileBytes, 256<<20)}
}

// NewAdminDocuments serves lib behind an admin token of its own, on HTTP
// and on gRPC (the cloud's public corpus: the devices' peer token must not
// change it). The daemon's interceptors must let DocumentMethods through.
func NewAdminDocuments(lib *library.Library, adminToken string, log *slog.Logger) *Documents {
	d := NewDocuments(lib, adminToken, log)
	d.checkGRPC = true
	return d
}

// DocumentMethods are DocumentService's full gRPC method names.
func DocumentMethods() []string {
	var out []string
	for _, m := range dragonv1.DocumentService_ServiceDesc.Methods {
		out = append(out, "/"+dragonv1.DocumentService_ServiceDesc.ServiceName+"/"+m.MethodName)
	}
	for _, m := range dragonv1.DocumentService_ServiceDesc.Streams {
		out = append(out, "/"+dragonv1.DocumentService_ServiceDesc.ServiceName+"/"+m.StreamName)
	}
	return out
}

// authorize checks a gRPC call's bearer token when this server checks its
// own.
func (d *Documents) authorize(ctx context.Context) error {
	if !d.checkGRPC {
		return nil
	}
	vals := metadata.ValueFromIncomingContext(ctx, "authorization")
	if len(vals) != 1 {
		return status.Error(codes.Unauthenticated, `this daemon's documents need its admin token: "authorization: Bearer <token>" (--admin-token)`)
	}
	got, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(d.token)) != 1 {
		return status.Error(codes.PermissionDenied, "not this daemon's admin token")
	}
	return nil
}

// Register adds the HTTP routes to mux.
func (d *Documents) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/documents", d.auth(d.add))
	mux.HandleFunc("GET /v1/documents", d.auth(d.list))
	mux.HandleFunc("GET /v1/documents/stats", d.auth(d.stats))
	mux.HandleFunc("GET /v1/documents/search", d.auth(d.search))
	mux.HandleFunc("GET /v1/documents/{id}", d.auth(d.get))
	mux.HandleFunc("DELETE /v1/documents/{id}", d.auth(d.delete))
}

func (d *Documents) auth(h http.HandlerFunc) http.HandlerFunc { return bearer(d.token, h) }

func writeJSONStatus(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// errTooManyFiles fails the files of a request past Limits.Files.
var errTooManyFiles = errors.New("too many files")

// Uploads are committed in batches of this many files or bytes: each is
// one journal sync, and each waits for answers being generated, so small
// enough that one started just before a question does not hold it long.
const (
	uploadBatchFiles = 64
	uploadBatchBytes = 8 << 20
)

// addResponse is POST /v1/documents's answer; Error is set when no file
// was accepted.
type addResponse struct {
	Documents []retrieval.DocInfo `json:"documents"`
	Error     *apiError           `json:"error,omitempty"`
}

// add takes multipart/form-data: "file" parts (the part's filename is the
// document's name), "path" fields (a file or folder on this machine) and
// an optional "metadata" field, a JSON object of strings given to every
// file of the request. Each file's outcome comes back in order.
func (d *Documents) add(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > d.maxRequest {
		writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
			fmt.Sprintf("the request declares %d bytes; an upload may carry at most %d (send the files in several requests)", r.ContentLength, d.maxRequest))
		return
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "bad_content_type",
			`send the files as multipart/form-data, each in a part named "file" (curl -F file=@notes.txt)`)
		return
	}
	body := http.MaxBytesReader(w, r.Body, d.maxRequest)
	mr := multipart.NewReader(body, params["boundary"])
	lim := d.lib.Limits()
	var out []retrieval.DocInfo
	var meta map[string]string
	files := 0
	fail := func(code int, msg string) {
		writeJSONStatus(w, code, addResponse{Documents: out, Error: &apiError{Message: msg, Type: "invalid_request_error"}})
	}
	// Files are committed in batches, one journal sync each.
	var batch []library.Upload
	var batchBytes int
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		docs, err := d.lib.AddAll(r.Context(), batch)
		batch, batchBytes = nil, 0
		out = append(out, docs...)
		return err
	}
	overLimit := func() {
		fail(http.StatusRequestEntityTooLarge, fmt.Sprintf("the request is over the %d bytes an upload may carry; the files before were added", d.maxRequest))
	}
	tooBig := func(err error) bool {
		var e *http.MaxBytesError
		return errors.As(err, &e)
	}
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			if ferr := flush(); ferr != nil {
				d.serverError(w, out, ferr)
				return
			}
			if tooBig(err) {
				overLimit()
				return
			}
			fail(http.StatusBadRequest, fmt.Sprintf("malformed multipart body: %v; the files before were added", err))
			return
		}
		switch part.FormName() {
		case "metadata":
			meta, err = readMetadata(part)
			if err != nil {
				if ferr := flush(); ferr != nil {
					d.serverError(w, out, ferr)
					return
				}
				fail(http.StatusBadRequest, err.Error())
				return
			}
		case "path":
			p, rerr := io.ReadAll(io.LimitReader(part, 4096))
			if err := flush(); err != nil {
				d.serverError(w, out, err)
				return
			}
			if rerr != nil {
				if tooBig(rerr) {
					overLimit()
					return
				}
				fail(http.StatusBadRequest, fmt.Sprintf("malformed multipart body: reading a path field: %v; the files before were added", rerr))
				return
			}
			docs, err := d.lib.AddPath(r.Context(), string(p))
			if err != nil {
				d.serverError(w, out, err)
				return
			}
			out = append(out, docs...)
		case "file":
			name := rawFileName(part)
			files++
			if files > lim.Files {
				// Flushed first, so that the answer keeps the files' order.
				if err := flush(); err != nil {
					d.serverError(w, out, err)
					return
				}
				out = append(out, library.Failed(name, fmt.Sprintf("%s: over the %d files a request may carry: send it again in another request", errTooManyFiles, lim.Files)))
				if _, err := io.Copy(io.Discard, part); err != nil && tooBig(err) {
					overLimit()
					return
				}
				continue
			}
			data, err := io.ReadAll(io.LimitReader(part, lim.FileBytes+1))
			if err == nil {
				// The rest of a file over the limit is skipped; the
				// library fails it by its size.
				_, err = io.Copy(io.Discard, part)
			}
			if err != nil {
				if ferr := flush(); ferr != nil {
					d.serverError(w, out, ferr)
					return
				}
				if tooBig(err) {
					out = append(out, library.Failed(name, "cut off: the request is over the bytes an upload may carry"))
					overLimit()
					return
				}
				fail(http.StatusBadRequest, fmt.Sprintf("reading %s: %v; the files before were added", name, err))
				return
			}
			batch = append(batch, library.Upload{Name: name, Meta: meta, Data: bytes.NewReader(data), Size: -1})
			batchBytes += len(data)
			if len(batch) >= uploadBatchFiles || batchBytes >= uploadBatchBytes {
				if err := flush(); err != nil {
					d.serverError(w, out, err)
					return
				}
			}
		default:
			io.Copy(io.Discard, part)
		}
	}
	if err := flush(); err != nil {
		d.serverError(w, out, err)
		return
	}
	if len(out) == 0 {
		fail(http.StatusBadRequest, `no file: send each in a multipart/form-data part named "file", or a "path" field`)
		return
	}
	code := http.StatusOK
	if !anyAccepted(out) {
		code = http.StatusUnprocessableEntity
		msg := "no file could be added: " + out[0].Source + ": " + out[0].Error
		if len(out) > 1 {
			msg = fmt.Sprintf("none of the %d files could be added; each one's error is in documents", len(out))
		}
		writeJSONStatus(w, code, addResponse{Documents: out, Error: &apiError{Message: msg, Type: "invalid_request_error"}})
		return
	}
	writeJSONStatus(w, code, addResponse{Documents: out})
}

// rawFileName is a file part's filename as the client sent it:
// multipart's FileName keeps only its last element, which would turn
// "notes/trip.md" into "trip.md" and "../x" into "x" without a word.
func rawFileName(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return p.Header.Get("Content-Disposition")
	}
	return params["filename"]
}

func anyAccepted(docs []retrieval.DocInfo) bool {
	for _, d := range docs {
		if d.Status != retrieval.StatusFailed {
			return true
		}
	}
	return false
}

func readMetadata(r io.Reader) (map[string]string, error) {
	var m map[string]string
	dec := json.NewDecoder(io.LimitReader(r, 64<<10))
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf(`the "metadata" field must be a JSON object of strings: %v`, err)
	}
	return m, nil
}

func (d *Documents) serverError(w http.ResponseWriter, done []retrieval.DocInfo, err error) {
	d.log.Error("document API", "err", err)
	code := http.StatusInternalServerError
	if errors.Is(err, context.Canceled) {
		code = 499 // the client went away
	}
	writeJSONStatus(w, code, addResponse{Documents: done, Error: &apiError{Message: err.Error(), Type: "server_error"}})
}

// listResponse is GET /v1/documents's answer.
type listResponse struct {
	Documents []retrieval.DocInfo `json:"documents"`
	Next      string              `json:"next_page_token,omitempty"`
	Total     int                 `json:"total"`
}

func (d *Documents) list(w http.ResponseWriter, r *http.Request) {
	size := 0
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > library.MaxPageSize {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "bad_limit", fmt.Sprintf("limit %q: need 1 to %d", s, library.MaxPageSize))
			return
		}
		size = n
	}
	order := r.URL.Query().Get("order")
	if order != "" && order != "source" && order != "recent" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "bad_order", fmt.Sprintf("order %q: source or recent", order))
		return
	}
	p, err := d.lib.List(size, r.URL.Query().Get("page_token"), order == "recent")
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "bad_page_token", err.Error())
		return
	}
	writeJSONStatus(w, http.StatusOK, listResponse{Documents: nonNil(p.Documents), Next: p.Next, Total: p.Total})
}

func nonNil(docs []retrieval.DocInfo) []retrieval.DocInfo {
	if docs == nil {
		return []retrieval.DocInfo{}
	}
	return docs
}

func (d *Documents) get(w http.ResponseWriter, r *http.Request) {
	doc, ok := d.lib.Get(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusNotFound, "invalid_request_error", "document_not_found", fmt.Sprintf("no document has id %q", r.PathValue("id")))
		return
	}
	writeJSONStatus(w, http.StatusOK, doc)
}

func (d *Documents) delete(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	n, err := d.lib.Delete(id)
	switch {
	case errors.Is(err, retrieval.ErrNotIndexed):
		writeError(w, http.StatusNotFound, "invalid_request_error", "document_not_found", fmt.Sprintf("no document has id %q", id))
	case err != nil:
		d.serverError(w, nil, err)
	default:
		writeJSONStatus(w, http.StatusOK, map[string]any{"id": id, "deleted": true, "passages_removed": n})
	}
}

// searchHit is one passage GET /v1/documents/search finds.
type searchHit struct {
	DocumentID string            `json:"document_id"`
	Source     string            `json:"source"`
	PassageID  uint64            `json:"passage_id"`
	Score      float64           `json:"score"`
	Text       string            `json:"text"`
	Metadata   map[string]string `json:"metadata,omitempty"`
}

// search answers GET /v1/documents/search?q=TEXT&k=N: the passages a
// generation would retrieve from this corpus, for apps and for checking
// what an add made retrievable.
func (d *Documents) search(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query().Get("q")
	if strings.TrimSpace(q) == "" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "missing_query", "give the query as q=")
		return
	}
	k := 5
	if s := r.URL.Query().Get("k"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "bad_k", fmt.Sprintf("k %q: need 1 to 100", s))
			return
		}
		k = n
	}
	hits, err := d.lib.Search(r.Context(), q, k, retrieval.Filter{SourcePrefix: r.URL.Query().Get("source_prefix")})
	if err != nil {
		d.serverError(w, nil, err)
		return
	}
	out := make([]searchHit, len(hits))
	for i, h := range hits {
		out[i] = searchHit{DocumentID: sources.DocumentID(h.Passage.Source), Source: h.Passage.Source, PassageID: h.Passage.ID,
			Score: h.Score, Text: h.Passage.Text, Metadata: h.Passage.Meta}
	}
	writeJSONStatus(w, http.StatusOK, map[string]any{"hits": out})
}

func (d *Documents) stats(w http.ResponseWriter, _ *http.Request) {
	writeJSONStatus(w, http.StatusOK, d.lib.Stats())
}

// AddDocuments implements dragon.v1.DocumentService.
func (d *Documents) AddDocuments(stream dragonv1.DocumentService_AddDocumentsServer) error {
	ctx := stream.Context()
	if err := d.authorize(ctx); err != nil {
		return err
	}
	lim := d.lib.Limits()
	var out []*dragonv1.Document
	// The file being received: its bytes so far, or why it failed.
	var (
		cur     *dragonv1.FileHeader
		buf     []byte
		curFail error
		files   int
	)
	var batch []library.Upload
	var batchBytes int
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		docs, err := d.lib.AddAll(ctx, batch)
		batch, batchBytes = nil, 0
		if err != nil {
			return status.Errorf(codes.Internal, "add documents: %v", err)
		}
		for _, doc := range docs {
			out = append(out, docProto(doc))
		}
		return nil
	}
	finish := func() error {
		if cur == nil {
			return nil
		}
		h, data, why := cur, buf, curFail
		cur, buf, curFail = nil, nil, nil
		if errors.Is(why, errTooManyFiles) {
			// Not listed: a flood of them must not fill the list. Flushed
			// first, so that the answer keeps the files' order.
			if err := flush(); err != nil {
				return err
			}
			out = append(out, docProto(library.Failed(h.GetName(), why.Error())))
			return nil
		}
		u := library.Upload{Name: h.GetName(), Meta: h.GetMetadata(), Data: bytes.NewReader(data), Size: -1}
		if why != nil {
			u.Data, u.Err = bytes.NewReader(nil), why
		}
		batch = append(batch, u)
		batchBytes += len(data)
		if len(batch) >= uploadBatchFiles || batchBytes >= uploadBatchBytes {
			return flush()
		}
		return nil
	}
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		switch p := req.GetPart().(type) {
		case *dragonv1.AddDocumentsRequest_File:
			if err := finish(); err != nil {
				return err
			}
			cur = p.File
			files++
			switch {
			case files > lim.Files:
				curFail = fmt.Errorf("%w: over the %d files a request may carry: send it again in another request", errTooManyFiles, lim.Files)
			case p.File.GetSize() > uint64(lim.FileBytes):
				curFail = fmt.Errorf("%w: declared %d bytes, over the %d a file may have", library.ErrTooLarge, p.File.GetSize(), lim.FileBytes)
			}
		case *dragonv1.AddDocumentsRequest_Data:
			if cur == nil {
				return status.Error(codes.InvalidArgument, "data before any file header: send a FileHeader first")
			}
			if curFail != nil {
				continue
			}
			if int64(len(buf)+len(p.Data)) > lim.FileBytes {
				buf, curFail = nil, fmt.Errorf("%w: over the %d bytes a file may have", library.ErrTooLarge, lim.FileBytes)
				continue
			}
			buf = append(buf, p.Data...)
		case *dragonv1.AddDocumentsRequest_Path:
			if err := finish(); err != nil {
				return err
			}
			if err := flush(); err != nil {
				return err
			}
			docs, err := d.lib.AddPath(ctx, p.Path)
			if err != nil {
				return status.Errorf(codes.Internal, "add %s: %v", p.Path, err)
			}
			for _, doc := range docs {
				out = append(out, docProto(doc))
			}
		default:
			return status.Error(codes.InvalidArgument, "an empty AddDocumentsRequest: set file, data or path")
		}
	}
	if err := finish(); err != nil {
		return err
	}
	if err := flush(); err != nil {
		return err
	}
	return stream.SendAndClose(&dragonv1.AddDocumentsResponse{Documents: out})
}

// DeleteDocument implements dragon.v1.DocumentService.
func (d *Documents) DeleteDocument(ctx context.Context, req *dragonv1.DeleteDocumentRequest) (*dragonv1.DeleteDocumentResponse, error) {
	if err := d.authorize(ctx); err != nil {
		return nil, err
	}
	var n int
	var err error
	switch which := req.GetDocument().(type) {
	case *dragonv1.DeleteDocumentRequest_Id:
		n, err = d.lib.Delete(which.Id)
	case *dragonv1.DeleteDocumentRequest_Source:
		n, err = d.lib.DeleteSource(which.Source)
	default:
		return nil, status.Error(codes.InvalidArgument, "say which document: id or source")
	}
	if errors.Is(err, retrieval.ErrNotIndexed) {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &dragonv1.DeleteDocumentResponse{PassagesRemoved: uint32(n)}, nil
}

// ListDocuments implements dragon.v1.DocumentService.
func (d *Documents) ListDocuments(ctx context.Context, req *dragonv1.ListDocumentsRequest) (*dragonv1.ListDocumentsResponse, error) {
	if err := d.authorize(ctx); err != nil {
		return nil, err
	}
	if req.GetPageSize() > library.MaxPageSize {
		return nil, status.Errorf(codes.InvalidArgument, "page_size %d: at most %d", req.GetPageSize(), library.MaxPageSize)
	}
	p, err := d.lib.List(int(req.GetPageSize()), req.GetPageToken(), req.GetRecentFirst())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	resp := &dragonv1.ListDocumentsResponse{NextPageToken: p.Next, Total: uint32(p.Total)}
	for _, doc := range p.Documents {
		resp.Documents = append(resp.Documents, docProto(doc))
	}
	return resp, nil
}

// GetDocument implements dragon.v1.DocumentService.
func (d *Documents) GetDocument(ctx context.Context, req *dragonv1.GetDocumentRequest) (*dragonv1.Document, error) {
	if err := d.authorize(ctx); err != nil {
		return nil, err
	}
	doc, ok := d.lib.Get(req.GetId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no document has id %q", req.GetId())
	}
	return docProto(doc), nil
}

// DocumentStats implements dragon.v1.DocumentService.
func (d *Documents) DocumentStats(ctx context.Context, _ *dragonv1.DocumentStatsRequest) (*dragonv1.DocumentStatsResponse, error) {
	if err := d.authorize(ctx); err != nil {
		return nil, err
	}
	s := d.lib.Stats()
	return &dragonv1.DocumentStatsResponse{Documents: uint32(s.Documents), Failed: uint32(s.Failed), Passages: uint64(s.Passages),
		PendingVectors: uint64(s.Pending), DiskBytes: uint64(s.DiskBytes)}, nil
}

func docProto(d retrieval.DocInfo) *dragonv1.Document {
	p := &dragonv1.Document{
		Id: d.ID, Source: d.Source, Error: d.Error, Kind: d.Kind, Size: uint64(d.Size), Sha256: d.SHA256,
		Parts: uint32(d.Parts), Passages: uint32(d.Passages), Embedded: uint32(d.Embedded), Title: d.Title,
		Metadata: d.Meta, Unchanged: d.Unchanged,
	}
	if !d.Added.IsZero() {
		p.Added = timestamppb.New(d.Added)
	}
	switch d.Status {
	case retrieval.StatusIndexed:
		p.Status = dragonv1.DocumentStatus_DOCUMENT_STATUS_INDEXED
	case retrieval.StatusEmbedding:
		p.Status = dragonv1.DocumentStatus_DOCUMENT_STATUS_EMBEDDING
	case retrieval.StatusWriting:
		p.Status = dragonv1.DocumentStatus_DOCUMENT_STATUS_WRITING
	case retrieval.StatusFailed:
		p.Status = dragonv1.DocumentStatus_DOCUMENT_STATUS_FAILED
	}
	return p
}
