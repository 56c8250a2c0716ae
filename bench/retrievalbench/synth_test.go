package retrievalbench

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSynthCorpus(t *testing.T) {
	texts := []string{
		"The cat sat. The dog ran after the cat. A bird sang!",
		"The river flows to the sea. Boats sail on the river?",
	}
	m, err := LearnText(texts)
	require.NoError(t, err)
	assert.Equal(t, "The", m.words[0], "the most frequent word first")

	// Word frequencies follow the source's.
	rng := rand.New(rand.NewPCG(1, 2))
	counts := map[string]int{}
	const n = 20000
	for range n {
		counts[m.Word(rng)]++
	}
	total := 0
	for _, t := range texts {
		total += len(strings.Fields(t))
	}
	assert.InDelta(t, 3.0/float64(total), float64(counts["The"])/n, 0.01) // "The" thrice; "the" is another word
	assert.InDelta(t, 1.0/float64(total), float64(counts["cat"])/n, 0.01) // and "cat." another
	for w := range counts {
		assert.Contains(t, m.words, w)
	}

	dir := t.TempDir()
	files, err := WriteSynthCorpus(dir, m, 1000, 300, 7)
	require.NoError(t, err)
	assert.Equal(t, 4, files)
	words := 0
	for i := range files {
		b, err := os.ReadFile(filepath.Join(dir, "synth-00000"+string(rune('0'+i))+".txt"))
		require.NoError(t, err)
		first, rest, _ := strings.Cut(string(b), "\n")
		assert.Equal(t, SynthHeader, first, "every file says it is synthetic")
		words += len(strings.Fields(rest))
	}
	assert.InDelta(t, 1000, words, 30, "about the words asked for")

	again := t.TempDir()
	_, err = WriteSynthCorpus(again, m, 1000, 300, 7)
	require.NoError(t, err)
	a, _ := os.ReadFile(filepath.Join(dir, "synth-000002.txt"))
	b, _ := os.ReadFile(filepath.Join(again, "synth-000002.txt"))
	assert.Equal(t, a, b, "the same seed writes the same corpus")

	_, err = LearnText([]string{"  "})
	assert.Error(t, err)
}
