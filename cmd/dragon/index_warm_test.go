package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/testmodel"
	"github.com/dragon-rag/dragon/kvcache"
	"github.com/dragon-rag/dragon/retrieval"
)

// warmDocs are one passage each (under the default 64 tokens).
var warmDocs = map[string]string{
	"volcano.txt": "Mount Etna is an active volcano on the east coast of Sicily. Its eruptions of lava and ash have shaped the island's farms and towns for thousands of years.",
	"bees.txt":    "Honey bees live in colonies ruled by a single queen. Worker bees gather nectar and pollen from flowers and turn the nectar into honey inside the hive.",
	"chess.txt":   "In chess the knight moves in an L shape and is the only piece that can jump over others. Castling moves the king two squares toward a rook.",
	"bread.txt":   "Sourdough bread rises with a starter of wild yeast and lactic acid bacteria instead of baker's yeast, which gives the loaf its sour taste and chewy crust.",
	"comet.txt":   "Halley's Comet returns to the inner solar system about every seventy-six years. Its last visit was in 1986 and the next is expected in 2061.",
}

// warmIndex builds a BM25 index of warmDocs in a temporary folder.
func warmIndex(t *testing.T, m engine.Model) (string, []retrieval.Passage) {
	t.Helper()
	src := t.TempDir()
	for name, text := range warmDocs {
		require.NoError(t, os.WriteFile(filepath.Join(src, name), []byte(text+"\n"), 0o644))
	}
	dir := filepath.Join(t.TempDir(), "index")
	ix, _, err := retrieval.Build(context.Background(), dir, retrieval.Options{Tokenizer: m}, src)
	require.NoError(t, err)
	ps := ix.Passages()
	require.NoError(t, ix.Close())
	require.Len(t, ps, len(warmDocs), "one passage per file")
	return dir, ps
}

// runWarm runs `dragon index warm args...` and returns its stdout.
func runWarm(ctx context.Context, args ...string) (string, error) {
	cmd := newIndexCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append([]string{"warm", "--threads", "2"}, args...))
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

var warmLine = regexp.MustCompile(`warmed (\d+), already cached (\d+)`)

// warmCounts parses "warmed X, already cached Y" from the report.
func warmCounts(t *testing.T, out string) (warmed, cached int) {
	t.Helper()
	m := warmLine.FindStringSubmatch(out)
	require.NotNil(t, m, "report: %s", out)
	warmed, _ = strconv.Atoi(m[1])
	cached, _ = strconv.Atoi(m[2])
	return warmed, cached
}

// kvFiles are the sizes of the entries in a cache folder.
func kvFiles(t *testing.T, dir string) []int64 {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	var sizes []int64
	for _, de := range des {
		if filepath.Ext(de.Name()) == ".kv" {
			info, err := de.Info()
			require.NoError(t, err)
			sizes = append(sizes, info.Size())
		}
	}
	return sizes
}

func TestIndexWarmErrors(t *testing.T) {
	ctx := context.Background()
	_, err := runWarm(ctx, "--kv-cache-dir", t.TempDir())
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"dir"`)
	_, err = runWarm(ctx, "--dir", t.TempDir())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--kv-cache-dir")
	for _, b := range []string{"0", "-5"} {
		_, err = runWarm(ctx, "--dir", t.TempDir(), "--kv-cache-dir", t.TempDir(), "--budget-mb", b)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "--budget-mb")
	}
	_, err = runWarm(ctx, "--dir", filepath.Join(t.TempDir(), "none"), "--kv-cache-dir", t.TempDir(), "--model", testmodel.Path(t))
	require.Error(t, err, "no index there")
}

// TestIndexWarm warms a small index's passages into a cache folder in
// steps (--limit, an interrupted run, the rest), checks a budget that
// holds only some, the most retrieved passages of --queries first, and
// that a decoder over a fresh cache on the folder restores a warmed
// passage for a question it was not warmed with.
func TestIndexWarm(t *testing.T) {
	model := testmodel.Path(t)
	m, err := llamacpp.Load(model, llamacpp.Options{Threads: 2})
	require.NoError(t, err)
	defer m.Close()
	ixDir, passages := warmIndex(t, m)
	n := len(passages)
	ctx := context.Background()

	// The head is what the prompts of any questions over a passage share.
	probe, err := decoder.New(m, decoder.Options{MaxPassages: 1, CtxPerSeq: 1024, Threads: 2})
	require.NoError(t, err)
	defer probe.Close()
	heads := map[string][]engine.Token{}
	for _, p := range passages {
		head, err := probe.PassageHead(p.Text)
		require.NoError(t, err)
		heads[p.Source] = head
	}
	for _, q := range []string{"When was it?", "42?", ":colon"} {
		require.NoError(t, probe.Begin(ctx, q, []decoder.Passage{{Text: passages[0].Text}}, nil))
		head := heads[passages[0].Source]
		assert.Equal(t, head, probe.Prompt(0)[:len(head)], "the head is a prefix of the prompt for %q", q)
		assert.Greater(t, len(probe.Prompt(0)), len(head))
	}

	// In steps: two with --limit, one more until interrupted, the rest.
	cacheDir := filepath.Join(t.TempDir(), "kv")
	out, err := runWarm(ctx, "--dir", ixDir, "--kv-cache-dir", cacheDir, "--limit", "2", "--model", model)
	require.NoError(t, err)
	w, c := warmCounts(t, out)
	assert.Equal(t, [2]int{2, 0}, [2]int{w, c}, out)
	assert.Contains(t, out, strconv.Itoa(n-2)+" left for a later run")
	assert.Len(t, kvFiles(t, cacheDir), 2)

	ictx, cancel := context.WithCancel(ctx)
	var stdout, stderr bytes.Buffer
	rep, err := runIndexWarm(ictx, warmOptions{
		dir: ixDir, cacheDir: cacheDir, model: model, retrieval: "auto", threads: 2, ctxPerSeq: 1024, budgetMB: 1024,
		afterEach: func(int) { cancel() },
	}, &stdout, &stderr)
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "run it again")
	assert.True(t, rep.Interrupted)
	assert.Equal(t, 1, rep.Warmed)
	assert.Equal(t, 2, rep.Cached)
	assert.Contains(t, stdout.String(), "interrupted")
	assert.Len(t, kvFiles(t, cacheDir), 3)

	out, err = runWarm(ctx, "--dir", ixDir, "--kv-cache-dir", cacheDir, "--model", model)
	require.NoError(t, err)
	w, c = warmCounts(t, out)
	assert.Equal(t, [2]int{n - 3, 3}, [2]int{w, c}, "the rerun does only the rest: %s", out)
	sizes := kvFiles(t, cacheDir)
	require.Len(t, sizes, n)
	out, err = runWarm(ctx, "--dir", ixDir, "--kv-cache-dir", cacheDir, "--model", model)
	require.NoError(t, err)
	w, c = warmCounts(t, out)
	assert.Equal(t, [2]int{0, n}, [2]int{w, c}, "all done: %s", out)

	// A fresh cache on the folder serves another question over a warmed
	// passage from disk, and the decoder then decodes what an uncached
	// one does.
	ns, err := kvNamespace(model)
	require.NoError(t, err)
	cache, err := kvcache.New(kvcache.Config{Namespace: ns, Dir: cacheDir, DiskBytes: 1 << 30})
	require.NoError(t, err)
	assert.Equal(t, n, cache.Stats().Entries)
	for _, head := range heads {
		assert.True(t, cache.Has(head))
	}
	dec, err := decoder.New(m, decoder.Options{MaxPassages: 1, CtxPerSeq: 1024, Threads: 2, Cache: cache})
	require.NoError(t, err)
	defer dec.Close()
	question := "Which island is the volcano on?"
	var volcano retrieval.Passage
	for _, p := range passages {
		if filepath.Base(p.Source) == "volcano.txt" {
			volcano = p
		}
	}
	require.NotEmpty(t, volcano.Text)
	vp := []decoder.Passage{{Text: volcano.Text, Score: 0}}
	require.NoError(t, dec.Begin(ctx, question, vp, nil))
	assert.Equal(t, 1, dec.Restored(), "the warmed passage is restored for a new question")
	assert.Equal(t, uint64(1), cache.Stats().Hits[kvcache.Disk])
	got, err := dec.Next(ctx)
	require.NoError(t, err)
	require.NoError(t, probe.Begin(ctx, question, vp, nil))
	want, err := probe.Next(ctx)
	require.NoError(t, err)
	assert.Equal(t, argmax(want), argmax(got), "restored and prefilled agree on the next token")

	// A budget of 5 MiB holds some of the entries (about 2 MB each), not
	// all: warming stops at the first that would exceed it, and a rerun
	// with a larger budget warms the rest.
	largest, smallest := sizes[0], sizes[0]
	for _, s := range sizes {
		largest, smallest = max(largest, s), min(smallest, s)
	}
	budgetDir := filepath.Join(t.TempDir(), "kv")
	out, err = runWarm(ctx, "--dir", ixDir, "--kv-cache-dir", budgetDir, "--budget-mb", "5", "--model", model)
	require.NoError(t, err)
	w, c = warmCounts(t, out)
	require.Equal(t, 0, c)
	require.Greater(t, w, 0, out)
	require.Less(t, w, n, out)
	assert.Contains(t, out, strconv.Itoa(n-w)+" did not fit the budget of 5 MiB")
	var used int64
	for _, s := range kvFiles(t, budgetDir) {
		used += s
	}
	assert.Len(t, kvFiles(t, budgetDir), w)
	assert.LessOrEqual(t, used, int64(5<<20), "within the budget")
	assert.Greater(t, used+largest, int64(5<<20), "the next entry would not have fitted")
	out, err = runWarm(ctx, "--dir", ixDir, "--kv-cache-dir", budgetDir, "--budget-mb", "64", "--model", model)
	require.NoError(t, err)
	w2, c2 := warmCounts(t, out)
	assert.Equal(t, [2]int{n - w, w}, [2]int{w2, c2}, out)

	// --queries: the passage two questions retrieve goes before the one a
	// single question retrieves, and a budget for one entry keeps it.
	queries := filepath.Join(t.TempDir(), "questions.txt")
	require.NoError(t, os.WriteFile(queries, []byte("Which volcano erupts on Sicily?\n\nhow do bees make honey\nWhen did the volcano Etna erupt with lava?\n"), 0o644))
	qDir := filepath.Join(t.TempDir(), "kv")
	budgetMB := largest>>20 + 1
	require.Less(t, budgetMB<<20, 2*smallest, "a budget for one entry, not two")
	budget := strconv.FormatInt(budgetMB, 10)
	out, err = runWarm(ctx, "--dir", ixDir, "--kv-cache-dir", qDir, "--queries", queries, "-k", "1", "--budget-mb", budget, "--model", model)
	require.NoError(t, err)
	w, c = warmCounts(t, out)
	assert.Equal(t, [2]int{1, 0}, [2]int{w, c}, out)
	assert.Contains(t, out, "2 passages the questions")
	assert.Contains(t, out, "1 did not fit")
	qc, err := kvcache.New(kvcache.Config{Namespace: ns, Dir: qDir, DiskBytes: 1 << 30})
	require.NoError(t, err)
	for _, p := range passages {
		assert.Equal(t, filepath.Base(p.Source) == "volcano.txt", qc.Has(heads[p.Source]), "cached: %s", p.Source)
	}
}

func argmax(p []float32) int {
	best := 0
	for i, v := range p {
		if v > p[best] {
			best = i
		}
	}
	return best
}
