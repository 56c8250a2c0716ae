package experiments

import (
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/testmodel"
	"github.com/dragon-rag/dragon/retrieval"
)

// TestQualitySplits: a corpus where one short document repeats the
// held-out window's text word for word. Under the paper's rank split that
// document is the best hit, so the cloud holds it and the cloud's passage
// in context lets the model copy the second half; under the file split it
// falls on the device's side, and only both sides' passages together
// (context, dragon) hold it. The real model, one window, k = 0 and 1.
// The file split runs E4's default methods, which include the device's
// and the cloud's alone.
func TestQualitySplits(t *testing.T) {
	m, err := llamacpp.Load(testmodel.Path(t), llamacpp.Options{Threads: 2})
	require.NoError(t, err)
	defer m.Close()

	var long []string
	for i := range 30 {
		long = append(long, fmt.Sprintf("Lighthouse keeper number %d polished the brass lamp of tower %d before dawn.", i, 7*i+3))
	}
	words := strings.Fields(strings.Join(long, " "))
	const windowWords = 24
	window := words[2*len(words)/3 : 2*len(words)/3+windowWords]
	dir := t.TempDir()
	docs := map[string]string{
		// Sorted, the rest of the corpus is a, b, d, e: the file split
		// gives a and d to the device, b and e to the cloud.
		"a.txt": strings.Join(window, " "),
		"b.txt": "The orchestra tuned its violins while the conductor studied the score of the symphony in the dim hall.",
		"c.txt": strings.Join(words, " "), // the window's source, held out
		"d.txt": "Farmers in the valley harvest wheat in late summer and store the grain in tall wooden barns near the river.",
		"e.txt": "The spacecraft adjusted its orbit with a short burn of its engines and sent pictures of the red planet home.",
	}
	for name, text := range docs {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
	run := func(split string, methods []string) map[string]map[string]float64 {
		ppl, windows, err := Quality(t.Context(), QualityOptions{Model: m, Corpus: dir, Windows: 1, Words: windowWords,
			Passages: []int{0, 1}, Methods: methods, Threads: 2, Split: split})
		require.NoError(t, err, split)
		require.Equal(t, 1, windows)
		for method, byK := range ppl {
			assert.Equal(t, ppl["none"]["0"], byK["0"], "%s %s: no passages is the model alone", split, method)
			assert.False(t, math.IsNaN(byK["1"]) || math.IsInf(byK["1"], 0), "%s %s", split, method)
		}
		t.Logf("%s: %v", split, ppl)
		return ppl
	}
	copied := func(ppl map[string]map[string]float64, method string) bool {
		return ppl[method]["1"] < ppl["none"]["1"]/2
	}
	rank := run(SplitRank, familyMethods[1:])
	assert.True(t, copied(rank, "cloud-context"), "rank: the cloud holds the best hit")
	assert.True(t, copied(rank, "context"))
	assert.True(t, copied(rank, "dragon"))
	// E4's own methods, the default (`bench exp --only quality`).
	files := run(SplitFiles, nil)
	assert.ElementsMatch(t, qualityMethods, slices.Collect(maps.Keys(files)))
	assert.False(t, copied(files, "cloud-only"), "files: the best hit is the device's")
	assert.True(t, copied(files, "device-only"))
	assert.True(t, copied(files, "context"), "files: both sides' passages hold it")

	_, _, err = Quality(t.Context(), QualityOptions{Model: m, Corpus: dir, Windows: 1, Words: windowWords, Passages: []int{1}, Split: "halves"})
	assert.ErrorContains(t, err, `split "halves"`)
}

func TestContextPromptPutsTheMostRelevantNextToTheText(t *testing.T) {
	hit := func(text string, score float64) retrieval.Hit {
		return retrieval.Hit{Passage: retrieval.Passage{Text: text}, Score: score}
	}
	// The device's k = 2 (ranks 3, 4), then the cloud's (ranks 1, 2), as
	// the rank split hands them over.
	hits := []retrieval.Hit{hit("third", 5), hit("fourth", 4), hit("first", 9), hit("second", 7)}
	assert.Equal(t, "fourth\n\nthird\n\nsecond\n\nfirst\n\nThe text.", contextPrompt(hits, "The text."))
	assert.Equal(t, "third", hits[0].Passage.Text, "the caller's order is kept")
	assert.Equal(t, "The text.", contextPrompt(nil, "The text."))
}

// TestArticleRestsLeaveTheWindowOut: the window's article comes back as
// its words before and after the window, neither holding the window, and
// a window at the article's end leaves no empty document.
func TestArticleRestsLeaveTheWindowOut(t *testing.T) {
	corpus, out := t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(corpus, "x.txt"), []byte("one two\nthree four five six seven"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(corpus, "y.txt"), []byte("alpha beta gamma"), 0o644))
	paths, err := articleRests(corpus, out, []string{"three four", "beta gamma"}, []string{"x.txt", "y.txt"})
	require.NoError(t, err)
	require.Equal(t, []string{filepath.Join(out, "x.before.txt"), filepath.Join(out, "x.after.txt"), filepath.Join(out, "y.before.txt")}, paths)
	for i, want := range []string{"one two\n", "five six seven\n", "alpha\n"} {
		got, err := os.ReadFile(paths[i])
		require.NoError(t, err)
		assert.Equal(t, want, string(got))
	}
	_, err = articleRests(corpus, out, []string{"two four"}, []string{"x.txt"})
	assert.ErrorContains(t, err, "not found in x.txt")
}
