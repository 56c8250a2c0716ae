package retrieval

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dragon-rag/dragon/sources"
)

// Statuses of a document in the document API.
const (
	// StatusIndexed: every passage is searchable by BM25 and, in a dense
	// index, by its vector.
	StatusIndexed = "indexed"
	// StatusEmbedding: searchable by BM25; vectors are being computed
	// (DocInfo.Embedded of DocInfo.Passages so far).
	StatusEmbedding = "embedding"
	// StatusWriting: held durably, and being written into the remote
	// collection that is searched (Mirror); not retrievable until then.
	StatusWriting = "writing"
	// StatusFailed: the file could not be read; DocInfo.Error says why.
	StatusFailed = "failed"
)

// DocInfo describes one file of the index, as the document API lists it.
type DocInfo struct {
	// ID is sources.DocumentID of Source: the id answers' sources give
	// the file (an mbox's messages have ids of their own, which Document
	// and DeleteDocument also take).
	ID string `json:"id"`
	// Source is the name the file was added under, or its path on the
	// device for a file added from a folder.
	Source string    `json:"source"`
	Kind   string    `json:"kind,omitempty"`
	Size   int64     `json:"size"`
	SHA256 string    `json:"sha256,omitempty"`
	Added  time.Time `json:"added,omitzero"`
	Status string    `json:"status"`
	Error  string    `json:"error,omitempty"`
	// Parts are the documents read from the file: 1, or an mbox's
	// messages.
	Parts    int               `json:"parts"`
	Passages int               `json:"passages"`
	Embedded int               `json:"embedded"` // passages with a dense vector
	Title    string            `json:"title,omitempty"`
	Meta     map[string]string `json:"meta,omitempty"`
	// Unchanged: Put was given the content the index already held, and
	// did nothing.
	Unchanged bool `json:"unchanged,omitempty"`
}

// MaxNameBytes bounds a document's name.
const MaxNameBytes = 1024

// ErrBadName: a document name the index refuses.
var ErrBadName = errors.New("retrieval: bad document name")

// CleanName checks a document name given to Put and returns it in the
// form it is stored under: a relative, slash-separated path without "."
// or ".." elements, NUL or control characters, in valid UTF-8.
func CleanName(name string) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("%w %q: %s", ErrBadName, name, why)
	}
	switch {
	case name == "":
		return bad("empty")
	case len(name) > MaxNameBytes:
		return bad(fmt.Sprintf("longer than %d bytes", MaxNameBytes))
	case !utf8.ValidString(name):
		return bad("not valid UTF-8")
	case strings.ContainsFunc(name, unicode.IsControl):
		return bad("holds a control character (NUL, newline, ...)")
	case strings.HasPrefix(name, "/") || strings.HasPrefix(name, `\`) || (len(name) > 1 && name[1] == ':'):
		return bad("an absolute path; give a name, or add a path on the device")
	case strings.Contains(name, "#"):
		return bad(`holds "#", which names the messages of an mbox`)
	}
	for _, el := range strings.FieldsFunc(name, func(r rune) bool { return r == '/' || r == '\\' }) {
		if el == ".." || el == "." {
			return bad(`holds a "." or ".." element`)
		}
	}
	clean := path.Clean(strings.ReplaceAll(name, `\`, "/"))
	if clean == "." || strings.TrimSpace(clean) == "" {
		return bad("names no file")
	}
	return clean, nil
}

// PutFile is one file for PutAll.
type PutFile struct {
	Name string
	Data []byte
	Meta map[string]string
	// Err, when set, is why the file could not even be read (too large,
	// cut off): it is recorded as failed, like a file that does not parse.
	Err error
}

// Put indexes a file given as bytes under name (see CleanName), with meta
// added to each of its passages' metadata. When Put returns, the file is
// durable and searchable by BM25; in a dense index its vectors follow
// from EmbedPending. Content the index holds under name already is a
// no-op (by SHA-256); other content replaces the old version in one
// change. A file that cannot be read comes back with StatusFailed and the
// reason, and is listed so; a failed new version leaves the old one in
// place. The error is for names refused and failures of the index.
func (ix *Index) Put(ctx context.Context, name string, data []byte, meta map[string]string) (DocInfo, error) {
	if _, err := CleanName(name); err != nil {
		return DocInfo{}, err
	}
	out, err := ix.PutAll(ctx, []PutFile{{Name: name, Data: data, Meta: meta}})
	if err != nil {
		return DocInfo{}, err
	}
	return out[0], nil
}

// PutAll is Put of many files, in as few changes as it can (one, unless a
// name repeats), so that a batch costs one sync of the journal. Each
// file's outcome is in the result, in order; a refused name fails its
// file alone.
func (ix *Index) PutAll(ctx context.Context, files []PutFile) ([]DocInfo, error) {
	if ix.opts.ReadOnly {
		return nil, ErrReadOnly
	}
	if ix.opts.Tokenizer == nil {
		return nil, errors.New("retrieval: adding files needs a tokenizer")
	}
	ix.wmu.Lock()
	defer ix.wmu.Unlock()
	if ix.isClosed() {
		return nil, ErrClosed
	}
	out := make([]DocInfo, len(files))
	c := &change{Files: map[string]*fileRecord{}}
	var add []*Passage
	staged := map[string]int{} // key → index in files
	flush := func() error {
		if len(c.Files) == 0 {
			return nil
		}
		ix.stage(c, add)
		if err := ix.write(c); err != nil {
			return err
		}
		for key, i := range staged {
			out[i] = ix.docInfo(key, c.Files[key])
		}
		c, add, staged = &change{Files: map[string]*fileRecord{}}, nil, map[string]int{}
		return nil
	}
	for i, f := range files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		key, err := CleanName(f.Name)
		if err != nil {
			out[i] = DocInfo{Source: f.Name, Status: StatusFailed, Error: err.Error()}
			continue
		}
		if _, dup := c.Files[key]; dup {
			// The later version replaces the earlier, which must be in
			// the index first.
			if err := flush(); err != nil {
				return nil, err
			}
		}
		info, rec, ps := ix.prepare(key, f)
		if rec == nil {
			out[i] = info
			continue
		}
		if old := ix.files[key]; old != nil {
			for _, s := range old.Sources {
				c.Remove = append(c.Remove, ix.bySource[s]...)
			}
		}
		c.Files[key] = rec
		add = append(add, ps...)
		staged[key] = i
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// prepare reads and chunks one file for PutAll. It returns the record and
// passages to write, or, when there is nothing to write (the same content
// again, or a failed new version of a good file), the file's outcome
// alone. Callers hold wmu.
func (ix *Index) prepare(key string, f PutFile) (DocInfo, *fileRecord, []*Passage) {
	sum := sha256.Sum256(f.Data)
	hash := hex.EncodeToString(sum[:])
	old := ix.files[key]
	if old != nil && old.Hash == hash && old.Error == "" && maps.Equal(old.Meta, f.Meta) {
		info := ix.docInfo(key, old)
		info.Unchanged = true
		return info, nil, nil
	}
	now := time.Now().UTC()
	rec := &fileRecord{Size: int64(len(f.Data)), ModTime: now, Hash: hash, Added: now, Meta: maps.Clone(f.Meta)}
	var rep Report
	var kind Kind
	var docs []Document
	var derrs []FileError
	err := f.Err
	if err == nil {
		kind, docs, derrs, err = documentsFrom(key, f.Data)
	}
	var ps []*Passage
	if err == nil {
		rec.Kind = kind.String()
		for _, e := range derrs {
			rep.skip(e.Path, e.Err)
		}
		rec.Sources, ps = chunkDocuments(ix.opts.Tokenizer, ix.opts.Chunk, docs, &rep)
		if len(ps) == 0 {
			err = errors.New("no text to index")
			if len(rep.Errors) > 0 {
				err = rep.Errors[0].Err
			}
		}
	}
	if err != nil {
		if errors.Is(err, errUnsupported) {
			err = fmt.Errorf("%w (this build reads text, Markdown, mail (.eml, mbox), PDF, HTML and DOCX files)", err)
		}
		if old != nil && old.Error == "" {
			// The version indexed before stays.
			return ix.docInfo(key, &fileRecord{Size: rec.Size, Hash: hash, Added: now, Error: err.Error()}), nil, nil
		}
		rec.Sources, rec.Error = nil, err.Error()
		return DocInfo{}, rec, nil
	}
	if len(f.Meta) > 0 {
		for _, p := range ps {
			m := maps.Clone(f.Meta)
			maps.Copy(m, p.Meta)
			p.Meta = m
		}
	}
	return DocInfo{}, rec, ps
}

// docInfo describes the file recorded under key.
func (ix *Index) docInfo(key string, rec *fileRecord) DocInfo {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.docInfoLocked(key, rec)
}

func (ix *Index) docInfoLocked(key string, rec *fileRecord) DocInfo {
	d := DocInfo{
		ID: sources.DocumentID(key), Source: key, Kind: rec.Kind, Size: rec.Size, SHA256: rec.Hash,
		Added: rec.Added, Error: rec.Error, Parts: len(rec.Sources), Meta: rec.Meta,
	}
	if d.Added.IsZero() {
		d.Added = rec.ModTime
	}
	for _, s := range rec.Sources {
		for _, id := range ix.bySource[s] {
			d.Passages++
			if _, wait := ix.pending[id]; !wait {
				d.Embedded++
			}
			if d.Title == "" {
				if p := ix.passages[id]; p != nil {
					d.Title = cmpOr(p.Meta["title"], p.Meta["subject"])
				}
			}
		}
	}
	if !ix.man.Dense {
		d.Embedded = 0
	}
	switch {
	case d.Error != "":
		d.Status = StatusFailed
	case ix.man.Dense && d.Embedded < d.Passages:
		d.Status = StatusEmbedding
	default:
		d.Status = StatusIndexed
	}
	return d
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Documents lists the index's files by source.
func (ix *Index) Documents() []DocInfo {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make([]DocInfo, 0, len(ix.files))
	for _, key := range slices.Sorted(maps.Keys(ix.files)) {
		out = append(out, ix.docInfoLocked(key, ix.files[key]))
	}
	return out
}

// Document describes the file with the given id, or the file holding the
// part (an mbox's message) with that id.
func (ix *Index) Document(id string) (DocInfo, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	key, _, ok := ix.resolveLocked(id)
	if !ok {
		return DocInfo{}, false
	}
	return ix.docInfoLocked(key, ix.files[key]), true
}

// resolveLocked finds the file key of a document id, and the part's source
// when the id names a part of a file rather than the file.
func (ix *Index) resolveLocked(id string) (key, part string, ok bool) {
	for k, rec := range ix.files {
		if sources.DocumentID(k) == id {
			return k, "", true
		}
		for _, s := range rec.Sources {
			if s != k && sources.DocumentID(s) == id {
				return k, s, true
			}
		}
	}
	return "", "", false
}

// DeleteDocument removes the file with the given id, or only the part
// with that id, and returns the passages removed; an unknown id gives
// ErrNotIndexed. Searches stop returning them at once.
func (ix *Index) DeleteDocument(id string) (int, error) {
	if ix.opts.ReadOnly {
		return 0, ErrReadOnly
	}
	ix.wmu.Lock()
	defer ix.wmu.Unlock()
	if ix.isClosed() {
		return 0, ErrClosed
	}
	key, part, ok := ix.resolveLocked(id)
	if !ok {
		return 0, fmt.Errorf("%w: no document has id %s", ErrNotIndexed, id)
	}
	c := &change{Files: map[string]*fileRecord{}, NextID: ix.man.NextID}
	if part == "" {
		c.Files[key] = nil
		for _, s := range ix.files[key].Sources {
			c.Remove = append(c.Remove, ix.bySource[s]...)
		}
	} else {
		// A message goes with its attachments.
		of := func(s string) bool { return s == part || strings.HasPrefix(s, part+"#") }
		r := *ix.files[key]
		r.Sources = slices.DeleteFunc(slices.Clone(r.Sources), of)
		c.Files[key] = &r
		for _, s := range ix.files[key].Sources {
			if of(s) {
				c.Remove = append(c.Remove, ix.bySource[s]...)
			}
		}
	}
	if err := ix.write(c); err != nil {
		return 0, err
	}
	return len(c.Remove), nil
}

// PassagesOf copies the passages of the document (or part) with the given
// id.
func (ix *Index) PassagesOf(id string) []Passage {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	key, part, ok := ix.resolveLocked(id)
	if !ok {
		return nil
	}
	srcs := ix.files[key].Sources
	if part != "" {
		srcs = slices.DeleteFunc(slices.Clone(srcs), func(s string) bool { return s != part && !strings.HasPrefix(s, part+"#") })
	}
	var out []Passage
	for _, s := range srcs {
		for _, pid := range ix.bySource[s] {
			out = append(out, *ix.passages[pid])
		}
	}
	return out
}

// PassagesUnder copies the passages Delete(source) would remove.
func (ix *Index) PassagesUnder(source string) []Passage {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var out []Passage
	for s, ids := range ix.bySource {
		if s == source || strings.HasPrefix(s, source+"#") || strings.HasPrefix(s, source+"/") {
			for _, pid := range ids {
				out = append(out, *ix.passages[pid])
			}
		}
	}
	return out
}

// Pending is the number of passages waiting for their dense vectors.
func (ix *Index) Pending() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return len(ix.pending)
}

// EmbedPending computes the vectors of up to n pending passages, oldest
// first, and returns how many it gave a vector. Only the vectors' insertion
// holds the write lock, so adds and deletes wait for no embedding; the
// vectors reach disk at the next checkpoint (a crash before only makes
// the passages pending again).
func (ix *Index) EmbedPending(ctx context.Context, n int) (int, error) {
	if ix.opts.ReadOnly || ix.opts.Embedder == nil || n <= 0 {
		return 0, nil
	}
	ix.mu.RLock()
	if ix.closed || len(ix.pending) == 0 {
		ix.mu.RUnlock()
		return 0, nil
	}
	ids := slices.Sorted(maps.Keys(ix.pending))
	ps := make([]*Passage, 0, min(n, len(ids)))
	for _, id := range ids[:min(n, len(ids))] {
		ps = append(ps, ix.passages[id])
	}
	ix.mu.RUnlock()
	vecs, err := ix.embedPassages(ctx, ps, 0, len(ps))
	if err != nil {
		return 0, err
	}
	ix.wmu.Lock()
	defer ix.wmu.Unlock()
	if ix.isClosed() {
		return 0, ErrClosed
	}
	ix.setVectors(ps, vecs)
	return len(ps), nil
}

// VectorsInMemory counts the vectors computed since the last checkpoint,
// which only memory holds until the next.
func (ix *Index) VectorsInMemory() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if ix.vecs == nil {
		return 0
	}
	return len(ix.vecs.mem)
}

// Checkpoint writes a snapshot of the index and empties its journal, when
// the snapshot lacks anything (journaled changes, vectors).
func (ix *Index) Checkpoint() error {
	if ix.opts.ReadOnly {
		return nil
	}
	ix.wmu.Lock()
	defer ix.wmu.Unlock()
	if ix.isClosed() {
		return ErrClosed
	}
	ix.mu.RLock()
	dirty := ix.dirty || ix.journal.size > 0
	ix.mu.RUnlock()
	if !dirty {
		return nil
	}
	return ix.persist()
}
