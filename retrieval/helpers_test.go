package retrieval

import (
	"context"
	"errors"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
)

// wordTokenizer is a GPT-style word tokenizer: each word is one token
// carrying its leading white space, so pieces concatenate to the text.
type wordTokenizer struct {
	mu    sync.Mutex
	vocab map[string]engine.Token
	words []string
}

func newWordTokenizer() *wordTokenizer { return &wordTokenizer{vocab: map[string]engine.Token{}} }

func (w *wordTokenizer) Tokenize(text string, _, _ bool) ([]engine.Token, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []engine.Token
	for len(text) > 0 {
		i := 0
		for i < len(text) && text[i] == ' ' {
			i++
		}
		for i < len(text) && text[i] != ' ' {
			i++
		}
		word := text[:i]
		id, ok := w.vocab[word]
		if !ok {
			id = engine.Token(len(w.words))
			w.vocab[word] = id
			w.words = append(w.words, word)
		}
		out = append(out, id)
		text = text[i:]
	}
	return out, nil
}

func (w *wordTokenizer) Piece(t engine.Token) []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return []byte(w.words[t])
}

// spTokenizer mimics SentencePiece: words become "▁word" pieces rendered
// as " word", including a space the text does not have at its start, and
// runs of spaces collapse (a normalization the aligner must survive).
type spTokenizer struct{ wordTokenizer }

func (s *spTokenizer) Tokenize(text string, a, b bool) ([]engine.Token, error) {
	return s.wordTokenizer.Tokenize(" "+strings.Join(strings.Fields(text), " "), a, b)
}

// synonymEmbedder is a deterministic bag-of-concepts embedder: words are
// lower-cased, mapped through a synonym table to a concept, and hashed
// into dims buckets. Paraphrases with no word in common land close
// together, which is what dense retrieval adds over BM25.
type synonymEmbedder struct {
	dims     int
	synonyms map[string]string
	calls    int
	mu       sync.Mutex
}

func newSynonymEmbedder() *synonymEmbedder {
	groups := [][]string{
		{"doctor", "physician", "medic"},
		{"medicine", "drugs", "medication", "pills"},
		{"illness", "sickness", "disease", "ailment"},
		{"gave", "prescribed", "handed"},
		{"car", "automobile", "vehicle"},
		{"fast", "quick", "rapid", "speedy"},
		{"ocean", "sea"},
		{"money", "funds", "cash"},
	}
	syn := map[string]string{}
	for _, g := range groups {
		for _, w := range g {
			syn[w] = g[0]
		}
	}
	return &synonymEmbedder{dims: 64, synonyms: syn}
}

func (e *synonymEmbedder) Fingerprint() string { return "test-synonyms-v1" }

func (e *synonymEmbedder) Embed(_ context.Context, texts []string) ([][]float32, error) {
	e.mu.Lock()
	e.calls++
	e.mu.Unlock()
	out := make([][]float32, len(texts))
	for i, t := range texts {
		v := make([]float32, e.dims)
		v[0] = 0.01 // never the zero vector
		for _, w := range strings.FieldsFunc(strings.ToLower(t), func(r rune) bool { return !unicode.IsLetter(r) }) {
			if stop[w] {
				continue
			}
			if c, ok := e.synonyms[w]; ok {
				w = c
			}
			h := fnv.New32a()
			h.Write([]byte(w))
			v[1+int(h.Sum32())%(e.dims-1)]++
		}
		out[i] = v
	}
	return out, nil
}

var stop = map[string]bool{"the": true, "a": true, "for": true, "of": true, "and": true, "to": true, "in": true, "is": true, "was": true, "his": true, "her": true}

// writeFiles creates files under dir from name → content.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
}

func fakeModel() *fake.Model { return fake.New(fake.Config{Name: "test"}) }

// testCorpus is a small corpus of distinct topics, one file each.
var testCorpus = map[string]string{
	"birds.md": "# Birds\n\nThe quetzalcoatlus was a giant flying reptile, not a bird. " +
		"Sparrows and finches are small songbirds that eat seeds in gardens.",
	"medicine.txt": "The physician prescribed medication for the illness of the patient.",
	"cars.txt":     "An automobile with a rapid engine won the race around the track on Sunday.",
	"ocean.txt":    "Whales swim in the deep sea and sing long songs to each other.",
	"bank.txt":     "The bank keeps funds in a vault and lends cash to small businesses.",
	"notes/cooking.txt": "To bake bread, knead the dough, let it rise, then bake it in a hot oven. " +
		"Bread needs flour, water, salt and yeast.",
}

// idsOf returns the passage ids of hits, in order.
func idsOf(hits []Hit) []uint64 {
	out := make([]uint64, len(hits))
	for i, h := range hits {
		out[i] = h.Passage.ID
	}
	return out
}

// snapFile is the path of one of a closed or open index's snapshot files
// (passagesFile, filesFile, vectorsFile, graphFile) as its manifest names
// it.
func snapFile(t *testing.T, dir, base string) string {
	t.Helper()
	man, err := readManifest(dir)
	require.NoError(t, err)
	return filepath.Join(dir, man.file(base))
}

// toPlainFormat rewrites a closed index into format 2, whose snapshot
// files had fixed names and which kept no journal.
func toPlainFormat(t *testing.T, dir string) {
	t.Helper()
	man, err := readManifest(dir)
	require.NoError(t, err)
	for _, base := range []string{passagesFile, filesFile, vectorsFile, graphFile} {
		err := os.Rename(filepath.Join(dir, man.file(base)), filepath.Join(dir, base))
		if !errors.Is(err, fs.ErrNotExist) {
			require.NoError(t, err)
		}
	}
	require.NoError(t, os.Remove(filepath.Join(dir, journalFile)))
	man.Version = formatPlain
	require.NoError(t, writeJSON(filepath.Join(dir, manifestFile), man))
}
