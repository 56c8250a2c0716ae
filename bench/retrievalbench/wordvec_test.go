package retrievalbench

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// axisEmbedder gives each known text a unit vector along its own axis and
// counts the texts it embedded.
type axisEmbedder struct {
	axes  map[string]int
	calls []string
}

func (a *axisEmbedder) Embed(_ context.Context, texts []string) ([][]float32, error) {
	out := make([][]float32, len(texts))
	for i, t := range texts {
		a.calls = append(a.calls, t)
		d, ok := a.axes[t]
		if !ok {
			return nil, errors.New("unknown text " + t)
		}
		out[i] = make([]float32, len(a.axes))
		out[i][d] = 1
	}
	return out, nil
}

type namedEmbedder struct {
	*axisEmbedder
	name string
}

func (n namedEmbedder) Fingerprint() string { return n.name }

func TestWordMeanEmbedder(t *testing.T) {
	model := &axisEmbedder{axes: map[string]int{"cat": 0, "dog": 1, "sea": 2, "a whole text": 3}}
	e, err := NewWordMeanEmbedder(t.Context(), model, []string{"Cat", "cat.", "dog", "sea"})
	require.NoError(t, err)
	assert.Equal(t, 3, e.Words(), "words are normalised before they are embedded, each once")
	assert.Equal(t, []string{"cat", "dog", "sea"}, model.calls)
	assert.Contains(t, e.Fingerprint(), "words=3")

	vs, err := e.Embed(t.Context(), []string{"The cat, the CAT and the dog!", "sea", "a whole text"})
	require.NoError(t, err)
	// Two cats and a dog; "the" and "and" have no vector and are left out.
	want := []float32{float32(2 / math.Sqrt(5)), float32(1 / math.Sqrt(5)), 0, 0}
	assert.InDeltaSlice(t, want, vs[0], 1e-6)
	assert.Equal(t, []float32{0, 0, 1, 0}, vs[1])
	assert.Equal(t, []float32{0, 0, 0, 1}, vs[2], "a text with no known word is embedded whole")

	path := filepath.Join(t.TempDir(), "words")
	require.NoError(t, e.Save(path))
	loaded, err := LoadWordMeanEmbedder(path, model)
	require.NoError(t, err)
	assert.Equal(t, e.Fingerprint(), loaded.Fingerprint())
	again, err := loaded.Embed(t.Context(), []string{"The cat, the CAT and the dog!", "sea", "a whole text"})
	require.NoError(t, err)
	assert.Equal(t, vs, again)
	_, err = LoadWordMeanEmbedder(path, namedEmbedder{model, "another"})
	assert.ErrorContains(t, err, "word vectors of", "another model's words")

	_, err = NewWordMeanEmbedder(t.Context(), model, []string{"...", ""})
	assert.Error(t, err, "no words")
	_, err = NewWordMeanEmbedder(t.Context(), model, []string{"unknown"})
	assert.ErrorContains(t, err, "embed words")
}
