package retrieval

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// LexicalScorer, from the analyzed terms and corpus statistics alone,
// gives every passage bleve's own score for the query, and the same upper
// bound: so a backend ranked with it orders passages as the bleve index
// does.
func TestLexicalScorerIsBleves(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{}
	for _, c := range paraphraseCorpus {
		files[c.file] = c.text
	}
	for i := range 12 {
		files[fmt.Sprintf("extra%d.txt", i)] = fmt.Sprintf("The bank raised rates %d times; the rates rose and rose. Patients, doctors and the central bank's %d nurses.", i, i*7)
	}
	writeFiles(t, filepath.Join(root, "docs"), files)
	ix, _, err := Build(t.Context(), filepath.Join(root, "idx"), Options{Tokenizer: newWordTokenizer()}, filepath.Join(root, "docs"))
	require.NoError(t, err)
	defer ix.Close()
	st := ix.corpusStats()

	df := map[string]int{}
	terms := map[uint64][]string{}
	var total int64
	for _, p := range ix.Passages() {
		ts := Terms(p.Text)
		terms[p.ID] = ts
		total += int64(len(ts))
		seen := map[string]bool{}
		for _, t := range ts {
			if !seen[t] {
				seen[t] = true
				df[t]++
			}
		}
	}
	require.Equal(t, st.terms, total, "Terms counts what the index counts")

	for _, q := range []string{
		"bank rates",
		"the central bank raised interest rates rates",
		"doctor patient antibiotics infection",
		"lava eruption",
		"a soccer club won the final",
	} {
		lex, upper, err := ix.bm25.search(t.Context(), q, 100, st)
		require.NoError(t, err)
		require.NotEmpty(t, lex, q)
		s := NewLexicalScorer(Terms(q), df, st.docs, st.terms)
		assert.InEpsilon(t, upper, s.Upper(), 1e-12, q)
		var matched int
		for _, h := range lex {
			assert.InEpsilon(t, h.score, s.Score(terms[h.id]), 1e-9, "%q: passage %d", q, h.id)
			matched++
		}
		// Passages bleve did not return hold no query term.
		for id, ts := range terms {
			if !slices.ContainsFunc(lex, func(h scored) bool { return h.id == id }) {
				assert.Zero(t, s.Score(ts), "%q: passage %d", q, id)
			}
		}
		t.Logf("%q: %d passages scored as bleve scores them", q, matched)
	}
}
