package retrieval

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/testmodel"
)

// paraphraseCorpus: one topic per file; each query says the same thing as
// its file with no content word in common.
var paraphraseCorpus = []struct{ file, text, query string }{
	{"medicine.txt", "The physician examined the patient and prescribed antibiotics to treat the bacterial infection. She advised rest and plenty of fluids.",
		"A doctor gave drugs to cure an illness."},
	{"astronomy.txt", "Through the telescope the astronomers observed a distant galaxy, its spiral arms full of young stars and glowing nebulae.",
		"Scientists watched faraway suns in the night sky."},
	{"baking.txt", "Knead the dough, let it rise for an hour, then bake the loaf in a hot oven until the crust turns golden.",
		"How to make bread at home."},
	{"rates.txt", "The central bank raised interest rates to curb inflation, and mortgage payments climbed for millions of homeowners.",
		"Borrowing money became more expensive as prices went up."},
	{"football.txt", "The striker scored twice in the second half, and the home team won the championship final in front of a roaring crowd.",
		"A soccer club celebrated a victory in the big match."},
	{"sailing.txt", "The sailors hoisted the sails and steered the ship through the storm toward the harbor.",
		"A boat crew crossed rough seas to reach port."},
	{"software.txt", "The programmer fixed a bug in the code that caused the application to crash when users uploaded large files.",
		"A developer repaired an error that made a computer program fail."},
	{"garden.txt", "In spring she planted tomatoes and roses, watering the garden every morning and pulling weeds by hand.",
		"Growing vegetables and flowers in the backyard."},
	{"volcano.txt", "Lava poured down the mountain after the eruption, and ash fell on villages for three days.",
		"A crater spewed molten rock and smoke."},
	{"election.txt", "Voters lined up at polling stations to choose a new president, and the ballots were counted overnight.",
		"Citizens picked their national leader."},
	{"wedding.txt", "The bride and groom exchanged rings before their families, then danced at the reception until midnight.",
		"A couple got married and celebrated with relatives."},
	{"flu.txt", "Fever, a sore throat and aching muscles kept him in bed for a week during the winter epidemic.",
		"He was sick with a seasonal virus."},
	{"piano.txt", "She practiced scales on the keyboard every evening and performed a Chopin nocturne at the recital.",
		"A musician rehearsed and played a concert."},
	{"earthquake.txt", "The ground shook violently, buildings collapsed and rescuers searched the rubble for survivors.",
		"A tremor destroyed houses and people were trapped."},
	{"train.txt", "The locomotive pulled the carriages out of the station and along the railway toward the coast.",
		"Passengers traveled by rail to the seaside."},
	{"taxes.txt", "Each April citizens file returns with the revenue service and pay what they owe on their income.",
		"People send the government a share of their earnings."},
}

// The real model's dense ranker, PoolPrompt, must rank every paraphrase's
// file first, where BM25 has no word to go on. (The first eight pairs were
// used to choose the pooling, the last eight were written afterwards and
// kept as they came; mean pooling ranks 11 of the 16 first.)
func TestRealModelDenseFindsParaphrase(t *testing.T) {
	m, err := llamacpp.Load(testmodel.Path(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	emb := NewEngineEmbedder(m, EngineEmbedderOptions{Threads: 1})
	defer emb.Close()

	dir := t.TempDir()
	files := map[string]string{}
	for _, c := range paraphraseCorpus {
		files[c.file] = c.text
	}
	writeFiles(t, filepath.Join(dir, "corpus"), files)
	ix, _, err := Build(t.Context(), filepath.Join(dir, "index"), Options{Tokenizer: m, Embedder: emb}, filepath.Join(dir, "corpus"))
	require.NoError(t, err)
	defer ix.Close()
	require.Equal(t, len(paraphraseCorpus), ix.Stats().Manifest.Passages)

	for _, c := range paraphraseCorpus {
		lex, err := ix.Search(t.Context(), c.query, 1, ModeBM25)
		require.NoError(t, err)
		if len(lex) > 0 {
			assert.NotEqual(t, c.file, filepath.Base(lex[0].Passage.Source), "%q shares a word with its file: not a paraphrase", c.query)
		}
		hits, err := ix.Search(t.Context(), c.query, 3, ModeDense)
		require.NoError(t, err)
		require.NotEmpty(t, hits)
		assert.Equal(t, c.file, filepath.Base(hits[0].Passage.Source), "%q", c.query)
		t.Logf("%-14s cosines %.3f %.3f %.3f", c.file, hits[0].Cosine, hits[1].Cosine, hits[2].Cosine)
	}
}
