package retrieval

import (
	"context"
	"errors"
	"fmt"

	"github.com/dragon-rag/dragon/retrieval/weaviate"
)

// StreamOptions configure Stream.
type StreamOptions struct {
	// Tokenizer cuts passages (required); its fingerprint is recorded with
	// a new collection.
	Tokenizer Tokenizer
	// Embedder makes a new collection dense; an existing dense one needs
	// the same embedder.
	Embedder Embedder
	Chunk    ChunkOptions
	// Batch is how many passages go to the engine per request (default 128):
	// with one file's passages, all the memory a run holds.
	Batch int
	// Layout places a new collection.
	Layout weaviate.Layout
	// Progress, if set, is called after each file (PhaseIndex, in files).
	Progress func(Progress)
}

// StreamReport is what a Stream run did: Passages counts those written.
type StreamReport struct {
	Report
	// Present counts passages found already stored (a resumed run skips
	// them without embedding them again).
	Present int
	// Failed are the passages the engine refused; the rest are stored.
	Failed []weaviate.ObjectError
}

// Stream reads, chunks, embeds and writes files' passages into a
// collection batch by batch, holding at most one batch and one file's
// passages in memory. Passages are keyed by source and span (RemotePID):
// running it again after a kill skips what is stored, without embedding
// it again, and never writes a passage twice. It ends by counting the
// collection's BM25 statistics (RefreshTermStats).
func Stream(ctx context.Context, store *weaviate.Client, o StreamOptions, paths ...string) (StreamReport, error) {
	var rep StreamReport
	if o.Tokenizer == nil {
		return rep, errors.New("retrieval: streaming files needs a tokenizer")
	}
	o.Chunk = o.Chunk.withDefaults()
	if err := o.Chunk.validate(); err != nil {
		return rep, err
	}
	if o.Batch <= 0 {
		o.Batch = 128
	}
	man := Manifest{ChunkTokens: o.Chunk.Tokens, Overlap: o.Chunk.Overlap, Tokenizer: tokenizerID(o.Tokenizer)}
	if o.Embedder != nil {
		vs, err := o.Embedder.Embed(ctx, []string{"dimension probe"})
		if err != nil {
			return rep, fmt.Errorf("embedder: %w", err)
		}
		man.Embedder, man.Dims = embedderID(o.Embedder), len(vs[0])
	}
	if err := store.EnsureCollection(ctx, remoteSpec(man), o.Layout); err != nil {
		return rep, err
	}
	files, werrs := walk(paths, nil)
	for _, e := range werrs {
		rep.skip(e.Path, e.Err)
	}
	var batch []*Passage
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		defer func() { batch = batch[:0] }()
		pids := make([]uint64, len(batch))
		for i, p := range batch {
			pids[i] = RemotePID(*p)
		}
		have, err := store.Existing(ctx, pids)
		if err != nil {
			return err
		}
		var todo []*Passage
		for i, p := range batch {
			if have[pids[i]] {
				rep.Present++
			} else {
				todo = append(todo, p)
			}
		}
		if len(todo) == 0 {
			return nil
		}
		objs := make([]weaviate.Object, len(todo))
		texts := make([]string, len(todo))
		for i, p := range todo {
			objs[i] = weaviate.Object{PID: RemotePID(*p), Source: p.Source, Start: p.Start, End: p.End, Tokens: p.Tokens, Text: p.Text, Meta: p.Meta, Terms: Terms(p.Text)}
			texts[i] = p.Text
		}
		if o.Embedder != nil {
			vs, err := o.Embedder.Embed(ctx, texts)
			if err != nil {
				return fmt.Errorf("embed: %w", err)
			}
			for i, v := range vs {
				if objs[i].Vector, err = unit(v); err != nil {
					return fmt.Errorf("embed %s: %w", todo[i].Source, err)
				}
			}
		}
		failed, err := store.Upsert(ctx, objs)
		if err != nil {
			return err
		}
		rep.Failed = append(rep.Failed, failed...)
		rep.Passages += len(objs) - len(failed)
		return nil
	}
	for i, path := range files {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		ps, ok := readStreamFile(path, o, &rep)
		if ok {
			// What an earlier version of the file left goes first: the
			// passages kept are written (or found) below.
			keep := make([]uint64, len(ps))
			messages := false
			for j, p := range ps {
				keep[j] = RemotePID(*p)
				messages = messages || p.Source != path
			}
			n, err := store.DeleteStale(ctx, path, messages, keep)
			if err != nil {
				return rep, fmt.Errorf("write to %s: drop what %s held before: %w", store, path, err)
			}
			rep.Removed += n
		}
		for _, p := range ps {
			batch = append(batch, p)
			if len(batch) == o.Batch {
				if err := flush(); err != nil {
					return rep, fmt.Errorf("write to %s: %w", store, err)
				}
			}
		}
		if ok {
			rep.Files++
		}
		if i == len(files)-1 {
			if err := flush(); err != nil {
				return rep, fmt.Errorf("write to %s: %w", store, err)
			}
		}
		if o.Progress != nil {
			o.Progress(Progress{Phase: PhaseIndex, Done: i + 1, Total: len(files), Item: path})
		}
	}
	if err := RefreshTermStats(ctx, store, o.Progress); err != nil {
		return rep, err
	}
	return rep, nil
}

// RefreshTermStats counts a collection's BM25 statistics again if no
// valid count is stored (every write removes it), so that searches need
// not count the passages of their terms live. Progress, if set, is called
// per page (PhaseStats, in passages).
func RefreshTermStats(ctx context.Context, store *weaviate.Client, progress func(Progress)) error {
	gen, err := store.TermStatsGeneration(ctx)
	if err == nil && gen != "" {
		return nil
	}
	total := 0
	if err == nil {
		total, err = store.Count(ctx)
	}
	if err == nil {
		_, err = store.RebuildTermStats(ctx, func(n int) {
			if progress != nil {
				progress(Progress{Phase: PhaseStats, Done: n, Total: total})
			}
		})
	}
	if err != nil {
		return fmt.Errorf("%s: term statistics: %w", store, err)
	}
	return nil
}

// readStreamFile reads and chunks one file (every document in it).
func readStreamFile(path string, o StreamOptions, rep *StreamReport) ([]*Passage, bool) {
	docs, derrs, err := readDocuments(path)
	if errors.Is(err, errUnsupported) {
		rep.Unsupported++
		return nil, false
	}
	if err != nil {
		rep.skip(path, err)
		return nil, false
	}
	for _, e := range derrs {
		rep.skip(e.Path, e.Err)
	}
	_, ps := chunkDocuments(o.Tokenizer, o.Chunk, docs, &rep.Report)
	return ps, true
}
