package retrieval

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/coder/hnsw"
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

// codeOptions index passageFiles with a tiny ExactDenseMax, logging into
// logs, so that searches past it go through the codes.
func codeOptions(exactMax int, logs *bytes.Buffer) Options {
	return Options{
		Tokenizer: newWordTokenizer(), Embedder: RandomEmbedder{Dims: 32}, Chunk: ChunkOptions{Tokens: 16},
		ExactDenseMax: exactMax, CommitEvery: 64, Logger: slog.New(slog.NewTextHandler(logs, nil)),
	}
}

// assertFindsItself checks that dense search for each passage's own text
// (so its own vector) ranks that passage first, with cosine 1: searched
// through the codes too, a vector's own code is at distance 0.
func assertFindsItself(t *testing.T, ix *Index) {
	t.Helper()
	ix.mu.RLock()
	ps := make([]Passage, 0, len(ix.passages))
	for _, p := range ix.passages {
		ps = append(ps, *p)
	}
	ix.mu.RUnlock()
	require.NotEmpty(t, ps)
	for _, p := range ps {
		hits, err := ix.Search(t.Context(), p.Text, 3, ModeDense)
		require.NoError(t, err)
		require.NotEmpty(t, hits)
		if assert.Equal(t, p.ID, hits[0].Passage.ID, "passage %d", p.ID) {
			assert.InDelta(t, 1, hits[0].Cosine, 1e-5)
		}
	}
}

// assertVectorsOnDisk checks that the vectors of a checkpointed index are
// all in its vectors file, none in memory, and that no graph is written.
func assertVectorsOnDisk(t *testing.T, ix *Index, n int) {
	t.Helper()
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	assert.Equal(t, n, ix.vecs.Len())
	assert.Equal(t, n, ix.vecs.inFile)
	assert.Empty(t, ix.vecs.mem)
	assert.Zero(t, ix.vecs.tombstones())
	assert.FileExists(t, snapFile(t, ix.dir, vectorsFile))
	assert.NoFileExists(t, snapFile(t, ix.dir, graphFile))
	assert.Zero(t, ix.man.GraphNodes)
}

func TestDenseSearchThroughCodes(t *testing.T) {
	root := t.TempDir()
	corpus, more := filepath.Join(root, "corpus"), filepath.Join(root, "corpus", "more")
	writeFiles(t, corpus, passageFiles(0, 20))
	writeFiles(t, more, passageFiles(20, 400))
	var logs bytes.Buffer
	opts := codeOptions(50, &logs)

	ix, _, err := Build(t.Context(), filepath.Join(root, "index"), opts, filepath.Join(corpus, "f000.txt"))
	require.NoError(t, err)
	defer func() { ix.Close() }()
	assertVectorsOnDisk(t, ix, 2)

	// Past 50 passages, searches rank by codes; every commit writes the
	// vectors out.
	rep, err := ix.Add(t.Context(), corpus)
	require.NoError(t, err)
	require.Equal(t, 798, rep.Passages)
	assertVectorsOnDisk(t, ix, 800)
	assertFindsItself(t, ix)

	require.NoError(t, ix.Close())
	ix, err = Open(filepath.Join(root, "index"), opts)
	require.NoError(t, err)
	assertVectorsOnDisk(t, ix, 800)
	assertFindsItself(t, ix)

	// A delete takes the vectors out of searches at once, and out of the
	// file at the next checkpoint (Close makes one).
	n, err := ix.Delete(more)
	require.NoError(t, err)
	require.Equal(t, 760, n)
	assert.Equal(t, 760, ix.Stats().Tombstones)
	assertFindsItself(t, ix)
	require.NoError(t, ix.Close())
	ix, err = Open(filepath.Join(root, "index"), opts)
	require.NoError(t, err)
	assertVectorsOnDisk(t, ix, 40)
	assertFindsItself(t, ix)
}

func TestReopenWithAnotherExactDenseMax(t *testing.T) {
	for _, tc := range []struct {
		name              string
		buildMax, openMax int
		readOnly          bool
	}{
		{"exact index opened exactly", exactOnly, exactOnly, false},
		{"exact index opened to search codes", exactOnly, 50, true},
		{"codes opened to search them", 50, 50, true},
		{"codes opened exactly", 50, exactOnly, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeFiles(t, root, passageFiles(0, 100))
			dir := filepath.Join(root, "index")
			var logs bytes.Buffer
			ix, _, err := Build(t.Context(), dir, codeOptions(tc.buildMax, &logs), root)
			require.NoError(t, err)
			require.NoError(t, ix.Close())

			opts := codeOptions(tc.openMax, &logs)
			opts.ReadOnly = tc.readOnly
			ix, err = Open(dir, opts)
			require.NoError(t, err)
			assertVectorsOnDisk(t, ix, 200)
			assertFindsItself(t, ix)
			require.NoError(t, ix.Close())
		})
	}
}

// toGraphOnlyFormat rewrites a closed index into format 1, whose vectors
// lived only in the graph file, as the code before dense.vec wrote it.
func toGraphOnlyFormat(t *testing.T, dir string) {
	t.Helper()
	toPlainFormat(t, dir)
	vs, err := openVectorStore(filepath.Join(dir, vectorsFile), func(uint64) bool { return true })
	require.NoError(t, err)
	g := hnsw.NewGraph[uint64]()
	require.NoError(t, vs.each(func(i int, v []float32) { g.Add(hnsw.MakeNode(vs.ids[i], slices.Clone(v))) }))
	require.NoError(t, vs.close())
	f, err := os.Create(filepath.Join(dir, graphFile))
	require.NoError(t, err)
	require.NoError(t, g.Export(f))
	require.NoError(t, f.Close())
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

	// Opened, the old index holds its vectors in memory and finds what it
	// found before, scanned whole or through its codes.
	for _, exactMax := range []int{0, -1} {
		old, err := Open(dir, Options{Embedder: emb, Tokenizer: tok, ReadOnly: true, ExactDenseMax: exactMax})
		require.NoError(t, err)
		assert.Equal(t, passages, old.vecs.Len())
		assert.Len(t, old.vecs.mem, passages)
		for key, want := range before {
			q, m, _ := strings.Cut(key, "/")
			mode, err := ParseMode(m)
			require.NoError(t, err)
			got, err := old.Search(t.Context(), q, 4, mode)
			require.NoError(t, err)
			assert.Equal(t, want, got, key)
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
	assertVectorsOnDisk(t, re, passages+1)
	hits, err := re.Search(t.Context(), "lighthouse keeper", 1, ModeDense)
	require.NoError(t, err)
	require.Len(t, hits, 1)
	assert.Equal(t, filepath.Join(corpus, "new.txt"), hits[0].Passage.Source)
}

// storeOf returns a store of vecs, written to path and read back.
func storeOf(t *testing.T, path string, vecs map[uint64][]float32) *vectorStore {
	t.Helper()
	s := newVectorStore(0)
	for _, id := range slices.Sorted(maps.Keys(vecs)) {
		s.set(id, vecs[id])
	}
	ns, err := s.write(path)
	require.NoError(t, err)
	t.Cleanup(func() { ns.close() })
	return ns
}

func TestVectorsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), vectorsFile)
	for _, vecs := range []map[uint64][]float32{{}, randomUnitVecs(t, 50, 8, 3)} {
		storeOf(t, path, vecs)
		got, err := openVectorStore(path, func(id uint64) bool { return vecs[id] != nil })
		require.NoError(t, err)
		assert.Equal(t, len(vecs), got.Len())
		for id, want := range vecs {
			v, err := got.vector(id)
			require.NoError(t, err)
			assert.Equal(t, want, v, "passage %d", id)
		}
		require.NoError(t, got.close())
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
		{"a passage the index lacks", func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[vecHeaderSize:], 999)
			return b
		}, "passage 999, which the index does not hold"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(path, tc.break_(bytes.Clone(good)), 0o644))
			_, err := openVectorStore(path, func(id uint64) bool { return id <= 50 })
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
