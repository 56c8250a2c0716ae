package qabench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/retrievalbench"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

func TestSplitIsDeterministicAndTotal(t *testing.T) {
	root := t.TempDir()
	var all []string
	for _, sub := range []string{"articles", "summaries"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, sub), 0o755))
		for i := range 40 {
			p := filepath.Join(root, sub, string(rune('a'+i%26))+string(rune('0'+i/26))+".txt")
			require.NoError(t, os.WriteFile(p, []byte("text"), 0o644))
			all = append(all, p)
		}
	}
	require.NoError(t, os.WriteFile(filepath.Join(root, ".complete"), []byte("x"), 0o644))
	cloud, device, err := Split(root)
	require.NoError(t, err)
	assert.ElementsMatch(t, all, append(append([]string(nil), cloud...), device...), "every file in one half")
	assert.InDelta(t, 40, len(cloud), 15, "about half each")

	// The same files under another root split the same way.
	other := t.TempDir()
	require.NoError(t, os.CopyFS(other, os.DirFS(root)))
	cloud2, _, err := Split(other)
	require.NoError(t, err)
	require.Len(t, cloud2, len(cloud))
	for i := range cloud {
		rel1, _ := filepath.Rel(root, cloud[i])
		rel2, _ := filepath.Rel(other, cloud2[i])
		assert.Equal(t, rel1, rel2)
	}

	_, _, err = Split(t.TempDir())
	assert.ErrorContains(t, err, "make wiki")
}

func TestSampleKeepsAnswerableQuestions(t *testing.T) {
	qs := []Labelled{
		{Source: "nq", Line: 1, Question: retrievalbench.Question{Text: "who wrote hamlet", Answers: []string{"Shakespeare"}}},
		{Source: "nq", Line: 2, Question: retrievalbench.Question{Text: "capital of peru", Answers: []string{"Lima"}}},
		{Source: "nq", Line: 3, Question: retrievalbench.Question{Text: "tallest mountain", Answers: []string{"Everest", "Mount Everest"}}},
	}
	passages := []string{"Hamlet is a tragedy by William Shakespeare.", "Mount Everest is the highest mountain."}
	got, answerable := Sample(qs, passages, 10, 1)
	assert.Equal(t, 2, answerable)
	assert.Len(t, got, 2)
	for _, q := range got {
		assert.NotEqual(t, 2, q.Line, "Lima is in no passage")
	}
	one, _ := Sample(qs, passages, 1, 1)
	again, _ := Sample(qs, passages, 1, 1)
	assert.Equal(t, one, again, "the same seed draws the same questions")
}

func TestRecordsResume(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.jsonl")
	cfg := config{DeviceModel: "a.gguf", CloudModel: "b.gguf", K: 2, MaxTokens: 32, Seed: 1, System: ShortAnswer}
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, appendJSON(f, header{cfg}))
	rec := Record{Source: "nq.test.tsv", Line: 7, Mode: "dragon", Question: "q", Gold: []string{"Paris"}, Answer: "Paris", Tokens: 2, Scores: Score("Paris", []string{"Paris"})}
	require.NoError(t, appendJSON(f, rec))
	_, err = f.WriteString(`{"source":"nq.test.tsv","line":8,"mo`) // killed mid-write
	require.NoError(t, err)
	require.NoError(t, f.Close())

	done, err := readRecords(path, cfg)
	require.NoError(t, err)
	require.Len(t, done, 1, "the partial line is asked again")
	assert.Equal(t, rec, done[key("nq.test.tsv", 7, "dragon")])

	other := cfg
	other.K = 4
	_, err = readRecords(path, other)
	assert.ErrorContains(t, err, "give another --records file")
	reranked := cfg
	reranked.Weights, reranked.Candidates = "rerank", 16
	_, err = readRecords(path, reranked)
	assert.ErrorContains(t, err, "give another --records file", "re-ranked answers are not static ones")

	none, err := readRecords(filepath.Join(t.TempDir(), "missing.jsonl"), cfg)
	require.NoError(t, err)
	assert.Empty(t, none)

	q := Labelled{Source: "nq.test.tsv", Line: 7, Question: retrievalbench.Question{Text: "q", Answers: []string{"Paris"}}}
	q2 := Labelled{Source: "nq.test.tsv", Line: 9, Question: retrievalbench.Question{Text: "r", Answers: []string{"Lima"}}}
	done[key("nq.test.tsv", 9, "dragon")] = Record{Source: "nq.test.tsv", Line: 9, Mode: "dragon", Answer: "It is Lima", Tokens: 4, Scores: Score("It is Lima", []string{"Lima"}), Fallback: true}
	res := summarize(Options{Questions: []Labelled{q, q2}, Modes: []string{"dragon"}, K: 2}, cfg, done)
	assert.Equal(t, 2, res.N)
	assert.InDelta(t, 0.5, res.EM["dragon"], 1e-12)
	assert.InDelta(t, 1, res.Contained["dragon"], 1e-12)
	assert.InDelta(t, (1+0.5)/2, res.F1["dragon"], 1e-12)
	assert.Equal(t, 1, res.Fallbacks["dragon"])
}

func TestRunRefusesUnknownWeights(t *testing.T) {
	for _, o := range []Options{
		{Weights: "learned"},
		{Weights: "rerank"},
		{Weights: "rerank", RerankModel: "m.gguf"},
		{Weights: "dynamic", RerankModel: "m.gguf", RerankCandidates: 8},
		{Weights: "posterior", PosteriorEvery: 0},
		{Weights: "rerank-posterior", PosteriorEvery: 4},
	} {
		o.Modes = []string{"dragon"}
		_, err := Run(t.Context(), o)
		assert.ErrorContains(t, err, "weights", "%+v", o)
	}
}

func TestRunRefusesBadClosedBookSides(t *testing.T) {
	for _, c := range []struct {
		closedBook, sides, want string
	}{
		{"0", "edge", `closed-book sides "edge"`},
		{"", "cloud", "closed-book sides cloud without a closed-book relevance"},
	} {
		_, err := Run(t.Context(), Options{Modes: []string{"dragon"}, ClosedBook: c.closedBook, ClosedBookSides: c.sides})
		assert.ErrorContains(t, err, c.want)
	}
	for in, want := range map[string]string{"both": "", "": "", "cloud": "cloud", "device": "device"} {
		got, err := CheckClosedBook("0", in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
}

func TestCheckModes(t *testing.T) {
	require.NoError(t, CheckModes(Modes))
	assert.ErrorContains(t, CheckModes([]string{"dragon", "centralised"}), `unknown mode "centralised"`)
	assert.Error(t, CheckModes(nil))
}

func TestWriteTopicsRoundTrips(t *testing.T) {
	qs := []Labelled{
		{Source: "nq", Line: 1, Question: retrievalbench.Question{Text: "who sang \"yesterday\"", Answers: []string{"The Beatles", "Paul McCartney's band", `a\b`}}},
		{Source: "nq", Line: 2, Question: retrievalbench.Question{Text: "capital of peru", Answers: []string{"Lima"}}},
	}
	path := filepath.Join(t.TempDir(), "q.tsv")
	require.NoError(t, WriteTopics(path, qs))
	back, err := LoadTopics(path)
	require.NoError(t, err)
	require.Len(t, back, 2)
	for i := range qs {
		assert.Equal(t, qs[i].Question, back[i].Question)
		assert.Equal(t, i+1, back[i].Line)
	}
}

// TestTopSources: the largest-share source and the highest-score source
// are tested against the gold answers on their passage's whole text (the
// excerpt where the index has none), and summarize counts them over the
// answers that contain a gold answer only.
func TestTopSources(t *testing.T) {
	o := Options{
		DevicePassages: map[uint64]string{1: "The capital of Peru is Lima, on the coast."},
		CloudPassages:  map[uint64]string{1: "Paris is the capital of France.", 2: "Quito is high in the Andes."},
	}
	list := []*dragonv1.Source{
		{Side: dragonv1.Side_SIDE_CLOUD, PassageId: 2, Score: 3, Share: 0.1},
		{Side: dragonv1.Side_SIDE_DEVICE, PassageId: 1, Score: 1, Share: 0.8},
		{Side: dragonv1.Side_SIDE_CLOUD, PassageId: 1, Score: 2, Share: 0.1},
		{Side: dragonv1.Side_SIDE_DEVICE, ClosedBook: true, Score: 0, Share: 0},
	}
	recs := o.recordSources(list, []string{"Lima"})
	require.Len(t, recs, 4)
	assert.Equal(t, RecordSource{Side: "device", PassageID: 1, Score: 1, Share: 0.8, HasAnswer: true}, recs[1])
	assert.False(t, recs[3].HasAnswer, "the closed-book document holds nothing")
	byShare, byScore := topSources(recs)
	require.NotNil(t, byShare)
	assert.True(t, *byShare, "the device's passage 1 holds Lima")
	assert.False(t, *byScore, "the cloud's passage 2 does not")
	byShare, byScore = topSources(nil)
	assert.Nil(t, byShare)
	assert.Nil(t, byScore)

	yes, no := true, false
	cfg := config{K: 2}
	qs := []Labelled{
		{Source: "t", Line: 1, Question: retrievalbench.Question{Answers: []string{"Lima"}}},
		{Source: "t", Line: 2, Question: retrievalbench.Question{Answers: []string{"Lima"}}},
		{Source: "t", Line: 3, Question: retrievalbench.Question{Answers: []string{"Lima"}}},
	}
	done := map[string]Record{
		key("t", 1, "dragon"): {Scores: Score("Lima", []string{"Lima"}), TopShareHasAnswer: &yes, TopScoreHasAnswer: &no, Sources: []RecordSource{{HasAnswer: true}}},
		key("t", 2, "dragon"): {Scores: Score("Lima", []string{"Lima"}), TopShareHasAnswer: &yes, TopScoreHasAnswer: &yes},
		key("t", 3, "dragon"): {Scores: Score("Quito", []string{"Lima"}), TopShareHasAnswer: &no, TopScoreHasAnswer: &no},
	}
	res := summarize(Options{Questions: qs, Modes: []string{"dragon"}}, cfg, done)
	assert.Equal(t, 2, res.SourcesCounted["dragon"], "the wrong answer is not counted")
	assert.InDelta(t, 1, res.TopSourceContainsAnswer["dragon"], 1e-12)
	assert.InDelta(t, 0.5, res.TopScoreContainsAnswer["dragon"], 1e-12)
	assert.InDelta(t, 0.5, res.AnySourceContainsAnswer["dragon"], 1e-12, "one of the two has a source that holds it")
}
