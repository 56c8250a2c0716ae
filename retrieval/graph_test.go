package retrieval

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// exactOnly is an ExactDenseMax no index reaches, as the scale
// benchmark's reference index uses.
const exactOnly = 1 << 40

// passageFiles returns files n0..n1-1 of two 16-word passages each, no two
// passages alike, so that RandomEmbedder gives each its own vector.
func passageFiles(n0, n1 int) map[string]string {
	files := map[string]string{}
	for f := n0; f < n1; f++ {
		var words []string
		for w := range 32 {
			words = append(words, fmt.Sprintf("w%dx%d", f, w))
		}
		files[fmt.Sprintf("f%03d.txt", f)] = strings.Join(words, " ")
	}
	return files
}

// graphOptions index passageFiles with a tiny ExactDenseMax, logging into
// logs. The vectors have 8 dimensions: in 32, coder/hnsw's early-stopping
// search (see graphSearch) misses 2 of these 400 passages' own vectors,
// which is the graph's recall, not what these tests check.
func graphOptions(exactMax int, logs *bytes.Buffer) Options {
	return Options{
		Tokenizer: newWordTokenizer(), Embedder: RandomEmbedder{Dims: 8}, Chunk: ChunkOptions{Tokens: 16},
		ExactDenseMax: exactMax, CommitEvery: 64, Logger: slog.New(slog.NewTextHandler(logs, nil)),
	}
}

// assertGraph checks that ix keeps a graph of nodes vectors in memory and
// on disk, which holds the vectors, or none (nodes 0) and the vectors in
// their own file.
func assertGraph(t *testing.T, ix *Index, nodes int) {
	t.Helper()
	if nodes == 0 {
		assert.Nil(t, ix.graph)
		assert.NoFileExists(t, snapFile(t, ix.dir, graphFile))
		assert.FileExists(t, snapFile(t, ix.dir, vectorsFile))
	} else if assert.NotNil(t, ix.graph) {
		assert.Equal(t, nodes, ix.graph.Len())
		assert.FileExists(t, snapFile(t, ix.dir, graphFile))
		assert.NoFileExists(t, snapFile(t, ix.dir, vectorsFile))
	}
	assert.Equal(t, nodes, ix.Stats().Manifest.GraphNodes)
}

// assertFindsItself checks that dense search for each passage's own text
// (so its own vector) ranks that passage first. Searched exactly, every
// passage must. Through the graph, coder/hnsw enters its top layer at
// whichever node Go's map order gives and stops its beam early, so one
// graph in six misses one passage of these 400 (100 builds, 2026-11-27).
// That is the graph's recall, not what these tests check: up to 1% may be
// missed.
func assertFindsItself(t *testing.T, ix *Index) {
	t.Helper()
	ix.mu.RLock()
	ps := make([]Passage, 0, len(ix.passages))
	for _, p := range ix.passages {
		ps = append(ps, *p)
	}
	graph := ix.graph != nil
	ix.mu.RUnlock()
	require.NotEmpty(t, ps)
	var missed []uint64
	for _, p := range ps {
		hits, err := ix.Search(t.Context(), p.Text, 3, ModeDense)
		require.NoError(t, err)
		require.NotEmpty(t, hits)
		if hits[0].Passage.ID != p.ID {
			missed = append(missed, p.ID)
			continue
		}
		assert.InDelta(t, 1, hits[0].Cosine, 1e-5)
	}
	if !graph {
		assert.Empty(t, missed, "searched exactly, every passage finds itself")
		return
	}
	t.Logf("graph missed %d of %d passages' own vectors", len(missed), len(ps))
	assert.LessOrEqual(t, len(missed)*100, len(ps), "the graph missed passages %v", missed)
}

func TestGraphIsKeptOnlyPastExactDenseMax(t *testing.T) {
	root := t.TempDir()
	corpus, more := filepath.Join(root, "corpus"), filepath.Join(root, "corpus", "more")
	writeFiles(t, corpus, passageFiles(0, 20))
	writeFiles(t, more, passageFiles(20, 200))
	var logs bytes.Buffer
	opts := graphOptions(50, &logs)

	ix, _, err := Build(t.Context(), filepath.Join(root, "index"), opts, filepath.Join(corpus, "f000.txt"))
	require.NoError(t, err)
	defer func() { ix.Close() }()
	assertGraph(t, ix, 0)

	// Growing past 50 passages (in commits of 64) builds the graph once,
	// from the vectors; later commits add to it.
	rep, err := ix.Add(t.Context(), corpus)
	require.NoError(t, err)
	require.Equal(t, 398, rep.Passages)
	assertGraph(t, ix, 400)
	assert.Equal(t, 1, strings.Count(logs.String(), "building the dense graph"), logs.String())
	assertFindsItself(t, ix)

	// Reopened, it reads the graph rather than building it again.
	require.NoError(t, ix.Close())
	ix, err = Open(filepath.Join(root, "index"), opts)
	require.NoError(t, err)
	assertGraph(t, ix, 400)
	assert.Equal(t, 1, strings.Count(logs.String(), "building the dense graph"))
	assertFindsItself(t, ix)

	// Shrinking back to 40 passages drops it, and on disk too from the
	// next checkpoint (Close makes one).
	n, err := ix.Delete(more)
	require.NoError(t, err)
	require.Equal(t, 360, n)
	assert.Nil(t, ix.graph)
	assert.Contains(t, logs.String(), "dropping the dense graph")
	assertFindsItself(t, ix)
	require.NoError(t, ix.Close())
	ix, err = Open(filepath.Join(root, "index"), opts)
	require.NoError(t, err)
	assertGraph(t, ix, 0)
	assertFindsItself(t, ix)
}

func TestReopenWithAnotherExactDenseMax(t *testing.T) {
	tests := []struct {
		name              string
		buildMax, openMax int
		readOnly          bool
		wantGraph         bool // searched through a graph
		wantBuilt         bool // which the open built from the vectors
		wantFile          bool // dense.hnsw, not dense.vec, after closing
	}{
		{"exact index opened exactly", exactOnly, exactOnly, false, false, false, false},
		{"exact index opened to search a graph", exactOnly, 50, true, true, true, false},
		{"graph index opened to search it", 50, 50, true, true, false, true},
		{"graph index opened exactly", 50, exactOnly, true, false, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeFiles(t, root, passageFiles(0, 100))
			dir := filepath.Join(root, "index")
			var logs bytes.Buffer
			ix, _, err := Build(t.Context(), dir, graphOptions(tc.buildMax, &logs), root)
			require.NoError(t, err)
			require.NoError(t, ix.Close())
			assert.Equal(t, tc.buildMax != exactOnly, strings.Contains(logs.String(), "building the dense graph"),
				"only a graph index builds a graph")

			logs.Reset()
			opts := graphOptions(tc.openMax, &logs)
			opts.ReadOnly = tc.readOnly
			ix, err = Open(dir, opts)
			require.NoError(t, err)
			assert.Equal(t, tc.wantGraph, ix.graph != nil)
			if tc.wantBuilt {
				assert.Contains(t, logs.String(), `building the dense graph" dir=`+dir+" passages=200")
			} else {
				assert.NotContains(t, logs.String(), "building the dense graph")
			}
			assertFindsItself(t, ix)
			require.NoError(t, ix.Close())
			_, err = os.Stat(snapFile(t, dir, graphFile))
			assert.Equal(t, tc.wantFile, err == nil, "graph file: %v", err)
			_, err = os.Stat(snapFile(t, dir, vectorsFile))
			assert.Equal(t, !tc.wantFile, err == nil, "vectors file: %v", err)
		})
	}
}

// toGraphOnlyFormat rewrites a closed index into format 1, whose vectors
// lived only in the graph file, as the code before dense.vec wrote it.
func toGraphOnlyFormat(t *testing.T, dir string) {
	t.Helper()
	toPlainFormat(t, dir)
	vecs, _, err := readVectors(filepath.Join(dir, vectorsFile))
	require.NoError(t, err)
	g := rebuildGraph(vecs)
	require.NoError(t, writeGraph(filepath.Join(dir, graphFile), g))
	require.NoError(t, os.Remove(filepath.Join(dir, vectorsFile)))
	man, err := readManifest(dir)
	require.NoError(t, err)
	man.Version, man.GraphNodes = formatGraphVectors, g.Len()
	require.NoError(t, writeJSON(filepath.Join(dir, manifestFile), man))
}

func TestOpensGraphOnlyFormat(t *testing.T) {
	emb, tok := newSynonymEmbedder(), newWordTokenizer()
	ix, dir, corpus := buildTestIndex(t, Options{Embedder: emb, Tokenizer: tok})
	queries := []string{"bread oven", "fast car race", "sea whales", "physician medication"}
	before := map[string][]Hit{}
	for _, q := range queries {
		for _, m := range []Mode{ModeDense, ModeHybrid} {
			hits, err := ix.Search(t.Context(), q, 4, m)
			require.NoError(t, err)
			before[q+"/"+m.String()] = hits
		}
	}
	passages := ix.Stats().Manifest.Passages
	require.NoError(t, ix.Close())
	toGraphOnlyFormat(t, dir)

	// Searched exactly, the old index finds what it found before; searched
	// through its graph, it reads the graph rather than building one.
	for _, exactMax := range []int{0, 1} {
		var logs bytes.Buffer
		old, err := Open(dir, Options{Embedder: emb, Tokenizer: tok, ReadOnly: true, ExactDenseMax: exactMax, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		require.NoError(t, err)
		if exactMax == 0 {
			assert.Nil(t, old.graph)
			for key, want := range before {
				q, m, _ := strings.Cut(key, "/")
				mode, err := ParseMode(m)
				require.NoError(t, err)
				got, err := old.Search(t.Context(), q, 4, mode)
				require.NoError(t, err)
				assert.Equal(t, want, got, key)
			}
		} else {
			require.NotNil(t, old.graph)
			assert.Equal(t, passages, old.graph.Len())
			assert.NotContains(t, logs.String(), "building the dense graph")
			hits, err := old.Search(t.Context(), "A doctor gave drugs for his sickness", 1, ModeDense)
			require.NoError(t, err)
			require.Len(t, hits, 1)
			assert.Equal(t, filepath.Join(corpus, "medicine.txt"), hits[0].Passage.Source)
		}
		require.NoError(t, old.Close())
	}

	// The first write moves it to the current format: the vectors get
	// their own file, and the graph, not needed, goes.
	old, err := Open(dir, Options{Embedder: emb, Tokenizer: tok})
	require.NoError(t, err)
	writeFiles(t, corpus, map[string]string{"new.txt": "A lighthouse keeper rows to town."})
	_, err = old.Add(t.Context(), corpus)
	require.NoError(t, err)
	require.NoError(t, old.Close())
	man, err := ReadManifest(dir)
	require.NoError(t, err)
	assert.Equal(t, formatVersion, man.Version)
	assert.Equal(t, passages+1, man.Passages)
	re, err := Open(dir, Options{Embedder: emb, Tokenizer: tok})
	require.NoError(t, err)
	defer re.Close()
	assertGraph(t, re, 0)
	hits, err := re.Search(t.Context(), "lighthouse keeper", 1, ModeDense)
	require.NoError(t, err)
	require.Len(t, hits, 1)
	assert.Equal(t, filepath.Join(corpus, "new.txt"), hits[0].Passage.Source)
}

func TestVectorsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), vectorsFile)
	for _, vecs := range []map[uint64][]float32{{}, randomUnitVecs(t, 50, 8, 3)} {
		require.NoError(t, writeVectors(path, 8, vecs))
		got, dims, err := readVectors(path)
		require.NoError(t, err)
		assert.Equal(t, 8, dims)
		assert.Equal(t, vecs, got)
	}

	good, err := os.ReadFile(path)
	require.NoError(t, err)
	const rec = 8 + 4*8
	tests := []struct {
		name   string
		break_ func(b []byte) []byte
		want   string
	}{
		{"another file", func(b []byte) []byte { return append([]byte("PK\x03\x04"), b[4:]...) }, "not a vectors file"},
		{"a later version", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[8:], vecVersion+1); return b }, "version 2"},
		{"truncated", func(b []byte) []byte { return b[:len(b)-1] }, "not 50 vectors"},
		{"trailing bytes", func(b []byte) []byte { return append(b, 0) }, "not 50 vectors"},
		{"a count far too large", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[16:], 1<<62); return b }, "not 4611686018427387904 vectors"},
		{"short header", func(b []byte) []byte { return b[:10] }, "header"},
		{"an id twice", func(b []byte) []byte {
			copy(b[vecHeaderSize+rec:], b[vecHeaderSize:vecHeaderSize+8])
			return b
		}, "duplicate passage id 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(path, tc.break_(bytes.Clone(good)), 0o644))
			_, _, err := readVectors(path)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
