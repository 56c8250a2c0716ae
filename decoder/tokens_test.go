package decoder

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
)

// countingModel counts tokenizations.
type countingModel struct {
	engine.Model
	calls int
}

func (m *countingModel) Tokenize(text string, addSpecial, parseSpecial bool) ([]engine.Token, error) {
	m.calls++
	return m.Model.Tokenize(text, addSpecial, parseSpecial)
}

func TestPromptTokensRemembersRecentPrompts(t *testing.T) {
	m := &countingModel{Model: fake.New(fake.Config{})}
	var p promptTokens
	want, err := m.Model.Tokenize("Passage: the tide", true, true)
	require.NoError(t, err)

	first, err := p.tokenize(m, "Passage: the tide")
	require.NoError(t, err)
	second, err := p.tokenize(m, "Passage: the tide")
	require.NoError(t, err)
	assert.Equal(t, want, first)
	assert.Equal(t, want, second)
	assert.Equal(t, 1, m.calls, "the second time comes from memory")

	// The caller owns what it gets: changing it changes nothing remembered.
	second[0] = 12345
	third, err := p.tokenize(m, "Passage: the tide")
	require.NoError(t, err)
	assert.Equal(t, want, third)
}

func TestPromptTokensIsBounded(t *testing.T) {
	m := &countingModel{Model: fake.New(fake.Config{})}
	var p promptTokens
	for i := range recentPrompts + 1 {
		_, err := p.tokenize(m, fmt.Sprintf("prompt %d", i))
		require.NoError(t, err)
	}
	assert.Len(t, p.toks, recentPrompts)
	assert.Len(t, p.order, recentPrompts)

	_, err := p.tokenize(m, fmt.Sprintf("prompt %d", recentPrompts))
	require.NoError(t, err)
	assert.Equal(t, recentPrompts+1, m.calls, "the newest is remembered")
	_, err = p.tokenize(m, "prompt 0")
	require.NoError(t, err)
	assert.Equal(t, recentPrompts+2, m.calls, "the oldest was forgotten")
}
