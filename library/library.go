// Package library is a daemon's corpus as its owner changes it while the
// daemon runs: the document API's semantics over a writable
// retrieval.Index. Adds are acknowledged once durable and searchable by
// BM25; dense vectors follow in the background, paused while answers are
// being generated so that ingestion does not slow them; deletes take
// effect at once and tell the KV cache to drop the passages' entries. It
// knows nothing of HTTP or gRPC: device/ serves it over both.
package library

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/dragon-rag/dragon/retrieval"
	"github.com/dragon-rag/dragon/sources"
)

// Limits bound what one request may ask of the library.
type Limits struct {
	// FileBytes is the largest file an upload may carry (default 64 MiB).
	FileBytes int64
	// Files is the most files one request may carry (default 1000): the
	// files past it fail, the ones before are kept.
	Files int
}

func (l Limits) withDefaults() Limits {
	if l.FileBytes <= 0 {
		l.FileBytes = 64 << 20
	}
	if l.Files <= 0 {
		l.Files = 1000
	}
	return l
}

// Options configure a Library.
type Options struct {
	Limits Limits
	// Busy says whether answers are being generated; embedding waits
	// while it does (nil: never busy).
	Busy func() bool
	// OnRemove is told the passages a change removed, after searches
	// stopped returning them (e.g. to drop their KV-cache entries).
	OnRemove func([]retrieval.Passage)
	// EmbedBatch is how many passages one background embedding step takes
	// (default 16: a step must end soon after a question comes in).
	EmbedBatch int
	// CheckpointEvery is the longest a change stays only in the journal
	// while the library is quiet (default 1 minute).
	CheckpointEvery time.Duration
	// Mark, when set, may change the status of documents the library
	// describes: a cloud whose searched collection is written after the
	// index (retrieval.Mirror.Unwritten) marks those not yet there.
	Mark func([]retrieval.DocInfo)
	// Checkpointed, when set, is called after each checkpoint the
	// library makes: a checkpoint allocates as much as the snapshot it
	// writes, which a device returns to the OS (debug.FreeOSMemory)
	// rather than keep resident until the runtime's scavenger gets to it.
	Checkpointed func()
	Logger       *slog.Logger
}

// Library serves a writable index's documents.
type Library struct {
	ix   *retrieval.Index
	opts Options
	log  *slog.Logger
	wake chan struct{}
	// savedAt is the index's change count at the last checkpoint (if
	// saved).
	saved   bool
	savedAt uint64
}

// New serves ix, which must be open for writing; Run does the background
// work.
func New(ix *retrieval.Index, opts Options) *Library {
	opts.Limits = opts.Limits.withDefaults()
	if opts.EmbedBatch <= 0 {
		opts.EmbedBatch = 16
	}
	if opts.CheckpointEvery <= 0 {
		opts.CheckpointEvery = time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Busy == nil {
		opts.Busy = func() bool { return false }
	}
	if opts.Mark == nil {
		opts.Mark = func([]retrieval.DocInfo) {}
	}
	return &Library{ix: ix, opts: opts, log: opts.Logger, wake: make(chan struct{}, 1)}
}

// Limits are the library's limits, defaults filled in.
func (l *Library) Limits() Limits { return l.opts.Limits }

// Upload is one file given to Add.
type Upload struct {
	Name string
	Meta map[string]string
	// Data reads the file's bytes; Size, when declared (≥ 0), is checked
	// against the limit before any is read.
	Data io.Reader
	Size int64
	// Err, when set, is why the file could not be received (a client's
	// declared size over the limit): it is listed as failed with it.
	Err error
}

// ErrTooLarge: a file over Limits.FileBytes.
var ErrTooLarge = errors.New("library: file too large")

// Failed describes a file that could not be added, for an API's answer.
func Failed(name, why string) retrieval.DocInfo {
	return retrieval.DocInfo{Source: name, Status: retrieval.StatusFailed, Error: why}
}

// Add reads and indexes one uploaded file. The outcome is per file: a
// file that cannot be read comes back failed with the reason; the error
// is for the index failing (and ctx), which fails the request.
func (l *Library) Add(ctx context.Context, u Upload) (retrieval.DocInfo, error) {
	out, err := l.AddAll(ctx, []Upload{u})
	if err != nil {
		return retrieval.DocInfo{}, err
	}
	return out[0], nil
}

// AddAll is Add of many files as one batch: one sync of the journal for
// all of them. Each file's outcome is in the result, in order.
func (l *Library) AddAll(ctx context.Context, us []Upload) ([]retrieval.DocInfo, error) {
	out := make([]retrieval.DocInfo, len(us))
	var files []retrieval.PutFile
	var at []int
	for i, u := range us {
		if _, err := retrieval.CleanName(u.Name); err != nil {
			out[i] = Failed(u.Name, err.Error())
			continue
		}
		data, fail, err := l.read(u)
		if err != nil {
			return nil, err
		}
		if u.Err != nil {
			fail = u.Err
		}
		f := retrieval.PutFile{Name: u.Name, Data: data, Meta: u.Meta}
		if fail != nil {
			f.Data, f.Err = nil, fail
		}
		files = append(files, f)
		at = append(at, i)
	}
	if len(files) > 0 {
		l.yield(ctx)
		infos, err := l.ix.PutAll(ctx, files)
		if err != nil {
			return nil, err
		}
		l.opts.Mark(infos)
		for j, info := range infos {
			out[at[j]] = info
			l.log.Info("document added", "id", info.ID, "status", info.Status, "passages", info.Passages, "unchanged", info.Unchanged)
		}
	}
	l.kick()
	return out, nil
}

// maxYield bounds how long an add waits for answers to finish, so that a
// device answering without pause still takes its owner's files.
const maxYield = 10 * time.Second

// yield waits while answers are being generated: reading, chunking and
// indexing a batch takes the core an answer's decoding needs (on one core,
// a bulk add doubled the time to first token of questions asked
// meanwhile). Files wait at most maxYield; their ack comes after.
func (l *Library) yield(ctx context.Context) {
	deadline := time.Now().Add(maxYield)
	for l.opts.Busy() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
}

// read reads an upload's bytes, or says why the file fails; the error is
// for the reader failing (the request's body).
func (l *Library) read(u Upload) ([]byte, error, error) {
	max := l.opts.Limits.FileBytes
	if u.Size > max {
		return nil, fmt.Errorf("%w: declared %d bytes, over the %d a file may have", ErrTooLarge, u.Size, max), nil
	}
	data, err := io.ReadAll(io.LimitReader(u.Data, max+1))
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", u.Name, err)
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%w: over the %d bytes a file may have", ErrTooLarge, max), nil
	}
	return data, nil, nil
}

// AddPath indexes a file or folder on this machine in place and returns
// the documents under it, with a failed entry per file that could not be
// read.
func (l *Library) AddPath(ctx context.Context, path string) ([]retrieval.DocInfo, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("path %q: %w", path, err)
	}
	rep, err := l.ix.Add(ctx, abs)
	if err != nil {
		return nil, err
	}
	l.kick()
	var out []retrieval.DocInfo
	for _, d := range l.ix.Documents() {
		if d.Source == abs || hasDirPrefix(d.Source, abs) {
			out = append(out, d)
		}
	}
	for _, e := range rep.Errors {
		out = append(out, Failed(e.Path, e.Err.Error()))
	}
	if len(out) == 0 {
		out = append(out, Failed(abs, "no file there that this build reads (text, Markdown, mail, PDF, HTML, DOCX)"))
	}
	return out, nil
}

func hasDirPrefix(s, dir string) bool {
	return len(s) > len(dir) && s[:len(dir)] == dir && s[len(dir)] == filepath.Separator
}

// Delete removes the document with the given id (or the part with it).
func (l *Library) Delete(id string) (int, error) {
	removed := l.snapshotOf(id)
	n, err := l.ix.DeleteDocument(id)
	if err != nil {
		return 0, err
	}
	l.removed(removed)
	return n, nil
}

// DeleteSource removes a document by the name it was added under, or by
// path (a file, an mbox message path#N, everything under a folder).
func (l *Library) DeleteSource(source string) (int, error) {
	if name, err := retrieval.CleanName(source); err == nil {
		if d, ok := l.bySource(name); ok {
			return l.Delete(d.ID)
		}
	}
	before := l.passagesUnder(source)
	n, err := l.ix.Delete(source)
	if err != nil {
		return 0, err
	}
	l.removed(before)
	return n, nil
}

// bySource finds a file by the name it was added under, through its id:
// listing every document to find one would cost a pass over all passages.
func (l *Library) bySource(source string) (retrieval.DocInfo, bool) {
	d, ok := l.ix.Document(sources.DocumentID(source))
	return d, ok && d.Source == source
}

// snapshotOf copies the passages a delete of id would remove, for
// OnRemove.
func (l *Library) snapshotOf(id string) []retrieval.Passage {
	if l.opts.OnRemove == nil {
		return nil
	}
	return l.ix.PassagesOf(id)
}

func (l *Library) passagesUnder(source string) []retrieval.Passage {
	if l.opts.OnRemove == nil {
		return nil
	}
	abs, err := filepath.Abs(source)
	if err != nil {
		return nil
	}
	return l.ix.PassagesUnder(abs)
}

func (l *Library) removed(ps []retrieval.Passage) {
	if l.opts.OnRemove != nil && len(ps) > 0 {
		l.opts.OnRemove(ps)
	}
	l.kick()
}

// Search returns the k passages of the corpus most relevant to query,
// among those f lets through, as a generation retrieves them (before any
// re-ranking).
func (l *Library) Search(ctx context.Context, query string, k int, f retrieval.Filter) ([]retrieval.Hit, error) {
	return l.ix.SearchFilter(ctx, query, k, retrieval.ModeAuto, f)
}

// Get describes the document with the given id, or holding the part with
// it.
func (l *Library) Get(id string) (retrieval.DocInfo, bool) {
	d, ok := l.ix.Document(id)
	if ok {
		ds := []retrieval.DocInfo{d}
		l.opts.Mark(ds)
		d = ds[0]
	}
	return d, ok
}

// Page is one page of a listing.
type Page struct {
	Documents []retrieval.DocInfo
	Next      string // the token of the next page; empty on the last
	Total     int
}

// MaxPageSize bounds a page of List.
const MaxPageSize = 1000

// List returns up to size documents (0: 100) after the page token (the
// index of the next document, as a decimal), by source or, recentFirst,
// the most recently added first.
func (l *Library) List(size int, token string, recentFirst bool) (Page, error) {
	if size <= 0 {
		size = 100
	}
	size = min(size, MaxPageSize)
	start := 0
	if token != "" {
		n, err := strconv.Atoi(token)
		if err != nil || n < 0 {
			return Page{}, fmt.Errorf("bad page token %q", token)
		}
		start = n
	}
	all := l.ix.Documents()
	if recentFirst {
		slices.SortStableFunc(all, func(a, b retrieval.DocInfo) int { return b.Added.Compare(a.Added) })
	}
	start = min(start, len(all))
	end := min(start+size, len(all))
	p := Page{Documents: all[start:end], Total: len(all)}
	l.opts.Mark(p.Documents)
	if end < len(all) {
		p.Next = strconv.Itoa(end)
	}
	return p, nil
}

// Stats count the corpus.
type Stats struct {
	Documents int   `json:"documents"`
	Failed    int   `json:"failed"`
	Passages  int   `json:"passages"`
	Pending   int   `json:"pending_vectors"`
	DiskBytes int64 `json:"disk_bytes"`
}

// Stats counts the corpus.
func (l *Library) Stats() Stats {
	docs := l.ix.Documents()
	st := l.ix.Stats()
	s := Stats{Documents: len(docs), Passages: st.Manifest.Passages, Pending: l.ix.Pending(), DiskBytes: st.DiskBytes}
	for _, d := range docs {
		if d.Status == retrieval.StatusFailed {
			s.Failed++
		}
	}
	return s
}

func (l *Library) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// checkpointVectors are the vectors held only in memory that make the
// end of embedding checkpoint at once (about 1.5 MB of MiniLM's).
const checkpointVectors = 1024

// busyPoll is how often embedding looks again while answers are being
// generated.
const busyPoll = 200 * time.Millisecond

// Run embeds pending passages, a batch at a time and only while no
// answer is being generated, and checkpoints once the journal has been
// quiet a while or all vectors are in; it returns when ctx ends, after a
// last checkpoint.
func (l *Library) Run(ctx context.Context) {
	tick := time.NewTicker(l.opts.CheckpointEvery)
	defer tick.Stop()
	lastChange := time.Now()
	for {
		switch {
		case ctx.Err() != nil:
			l.checkpoint()
			return
		case l.ix.Pending() > 0 && l.opts.Busy():
			l.sleep(ctx, busyPoll)
			continue
		case l.ix.Pending() > 0:
			n, err := l.ix.EmbedPending(ctx, l.opts.EmbedBatch)
			if err != nil {
				if ctx.Err() == nil {
					l.log.Error("embedding pending passages failed; retrying", "err", err)
					l.sleep(ctx, 5*time.Second)
				}
				continue
			}
			// A checkpoint rewrites the whole snapshot, so a few vectors
			// wait for the quiet one: lost to a crash, they are only
			// computed again.
			if n > 0 && l.ix.Pending() == 0 && l.ix.VectorsInMemory() >= checkpointVectors {
				l.log.Info("all passages have their vectors")
				l.checkpoint()
			}
			lastChange = time.Now()
			continue
		}
		select {
		case <-ctx.Done():
		case <-l.wake:
			lastChange = time.Now()
		case <-tick.C:
			if time.Since(lastChange) >= l.opts.CheckpointEvery/2 {
				l.checkpoint()
			}
		}
	}
}

func (l *Library) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-l.wake:
	}
}

// checkpoint checkpoints the index unless nothing changed since the last
// one. Only Run calls it.
func (l *Library) checkpoint() {
	changes := l.ix.Changes()
	if l.saved && changes == l.savedAt {
		return
	}
	if err := l.ix.Checkpoint(); err != nil {
		if !errors.Is(err, retrieval.ErrClosed) {
			l.log.Warn("checkpoint failed; the journal keeps every change", "err", err)
		}
		return
	}
	l.saved, l.savedAt = true, changes
	if l.opts.Checkpointed != nil {
		l.opts.Checkpointed()
	}
}
