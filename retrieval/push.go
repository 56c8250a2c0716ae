package retrieval

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"

	"github.com/dragon-rag/dragon/retrieval/weaviate"
)

// RemotePID is a passage's id in a remote collection: a hash of its
// source, span and text, so that writing the same passage again, from this
// index or a rebuilt one, replaces it instead of adding a copy, and a
// changed file's passages are new ones (DeleteStale then drops the old).
func RemotePID(p Passage) uint64 {
	h := fnv.New64a()
	h.Write([]byte(p.Source))
	h.Write([]byte{0})
	h.Write(strconv.AppendInt(nil, int64(p.Start), 10))
	h.Write([]byte{0})
	h.Write(strconv.AppendInt(nil, int64(p.End), 10))
	h.Write([]byte{0})
	h.Write([]byte(p.Text))
	return h.Sum64()
}

// remoteSpec is what a collection of passages chunked, tokenized and
// embedded as man says is made for; its terms are analyzed by Terms.
func remoteSpec(man Manifest) weaviate.Spec {
	return weaviate.Spec{
		Embedder: man.Embedder, Dims: man.Dims, ChunkTokens: man.ChunkTokens, Overlap: man.Overlap,
		Tokenizer: man.Tokenizer, Analyzer: AnalyzerName,
	}
}

// Push copies the index's passages, their analyzed terms and vectors into
// a collection (created for the index's spec if absent), batch passages
// per request, reporting progress (PhaseIndex, in passages) after each.
// It is idempotent: passages already there are replaced, and what earlier
// versions of the index's files left there is removed. Objects the engine
// refuses are returned; the rest are stored.
func Push(ctx context.Context, ix *Index, store *weaviate.Client, layout weaviate.Layout, batch int, progress func(Progress)) ([]weaviate.ObjectError, error) {
	if batch <= 0 {
		batch = 256
	}
	ix.mu.RLock()
	man := ix.man
	ps := make([]*Passage, 0, len(ix.passages))
	for _, p := range ix.passages {
		ps = append(ps, p)
	}
	files := make(map[string]*fileRecord, len(ix.files))
	for path, f := range ix.files {
		files[path] = f
	}
	ix.mu.RUnlock()
	slices.SortFunc(ps, func(a, b *Passage) int { return cmp.Compare(a.ID, b.ID) })
	if err := store.EnsureCollection(ctx, remoteSpec(man), layout); err != nil {
		return nil, err
	}
	var failed []weaviate.ObjectError
	objs := make([]weaviate.Object, 0, batch)
	for i, p := range ps {
		o := weaviate.Object{
			PID: RemotePID(*p), Source: p.Source, Start: p.Start, End: p.End, Tokens: p.Tokens,
			Text: p.Text, Meta: p.Meta, Terms: Terms(p.Text),
		}
		if man.Dense {
			ix.mu.RLock()
			v, err := ix.vecs.vector(p.ID)
			ix.mu.RUnlock()
			if err != nil {
				return failed, fmt.Errorf("push %s: %w", ix.dir, err)
			}
			if o.Vector = v; v == nil {
				return failed, fmt.Errorf("push %s: passage %d has no vector", ix.dir, p.ID)
			}
		}
		objs = append(objs, o)
		if len(objs) == batch || i == len(ps)-1 {
			f, err := store.Upsert(ctx, objs)
			failed = append(failed, f...)
			if err != nil {
				return failed, fmt.Errorf("push %s to %s: %w", ix.dir, store, err)
			}
			objs = objs[:0]
			if progress != nil {
				progress(Progress{Phase: PhaseIndex, Done: i + 1, Total: len(ps)})
			}
		}
	}
	// Only once every current passage is stored: a push cut short never
	// leaves a file with fewer passages than before.
	bySource := map[string][]uint64{}
	for _, p := range ps {
		bySource[p.Source] = append(bySource[p.Source], RemotePID(*p))
	}
	for path, f := range files {
		var keep []uint64
		messages := false
		for _, src := range f.Sources {
			keep = append(keep, bySource[src]...)
			messages = messages || src != path
		}
		if _, err := store.DeleteStale(ctx, path, messages, keep); err != nil {
			return failed, fmt.Errorf("push %s to %s: drop what %s held before: %w", ix.dir, store, path, err)
		}
	}
	return failed, RefreshTermStats(ctx, store, progress)
}
