package loadbench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
)

// counting records the passes and rows a replay decodes.
type counting struct {
	engine.Model
	calls, rows, logits int
	maxRows             int
}

func (c *counting) NewContext(o engine.ContextOptions) (engine.Context, error) {
	ctx, err := c.Model.NewContext(o)
	return &countingCtx{Context: ctx, m: c}, err
}

type countingCtx struct {
	engine.Context
	m *counting
}

func (c *countingCtx) Decode(ctx context.Context, b *engine.Batch) error {
	c.m.calls++
	c.m.rows += b.Len()
	c.m.maxRows = max(c.m.maxRows, b.Len())
	for _, e := range b.Entries {
		if e.Logits {
			c.m.logits++
		}
	}
	return c.Context.Decode(ctx, b)
}

// TestReplayDecodesEveryRowOnce: every prompt token and one row per
// passage per later token, logits where a decoder reads them, all clients
// in shared passes no larger than the batch size.
func TestReplayDecodesEveryRowOnce(t *testing.T) {
	prompt := func(n int) []engine.Token {
		p := make([]engine.Token, n)
		for i := range p {
			p[i] = engine.Token(1 + i%200)
		}
		return p
	}
	prompts := [][][]engine.Token{
		{prompt(40), prompt(30)},
		{prompt(600), prompt(20)}, // longer than a pass: split
		{prompt(10)},              // one passage only
	}
	perClient := [][]job{
		{{question: 0, tokens: 5}, {question: 2, tokens: 3}},
		{{question: 1, tokens: 4}},
		{{question: 2, tokens: 1}, {question: 0, tokens: 6}},
	}
	wantRows, wantLogits, tokens := 0, 0, 0
	for _, js := range perClient {
		for _, j := range js {
			for _, p := range prompts[j.question] {
				wantRows += len(p) + j.tokens - 1
				wantLogits += j.tokens
			}
			tokens += j.tokens
		}
	}
	m := &counting{Model: fake.New(fake.Config{Vocab: 300})}
	tps, err := Replay(context.Background(), m, prompts, perClient, 2, 1)
	require.NoError(t, err)
	assert.Positive(t, tps)
	assert.Equal(t, wantRows, m.rows)
	assert.Equal(t, wantLogits, m.logits)
	assert.LessOrEqual(t, m.maxRows, 512)
	assert.Less(t, m.calls, tokens, "clients share passes")

	_, err = Replay(context.Background(), m, prompts, [][]job{{{question: 0, tokens: 2}}}, 1, 1)
	assert.Error(t, err, "two passages where one was asked for")
}
