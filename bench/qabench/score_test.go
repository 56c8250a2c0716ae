package qabench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/retrievalbench"
)

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"The Eiffel Tower":           "eiffel tower",
		"  an   apple, a pear. ":     "apple pear",
		"Theatre of the Absurd":      "theatre of absurd",
		"O'Neill":                    "oneill",
		"U.S.":                       "us",
		"Wilhelm Conrad Röntgen":     "wilhelm conrad rontgen",
		"ÉCOLE «normale» supérieure": "ecole normale superieure",
		"1,000 km²":                  "1000 km2",
		"":                           "",
		"the":                        "",
		"ℌilbert Space":              "hilbert space",
		"𝐀pple":                      "apple",
		"İstanbul":                   "istanbul",
	} {
		assert.Equal(t, want, Normalize(in), "%q", in)
	}
}

func TestScores(t *testing.T) {
	cases := []struct {
		name  string
		pred  string
		golds []string
		want  Scores
	}{
		{"exact, articles and case", "the Beatles", []string{"The Beatles"}, Scores{1, 1, 1}},
		{"punctuation", "Paris.", []string{"Paris"}, Scores{1, 1, 1}},
		{"unicode", "Röntgen", []string{"Rontgen"}, Scores{1, 1, 1}},
		{"second gold answer matches", "MFSK", []string{"Olivia", "MFSK"}, Scores{1, 1, 1}},
		{"sentence holding the answer", "The first prize went to Wilhelm Röntgen in 1901.", []string{"Wilhelm Röntgen"},
			Scores{0, 2 * (2.0 / 8) * 1 / (2.0/8 + 1), 1}},
		{"partial overlap, not contained", "Wilhelm", []string{"Wilhelm Conrad Röntgen"}, Scores{0, 0.5, 0}},
		{"wrong", "London", []string{"Paris", "City of Light"}, Scores{0, 0, 0}},
		{"empty answer", "", []string{"Paris"}, Scores{0, 0, 0}},
		{"answer inside a word is not contained", "Parisian", []string{"Paris"}, Scores{0, 0, 0}},
		{"repeated words count once each", "paris paris", []string{"paris"}, Scores{0, 2 * 0.5 * 1 / 1.5, 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Score(c.pred, c.golds)
			assert.Equal(t, c.want.EM, got.EM, "em")
			assert.InDelta(t, c.want.F1, got.F1, 1e-9, "f1")
			assert.Equal(t, c.want.Contained, got.Contained, "contained")
		})
	}
}

// Gold answers come from DPR's topic files, whose lines holding a double
// quote are CSV-quoted: the scorer sees the unquoted answers.
func TestScoresOfQuotedTopicLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "topics.tsv")
	require.NoError(t, os.WriteFile(path, []byte(
		"who sang \"\"yesterday\"\"\t\"['The Beatles', \"\"Paul McCartney's band\"\"]\"\n"+
			"capital of france\t['Paris']\n"), 0o644))
	qs, err := retrievalbench.LoadQuestions(path)
	require.NoError(t, err)
	require.Len(t, qs, 2)
	assert.Equal(t, []string{"The Beatles", "Paul McCartney's band"}, qs[0].Answers)
	assert.Equal(t, Scores{1, 1, 1}, Score("Paul McCartney’s band", qs[0].Answers), "a typographic apostrophe")
	// DPR's has-answer test keeps articles: "beatles" does not contain "The
	// Beatles", though it is an exact match under SQuAD's normalisation.
	assert.Equal(t, Scores{1, 1, 0}, Score("beatles", qs[0].Answers))
}

// FuzzScore: whatever the answer and the gold, the normalisation is
// idempotent, the scores are in range and consistent (an exact match has
// F1 1), and a gold answer given as the answer scores fully.
func FuzzScore(f *testing.F) {
	for _, s := range [][2]string{
		{"The Eiffel Tower", "eiffel tower"}, {"1,000 km²", "1000 km2"}, {"ℌilbert", "hilbert"},
		{"𝐀pple pie", "apple pie"}, {"İstanbul", "istanbul"}, {"", "the"}, {"Å", "a"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pred, gold string) {
		n := Normalize(pred)
		if again := Normalize(n); again != n {
			t.Fatalf("Normalize(%q) = %q, but Normalize of that is %q", pred, n, again)
		}
		s := Score(pred, []string{gold})
		if (s.EM != 0 && s.EM != 1) || (s.Contained != 0 && s.Contained != 1) || !(s.F1 >= 0 && s.F1 <= 1) {
			t.Fatalf("scores %+v out of range", s)
		}
		if s.EM == 1 && s.F1 != 1 {
			t.Fatalf("%q against %q: exact match with F1 %v", pred, gold, s.F1)
		}
		if r := F1(gold, []string{pred}); r != s.F1 {
			t.Fatalf("F1 is not symmetric: %v one way, %v the other", s.F1, r)
		}
		self := Score(gold, []string{gold})
		if self.EM != 1 || self.F1 != 1 {
			t.Fatalf("%q against itself: %+v", gold, self)
		}
		if want := len(retrievalbench.Words(gold)) > 0; (self.Contained == 1) != want {
			t.Fatalf("%q against itself: contained %v, but it has %d words", gold, self.Contained, len(retrievalbench.Words(gold)))
		}
	})
}
