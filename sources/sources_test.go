package sources

import (
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSharesOfAHandMadeMixture: two documents whose distributions are
// fixed, d1 giving the answer's token a probability 0.9 at every step and
// d2 0.1, weighed 1:3 by relevance. After the answer "a a a" the posterior
// of d1 is 0.25·0.9³ / (0.25·0.9³ + 0.75·0.1³), and one more side's
// documents only renormalise the prior.
func TestSharesOfAHandMadeMixture(t *testing.T) {
	scores := []float64{0, math.Log(3)}
	logLik := []float64{3 * math.Log(0.9), 3 * math.Log(0.1)}
	weights, shares := Shares(scores, logLik)
	require.Len(t, shares, 2)
	assert.InDeltaSlice(t, []float64{0.25, 0.75}, weights, 1e-12)
	d1 := 0.25 * 0.729 / (0.25*0.729 + 0.75*0.001)
	assert.InDelta(t, d1, shares[0], 1e-12)
	assert.InDelta(t, 1-d1, shares[1], 1e-12)

	// A third document of the other side, relevance R = ln 4 (so η_cloud =
	// 4/8), that gives each token probability 0.5.
	scores = append(scores, math.Log(4))
	logLik = append(logLik, 3*math.Log(0.5))
	weights, shares = Shares(scores, logLik)
	assert.InDeltaSlice(t, []float64{1.0 / 8, 3.0 / 8, 4.0 / 8}, weights, 1e-12)
	z := 1.0/8*0.729 + 3.0/8*0.001 + 4.0/8*0.125
	assert.InDeltaSlice(t, []float64{1.0 / 8 * 0.729 / z, 3.0 / 8 * 0.001 / z, 4.0 / 8 * 0.125 / z}, shares, 1e-12)
	var sum float64
	for _, s := range shares {
		sum += s
	}
	assert.InDelta(t, 1, sum, 1e-12)
}

func TestSharesEdgeCases(t *testing.T) {
	for name, c := range map[string]struct {
		scores, logLik  []float64
		weights, shares []float64
	}{
		"no evidence: the prior":      {[]float64{0, 0}, nil, []float64{0.5, 0.5}, []float64{0.5, 0.5}},
		"no passages":                 {nil, nil, nil, nil},
		"lengths differ":              {[]float64{0}, []float64{0, 1}, nil, nil},
		"no finite relevance":         {[]float64{math.Inf(-1)}, []float64{0}, nil, nil},
		"a passage of no weight":      {[]float64{math.Inf(-1), 0}, []float64{0, -5}, []float64{0, 1}, []float64{0, 1}},
		"every passage finds it nil":  {[]float64{0, 0}, []float64{math.Inf(-1), math.Inf(-1)}, []float64{0.5, 0.5}, []float64{0.5, 0.5}},
		"huge log-likelihoods: exact": {[]float64{0, 0}, []float64{-2000, -2001}, []float64{0.5, 0.5}, []float64{1 / (1 + math.Exp(-1)), 1 - 1/(1+math.Exp(-1))}},
	} {
		w, s := Shares(c.scores, c.logLik)
		assert.InDeltaSlice(t, c.weights, w, 1e-12, name)
		assert.InDeltaSlice(t, c.shares, s, 1e-12, name)
		assert.Equal(t, c.weights == nil, w == nil, name)
	}
}

func TestExcerpt(t *testing.T) {
	long := strings.Repeat("word ", 100)
	for name, c := range map[string]struct {
		text  string
		limit int
		want  string
	}{
		"short, spaces folded": {"  Razor\n\tAgents  2.14 ", 300, "Razor Agents 2.14"},
		"cut mid-sentence":     {". But the energy industry", 300, "But the energy industry"},
		"cut at a word":        {"the quick brown fox jumps", 13, "the quick…"},
		"no limit":             {"text", 0, ""},
		"one long word":        {strings.Repeat("x", 20), 10, strings.Repeat("x", 9) + "…"},
	} {
		assert.Equal(t, c.want, Excerpt(c.text, c.limit), name)
	}
	got := Excerpt(long, MaxExcerpt)
	assert.LessOrEqual(t, utf8.RuneCountInString(got), MaxExcerpt)
	assert.True(t, strings.HasSuffix(got, "…"))
	multi := strings.Repeat("é", 400)
	assert.Equal(t, MaxExcerpt, utf8.RuneCountInString(Excerpt(multi, MaxExcerpt)), "characters, not bytes")
	assert.True(t, utf8.ValidString(Excerpt(multi, MaxExcerpt)))
}

func TestTitle(t *testing.T) {
	for name, c := range map[string]struct {
		source string
		meta   map[string]string
		want   string
	}{
		"a mail's subject":          {"/mail/easy-ham-1-00001.eml", map[string]string{"subject": " Re: New Sequences Window ", "title": "x"}, "Re: New Sequences Window"},
		"a document's title":        {"/notes/a.md", map[string]string{"title": "Plans"}, "Plans"},
		"the file's name":           {"/notes/a.md", nil, "a.md"},
		"a message of an mbox":      {"/mail/inbox.mbox#12", nil, "inbox.mbox, message 12"},
		"a fragment, not a message": {"https://example.org/page#intro", nil, "page"},
	} {
		assert.Equal(t, c.want, Title(c.source, c.meta), name)
	}
}

func TestDocumentID(t *testing.T) {
	a, b := DocumentID("/mail/a.eml"), DocumentID("/mail/b.eml")
	assert.Equal(t, a, DocumentID("/mail/a.eml"), "stable")
	assert.NotEqual(t, a, b)
	assert.Len(t, a, 16)
}
