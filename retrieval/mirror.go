package retrieval

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/dragon-rag/dragon/internal/atomicfile"
	"github.com/dragon-rag/dragon/retrieval/weaviate"
)

// Mirror keeps a remote collection holding what a local index holds, file
// by file: the cloud's document API writes into its own index, whose
// journal makes an acknowledged add durable at once, and the mirror then
// writes each file's passages (with their vectors) into the collection
// the cloud searches, and drops what deleted or replaced files left there.
//
// What the collection holds of each file is remembered in a state file
// in the index's folder, written after the collection: a crash in
// between only makes the next round write the same passages again (they
// are keyed by RemotePID, so nothing is doubled). Files the index never
// had are left alone, so a collection streamed from a corpus keeps its
// passages; a file added under a name the collection already holds
// replaces its passages.
type Mirror struct {
	ix    *Index
	store *weaviate.Client
	path  string
	log   *slog.Logger
	// Batch is how many passages go to the engine per request.
	batch int

	mu sync.Mutex
	// written is what the collection holds of each file, by its key.
	written map[string]mirrorFileState
	seen    uint64 // ix.Changes() at the last round that found nothing to do
	// stale: the collection changed since its term statistics were
	// counted.
	stale bool
}

// mirrorState is the state file.
type mirrorState struct {
	// Collection names the collection the state describes: a state of
	// another one is ignored.
	Collection string                     `json:"collection"`
	Files      map[string]mirrorFileState `json:"files"`
}

// mirrorFileState is what the collection holds of one file: the
// fingerprint of its passages (mirrorPrint) and their sources, which a
// later version or a delete must clear.
type mirrorFileState struct {
	Print   uint64   `json:"print,string"`
	Sources []string `json:"sources"`
}

// mirrorFile names the state file of a collection in an index's folder.
func mirrorFile(ix *Index, store *weaviate.Client) string {
	h := fnv.New32a()
	h.Write([]byte(store.String()))
	return filepath.Join(ix.dir, "mirror-"+strconv.FormatUint(uint64(h.Sum32()), 16)+".json")
}

// NewMirror checks that the collection is made for the index's passages
// (chunking, tokenizer, embedder: it is created if absent) and reads what
// earlier runs wrote into it.
func NewMirror(ctx context.Context, ix *Index, store *weaviate.Client, log *slog.Logger) (*Mirror, error) {
	if ix.opts.ReadOnly {
		return nil, fmt.Errorf("mirror %s: %w", ix.dir, ErrReadOnly)
	}
	if log == nil {
		log = slog.Default()
	}
	ix.mu.RLock()
	man := ix.man
	ix.mu.RUnlock()
	if man.Dense && ix.opts.Embedder == nil {
		return nil, fmt.Errorf("mirror %s: a dense index needs its embedder", ix.dir)
	}
	if man.Dense && man.Dims == 0 {
		// An index of no passages yet: its vectors' size is the embedder's.
		vs, err := ix.opts.Embedder.Embed(ctx, []string{"dimension probe"})
		if err != nil {
			return nil, fmt.Errorf("mirror %s: embedder: %w", ix.dir, err)
		}
		man.Dims = len(vs[0])
	}
	if err := store.EnsureCollection(ctx, remoteSpec(man), weaviate.Layout{}); err != nil {
		return nil, fmt.Errorf("mirror %s into %s: %w", ix.dir, store, err)
	}
	// seen matches no count: the first round compares the index with the
	// collection whatever the index's count (a checkpointed index reopens
	// at 0 with files the collection may not have yet).
	m := &Mirror{ix: ix, store: store, path: mirrorFile(ix, store), log: log, batch: 128, written: map[string]mirrorFileState{}, seen: math.MaxUint64}
	b, err := os.ReadFile(m.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("mirror %s: %w", ix.dir, err)
	default:
		var st mirrorState
		if err := json.Unmarshal(b, &st); err != nil {
			return nil, fmt.Errorf("mirror %s: %s: %w", ix.dir, m.path, err)
		}
		if st.Collection == store.String() && st.Files != nil {
			m.written = st.Files
		}
	}
	return m, nil
}

// Index is the index the mirror writes from.
func (m *Mirror) Index() *Index { return m.ix }

// mirrorPrint fingerprints the passages the collection should hold of a
// file: their RemotePIDs, in order.
func mirrorPrint(pids []uint64) uint64 {
	h := fnv.New64a()
	for _, pid := range pids {
		h.Write(strconv.AppendUint(nil, pid, 16))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

// mirrorTarget is what the collection should hold of one file.
type mirrorTarget struct {
	key     string
	objs    []weaviate.Object
	print   uint64
	sources []string
	// waiting: some passage has no vector yet (a dense collection takes
	// only passages with one).
	waiting bool
}

// prints fingerprints what the index holds, file by file.
func (m *Mirror) prints() map[string]uint64 {
	ix := m.ix
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make(map[string]uint64, len(ix.files))
	var pids []uint64
	for key, rec := range ix.files {
		pids = pids[:0]
		for _, src := range rec.Sources {
			for _, id := range ix.bySource[src] {
				pids = append(pids, RemotePID(*ix.passages[id]))
			}
		}
		slices.Sort(pids)
		out[key] = mirrorPrint(pids)
	}
	return out
}

// target reads what the index holds of one file (false: nothing now).
func (m *Mirror) target(key string) (mirrorTarget, bool, error) {
	ix := m.ix
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	rec, ok := ix.files[key]
	if !ok {
		return mirrorTarget{}, false, nil
	}
	t := mirrorTarget{key: key, sources: slices.Clone(rec.Sources)}
	for _, src := range rec.Sources {
		for _, id := range ix.bySource[src] {
			p := ix.passages[id]
			o := weaviate.Object{
				PID: RemotePID(*p), Source: p.Source, Start: p.Start, End: p.End, Tokens: p.Tokens,
				Text: p.Text, Meta: p.Meta,
			}
			if ix.man.Dense {
				v, err := ix.vecs.vector(id)
				if err != nil {
					return mirrorTarget{}, false, fmt.Errorf("mirror %s: %w", key, err)
				}
				if o.Vector = v; v == nil {
					t.waiting = true
				}
			}
			t.objs = append(t.objs, o)
		}
	}
	slices.SortFunc(t.objs, func(a, b weaviate.Object) int { return cmp.Compare(a.PID, b.PID) })
	pids := make([]uint64, len(t.objs))
	for i, o := range t.objs {
		pids[i] = o.PID
	}
	t.print = mirrorPrint(pids)
	return t, true, nil
}

// MirrorReport is what one Sync round did.
type MirrorReport struct {
	Written, Removed int // files whose passages were written, or dropped
	Passages         int // passages written
	Waiting          int // files waiting for their vectors
	Failed           []weaviate.ObjectError
}

// Sync writes into the collection every file whose passages there differ
// from the index's and drops those the index no longer has. Files still
// waiting for vectors are left for a later round.
func (m *Mirror) Sync(ctx context.Context) (rep MirrorReport, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	// The state is written once a round, even one cut short, with what
	// the collection holds by then; a crash before only makes the next
	// round drop or write the same files again.
	defer func() {
		if rep.Written+rep.Removed > 0 {
			if serr := m.save(); err == nil {
				err = serr
			}
		}
	}()
	seen := m.ix.Changes()
	want := m.prints()
	for _, key := range slices.Sorted(maps.Keys(m.written)) {
		if _, ok := want[key]; ok {
			continue
		}
		if _, err := m.store.DeleteSources(ctx, m.written[key].Sources, nil); err != nil {
			return rep, fmt.Errorf("mirror: drop %s from %s: %w", key, m.store, err)
		}
		delete(m.written, key)
		m.stale = true
		rep.Removed++
	}
	for _, key := range slices.Sorted(maps.Keys(want)) {
		if w, ok := m.written[key]; ok && w.Print == want[key] {
			continue
		}
		t, ok, err := m.target(key)
		if err != nil {
			return rep, err
		}
		if !ok {
			continue // deleted meanwhile: the next round drops it
		}
		if t.waiting {
			rep.Waiting++
			continue
		}
		n, failed, err := m.write(ctx, t)
		rep.Passages += n
		rep.Failed = append(rep.Failed, failed...)
		if err != nil {
			return rep, err
		}
		m.stale = true
		if len(failed) > 0 {
			// Left unrecorded: the next round tries the file again.
			continue
		}
		m.written[key] = mirrorFileState{Print: t.print, Sources: t.sources}
		rep.Written++
	}
	if rep.Waiting == 0 && len(rep.Failed) == 0 {
		m.seen = seen
	}
	return rep, nil
}

// write stores a file's passages, then drops what earlier versions of it
// (or a corpus's file of the same name) left: the file never has fewer
// passages there than before.
func (m *Mirror) write(ctx context.Context, t mirrorTarget) (int, []weaviate.ObjectError, error) {
	var failed []weaviate.ObjectError
	for i := 0; i < len(t.objs); i += m.batch {
		objs := t.objs[i:min(i+m.batch, len(t.objs))]
		for j := range objs {
			objs[j].Terms = Terms(objs[j].Text)
		}
		f, err := m.store.Upsert(ctx, objs)
		failed = append(failed, f...)
		if err != nil {
			return i, failed, fmt.Errorf("mirror: write %s into %s: %w", t.key, m.store, err)
		}
	}
	keep := make([]uint64, len(t.objs))
	for i, o := range t.objs {
		keep[i] = o.PID
	}
	// The key itself: a file that failed has no sources, and may replace
	// a readable version, or a corpus's file of its name.
	old := append(slices.Clone(m.written[t.key].Sources), t.key)
	old = append(old, t.sources...)
	slices.Sort(old)
	if _, err := m.store.DeleteSources(ctx, slices.Compact(old), keep); err != nil {
		return len(t.objs), failed, fmt.Errorf("mirror: drop what %s held before from %s: %w", t.key, m.store, err)
	}
	return len(t.objs), failed, nil
}

func (m *Mirror) save() error {
	st := mirrorState{Collection: m.store.String(), Files: m.written}
	err := atomicfile.Write(m.path, func(w io.Writer) error {
		return json.NewEncoder(w).Encode(st)
	})
	if err != nil {
		return fmt.Errorf("mirror: record what %s holds: %w", m.store, err)
	}
	return nil
}

// Unwritten marks the documents whose passages the collection does not
// hold as the index has them now: their status becomes StatusWriting.
func (m *Mirror) Unwritten(ds []DocInfo) {
	prints := m.prints()
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, d := range ds {
		fp, ok := prints[d.Source]
		if !ok || d.Status == StatusFailed {
			continue
		}
		if w, done := m.written[d.Source]; !done || w.Print != fp {
			ds[i].Status = StatusWriting
		}
	}
}

// Run syncs whenever the index changes (polled every interval), retrying
// after failures, and recounts the collection's term statistics once
// writes have paused, so that searches stop counting them live. It
// returns when ctx ends.
func (m *Mirror) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.mu.Lock()
		idle := m.ix.Changes() == m.seen
		stale := m.stale
		m.mu.Unlock()
		if idle {
			if stale {
				m.refreshStats(ctx)
			}
			continue
		}
		rep, err := m.Sync(ctx)
		if err != nil {
			if ctx.Err() == nil {
				m.log.Warn("writing documents into the collection failed; retrying", "collection", m.store.String(), "err", err)
			}
			continue
		}
		if rep.Written+rep.Removed > 0 || len(rep.Failed) > 0 {
			m.log.Info("documents written into the collection", "collection", m.store.String(),
				"files", rep.Written, "removed", rep.Removed, "passages", rep.Passages, "waiting", rep.Waiting, "refused", len(rep.Failed))
		}
		for _, f := range rep.Failed {
			m.log.Warn("the collection refused a passage", "collection", m.store.String(), "err", f.Error())
		}
	}
}

func (m *Mirror) refreshStats(ctx context.Context) {
	if err := RefreshTermStats(ctx, m.store, nil); err != nil {
		if ctx.Err() == nil {
			m.log.Warn("counting the collection's term statistics failed; searches count them live", "err", err)
		}
		return
	}
	m.mu.Lock()
	m.stale = false
	m.mu.Unlock()
}
