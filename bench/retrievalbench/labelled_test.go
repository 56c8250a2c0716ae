package retrievalbench

import (
	"context"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine/fake"
	"github.com/dragon-rag/dragon/retrieval"
)

func TestLoadQuestions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.tsv")
	require.NoError(t, os.WriteFile(path, []byte(
		"who got the first nobel prize in physics\t['Wilhelm Conrad Röntgen']\n"+
			"who sings the theme song\t\"['Solange Knowles', \"\"Destiny 's Child\"\"]\"\r\n"+
			"what is it\t['it\\'s', \"O'Neil\"]\n"), 0o644))
	qs, err := LoadQuestions(path)
	require.NoError(t, err)
	assert.Equal(t, []Question{
		{"who got the first nobel prize in physics", []string{"Wilhelm Conrad Röntgen"}},
		{"who sings the theme song", []string{"Solange Knowles", "Destiny 's Child"}},
		{"what is it", []string{"it's", "O'Neil"}},
	}, qs)

	for name, line := range map[string]string{
		"no tab":       "a question ['x']\n",
		"not a list":   "q\tx\n",
		"unterminated": "q\t['x]\n",
		"no answers":   "q\t[]\n",
	} {
		require.NoError(t, os.WriteFile(path, []byte(line), 0o644))
		_, err := LoadQuestions(path)
		assert.Error(t, err, name)
	}
	_, err = LoadQuestions(filepath.Join(t.TempDir(), "absent.tsv"))
	assert.ErrorContains(t, err, "make wiki")
}

func TestHasAnswer(t *testing.T) {
	for _, tc := range []struct {
		text    string
		answers []string
		want    bool
	}{
		{"The prize went to Wilhelm Conrad Röntgen in 1901.", []string{"Wilhelm Conrad Rontgen"}, true},
		{"RÖNTGEN, WILHELM CONRAD", []string{"Wilhelm Conrad Röntgen"}, false}, // word order matters
		{"Sunset Blvd. opened", []string{"x", "Sunset Blvd"}, true},
		{"in 19010 years", []string{"1901"}, false},       // whole words only
		{"anything", []string{"?!"}, false},               // no words, no match
		{"it ends in \xf7é", []string{"ends in e"}, true}, // a stray byte: é still loses its accent
	} {
		assert.Equal(t, tc.want, HasAnswer(tc.text, tc.answers), "%q in %q", tc.answers, tc.text)
	}
	ix := NewAnswerIndex([]string{"Paris is the capital of France.", "Lyon is in France.", "the capital of Peru is Lima"})
	assert.Equal(t, []int{0, 1}, ix.Holding([]string{"France"}))
	assert.Equal(t, []int{0, 2}, ix.Holding([]string{"capital of", "Lima"}))
	assert.Empty(t, ix.Holding([]string{"capital of Spain"}))
}

// bowEmbedder hashes words into a small vector: enough for the harness.
type bowEmbedder struct{}

func (bowEmbedder) Embed(_ context.Context, texts []string) ([][]float32, error) {
	out := make([][]float32, len(texts))
	for i, t := range texts {
		v := make([]float32, 32)
		for _, w := range Words(t) {
			h := fnv.New32a()
			h.Write([]byte(w))
			v[h.Sum32()%32]++
		}
		var n float64
		for _, x := range v {
			n += float64(x * x)
		}
		for j := range v {
			v[j] /= float32(math.Sqrt(n) + 1e-9)
		}
		out[i] = v
	}
	return out, nil
}

func TestQuality(t *testing.T) {
	passages := []string{
		"Mount Etna is an active volcano on Sicily.",
		"Halley's Comet returns about every seventy-six years.",
		"The knight moves in an L shape in chess.",
		"Sourdough rises with wild yeast.",
		"Honey bees are ruled by a queen.",
		"Copper conducts electricity well.",
	}
	qs := []Question{
		{"which volcano is on Sicily", []string{"Etna"}},
		{"how often does Halley's Comet return", []string{"seventy-six years"}},
		{"what does sourdough rise with", []string{"wild yeast"}},
		{"who wrote Hamlet", []string{"Shakespeare"}}, // not in the corpus
	}
	res, err := Quality(t.Context(), QualityOptions{
		Passages: passages, Questions: qs, Pool: 4, Tokenizer: fake.New(fake.Config{}),
		Embedders: map[string]retrieval.Embedder{"bow": bowEmbedder{}}, Ks: []int{1, 3},
	})
	require.NoError(t, err)
	assert.Equal(t, 3, res.Questions)
	assert.Equal(t, 3, res.Answerable)
	assert.Equal(t, 4, res.Passages, "the 3 answers' passages and one other")
	require.Contains(t, res.Recall, "bm25")
	assert.Equal(t, 1.0, res.Recall["bm25"]["@1"], "each question shares words with its passage")
	for _, key := range []string{"bow-dense", "bow-hybrid"} {
		require.Contains(t, res.Recall, key)
		assert.Equal(t, 1.0, res.Recall[key]["@3"], key)
	}

	_, err = Quality(t.Context(), QualityOptions{Passages: passages, Questions: qs[3:], Tokenizer: fake.New(fake.Config{})})
	assert.ErrorContains(t, err, "no question's answer")

	// A re-ranker that puts every answer last undoes the first stage's
	// recall@1 and keeps its recall at the candidates' depth.
	res, err = Quality(t.Context(), QualityOptions{
		Passages: passages, Questions: qs, Pool: 4, Tokenizer: fake.New(fake.Config{}), Ks: []int{1, 3, 5},
		Embedders: map[string]retrieval.Embedder{"bow": bowEmbedder{}},
		Reranker:  answersLast{qs}, RerankCandidates: 3, RerankFirst: "bow-dense",
	})
	require.NoError(t, err)
	require.NotNil(t, res.Rerank)
	assert.Equal(t, "bow-dense", res.Rerank.FirstStage)
	assert.Equal(t, map[string]map[string]float64{
		"1": {"off": 1, "on": 0},
		"3": {"off": 1, "on": 1},
	}, res.Rerank.RecallAt, "no recall@5 from 3 candidates")
	assert.Greater(t, res.Rerank.MsPerPair, 0.0)
}

// answersLast scores a passage holding the question's answer lowest.
type answersLast struct{ qs []Question }

func (a answersLast) Score(_ context.Context, query string, passages []string) ([]float32, error) {
	out := make([]float32, len(passages))
	for _, q := range a.qs {
		if q.Text != query {
			continue
		}
		for i, p := range passages {
			if HasAnswer(p, q.Answers) {
				out[i] = -1
			}
		}
	}
	time.Sleep(time.Millisecond)
	return out, nil
}
