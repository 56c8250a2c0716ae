package retrieval

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// buildTestIndex builds a dense index of testCorpus with the word
// tokenizer and the synonym embedder.
func buildTestIndex(t *testing.T, opts Options) (*Index, string, string) {
	t.Helper()
	root := t.TempDir()
	corpus := filepath.Join(root, "corpus")
	writeFiles(t, corpus, testCorpus)
	if opts.Tokenizer == nil {
		opts.Tokenizer = newWordTokenizer()
	}
	if opts.Embedder == nil {
		opts.Embedder = newSynonymEmbedder()
	}
	if opts.Chunk.Tokens == 0 {
		opts.Chunk.Tokens = 16
	}
	dir := filepath.Join(root, "index")
	ix, rep, err := Build(t.Context(), dir, opts, corpus)
	require.NoError(t, err)
	require.Equal(t, len(testCorpus), rep.Files)
	require.Zero(t, rep.Skipped, "%v", rep.Errors)
	t.Cleanup(func() { ix.Close() })
	return ix, dir, corpus
}

func TestBM25FindsRareKeyword(t *testing.T) {
	ix, _, corpus := buildTestIndex(t, Options{})
	hits, err := ix.Search(t.Context(), "Quetzalcoatlus", 3, ModeBM25)
	require.NoError(t, err)
	require.Len(t, hits, 1, "only one passage holds the word")
	h := hits[0]
	assert.Equal(t, filepath.Join(corpus, "birds.md"), h.Passage.Source)
	assert.Contains(t, h.Passage.Text, "quetzalcoatlus")
	assert.Equal(t, 1, h.BM25Rank)
	assert.Zero(t, h.DenseRank)
	assert.Equal(t, "Birds", h.Passage.Meta["title"])
	assert.Greater(t, h.Score, 0.0)
	assert.LessOrEqual(t, h.Score, 1/TempBM25)

	// Offsets point into the file.
	data, err := os.ReadFile(h.Passage.Source)
	require.NoError(t, err)
	assert.Equal(t, h.Passage.Text, string(data[h.Passage.Start:h.Passage.End]))

	// Stemming: "baking breads" finds the bread passage.
	hits, err = ix.Search(t.Context(), "baking breads", 1, ModeBM25)
	require.NoError(t, err)
	require.NotEmpty(t, hits)
	assert.Contains(t, hits[0].Passage.Source, "cooking.txt")
}

// densePaths are the two dense search paths: scanning every vector and
// the HNSW graph.
var densePaths = []struct {
	name     string
	exactMax int
}{{"exact", 0}, {"hnsw", -1}}

func TestDenseFindsParaphrase(t *testing.T) {
	for _, dp := range densePaths {
		t.Run(dp.name, func(t *testing.T) { testDenseFindsParaphrase(t, Options{ExactDenseMax: dp.exactMax}) })
	}
}

func testDenseFindsParaphrase(t *testing.T, opts Options) {
	ix, _, corpus := buildTestIndex(t, opts)
	const query = "A doctor gave drugs for his sickness"
	want := filepath.Join(corpus, "medicine.txt")

	// No content word of the query occurs in the passage, so BM25 cannot
	// rank it first: what dense retrieval adds.
	lex, err := ix.Search(t.Context(), query, 3, ModeBM25)
	require.NoError(t, err)
	for _, h := range lex {
		assert.NotEqual(t, want, h.Passage.Source)
	}

	for _, mode := range []Mode{ModeDense, ModeHybrid, ModeAuto} {
		hits, err := ix.Search(t.Context(), query, 3, mode)
		require.NoError(t, err, mode)
		require.NotEmpty(t, hits, mode)
		assert.Equal(t, want, hits[0].Passage.Source, mode)
		assert.Equal(t, 1, hits[0].DenseRank, mode)
		assert.Greater(t, hits[0].Cosine, hits[len(hits)-1].Cosine, mode)
	}
	// The real model's paraphrase check is the lead's integration test:
	// the synonym embedder only proves the dense path is wired right.
}

func TestIndexRoundTrip(t *testing.T) {
	for _, dp := range densePaths {
		t.Run(dp.name, func(t *testing.T) { testIndexRoundTrip(t, dp.exactMax) })
	}
}

func testIndexRoundTrip(t *testing.T, exactMax int) {
	emb := newSynonymEmbedder()
	tok := newWordTokenizer()
	ix, dir, _ := buildTestIndex(t, Options{Embedder: emb, Tokenizer: tok, ExactDenseMax: exactMax})
	queries := []string{"bread oven", "fast car race", "sea whales", "cash in the bank", "physician medication"}
	modes := []Mode{ModeBM25, ModeDense, ModeHybrid}
	before := map[string][]Hit{}
	for _, q := range queries {
		for _, m := range modes {
			hits, err := ix.Search(t.Context(), q, 4, m)
			require.NoError(t, err)
			require.NotEmpty(t, hits, "%s %s", q, m)
			before[q+"/"+m.String()] = hits
		}
	}
	stats := ix.Stats()
	require.NoError(t, ix.Close())
	_, err := ix.Search(t.Context(), "bread", 1, ModeBM25)
	assert.ErrorIs(t, err, ErrClosed)

	re, err := Open(dir, Options{Embedder: emb, Tokenizer: tok, ReadOnly: true, ExactDenseMax: exactMax})
	require.NoError(t, err)
	defer re.Close()
	for key, want := range before {
		q, m, _ := strings.Cut(key, "/")
		mode, err := ParseMode(m)
		require.NoError(t, err)
		got, err := re.Search(t.Context(), q, 4, mode)
		require.NoError(t, err)
		assert.Equal(t, want, got, key)
	}
	after := re.Stats()
	assert.Equal(t, stats.Manifest, after.Manifest)
	assert.Equal(t, stats.Tokens, after.Tokens)
	assert.Equal(t, len(testCorpus), after.Manifest.Files)
	assert.Equal(t, 64, after.Manifest.Dims)
	assert.Equal(t, "test-synonyms-v1", after.Manifest.Embedder)
	assert.Positive(t, after.DiskBytes)

	_, err = re.Add(t.Context(), dir)
	assert.ErrorIs(t, err, ErrReadOnly)
}

func TestDeleteRemovesSource(t *testing.T) {
	for _, dp := range densePaths {
		t.Run(dp.name, func(t *testing.T) { testDeleteRemovesSource(t, dp.exactMax) })
	}
}

func testDeleteRemovesSource(t *testing.T, exactMax int) {
	emb, tok := newSynonymEmbedder(), newWordTokenizer()
	ix, dir, corpus := buildTestIndex(t, Options{Embedder: emb, Tokenizer: tok, ExactDenseMax: exactMax})
	gone := filepath.Join(corpus, "notes", "cooking.txt")
	before := ix.Stats().Manifest

	n, err := ix.Delete(gone)
	require.NoError(t, err)
	assert.Positive(t, n)
	for _, mode := range []Mode{ModeBM25, ModeDense, ModeHybrid} {
		hits, err := ix.Search(t.Context(), "bake bread dough oven flour", 10, mode)
		require.NoError(t, err)
		for _, h := range hits {
			assert.NotEqual(t, gone, h.Passage.Source, mode)
		}
	}
	m := ix.Stats().Manifest
	assert.Equal(t, before.Passages-n, m.Passages)
	assert.Equal(t, before.Sources-1, m.Sources)
	assert.Equal(t, before.Files-1, m.Files)
	assert.NotContains(t, ix.Sources(), gone)

	_, err = ix.Delete(gone)
	assert.ErrorIs(t, err, ErrNotIndexed)

	// Deleting a folder removes what is under it; the deletion persists.
	_, err = ix.Delete(corpus)
	require.NoError(t, err)
	require.NoError(t, ix.Close())
	re, err := Open(dir, Options{Embedder: emb, Tokenizer: tok, ExactDenseMax: exactMax})
	require.NoError(t, err)
	defer re.Close()
	assert.Zero(t, re.Stats().Manifest.Passages)
	hits, err := re.Search(t.Context(), "whales sea", 5, ModeHybrid)
	require.NoError(t, err)
	assert.Empty(t, hits)

	// Adding back works after everything was deleted (the graph's dead
	// nodes were compacted away).
	rep, err := re.Add(t.Context(), corpus)
	require.NoError(t, err)
	assert.Equal(t, len(testCorpus), rep.Files)
	hits, err = re.Search(t.Context(), "whales sea", 1, ModeHybrid)
	require.NoError(t, err)
	require.Len(t, hits, 1)
	assert.Contains(t, hits[0].Passage.Source, "ocean.txt")
}

func TestAddSkipsUnchangedAndReplacesChanged(t *testing.T) {
	ix, _, corpus := buildTestIndex(t, Options{})
	rep, err := ix.Add(t.Context(), corpus)
	require.NoError(t, err)
	assert.Equal(t, len(testCorpus), rep.Unchanged)
	assert.Zero(t, rep.Files)

	changed := filepath.Join(corpus, "ocean.txt")
	require.NoError(t, os.WriteFile(changed, []byte("Penguins huddle on the ice to keep warm."), 0o644))
	rep, err = ix.Add(t.Context(), corpus)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Files)
	assert.Positive(t, rep.Removed)

	hits, err := ix.Search(t.Context(), "whales", 5, ModeBM25)
	require.NoError(t, err)
	assert.Empty(t, hits, "the old text of a changed file is gone")
	hits, err = ix.Search(t.Context(), "penguins", 5, ModeBM25)
	require.NoError(t, err)
	require.Len(t, hits, 1)
	assert.Equal(t, changed, hits[0].Passage.Source)
}

func TestUnreadableFilesAreSkippedAndCounted(t *testing.T) {
	root := t.TempDir()
	corpus := filepath.Join(root, "corpus")
	writeFiles(t, corpus, map[string]string{
		"good.txt":  "Readable text about lighthouses and their keepers.",
		"bad.eml":   "From: a@b\nSubject: x\nContent-Transfer-Encoding: base64\n\n!!!! not base64 @@@@\n",
		"image.png": "\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
	})
	require.NoError(t, os.Symlink(filepath.Join(root, "nowhere.txt"), filepath.Join(corpus, "dangling.txt")))
	wantSkipped := 3 // bad.eml, dangling.txt, missing.txt
	if os.Geteuid() != 0 {
		// root reads anything, so the permission case needs a normal user.
		p := filepath.Join(corpus, "secret.txt")
		require.NoError(t, os.WriteFile(p, []byte("secret"), 0o000))
		wantSkipped++
	}
	missing := filepath.Join(root, "missing.txt")

	ix, rep, err := Build(t.Context(), filepath.Join(root, "idx"), Options{Tokenizer: fakeModel()}, corpus, missing)
	require.NoError(t, err, "bad files never abort a build")
	defer ix.Close()
	assert.Equal(t, wantSkipped, rep.Skipped, "%v", rep.Errors)
	assert.Len(t, rep.Errors, wantSkipped)
	assert.Equal(t, 1, rep.Unsupported, "the PNG inside a folder is not an error")
	assert.Equal(t, 1, rep.Files)
	var paths []string
	for _, e := range rep.Errors {
		paths = append(paths, filepath.Base(e.Path))
		assert.Error(t, e.Err)
	}
	assert.Contains(t, paths, "bad.eml")
	assert.Contains(t, paths, "dangling.txt")
	assert.Contains(t, paths, "missing.txt")

	hits, err := ix.Search(t.Context(), "lighthouses", 1, ModeAuto)
	require.NoError(t, err)
	require.Len(t, hits, 1)
}

// A folder named through a link is read (as ls or find -H would), its
// passages under the name given; a link to a folder met inside is not
// followed.
func TestLinkedFolderIsFollowedAtTheTop(t *testing.T) {
	root := t.TempDir()
	corpus := filepath.Join(root, "corpus")
	writeFiles(t, corpus, map[string]string{"keeper.txt": "Readable text about lighthouses and their keepers."})
	require.NoError(t, os.Symlink(corpus, filepath.Join(corpus, "loop")))
	link := filepath.Join(root, "linked")
	require.NoError(t, os.Symlink(corpus, link))

	files, errs := walk([]string{link}, nil)
	assert.Empty(t, errs)
	assert.Equal(t, []string{filepath.Join(link, "keeper.txt")}, files)

	ix, rep, err := Build(t.Context(), filepath.Join(root, "idx"), Options{Tokenizer: fakeModel()}, link)
	require.NoError(t, err)
	defer ix.Close()
	assert.Equal(t, 1, rep.Files)
	hits, err := ix.Search(t.Context(), "lighthouses", 1, ModeAuto)
	require.NoError(t, err)
	require.Len(t, hits, 1)
	assert.Equal(t, filepath.Join(link, "keeper.txt"), hits[0].Passage.Source)
}

func TestCorruptIndexGivesClearError(t *testing.T) {
	tests := []struct {
		name     string
		exactMax int // 0: the default, searched exactly
		break_   func(t *testing.T, dir string)
	}{
		{"truncated manifest", 0, func(t *testing.T, dir string) {
			truncate(t, filepath.Join(dir, manifestFile), 0.5)
		}},
		{"missing bleve dir", 0, func(t *testing.T, dir string) {
			require.NoError(t, os.RemoveAll(filepath.Join(dir, bleveDir)))
		}},
		{"truncated passages", 0, func(t *testing.T, dir string) {
			truncate(t, snapFile(t, dir, passagesFile), 0.5)
		}},
		{"truncated dense vectors", 0, func(t *testing.T, dir string) {
			truncate(t, snapFile(t, dir, vectorsFile), 0.5)
		}},
		{"missing dense vectors", 0, func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(snapFile(t, dir, vectorsFile)))
		}},
		{"truncated dense graph of format 1", -1, func(t *testing.T, dir string) {
			toGraphOnlyFormat(t, dir)
			truncate(t, filepath.Join(dir, graphFile), 0.5)
		}},
		{"missing file list", 0, func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(snapFile(t, dir, filesFile)))
		}},
		{"future version", 0, func(t *testing.T, dir string) {
			p := filepath.Join(dir, manifestFile)
			data, err := os.ReadFile(p)
			require.NoError(t, err)
			data = []byte(strings.Replace(string(data), fmt.Sprintf(`"version": %d`, formatVersion), `"version": 99`, 1))
			require.NoError(t, os.WriteFile(p, data, 0o644))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			emb := newSynonymEmbedder()
			ix, dir, _ := buildTestIndex(t, Options{Embedder: emb, ExactDenseMax: tc.exactMax})
			require.NoError(t, ix.Close())
			tc.break_(t, dir)
			_, err := Open(dir, Options{Embedder: emb, ExactDenseMax: tc.exactMax})
			require.ErrorIs(t, err, ErrCorrupt)
			assert.Contains(t, err.Error(), "dragon index build --dir "+dir)
		})
	}

	_, err := Open(filepath.Join(t.TempDir(), "nothing"), Options{})
	require.ErrorIs(t, err, ErrNoIndex)
	assert.Contains(t, err.Error(), "dragon index build --dir")
}

func truncate(t *testing.T, path string, frac float64) {
	t.Helper()
	info, err := os.Stat(path)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(path, int64(float64(info.Size())*frac)))
}

func TestEmbedderMustMatch(t *testing.T) {
	writer, dir, _ := buildTestIndex(t, Options{})
	_, err := Open(dir, Options{Embedder: NewEngineEmbedder(fakeModel(), EngineEmbedderOptions{})})
	require.ErrorIs(t, err, ErrEmbedder)

	// The open writer holds the lock: a second process gets a clear error.
	_, err = Open(dir, Options{ReadOnly: true})
	require.ErrorContains(t, err, "in use by another process")
	require.NoError(t, writer.Close())

	// Without an embedder the index opens for BM25 only.
	ix, err := Open(dir, Options{ReadOnly: true})
	require.NoError(t, err)
	defer ix.Close()
	_, err = ix.Search(t.Context(), "bread", 1, ModeDense)
	assert.ErrorIs(t, err, ErrEmbedder)
	hits, err := ix.Search(t.Context(), "bread", 1, ModeAuto)
	require.NoError(t, err)
	require.Len(t, hits, 1)
	assert.Zero(t, hits[0].DenseRank)
}

func TestWeightsAreASoftmaxInRankOrder(t *testing.T) {
	ix, _, _ := buildTestIndex(t, Options{})
	for _, mode := range []Mode{ModeBM25, ModeDense, ModeHybrid} {
		hits, err := ix.Search(t.Context(), "small bread in the sea with cash", 5, mode)
		require.NoError(t, err)
		require.GreaterOrEqual(t, len(hits), 3, mode)
		w := Weights(hits)
		var sum float64
		for i, x := range w {
			sum += x
			assert.True(t, x > 0 && x <= 1, "%s weight %d = %v", mode, i, x)
			if i > 0 {
				assert.GreaterOrEqual(t, w[i-1], x, "%s: weights must follow the ranks", mode)
				assert.GreaterOrEqual(t, hits[i-1].Score, hits[i].Score, mode)
			}
		}
		assert.InDelta(t, 1, sum, 1e-12, mode)
		// logsumexp(R) is the log-normalizer of the weights.
		lse := LogSumExp(hits)
		assert.InDelta(t, w[0], math.Exp(hits[0].Score-lse), 1e-12)
	}
	assert.Nil(t, Weights(nil))
	assert.True(t, math.IsInf(LogSumExp(nil), -1))
}

func TestScoreCalibration(t *testing.T) {
	// BM25: a fraction of the query's upper bound over TempBM25.
	assert.InDelta(t, 0, bm25R(0, 3), 1e-12)
	assert.InDelta(t, 5, bm25R(1.5, 3), 1e-12)
	assert.InDelta(t, 10, bm25R(9, 3), 1e-12, "clipped at the bound")
	assert.Zero(t, bm25R(1, 0))
	// Dense: cosine over TempDense.
	assert.InDelta(t, 16, denseR(0.8), 1e-12)
	// RRF: first in both rankers is 1/TempRRF; first in one is half.
	assert.InDelta(t, 10, rrfR(2.0/61, 2), 1e-12)
	assert.InDelta(t, 5, rrfR(1.0/61, 2), 1e-12)
	// A passage missing from one list of 50 counts as ranked 51st there.
	assert.InDelta(t, 10*(1.0/61+1.0/111)/(2.0/61), rrfR(rrf(1, 50)+rrf(0, 50), 2), 1e-12)
	hits := fuse(ModeHybrid, []scored{{1, 9}, {2, 8}}, 10, []scored{{2, 0.9}, {3, 0.8}}, 50, nil)
	byID := map[uint64]Hit{}
	for _, h := range hits {
		byID[h.Passage.ID] = h
	}
	assert.Greater(t, byID[2].Score, byID[1].Score, "found by both beats first in one")
	assert.Greater(t, byID[1].Score, byID[3].Score)
	assert.Equal(t, Hit{Passage: Passage{ID: 3}, Score: rrfR(rrf(0, 50)+rrf(2, 50), 2), DenseRank: 2, Cosine: 0.8}, byID[3])
	// A passage without its vector yet ranks by its words alone.
	hits = fuse(ModeHybrid, []scored{{1, 9}, {2, 8}}, 10, []scored{{2, 0.9}, {3, 0.8}}, 50, func(id uint64) bool { return id == 1 })
	for _, h := range hits {
		byID[h.Passage.ID] = h
	}
	assert.InDelta(t, rrfR(2*rrf(1, 50), 2), byID[1].Score, 1e-12, "first by BM25, as if first by its vector too")
	assert.Greater(t, byID[1].Score, byID[2].Score)

	for _, s := range []string{"auto", "bm25", "dense", "hybrid"} {
		m, err := ParseMode(s)
		require.NoError(t, err)
		assert.Equal(t, s, m.String())
	}
	_, err := ParseMode("sparse")
	assert.Error(t, err)
}

func TestBM25UpperBound(t *testing.T) {
	ix, _, _ := buildTestIndex(t, Options{})
	// Every score stays below the bound, and a query with a word the
	// corpus lacks scores the same passage lower (it matches less of it).
	for _, q := range []string{"bread", "bread oven flour yeast salt water dough", "the whales sing songs"} {
		lex, upper, err := ix.bm25.search(t.Context(), q, 10, ix.corpusStats())
		require.NoError(t, err)
		require.NotEmpty(t, lex, q)
		for _, s := range lex {
			assert.Less(t, s.score, upper, q)
		}
	}
	a, ua, err := ix.bm25.search(t.Context(), "whales", 1, ix.corpusStats())
	require.NoError(t, err)
	b, ub, err := ix.bm25.search(t.Context(), "whales xylophone", 1, ix.corpusStats())
	require.NoError(t, err)
	require.Len(t, a, 1)
	require.Len(t, b, 1)
	assert.Greater(t, bm25R(a[0].score, ua), bm25R(b[0].score, ub))
}

func TestSearchArguments(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, map[string]string{"a.txt": "alpha beta gamma"})
	ix, _, err := Build(t.Context(), filepath.Join(root, "idx"), Options{Tokenizer: fakeModel()}, filepath.Join(root, "a.txt"))
	require.NoError(t, err)
	defer ix.Close()
	_, err = ix.Search(t.Context(), "alpha", 0, ModeBM25)
	assert.Error(t, err)
	_, err = ix.Search(t.Context(), "  ", 1, ModeBM25)
	assert.Error(t, err)
	_, err = ix.Search(t.Context(), "alpha", 1, ModeDense)
	assert.ErrorContains(t, err, "no dense vectors")
	_, err = ix.Search(t.Context(), "alpha", 1, Mode(42))
	assert.Error(t, err)
}

func TestBuildReplacesOnlyIndexes(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, map[string]string{"docs/a.txt": "alpha beta gamma", "docs/b.txt": "delta epsilon"})
	docs := filepath.Join(root, "docs")
	opts := Options{Tokenizer: fakeModel()}

	// A --dir that holds someone's files is never replaced.
	_, _, err := Build(t.Context(), docs, opts, docs)
	require.ErrorContains(t, err, "does not hold an index")
	_, err = os.Stat(filepath.Join(docs, "a.txt"))
	require.NoError(t, err)

	// An index inside the corpus is not indexed itself, and building again
	// replaces the old index.
	dir := filepath.Join(docs, "idx")
	for range 2 {
		ix, rep, err := Build(t.Context(), dir, opts, docs)
		require.NoError(t, err)
		assert.Equal(t, 2, rep.Files)
		assert.Equal(t, []string{filepath.Join(docs, "a.txt"), filepath.Join(docs, "b.txt")}, ix.Sources())
		rep, err = ix.Add(t.Context(), docs)
		require.NoError(t, err)
		assert.Equal(t, 2, rep.Unchanged)
		assert.Zero(t, rep.Files)
		require.NoError(t, ix.Close())
	}
	leftovers, err := filepath.Glob(filepath.Join(docs, "idx.*"))
	require.NoError(t, err)
	assert.Empty(t, leftovers, "no temporary directories stay behind")
}

// TestBM25IsTextbook checks the scores against BM25 computed by hand, which
// holds only if the true average passage length reaches bleve.
func TestBM25IsTextbook(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{}
	// Ten passages of four distinct terms each (avgdl = 4), one of which is
	// longer (eight terms) and one shorter (two terms); "zebra" occurs once
	// in a four-term, the eight-term and the two-term passage.
	for i := range 7 {
		files[fmt.Sprintf("p%d.txt", i)] = fmt.Sprintf("alpha%c bravo%c charlie%c delta%c", 'a'+i, 'a'+i, 'a'+i, 'a'+i)
	}
	files["zebra4.txt"] = "zebra echo foxtrot golf"
	files["zebra8.txt"] = "zebra hotel india juliett kilo lima mike november"
	files["zebra2.txt"] = "zebra oscar"
	writeFiles(t, root, files)
	ix, _, err := Build(t.Context(), filepath.Join(root, "idx"), Options{Tokenizer: newWordTokenizer()}, root)
	require.NoError(t, err)
	defer ix.Close()
	st := ix.corpusStats()
	require.Equal(t, 10, st.docs)
	require.EqualValues(t, 7*4+4+8+2, st.terms)

	lex, upper, err := ix.bm25.search(t.Context(), "zebra", 5, st)
	require.NoError(t, err)
	require.Len(t, lex, 3)
	const k1, b = 1.2, 0.75
	avgdl := math.Ceil(42.0 / 10) // bleve rounds the average up
	idf := math.Log(1 + (10-3+0.5)/(3+0.5))
	byLen := map[int]float64{}
	for _, s := range lex {
		p := ix.passages[s.id]
		byLen[p.terms] = s.score / upper
	}
	for _, dl := range []int{2, 4, 8} {
		want := idf * k1 / (1 + k1*(1-b+b*float64(dl)/avgdl)) / (k1 * idf)
		assert.InDelta(t, want, byLen[dl], 0.02, "passage of %d terms", dl)
	}
}
