package retrieval

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure Build and Open.
type Options struct {
	// Chunk sizes the passages of a new index; an opened index keeps the
	// sizes it was built with.
	Chunk ChunkOptions
	// Tokenizer cuts passages; required to add files.
	Tokenizer Tokenizer
	// Embedder makes the index dense when given to Build. Open needs the
	// same embedder (by fingerprint) for dense search and for adding to a
	// dense index; without one, only BM25 search works.
	Embedder Embedder
	// EmbedBatch is how many passages go to one Embed call (default 32).
	EmbedBatch int
	// CommitEvery is how many new passages are written to disk at once
	// (default 4096): an interrupted Add keeps what it committed, and
	// running it again skips the files already in.
	CommitEvery int
	// ExactDenseMax is the largest index whose dense search scans every
	// vector (default DefaultExactDenseMax); larger ones rank by the
	// vectors' codes first. Negative: always the codes.
	ExactDenseMax int
	// ReadOnly opens an index for searching only (shared lock).
	ReadOnly bool
	// DeferVectors makes Add leave new passages' dense vectors to
	// EmbedPending, as Put does, and commit without a checkpoint: a
	// daemon's adds are searchable by BM25 at once and never wait for the
	// embedder. Offline adds compute them in line.
	DeferVectors bool
	// Progress, if set, is called as files are read and passages embedded
	// and indexed, from the goroutine that called Build or Add.
	Progress func(Progress)
	Logger   *slog.Logger
}

func (o Options) withDefaults() Options {
	o.Chunk = o.Chunk.withDefaults()
	if o.EmbedBatch <= 0 {
		o.EmbedBatch = 32
	}
	if o.ExactDenseMax == 0 {
		o.ExactDenseMax = DefaultExactDenseMax
	}
	if o.CommitEvery <= 0 {
		o.CommitEvery = 4096
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Phase of an indexing run.
type Phase string

// Phases, in order.
const (
	PhaseScan  Phase = "scan"  // listing files; Total is the count found
	PhaseRead  Phase = "read"  // reading and chunking files
	PhaseEmbed Phase = "embed" // embedding passages
	PhaseIndex Phase = "index" // committing passages to disk
	PhaseStats Phase = "stats" // counting a remote collection's terms, in passages
)

// Progress of an indexing run: Done of Total units (files for scan and
// read, passages for embed and index).
type Progress struct {
	Phase       Phase
	Done, Total int
	Item        string // the file being read, if any
}

// Index is an open index directory. Search may be called from many
// goroutines at once, also while Add or Delete runs; writers are
// serialized.
type Index struct {
	dir  string
	opts Options
	log  *slog.Logger
	bm25 *bm25Index

	// wmu serializes writers. The graph, vectors and passage maps change
	// only with wmu held, so a writer may read them without mu.
	wmu sync.Mutex
	// mu guards the fields below against writers' changes while readers
	// use them.
	mu       sync.RWMutex
	man      Manifest
	passages map[uint64]*Passage
	bySource map[string][]uint64
	files    map[string]*fileRecord
	vecs     *vectorStore // live passages' unit vectors; nil if not dense
	terms    int64        // analyzed terms in all passages, for BM25
	// pending are the live passages of a dense index without a vector
	// yet: added by the document API, whose vectors follow in the
	// background (EmbedPending), or journaled by a writer that crashed
	// before its checkpoint.
	pending map[uint64]struct{}
	closed  bool

	// journal holds the changes since the snapshot the manifest names.
	journal *journal
	// dirty: the snapshot lacks something only memory holds (vectors,
	// the dimensions), though the journal may be empty.
	dirty bool

	// changes counts the changes applied since Open (passages added or
	// removed, vectors set), so that a watcher of the index (Mirror) can
	// tell an unchanged index from a look at one number.
	changes atomic.Uint64

	// exclude are folders Add never reads: the index's own directory and,
	// while building, the one it will replace.
	exclude []string
}

// Build creates the index at dir from paths, replacing any index there
// only once the new one is complete: it is built in a sibling directory
// and renamed into place. An error from an unreadable file is reported in
// the Report, not returned.
func Build(ctx context.Context, dir string, opts Options, paths ...string) (*Index, Report, error) {
	opts = opts.withDefaults()
	if err := opts.Chunk.validate(); err != nil {
		return nil, Report{}, err
	}
	if opts.Tokenizer == nil {
		return nil, Report{}, errors.New("retrieval: build needs a tokenizer")
	}
	dir = filepath.Clean(dir)
	if err := replaceable(dir); err != nil {
		return nil, Report{}, err
	}
	if err := notInUse(dir); err != nil {
		return nil, Report{}, err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, Report{}, fmt.Errorf("build %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".building-*")
	if err != nil {
		return nil, Report{}, fmt.Errorf("build %s: %w", dir, err)
	}
	ix, err := create(tmp, opts)
	if err != nil {
		os.RemoveAll(tmp)
		return nil, Report{}, err
	}
	// Never index the index, old or new, when it lies inside a path.
	ix.exclude = append(ix.exclude, dir)
	rep, err := ix.Add(ctx, paths...)
	if cerr := ix.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close new index: %w", cerr)
	}
	if err == nil {
		err = replaceDir(tmp, dir)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return nil, rep, fmt.Errorf("build %s: %w", dir, err)
	}
	ix, err = Open(dir, opts)
	return ix, rep, err
}

// replaceable checks that Build may replace dir: it must not exist, be
// empty, or hold an index (even a broken one). Anything else is someone's
// files, which a typo in --dir must not delete.
func replaceable(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("build %s: %w", dir, err)
	}
	if len(entries) == 0 {
		return nil
	}
	for _, e := range entries {
		switch e.Name() {
		case manifestFile, bleveDir, journalFile:
			return nil
		}
		if snapshotFile(e.Name()) {
			return nil
		}
	}
	return fmt.Errorf("build %s: the directory exists and does not hold an index; refusing to replace it", dir)
}

// notInUse fails when a process has the index at dir open: a daemon would
// go on answering from the index it holds, not the one built, and a
// writer's changes since would be lost.
func notInUse(dir string) error {
	bdir := filepath.Join(dir, bleveDir)
	if _, err := os.Stat(filepath.Join(bdir, "index_meta.json")); err != nil {
		return nil
	}
	b, err := openBM25(bdir, false)
	if err != nil {
		if strings.Contains(err.Error(), "timeout") {
			return fmt.Errorf("build %s: %w: a running daemon serves it; stop it first, or change its documents through it (dragon docs add|ls|rm --device ADDR)", dir, ErrInUse)
		}
		return nil // a broken index: Build replaces it
	}
	return b.close()
}

// replaceDir moves tmp to dir, removing what was at dir.
func replaceDir(tmp, dir string) error {
	old := ""
	if _, err := os.Stat(dir); err == nil {
		old = tmp + ".old"
		if err := os.Rename(dir, old); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if old != "" {
			os.Rename(old, dir)
		}
		return err
	}
	if old != "" {
		return os.RemoveAll(old)
	}
	return nil
}

// create makes an empty index in the empty directory dir.
func create(dir string, opts Options) (*Index, error) {
	now := time.Now().UTC()
	man := Manifest{
		Version:     formatVersion,
		Created:     now,
		Updated:     now,
		ChunkTokens: opts.Chunk.Tokens,
		Overlap:     opts.Chunk.Overlap,
		Tokenizer:   tokenizerID(opts.Tokenizer),
		Dense:       opts.Embedder != nil,
		NextID:      1,
	}
	if man.Dense {
		man.Embedder = embedderID(opts.Embedder)
	}
	b, err := createBM25(filepath.Join(dir, bleveDir))
	if err != nil {
		return nil, err
	}
	ix := &Index{
		dir: dir, opts: opts, log: opts.Logger, bm25: b, man: man, exclude: []string{dir},
		passages: map[uint64]*Passage{}, bySource: map[string][]uint64{},
		files: map[string]*fileRecord{}, pending: map[uint64]struct{}{},
	}
	if man.Dense {
		ix.vecs = newVectorStore(0)
	}
	j, _, err := openJournal(dir, 0, false)
	if err == nil {
		ix.journal = j
		err = ix.persist()
	}
	if err != nil {
		ix.journal.close()
		b.close()
		return nil, err
	}
	return ix, nil
}

// ReadManifest reads an index's manifest without opening the index, e.g.
// to learn whether it is dense before loading a model.
func ReadManifest(dir string) (Manifest, error) {
	dir = filepath.Clean(dir)
	man, err := readManifest(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return man, fmt.Errorf("%w at %s: build one with: dragon index build --dir %s PATHS...", ErrNoIndex, dir, dir)
	}
	if err != nil {
		return man, corrupt(dir, "unreadable manifest", err)
	}
	if man.Version < formatGraphVectors || man.Version > formatVersion {
		return man, corrupt(dir, fmt.Sprintf("format version %d, this build reads %d to %d", man.Version, formatGraphVectors, formatVersion), nil)
	}
	return man, nil
}

// Open opens the index at dir. A missing index gives ErrNoIndex, a
// damaged one ErrCorrupt; both messages say how to rebuild.
func Open(dir string, opts Options) (*Index, error) {
	opts = opts.withDefaults()
	dir = filepath.Clean(dir)
	man, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	if opts.Embedder != nil && man.Dense && embedderID(opts.Embedder) != man.Embedder {
		return nil, fmt.Errorf("%w: index %s was embedded with %q, not %q: use that model or %s",
			ErrEmbedder, dir, man.Embedder, embedderID(opts.Embedder), rebuildHint(dir))
	}
	if opts.Tokenizer != nil && tokenizerID(opts.Tokenizer) != man.Tokenizer {
		opts.Logger.Warn("index was chunked with another tokenizer; new passages will not align with the old ones",
			"dir", dir, "index", man.Tokenizer, "given", tokenizerID(opts.Tokenizer))
	}
	opts.Chunk = ChunkOptions{Tokens: man.ChunkTokens, Overlap: man.Overlap}
	ix := &Index{dir: dir, opts: opts, log: opts.Logger, man: man, bySource: map[string][]uint64{},
		pending: map[uint64]struct{}{}, exclude: []string{dir}}
	if err := ix.load(); err != nil {
		if ix.bm25 != nil {
			ix.bm25.close()
		}
		ix.journal.close()
		return nil, err
	}
	return ix, nil
}

// load reads the snapshot the manifest names, checks that its files agree
// with it, replays the journal's later changes and brings bleve up to
// them.
func (ix *Index) load() error {
	dir, man := ix.dir, ix.man
	var err error
	if ix.passages, err = readPassages(filepath.Join(dir, man.file(passagesFile))); err != nil {
		return corrupt(dir, "unreadable passages", err)
	}
	if len(ix.passages) != man.Passages {
		return corrupt(dir, fmt.Sprintf("%d passages on disk, manifest says %d", len(ix.passages), man.Passages), nil)
	}
	for id, p := range ix.passages {
		ix.bySource[p.Source] = append(ix.bySource[p.Source], id)
		ix.terms += int64(p.terms)
		p.readDate()
	}
	if ix.files, err = readFiles(filepath.Join(dir, man.file(filesFile))); err != nil {
		return corrupt(dir, "unreadable file list", err)
	}
	if man.Dense {
		if err := ix.loadDense(); err != nil {
			return err
		}
	}
	j, changes, err := openJournal(dir, man.JournalSeq, ix.opts.ReadOnly)
	if err != nil {
		return corrupt(dir, "unreadable journal", err)
	}
	ix.journal = j
	var add []*Passage
	var del []uint64
	for _, c := range changes {
		ix.applyLocked(c)
		del = append(del, c.Remove...)
		for _, r := range c.Add {
			add = append(add, r.Passage)
		}
	}
	if len(changes) > 0 {
		ix.log.Info("replayed the journal", "dir", dir, "changes", len(changes), "added", len(add), "removed", len(del))
	}
	return ix.openBleve(add, del)
}

// openBleve opens the BM25 index and applies the journal's replayed
// changes to it, which it may hold already: both are idempotent. Should it
// still disagree with the passages (a crash inside a checkpoint of the
// fixed-name formats), it is rebuilt from them.
func (ix *Index) openBleve(add []*Passage, del []uint64) error {
	dir := ix.dir
	bdir := filepath.Join(dir, bleveDir)
	if _, err := os.Stat(filepath.Join(bdir, "index_meta.json")); err != nil {
		return corrupt(dir, "missing bleve index", err)
	}
	var err error
	if ix.bm25, err = openBM25(bdir, ix.opts.ReadOnly); err != nil {
		if strings.Contains(err.Error(), "timeout") {
			return fmt.Errorf("open %s: %w: a running device or cloud daemon is its only writer, so add and remove documents through it (dragon docs add|ls|rm --device ADDR), or stop it first", dir, ErrInUse)
		}
		return corrupt(dir, "unreadable bleve index", err)
	}
	if !ix.opts.ReadOnly && (len(add) > 0 || len(del) > 0) {
		live := slices.DeleteFunc(add, func(p *Passage) bool { return ix.passages[p.ID] != p })
		if err := ix.bm25.apply(live, del); err != nil {
			return corrupt(dir, "bleve index", err)
		}
	}
	n, err := ix.bm25.count()
	if err != nil {
		return corrupt(dir, "bleve index", err)
	}
	if int(n) == len(ix.passages) {
		return nil
	}
	if ix.opts.ReadOnly {
		return corrupt(dir, fmt.Sprintf("bleve holds %d passages, the index %d (opening it for writing repairs it)", n, len(ix.passages)), nil)
	}
	ix.log.Warn("the BM25 index disagrees with the passages; rebuilding it", "dir", dir, "bleve", n, "passages", len(ix.passages))
	ix.bm25.close()
	ix.bm25 = nil
	if err := os.RemoveAll(bdir); err != nil {
		return fmt.Errorf("rebuild bleve index: %w", err)
	}
	if ix.bm25, err = createBM25(bdir); err != nil {
		return err
	}
	all := make([]*Passage, 0, len(ix.passages))
	for _, id := range slices.Sorted(maps.Keys(ix.passages)) {
		all = append(all, ix.passages[id])
	}
	if err := ix.bm25.apply(all, nil); err != nil {
		return fmt.Errorf("rebuild bleve index: %w", err)
	}
	return nil
}

// loadDense reads the vectors: from their own file, or from the graph
// file of an index that kept an HNSW graph (format 1, and format 3 past
// the old exact-search size), which the next checkpoint replaces by a
// vectors file. Passages without a vector are pending from format 3 on;
// before, every passage had one.
func (ix *Index) loadDense() error {
	dir, man := ix.dir, ix.man
	if man.GraphNodes > 0 || man.Version == formatGraphVectors {
		if err := ix.loadGraph(); err != nil {
			return err
		}
	} else if err := ix.loadVectors(); err != nil {
		return err
	}
	for id := range ix.passages {
		if ix.vecs.has(id) {
			continue
		}
		if man.Version < formatVersion {
			return corrupt(dir, fmt.Sprintf("passage %d has no dense vector", id), nil)
		}
		ix.pending[id] = struct{}{}
	}
	return nil
}

// loadVectors opens the vectors file and checks it against the passages.
func (ix *Index) loadVectors() error {
	dir, man := ix.dir, ix.man
	vs, err := openVectorStore(filepath.Join(dir, man.file(vectorsFile)), func(id uint64) bool { return ix.passages[id] != nil })
	if err != nil {
		return corrupt(dir, "unreadable dense vectors", err)
	}
	ix.vecs = vs
	if man.Version < formatVersion && vs.Len() != man.Passages {
		return corrupt(dir, fmt.Sprintf("%d dense vectors on disk, manifest says %d passages", vs.Len(), man.Passages), nil)
	}
	if vs.Len() > 0 && vs.dims != man.Dims {
		return corrupt(dir, fmt.Sprintf("dense vectors have %d dimensions, manifest says %d", vs.dims, man.Dims), nil)
	}
	return nil
}

// loadGraph reads the vectors from an old index's graph file into memory.
func (ix *Index) loadGraph() error {
	dir, man := ix.dir, ix.man
	g, err := readGraph(filepath.Join(dir, man.file(graphFile)))
	if err != nil {
		return corrupt(dir, "unreadable dense graph", err)
	}
	if g.Len() != man.GraphNodes {
		return corrupt(dir, fmt.Sprintf("dense graph holds %d vectors, manifest says %d", g.Len(), man.GraphNodes), nil)
	}
	if g.Len() > 0 && g.Dims() != man.Dims {
		return corrupt(dir, fmt.Sprintf("dense graph has %d dimensions, manifest says %d", g.Dims(), man.Dims), nil)
	}
	ix.vecs = newVectorStore(man.Dims)
	for id := range ix.passages {
		if v, ok := g.Lookup(id); ok {
			ix.vecs.set(id, v)
		}
	}
	ix.dirty = true
	return nil
}

// persist checkpoints the index: it writes a snapshot of the next
// generation (the vectors, the passages, the file list), then the manifest that names it, which is the
// commit point, then empties the journal the snapshot now holds and
// removes the older generation's files. A crash at any point leaves one
// whole snapshot and the journal of what it lacks. Callers hold wmu.
func (ix *Index) persist() error {
	if ix.opts.ReadOnly {
		return ErrReadOnly
	}
	ix.mu.RLock()
	man := ix.man
	ix.mu.RUnlock()
	man.Version = formatVersion
	man.Passages = len(ix.passages)
	man.Sources = len(ix.bySource)
	man.Files = len(ix.files)
	man.Generation++
	man.Updated = time.Now().UTC()
	man.GraphNodes = 0
	man.JournalSeq = ix.journal.seq
	var vecs *vectorStore
	if ix.vecs != nil {
		var err error
		if vecs, err = ix.vecs.write(filepath.Join(ix.dir, man.file(vectorsFile))); err != nil {
			return fmt.Errorf("write dense vectors: %w", err)
		}
	}
	// Until the manifest names it, the new vectors file is not the
	// snapshot's; searches keep reading the old one.
	committed := false
	defer func() {
		if !committed && vecs != nil {
			vecs.close()
		}
	}()
	if err := writePassages(filepath.Join(ix.dir, man.file(passagesFile)), ix.passages); err != nil {
		return fmt.Errorf("write passages: %w", err)
	}
	if err := writeJSON(filepath.Join(ix.dir, man.file(filesFile)), ix.files); err != nil {
		return fmt.Errorf("write file list: %w", err)
	}
	if err := syncDir(ix.dir); err != nil {
		return fmt.Errorf("sync %s: %w", ix.dir, err)
	}
	if err := writeJSON(filepath.Join(ix.dir, manifestFile), man); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	if err := syncDir(ix.dir); err != nil {
		return fmt.Errorf("sync %s: %w", ix.dir, err)
	}
	ix.mu.Lock()
	ix.man = man
	ix.dirty = false
	if vecs != nil {
		old := ix.vecs
		ix.vecs, committed = vecs, true
		if err := old.close(); err != nil {
			ix.log.Warn("could not close the old vectors file", "dir", ix.dir, "err", err)
		}
	}
	ix.mu.Unlock()
	// Open replays only the changes after JournalSeq, so failing from here
	// on does no harm.
	if err := ix.journal.reset(); err != nil {
		ix.log.Warn("could not empty the journal after a checkpoint", "dir", ix.dir, "err", err)
	}
	ix.removeStale(man)
	return nil
}

// removeStale removes the snapshot files of other generations than man's.
func (ix *Index) removeStale(man Manifest) {
	keep := map[string]bool{}
	for _, base := range []string{passagesFile, filesFile, vectorsFile, graphFile} {
		keep[man.file(base)] = true
	}
	entries, err := os.ReadDir(ix.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if name := e.Name(); snapshotFile(name) && !keep[name] {
			if err := os.Remove(filepath.Join(ix.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				ix.log.Warn("could not remove an old snapshot file", "file", name, "dir", ix.dir, "err", err)
			}
		}
	}
}

// Stats describe an index.
type Stats struct {
	Dir        string   `json:"dir"`
	Manifest   Manifest `json:"manifest"`
	Tokens     int      `json:"tokens"`     // in all passages
	Tombstones int      `json:"tombstones"` // deleted vectors still in the vectors file
	DiskBytes  int64    `json:"disk_bytes"` // size of the directory
}

// Stats returns the index's counts.
func (ix *Index) Stats() Stats {
	ix.mu.RLock()
	s := Stats{Dir: ix.dir, Manifest: ix.man}
	for _, p := range ix.passages {
		s.Tokens += p.Tokens
	}
	if ix.vecs != nil {
		s.Tombstones = ix.vecs.tombstones()
	}
	ix.mu.RUnlock()
	s.DiskBytes = dirSize(ix.dir)
	return s
}

// Sources lists the indexed sources.
func (ix *Index) Sources() []string {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make([]string, 0, len(ix.bySource))
	for s := range ix.bySource {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// Dir is the index directory.
func (ix *Index) Dir() string { return ix.dir }

// Close releases the index. Searches after Close fail with ErrClosed.
func (ix *Index) Close() error {
	ix.wmu.Lock()
	defer ix.wmu.Unlock()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.closed {
		return nil
	}
	dirty := ix.dirty || (ix.journal != nil && ix.journal.size > 0)
	ix.mu.Unlock()
	// A checkpoint now spares the next Open the replay; a failed one
	// loses nothing, the journal keeps it all.
	var err error
	if dirty && !ix.opts.ReadOnly {
		if err = ix.persist(); err != nil {
			err = fmt.Errorf("checkpoint %s: %w", ix.dir, err)
		}
	}
	ix.mu.Lock()
	ix.closed = true
	if cerr := ix.bm25.close(); cerr != nil && err == nil {
		err = fmt.Errorf("close bleve index: %w", cerr)
	}
	if cerr := ix.journal.close(); cerr != nil && err == nil {
		err = fmt.Errorf("close journal: %w", cerr)
	}
	if ix.vecs != nil {
		if cerr := ix.vecs.close(); cerr != nil && err == nil {
			err = fmt.Errorf("close dense vectors: %w", cerr)
		}
	}
	return err
}

// Changes counts the changes applied since Open: equal counts mean the
// index's passages, files and vectors are as they were.
func (ix *Index) Changes() uint64 { return ix.changes.Load() }
