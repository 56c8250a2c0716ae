package retrieval

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/dragon-rag/dragon/extract"
)

// Report summarizes an Add or Build.
type Report struct {
	Files       int // files read (new or changed)
	Unchanged   int // files skipped: indexed before and unchanged since
	Documents   int // documents (files, mail messages) chunked
	Passages    int // passages added
	Removed     int // passages of changed files that were replaced
	Unsupported int // files inside folders that are not text, mail or mbox
	// Skipped counts files and messages that could not be read; Errors
	// says why. They never stop a run.
	Skipped int
	Errors  []FileError
}

func (r *Report) skip(path string, err error) {
	r.Skipped++
	r.Errors = append(r.Errors, FileError{path, err})
}

// vectorChunk is how many vectors are set per hold of the write lock, so
// searches keep running while a large batch goes in.
const vectorChunk = 128

// pendingFile is a file read and chunked, waiting to be committed.
type pendingFile struct {
	path     string
	rec      *fileRecord
	passages []*Passage
}

// Add indexes files and folders. New files are added; files indexed
// before are skipped while unchanged (size and modification time) and
// replaced when changed. Files that cannot be read are counted in the
// Report; the error is for failures of the index itself (and ctx).
func (ix *Index) Add(ctx context.Context, paths ...string) (Report, error) {
	var rep Report
	if ix.opts.ReadOnly {
		return rep, ErrReadOnly
	}
	if ix.opts.Tokenizer == nil {
		return rep, errors.New("retrieval: adding files needs a tokenizer")
	}
	ix.wmu.Lock()
	defer ix.wmu.Unlock()
	if ix.isClosed() {
		return rep, ErrClosed
	}
	if ix.man.Dense && ix.opts.Embedder == nil {
		return rep, fmt.Errorf("%w: index %s is dense; adding files needs its embedder %q", ErrEmbedder, ix.dir, ix.man.Embedder)
	}
	files, werrs := walk(paths, ix.exclude)
	for _, e := range werrs {
		rep.skip(e.Path, e.Err)
	}
	explicit := map[string]bool{}
	for _, p := range paths {
		if abs, err := filepath.Abs(p); err == nil {
			explicit[abs] = true
		}
	}
	ix.progress(PhaseScan, len(files), len(files), "")

	var pending []pendingFile
	total := 0
	for i, path := range files {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		ix.progress(PhaseRead, i, len(files), path)
		if pf, ok := ix.readFile(path, explicit[path], &rep); ok {
			pending = append(pending, pf)
			total += len(pf.passages)
		}
	}
	ix.progress(PhaseRead, len(files), len(files), "")
	for _, e := range rep.Errors {
		ix.log.Warn("skipped", "path", e.Path, "err", e.Err)
	}

	done := 0
	for start := 0; start < len(pending); {
		end, n := start, 0
		for end < len(pending) && (end == start || n+len(pending[end].passages) <= ix.opts.CommitEvery) {
			n += len(pending[end].passages)
			end++
		}
		if err := ix.commit(ctx, pending[start:end], &done, total, &rep); err != nil {
			return rep, err
		}
		start = end
	}
	return rep, nil
}

// readFile reads and chunks one file, or counts why it is skipped.
func (ix *Index) readFile(path string, explicit bool, rep *Report) (pendingFile, bool) {
	info, err := os.Stat(path)
	if err != nil {
		rep.skip(path, err)
		return pendingFile{}, false
	}
	if rec := ix.files[path]; rec != nil && rec.Size == info.Size() && rec.ModTime.Equal(info.ModTime()) {
		rep.Unchanged++
		return pendingFile{}, false
	}
	docs, derrs, err := readDocuments(path)
	if errors.Is(err, errUnsupported) && !explicit {
		rep.Unsupported++
		ix.log.Debug("unsupported file type", "path", path)
		return pendingFile{}, false
	}
	if err != nil {
		rep.skip(path, err)
		return pendingFile{}, false
	}
	for _, e := range derrs {
		rep.skip(e.Path, e.Err)
	}
	pf := pendingFile{path: path, rec: &fileRecord{Size: info.Size(), ModTime: info.ModTime()}}
	pf.rec.Sources, pf.passages = chunkDocuments(ix.opts.Tokenizer, ix.opts.Chunk, docs, rep)
	rep.Files++
	return pf, true
}

// chunkDocuments cuts documents into passages and returns the sources it
// chunked; a document that cannot be chunked is counted in rep and left out.
func chunkDocuments(tok Tokenizer, chunk ChunkOptions, docs []Document, rep *Report) ([]string, []*Passage) {
	var sources []string
	var out []*Passage
	for _, d := range docs {
		spans, err := chunkText(tok, d.Text, chunk)
		if err != nil {
			rep.skip(d.Source, err)
			continue
		}
		sources = append(sources, d.Source)
		for _, s := range spans {
			meta := d.Meta
			if len(d.Pages) > 0 {
				meta = maps.Clone(d.Meta)
				meta["page"] = strconv.Itoa(extract.PageAt(d.Pages, s.Start))
			}
			out = append(out, &Passage{
				Source: d.Source, Start: s.Start, End: s.End, Tokens: s.Tokens,
				Text: d.Text[s.Start:s.End], Meta: meta,
			})
		}
		rep.Documents++
	}
	return sources, out
}

// commit embeds a group of files' passages, journals them in place of the
// files' old passages as one change, applies it and checkpoints, so the
// group's vectors are on disk with it (with DeferVectors, only journals
// and applies).
func (ix *Index) commit(ctx context.Context, group []pendingFile, done *int, total int, rep *Report) error {
	var add []*Passage
	for _, pf := range group {
		add = append(add, pf.passages...)
	}
	var vecs [][]float32
	if !ix.opts.DeferVectors {
		var err error
		if vecs, err = ix.embedPassages(ctx, add, *done, total); err != nil {
			return err
		}
	}
	c := &change{Files: map[string]*fileRecord{}}
	for _, pf := range group {
		if old := ix.files[pf.path]; old != nil {
			for _, s := range old.Sources {
				c.Remove = append(c.Remove, ix.bySource[s]...)
			}
		}
		c.Files[pf.path] = pf.rec
	}
	ix.stage(c, add)
	if err := ix.write(c); err != nil {
		return err
	}
	rep.Removed += len(c.Remove)
	rep.Passages += len(add)
	if vecs != nil {
		ix.setVectors(add, vecs)
	}
	if !ix.opts.DeferVectors {
		if err := ix.persist(); err != nil {
			return ix.failed(err)
		}
	}
	*done += len(add)
	ix.progress(PhaseIndex, *done, total, "")
	return nil
}

// stage numbers new passages and puts them in c. Callers hold wmu.
func (ix *Index) stage(c *change, add []*Passage) {
	next := ix.man.NextID
	for _, p := range add {
		if p.terms == 0 {
			p.terms = ix.bm25.analyzedLength(p.Text)
		}
		p.ID = next
		next++
		c.Add = append(c.Add, passageRecord{p, p.terms})
	}
	c.NextID = next
}

// write makes a change durable in the journal, then applies it to memory
// and bleve: once it returns, searches see it and it survives a crash.
// Callers hold wmu.
func (ix *Index) write(c *change) error {
	if err := ix.journal.append(c); err != nil {
		return err
	}
	// Memory first: searches drop bleve's hits that memory lacks, so a
	// removed passage is gone at once and an added one shows as soon as
	// bleve has it.
	ix.mu.Lock()
	ix.applyLocked(c)
	ix.mu.Unlock()
	add := make([]*Passage, len(c.Add))
	for i, r := range c.Add {
		add[i] = r.Passage
	}
	if err := ix.bm25.apply(add, c.Remove); err != nil {
		return ix.failed(err)
	}
	if ix.journal.size > checkpointJournalBytes {
		if err := ix.persist(); err != nil {
			// The change is durable in the journal all the same.
			ix.log.Warn("checkpoint failed; the journal keeps growing", "dir", ix.dir, "err", err)
		}
	}
	return nil
}

// checkpointJournalBytes is the journal's size past which a write
// checkpoints: it bounds the replay at Open and the journal's disk, while
// each checkpoint rewrites the whole snapshot.
const checkpointJournalBytes = 64 << 20

// applyLocked applies a change to the maps in memory, also when replaying
// one they hold already. Callers hold mu (or own the index, in Open).
func (ix *Index) applyLocked(c *change) {
	ix.removeLocked(c.Remove)
	for _, r := range c.Add {
		p := r.Passage
		p.terms = r.Terms
		p.readDate()
		if old := ix.passages[p.ID]; old != nil {
			ix.removeLocked([]uint64{p.ID})
		}
		ix.passages[p.ID] = p
		ix.bySource[p.Source] = append(ix.bySource[p.Source], p.ID)
		ix.terms += int64(p.terms)
		if ix.man.Dense {
			ix.pending[p.ID] = struct{}{}
		}
	}
	for key, rec := range c.Files {
		if rec == nil {
			delete(ix.files, key)
		} else {
			ix.files[key] = rec
		}
	}
	ix.man.NextID = max(ix.man.NextID, c.NextID)
	ix.man.Passages, ix.man.Sources, ix.man.Files = len(ix.passages), len(ix.bySource), len(ix.files)
	ix.changes.Add(1)
}

// setVectors gives live passages their vectors, a chunk per hold of the
// lock so that searches keep running. Callers hold wmu.
func (ix *Index) setVectors(ps []*Passage, vecs [][]float32) {
	for i := 0; i < len(ps); i += vectorChunk {
		ix.mu.Lock()
		for j := i; j < min(i+vectorChunk, len(ps)); j++ {
			id := ps[j].ID
			if ix.passages[id] != ps[j] {
				continue // removed (or replaced) meanwhile
			}
			ix.vecs.set(id, vecs[j])
			delete(ix.pending, id)
		}
		ix.dirty = true
		ix.changes.Add(1)
		ix.mu.Unlock()
	}
}

// embedPassages returns the unit vectors of ps, or nil for a BM25-only
// index.
func (ix *Index) embedPassages(ctx context.Context, ps []*Passage, done, total int) ([][]float32, error) {
	if !ix.man.Dense {
		return nil, nil
	}
	vecs := make([][]float32, 0, len(ps))
	for i := 0; i < len(ps); i += ix.opts.EmbedBatch {
		batch := ps[i:min(i+ix.opts.EmbedBatch, len(ps))]
		texts := make([]string, len(batch))
		for j, p := range batch {
			texts[j] = p.Text
		}
		vs, err := ix.opts.Embedder.Embed(ctx, texts)
		if err != nil {
			return nil, fmt.Errorf("embed passages of %s: %w", batch[0].Source, err)
		}
		if len(vs) != len(batch) {
			return nil, fmt.Errorf("embedder returned %d vectors for %d texts", len(vs), len(batch))
		}
		for j, v := range vs {
			u, err := unit(v)
			if err != nil {
				return nil, fmt.Errorf("embedding of a passage of %s: %w", batch[j].Source, err)
			}
			if err := ix.checkDims(len(u)); err != nil {
				return nil, err
			}
			vecs = append(vecs, u)
		}
		ix.progress(PhaseEmbed, done+len(vecs), total, "")
	}
	return vecs, nil
}

func (ix *Index) checkDims(n int) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.man.Dims == 0 {
		ix.man.Dims = n
	}
	if n != ix.man.Dims {
		return fmt.Errorf("%w: embedder gives %d dimensions, index has %d", ErrEmbedder, n, ix.man.Dims)
	}
	return nil
}

// removeLocked drops passages from the maps and their vectors, whose
// slots the next checkpoint drops. Callers hold mu.
func (ix *Index) removeLocked(ids []uint64) {
	for _, id := range ids {
		p := ix.passages[id]
		if p == nil {
			continue
		}
		delete(ix.passages, id)
		if ix.vecs != nil {
			ix.vecs.remove(id)
		}
		delete(ix.pending, id)
		ix.terms -= int64(p.terms)
		rest := slices.DeleteFunc(ix.bySource[p.Source], func(x uint64) bool { return x == id })
		if len(rest) == 0 {
			delete(ix.bySource, p.Source)
		} else {
			ix.bySource[p.Source] = rest
		}
	}
}

// Delete removes a source from the index: a file or mail message by its
// Source, every message of an mbox by the mbox's path, or everything under
// a folder. It returns the number of passages removed; a source with none
// gives ErrNotIndexed. A deleted mbox message stays deleted until the mbox
// file changes.
func (ix *Index) Delete(source string) (int, error) {
	if ix.opts.ReadOnly {
		return 0, ErrReadOnly
	}
	target, err := filepath.Abs(source)
	if err != nil {
		return 0, fmt.Errorf("delete %s: %w", source, err)
	}
	ix.wmu.Lock()
	defer ix.wmu.Unlock()
	if ix.isClosed() {
		return 0, ErrClosed
	}
	under := func(s string) bool {
		return s == target || strings.HasPrefix(s, target+"#") || strings.HasPrefix(s, target+string(filepath.Separator))
	}
	c := &change{Files: map[string]*fileRecord{}, NextID: ix.man.NextID}
	matched := false
	for s, ids := range ix.bySource {
		if under(s) {
			c.Remove = append(c.Remove, ids...)
			matched = true
		}
	}
	for path, rec := range ix.files {
		if under(path) {
			c.Files[path] = nil
			matched = true
			continue
		}
		if kept := slices.DeleteFunc(slices.Clone(rec.Sources), under); len(kept) != len(rec.Sources) {
			r := *rec
			r.Sources = kept
			c.Files[path] = &r
		}
	}
	if !matched {
		return 0, fmt.Errorf("%w: %s", ErrNotIndexed, target)
	}
	if err := ix.write(c); err != nil {
		return 0, err
	}
	return len(c.Remove), nil
}

// failed wraps an error that struck after memory changed but before the
// manifest was written: the files on disk may now disagree.
func (ix *Index) failed(err error) error {
	return fmt.Errorf("%w (the index on disk may be inconsistent; if it fails to open, %s)", err, rebuildHint(ix.dir))
}

func (ix *Index) isClosed() bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.closed
}

func (ix *Index) progress(phase Phase, done, total int, item string) {
	if ix.opts.Progress != nil {
		ix.opts.Progress(Progress{Phase: phase, Done: done, Total: total, Item: item})
	}
}
