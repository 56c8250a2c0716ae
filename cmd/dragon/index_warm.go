package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/kvcache"
	"github.com/dragon-rag/dragon/retrieval"
)

// warmQuestion is the question each passage is prefilled with. Any
// question does: a later question over the passage restores the entry and
// cuts it back to the prefix they share, which holds the passage's whole
// head (decoder.PassageHead). A short one wastes few bytes per entry.
const warmQuestion = "What?"

// warmOptions configure runIndexWarm.
type warmOptions struct {
	dir, cacheDir, model, queries, system, retrieval string
	threads, ctxPerSeq, k, limit                     int
	budgetMB                                         int64
	quiet                                            bool
	// afterEach, when set, is called after each passage warmed with the
	// count so far (tests interrupt a run with it).
	afterEach func(warmed int)
}

// warmReport counts what a run did with each candidate passage.
type warmReport struct {
	Candidates  int // passages considered (all, or those the questions retrieve)
	Warmed      int // prefilled and cached by this run
	Cached      int // already cached (an earlier run, or a daemon)
	NoFit       int // not warmed: the budget was full at the first of them
	Limited     int // not warmed: --limit was reached at the first of them
	TooLong     int // prompts that do not fit --ctx-per-seq
	Entries     int // entries in the cache directory at the end
	DiskBytes   int64
	Interrupted bool
}

func newIndexWarmCmd(fl *indexFlags) *cobra.Command {
	o := warmOptions{}
	cmd := &cobra.Command{
		Use:   "warm --dir DIR --kv-cache-dir CACHEDIR [--budget-mb N] [--queries FILE]",
		Short: "Precompute the KV of an index's passages into a KV cache folder, so that a daemon with --kv-cache-dir starts warm",
		Long: `Prefills the prompt of each passage of the index (all of them in index
order, or with --queries FILE the passages those questions retrieve, the
most often retrieved first) and stores its KV state in the cache folder a
daemon reads with --kv-cache-dir. A question over a warmed passage then
prefills only the question's tokens.

Entries already in the folder count against --budget-mb (a folder holding
more is first cut down to it, as a daemon does); warming stops at the first
passage whose entry would exceed it. Keep the budget within the daemon's
--kv-cache-disk-mb, or the daemon evicts entries when it starts. A daemon
reads the folder when it starts: warm it before starting the daemon.
Use the daemon's --model and --ctx (as --ctx-per-seq) and, if requests set
one, its system message.

Resumable: a passage whose prompt head is already cached is skipped, so a
run that was interrupted, limited or cut off by the budget continues where
it stopped when run again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.dir, o.model, o.threads, o.quiet = fl.dir, fl.model, fl.threads, fl.quiet
			_, err := runIndexWarm(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.cacheDir, "kv-cache-dir", "", "KV cache folder to fill (the daemon's --kv-cache-dir; required)")
	f.Int64Var(&o.budgetMB, "budget-mb", 1024, "disk budget of the cache folder in MiB, entries already there included")
	f.StringVar(&o.queries, "queries", "", "file of questions, one a line: warm the passages they retrieve, the most often retrieved first")
	f.IntVarP(&o.k, "k", "k", 8, "passages each question of --queries retrieves")
	f.StringVar(&o.retrieval, "retrieval", "auto", "ranker for --queries: auto, bm25, dense or hybrid (the daemons' --retrieval)")
	f.StringVar(&o.system, "system", "", "system message of the prompts (empty: the decoder's default, what the daemons use)")
	f.IntVar(&o.ctxPerSeq, "ctx-per-seq", 1024, "KV positions per passage sequence (the daemon's --ctx): longer prompts are skipped")
	f.IntVar(&o.limit, "limit", 0, "warm at most this many passages in this run (0: no limit)")
	return cmd
}

// validate checks the options before anything is loaded.
func (o warmOptions) validate() error {
	switch {
	case o.dir == "":
		return errors.New("no index: --dir DIR names the index whose passages to warm")
	case o.cacheDir == "":
		return errors.New("no cache folder: --kv-cache-dir CACHEDIR names the folder to fill (the daemon's --kv-cache-dir)")
	case o.budgetMB <= 0:
		return fmt.Errorf("--budget-mb %d: need a budget of at least 1 MiB", o.budgetMB)
	case o.threads < 1:
		return fmt.Errorf("--threads %d: need at least 1", o.threads)
	case o.ctxPerSeq < 64:
		return fmt.Errorf("--ctx-per-seq %d: need at least 64", o.ctxPerSeq)
	case o.queries != "" && o.k < 1:
		return fmt.Errorf("-k %d: need at least 1", o.k)
	case o.limit < 0:
		return fmt.Errorf("--limit %d: need 0 (no limit) or more", o.limit)
	}
	return nil
}

// runIndexWarm warms the cache folder with the index's passages; it prints
// the progress on errOut and the report on out.
func runIndexWarm(ctx context.Context, o warmOptions, out, errOut io.Writer) (warmReport, error) {
	var rep warmReport
	if err := o.validate(); err != nil {
		return rep, err
	}
	mode, err := retrieval.ParseMode(o.retrieval)
	if err != nil {
		return rep, err
	}
	var questions []string
	if o.queries != "" {
		if questions, err = readQuestions(o.queries); err != nil {
			return rep, err
		}
	}
	ns, err := kvNamespace(o.model)
	if err != nil {
		return rep, err
	}
	m, err := llamacpp.Load(o.model, llamacpp.Options{Threads: o.threads})
	if err != nil {
		return rep, err
	}
	defer m.Close()
	cands, err := warmCandidates(ctx, o.dir, m, o.threads, questions, o.k, mode)
	if err != nil {
		return rep, err
	}
	rep.Candidates = len(cands)
	budget := o.budgetMB << 20
	cache, err := kvcache.New(kvcache.Config{Namespace: ns, Dir: o.cacheDir, DiskBytes: budget})
	if err != nil {
		return rep, err
	}
	// The passages are prefilled by a decoder without a cache, and their
	// states stored here, as the decoder stores the prompts it prefills
	// (prompt tokens, the sequence's state): each entry's size is then
	// known before it is stored, so that the budget is kept exactly.
	dec, err := decoder.New(m, decoder.Options{MaxPassages: 1, CtxPerSeq: o.ctxPerSeq, Threads: o.threads, System: o.system})
	if err != nil {
		return rep, err
	}
	defer dec.Close()

	bar := newProgressBar(errOut, o.quiet)
	warmed := func(done int, disk int64) retrieval.Progress {
		return retrieval.Progress{Phase: "warm", Done: done, Total: len(cands), Item: humanBytes(disk)}
	}
	// The passages after the one that stops warming (the budget, --limit)
	// are counted, not looked at: some of them may be cached already, but
	// telling which costs a tokenization each.
	for i, p := range cands {
		bar.update(warmed(i, cache.Stats().DiskBytes))
		if ctx.Err() != nil {
			rep.Interrupted = true
			break
		}
		head, err := dec.PassageHead(p.Text)
		if err != nil {
			return rep, err
		}
		if len(head) >= kvcache.BlockTokens && cache.Has(head) {
			rep.Cached++
			continue
		}
		if o.limit > 0 && rep.Warmed >= o.limit {
			rep.Limited = len(cands) - i
			break
		}
		err = dec.Begin(ctx, warmQuestion, []decoder.Passage{{Text: p.Text, Source: p.Source}}, nil)
		if errors.Is(err, engine.ErrContextFull) {
			rep.TooLong++
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				rep.Interrupted = true
				break
			}
			return rep, fmt.Errorf("passage %d (%s): %w", p.ID, p.Source, err)
		}
		toks := dec.Prompt(0)
		state, err := dec.SeqState(0)
		if err != nil {
			return rep, fmt.Errorf("passage %d (%s): %w", p.ID, p.Source, err)
		}
		if cache.Stats().DiskBytes+entryBytes(ns, len(toks), len(state)) > budget {
			rep.NoFit = len(cands) - i
			break
		}
		cache.Put(toks, state)
		if !cache.Has(head) {
			return rep, fmt.Errorf("passage %d (%s): the cache did not keep its %s entry (a write error? see the log)",
				p.ID, p.Source, humanBytes(int64(len(state))))
		}
		rep.Warmed++
		if o.afterEach != nil {
			o.afterEach(rep.Warmed)
		}
	}
	st := cache.Stats()
	rep.Entries, rep.DiskBytes = st.Entries, st.DiskBytes
	bar.update(warmed(rep.Warmed+rep.Cached+rep.TooLong, st.DiskBytes))
	bar.done()
	printWarmReport(out, o, rep)
	if rep.Interrupted {
		return rep, fmt.Errorf("interrupted after warming %d passages; run it again to warm the rest: %w", rep.Warmed, context.Cause(ctx))
	}
	return rep, nil
}

// entryBytes bounds the size of a cache entry on disk: the state, the
// tokens and the header (kvcache/disk.go: 32 bytes and the namespace),
// with a margin.
func entryBytes(ns string, tokens, state int) int64 {
	return int64(state) + 4*int64(tokens) + int64(len(ns)) + 64
}

func printWarmReport(out io.Writer, o warmOptions, rep warmReport) {
	what := "passages of " + o.dir
	if o.queries != "" {
		what = fmt.Sprintf("passages the questions of %s retrieve from %s", o.queries, o.dir)
	}
	fmt.Fprintf(out, "%d %s: warmed %d, already cached %d", rep.Candidates, what, rep.Warmed, rep.Cached)
	if rep.NoFit > 0 {
		fmt.Fprintf(out, ", %d did not fit the budget of %d MiB", rep.NoFit, o.budgetMB)
	}
	if rep.Limited > 0 {
		fmt.Fprintf(out, ", %d left for a later run by --limit %d", rep.Limited, o.limit)
	}
	if rep.TooLong > 0 {
		fmt.Fprintf(out, ", %d too long for --ctx-per-seq %d", rep.TooLong, o.ctxPerSeq)
	}
	if rep.Interrupted {
		left := rep.Candidates - rep.Warmed - rep.Cached - rep.NoFit - rep.Limited - rep.TooLong
		fmt.Fprintf(out, ", %d not reached (interrupted)", left)
	}
	fmt.Fprintf(out, "\nkv cache %s: %d entries, %s\n", o.cacheDir, rep.Entries, humanBytes(rep.DiskBytes))
}

// readQuestions reads one question a line, skipping blank lines.
func readQuestions(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var qs []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if q := strings.TrimSpace(sc.Text()); q != "" {
			qs = append(qs, q)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(qs) == 0 {
		return nil, fmt.Errorf("%s: no questions", path)
	}
	return qs, nil
}

// warmCandidates lists the passages to warm, in order: all of the index's
// without questions, else those the questions retrieve (k each), the most
// often retrieved first, ties in the order first retrieved.
func warmCandidates(ctx context.Context, dir string, m engine.Model, threads int, questions []string, k int, mode retrieval.Mode) ([]retrieval.Passage, error) {
	ix, closeIx, err := openIndex(dir, m, threads)
	if err != nil {
		return nil, err
	}
	defer closeIx()
	if len(questions) == 0 {
		return ix.Passages(), nil
	}
	type tally struct {
		p     retrieval.Passage
		count int
	}
	var order []*tally
	byID := map[uint64]*tally{}
	for _, q := range questions {
		hits, err := ix.Search(ctx, q, k, mode)
		if err != nil {
			return nil, fmt.Errorf("question %q: %w", q, err)
		}
		for _, h := range hits {
			t := byID[h.Passage.ID]
			if t == nil {
				t = &tally{p: h.Passage}
				byID[h.Passage.ID] = t
				order = append(order, t)
			}
			t.count++
		}
	}
	slices.SortStableFunc(order, func(a, b *tally) int { return b.count - a.count })
	out := make([]retrieval.Passage, len(order))
	for i, t := range order {
		out[i] = t.p
	}
	return out, nil
}
