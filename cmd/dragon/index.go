package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/retrieval"
	"github.com/dragon-rag/dragon/retrieval/weaviate"
)

func init() { commands = append(commands, newIndexCmd) }

// indexFlags are shared by the index subcommands.
type indexFlags struct {
	dir, model           string
	threads              int
	chunkTokens, overlap int
	dense                bool
	quiet                bool
	maxErrors            int
	// remote is build's and add's --retrieval: a collection to stream
	// passages into instead of an index folder.
	remote string
	layout weaviate.Layout
	batch  int
}

func newIndexCmd() *cobra.Command {
	var fl indexFlags
	cmd := &cobra.Command{
		Use:   "index",
		Short: "Build and maintain a retrieval index (BM25 + dense) over files, mail and mbox folders",
		Long: `An index directory holds the passages of text, Markdown, mail (.eml) and mbox
(with their attachments), PDF (its text layer, with page numbers), HTML (the
visible text) and DOCX files, cut into passages of --chunk-tokens model tokens, a BM25 index and, with
--dense, embeddings (on disk, with one bit a dimension in memory): from the sentence-embedding model
(--embed-model, all-MiniLM-L6-v2 by default), or with --embed-model chat from
the chat model's own hidden states (prompt-pooled; far slower, and not
trained for retrieval).`,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&fl.dir, "dir", "", "index directory (required)")
	pf.StringVar(&fl.model, "model", defaultModel(), "GGUF chat model: its tokenizer cuts passages")
	pf.IntVar(&fl.threads, "threads", 2, "compute threads for embedding")
	pf.BoolVarP(&fl.quiet, "quiet", "q", false, "no progress bar")
	pf.IntVar(&fl.maxErrors, "max-errors", 20, "skipped files to list (all are counted)")

	build := &cobra.Command{
		Use:   "build --dir DIR [flags] PATHS...",
		Short: "Build a new index from files and folders, replacing any index in DIR once done",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runIndexWrite(cmd.Context(), cmd.OutOrStdout(), fl, args, true)
		},
	}
	build.Flags().IntVar(&fl.chunkTokens, "chunk-tokens", retrieval.DefaultChunkTokens, "tokens per passage")
	build.Flags().IntVar(&fl.overlap, "overlap", retrieval.DefaultOverlap, "tokens shared by consecutive passages")
	build.Flags().BoolVar(&fl.dense, "dense", true, "also embed passages for dense and hybrid search")

	add := &cobra.Command{
		Use:   "add --dir DIR PATHS...",
		Short: "Add files and folders to an index; unchanged files are skipped, changed ones replaced",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runIndexWrite(cmd.Context(), cmd.OutOrStdout(), fl, args, false)
		},
	}

	for _, c := range []*cobra.Command{build, add} {
		f := c.Flags()
		f.StringVar(&fl.remote, "retrieval", "", "stream passages into a Weaviate collection instead of --dir: weaviate://HOST:PORT/COLLECTION or weaviate+https://... (API key in $DRAGON_WEAVIATE_API_KEY); resumable, idempotent")
		f.IntVar(&fl.batch, "batch", 128, "with --retrieval: passages per request")
		layoutFlags(f, &fl.layout, "with --retrieval: ")
	}
	add.Flags().IntVar(&fl.chunkTokens, "chunk-tokens", retrieval.DefaultChunkTokens, "with --retrieval: tokens per passage (the collection's)")
	add.Flags().IntVar(&fl.overlap, "overlap", retrieval.DefaultOverlap, "with --retrieval: tokens shared by consecutive passages")

	del := &cobra.Command{
		Use:   "delete --dir DIR|--retrieval URL SOURCES...",
		Short: "Remove files, mbox messages (path#N), mboxes or folders from an index",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if fl.remote != "" {
				return deleteRemote(cmd, fl, args)
			}
			ix, err := retrieval.Open(fl.dir, retrieval.Options{})
			if err != nil {
				return err
			}
			defer ix.Close()
			var missing []string
			for _, src := range args {
				n, err := ix.Delete(src)
				if errors.Is(err, retrieval.ErrNotIndexed) {
					missing = append(missing, src)
					continue
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "deleted %s: %d passages\n", src, n)
			}
			if len(missing) > 0 {
				return fmt.Errorf("not in index %s: %s", fl.dir, strings.Join(missing, ", "))
			}
			return nil
		},
	}

	del.Flags().StringVar(&fl.remote, "retrieval", "", "delete from a Weaviate collection instead of --dir: weaviate://HOST:PORT/COLLECTION")

	var asJSON bool
	stats := &cobra.Command{
		Use:   "stats --dir DIR",
		Short: "Show an index's counts and settings",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ix, err := retrieval.Open(fl.dir, retrieval.Options{ReadOnly: true})
			if err != nil {
				return err
			}
			defer ix.Close()
			return printStats(cmd.OutOrStdout(), ix.Stats(), asJSON)
		},
	}
	stats.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	cmd.AddCommand(build, add, del, stats, newIndexSearchCmd(&fl))
	cmd.AddCommand(newIndexWarmCmd(&fl), newIndexPushCmd(&fl))
	for _, c := range cmd.Commands() {
		run := c.RunE
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if fl.dir == "" && fl.remote == "" {
				return fmt.Errorf(`required flag "dir" not set`)
			}
			return run(cmd, args)
		}
	}
	cmd.AddCommand(newIndexSynthCmd(&fl)) // writes no index: needs no --dir
	return cmd
}

func newIndexSearchCmd(fl *indexFlags) *cobra.Command {
	var (
		k        int
		modeName string
	)
	cmd := &cobra.Command{
		Use:   "search --dir DIR [-k 8] [--mode auto|bm25|dense|hybrid] QUERY",
		Short: "Show the passages an index retrieves for a query, with R(d) and the softmax weights",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mode, err := retrieval.ParseMode(modeName)
			if err != nil {
				return err
			}
			man, err := retrieval.ReadManifest(fl.dir)
			if err != nil {
				return err
			}
			opts := retrieval.Options{ReadOnly: true}
			if man.Dense && mode != retrieval.ModeBM25 {
				m, err := llamacpp.Load(fl.model, llamacpp.Options{Threads: fl.threads})
				if err != nil {
					return err
				}
				defer m.Close()
				emb, closeEmb, err := indexEmbedder(man, m, fl.threads)
				if err != nil {
					return err
				}
				defer closeEmb()
				opts.Embedder = emb
			}
			ix, err := retrieval.Open(fl.dir, opts)
			if err != nil {
				return err
			}
			defer ix.Close()
			start := time.Now()
			hits, err := ix.Search(cmd.Context(), strings.Join(args, " "), k, mode)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			w := retrieval.Weights(hits)
			fmt.Fprintf(out, "%d hits in %v, logsumexp(R) = %.3f\n", len(hits), time.Since(start).Round(10*time.Microsecond), retrieval.LogSumExp(hits))
			for i, h := range hits {
				fmt.Fprintf(out, "\n#%d  R=%.3f  w=%.3f  bm25 #%d (%.3f)  dense #%d (cos %.3f)\n   %s [%d:%d]\n   %s\n",
					i+1, h.Score, w[i], h.BM25Rank, h.BM25, h.DenseRank, h.Cosine,
					h.Passage.Source, h.Passage.Start, h.Passage.End, oneLine(h.Passage.Text))
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&k, "k", "k", 8, "passages to return")
	cmd.Flags().StringVar(&modeName, "mode", "auto", "ranker: auto, bm25, dense or hybrid")
	return cmd
}

// runIndexWrite builds (fresh) or adds to an index.
func runIndexWrite(ctx context.Context, out io.Writer, fl indexFlags, paths []string, fresh bool) error {
	if fl.remote != "" {
		return runIndexStream(ctx, out, fl, paths)
	}
	dense := fl.dense
	var man retrieval.Manifest
	if !fresh {
		var err error
		if man, err = retrieval.ReadManifest(fl.dir); err != nil {
			return err
		}
		dense = man.Dense
	}
	m, err := llamacpp.Load(fl.model, llamacpp.Options{Threads: fl.threads})
	if err != nil {
		return err
	}
	defer m.Close()
	bar := newProgressBar(os.Stderr, fl.quiet)
	opts := retrieval.Options{
		Chunk:     retrieval.ChunkOptions{Tokens: fl.chunkTokens, Overlap: fl.overlap},
		Tokenizer: m,
		Progress:  bar.update,
	}
	if dense {
		emb, closeEmb, err := newEmbedder(embedModel, m, fl.threads)
		if !fresh {
			emb, closeEmb, err = indexEmbedder(man, m, fl.threads)
		}
		if err != nil {
			return err
		}
		defer closeEmb()
		opts.Embedder = emb
	}
	start := time.Now()
	var (
		ix  *retrieval.Index
		rep retrieval.Report
	)
	if fresh {
		ix, rep, err = retrieval.Build(ctx, fl.dir, opts, paths...)
	} else {
		if ix, err = retrieval.Open(fl.dir, opts); err == nil {
			rep, err = ix.Add(ctx, paths...)
		}
	}
	bar.done()
	printReport(os.Stdout, os.Stderr, rep, time.Since(start), fl.maxErrors)
	if ix != nil {
		s := ix.Stats()
		fmt.Fprintf(os.Stdout, "index %s: %d passages from %d sources (%d files), %s on disk\n",
			s.Dir, s.Manifest.Passages, s.Manifest.Sources, s.Manifest.Files, humanBytes(s.DiskBytes))
		if cerr := ix.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

func printReport(out, errOut io.Writer, rep retrieval.Report, took time.Duration, maxErrors int) {
	fmt.Fprintf(out, "read %d files (%d documents) into %d passages in %v", rep.Files, rep.Documents, rep.Passages, took.Round(time.Millisecond))
	if rep.Removed > 0 {
		fmt.Fprintf(out, ", replacing %d", rep.Removed)
	}
	fmt.Fprintf(out, "; %d unchanged, %d skipped, %d unsupported\n", rep.Unchanged, rep.Skipped, rep.Unsupported)
	for i, e := range rep.Errors {
		if i == maxErrors {
			fmt.Fprintf(errOut, "  ... and %d more skipped\n", len(rep.Errors)-maxErrors)
			break
		}
		fmt.Fprintf(errOut, "  skipped %s\n", e.Error())
	}
}

// printNotStored lists the passages an engine refused, up to max.
func printNotStored(w io.Writer, failed []weaviate.ObjectError, max int) {
	for i, f := range failed {
		if i == max {
			fmt.Fprintf(w, "  ... and %d more not stored\n", len(failed)-i)
			return
		}
		fmt.Fprintf(w, "  not stored: %v\n", f)
	}
}

func printStats(out io.Writer, s retrieval.Stats, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	m := s.Manifest
	fmt.Fprintf(out, "index       %s (format %d, generation %d)\n", s.Dir, m.Version, m.Generation)
	fmt.Fprintf(out, "created     %s, updated %s\n", m.Created.Format(time.RFC3339), m.Updated.Format(time.RFC3339))
	fmt.Fprintf(out, "files       %d\nsources     %d\npassages    %d (%d tokens)\n", m.Files, m.Sources, m.Passages, s.Tokens)
	fmt.Fprintf(out, "chunking    %d tokens, overlap %d\ntokenizer   %s\n", m.ChunkTokens, m.Overlap, m.Tokenizer)
	if m.Dense {
		fmt.Fprintf(out, "dense       %d dimensions (%d deleted, dropped at the next checkpoint)\nembedder    %s\n",
			m.Dims, s.Tombstones, m.Embedder)
	} else {
		fmt.Fprintf(out, "dense       no (BM25 only)\n")
	}
	fmt.Fprintf(out, "disk        %s\n", humanBytes(s.DiskBytes))
	return nil
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if n := 300; len(s) > n {
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n] + "…"
	}
	return s
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// progressBar renders indexing progress on stderr: one redrawn line per
// phase on a terminal, a line every 10% otherwise (logs, CI).
type progressBar struct {
	w     io.Writer
	tty   bool
	quiet bool

	phase   retrieval.Phase
	start   time.Time
	last    time.Time
	lastPct int
	drawn   bool
}

func newProgressBar(w io.Writer, quiet bool) *progressBar {
	tty := false
	if f, ok := w.(*os.File); ok {
		if info, err := f.Stat(); err == nil {
			tty = info.Mode()&os.ModeCharDevice != 0
		}
	}
	return &progressBar{w: w, tty: tty, quiet: quiet}
}

func (b *progressBar) update(p retrieval.Progress) {
	if b.quiet {
		return
	}
	now := time.Now()
	if p.Phase != b.phase {
		b.done()
		b.phase, b.start, b.last, b.lastPct = p.Phase, now, time.Time{}, -1
	}
	pct := 0
	if p.Total > 0 {
		pct = 100 * p.Done / p.Total
	}
	final := p.Total > 0 && p.Done >= p.Total
	if b.tty {
		if !final && now.Sub(b.last) < 100*time.Millisecond {
			return
		}
	} else if !final && pct/10 == b.lastPct/10 {
		return
	}
	b.last, b.lastPct = now, pct
	line := b.render(p, pct, now)
	if b.tty {
		fmt.Fprintf(b.w, "\r%s\x1b[K", line)
		b.drawn = true
	} else {
		fmt.Fprintln(b.w, line)
	}
}

func (b *progressBar) render(p retrieval.Progress, pct int, now time.Time) string {
	if p.Phase == retrieval.PhaseScan {
		return fmt.Sprintf("%-5s found %d files", p.Phase, p.Total)
	}
	const width = 30
	fill := width * pct / 100
	bar := strings.Repeat("=", fill) + strings.Repeat(" ", width-fill)
	line := fmt.Sprintf("%-5s [%s] %d/%d %3d%%", p.Phase, bar, p.Done, p.Total, pct)
	if el := now.Sub(b.start); p.Done > 0 && el > time.Second {
		rate := float64(p.Done) / el.Seconds()
		line += fmt.Sprintf(" %.0f/s", rate)
		if p.Done < p.Total {
			eta := time.Duration(float64(p.Total-p.Done) / rate * float64(time.Second))
			line += " eta " + eta.Round(time.Second).String()
		}
	}
	if p.Item != "" && b.tty {
		line += " " + filepath.Base(p.Item)
	}
	return line
}

// done ends the current line.
func (b *progressBar) done() {
	if b.drawn {
		fmt.Fprintln(b.w)
		b.drawn = false
	}
}

// runIndexStream streams files' passages into a remote collection.
func runIndexStream(ctx context.Context, out io.Writer, fl indexFlags, paths []string) error {
	if fl.dir != "" {
		return fmt.Errorf("give --dir or --retrieval, not both")
	}
	store, err := weaviate.Open(fl.remote)
	if err != nil {
		return err
	}
	defer store.Close()
	m, err := llamacpp.Load(fl.model, llamacpp.Options{Threads: fl.threads})
	if err != nil {
		return err
	}
	defer m.Close()
	opts := retrieval.StreamOptions{
		Tokenizer: m, Chunk: retrieval.ChunkOptions{Tokens: fl.chunkTokens, Overlap: fl.overlap}, Batch: fl.batch,
		Layout: fl.layout,
	}
	if spec, err := store.Spec(ctx); err == nil {
		// An existing collection is filled as it was made.
		opts.Chunk = retrieval.ChunkOptions{Tokens: spec.ChunkTokens, Overlap: spec.Overlap}
		if spec.Embedder != "" {
			emb, closeEmb, err := indexEmbedder(retrieval.Manifest{Embedder: spec.Embedder}, m, fl.threads)
			if err != nil {
				return err
			}
			defer closeEmb()
			opts.Embedder = emb
		}
	} else if !errors.Is(err, weaviate.ErrNoCollection) {
		return err
	} else if fl.dense {
		emb, closeEmb, err := newEmbedder(embedModel, m, fl.threads)
		if err != nil {
			return err
		}
		defer closeEmb()
		opts.Embedder = emb
	}
	bar := newProgressBar(os.Stderr, fl.quiet)
	opts.Progress = bar.update
	start := time.Now()
	rep, err := retrieval.Stream(ctx, store, opts, paths...)
	bar.done()
	printReport(out, os.Stderr, rep.Report, time.Since(start), fl.maxErrors)
	printNotStored(os.Stderr, rep.Failed, fl.maxErrors)
	if err != nil {
		return fmt.Errorf("%w (run the same command again to resume)", err)
	}
	n, err := store.Count(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s: %d passages stored, %d already there, %d refused; the collection holds %d\n",
		store, rep.Passages, rep.Present, len(rep.Failed), n)
	if len(rep.Failed) > 0 {
		return fmt.Errorf("%d passages not stored", len(rep.Failed))
	}
	return nil
}

// deleteRemote removes sources (as absolute paths, like the local index's
// Delete) from a remote collection.
func deleteRemote(cmd *cobra.Command, fl indexFlags, sources []string) error {
	store, err := weaviate.Open(fl.remote)
	if err != nil {
		return err
	}
	defer store.Close()
	for _, src := range sources {
		abs, err := filepath.Abs(src)
		if err != nil {
			return err
		}
		n, err := store.DeleteUnder(cmd.Context(), abs)
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "deleted %s: %d passages\n", abs, n)
	}
	return retrieval.RefreshTermStats(cmd.Context(), store, nil)
}

// layoutFlags binds the flags that place and tune a new Weaviate
// collection (and tune an existing one's vector index) to l, each help
// text led by prefix.
func layoutFlags(f *pflag.FlagSet, l *weaviate.Layout, prefix string) {
	f.IntVar(&l.Shards, "shards", 1, prefix+"shards of a new collection")
	f.IntVar(&l.Replicas, "replicas", 1, prefix+"replicas of each shard of a new collection (2 survive losing a node)")
	f.IntVar(&l.SearchEf, "search-ef", 0, prefix+"the collection's query-time HNSW candidate list (0: 256 for a new collection, an existing one's kept); longer finds more true nearest vectors, slower")
	f.IntVar(&l.GraphConnections, "graph-connections", 0, prefix+"the HNSW graph of a new collection: links per node (0: 32); more find more true nearest vectors at a given search ef, for a slower ingest")
	f.IntVar(&l.GraphEfConstruction, "graph-ef-construction", 0, prefix+"the HNSW graph of a new collection: candidate list while linking (0: 128); longer builds a better graph, for a slower ingest")
	f.StringVar(&l.Quantizer, "quantizer", "", prefix+"the collection's vector quantizer: empty for float32 vectors (an existing collection keeps its own) or rq (8-bit rotational quantization: about 30% less engine memory at 10^6 passages, searches no faster there; cannot be turned off)")
}
