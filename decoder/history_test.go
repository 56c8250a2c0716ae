package decoder

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/testmodel"
)

// noTemplate is a model without a chat template: prompts are plain text.
type noTemplate struct{ engine.Model }

func (noTemplate) ChatPrompt([]engine.Message, bool) (string, error) {
	return "", fmt.Errorf("%w: no chat template", engine.ErrInvalidInput)
}

// singleTurnPrompt is how prompts were rendered before conversations:
// prompts without history must stay byte for byte the same.
func singleTurnPrompt(m engine.Model, system, user string) string {
	text, err := m.ChatPrompt([]engine.Message{{Role: engine.RoleSystem, Content: system}, {Role: engine.RoleUser, Content: user}}, true)
	if err != nil {
		return system + "\n\n" + user + "\n\nAnswer: "
	}
	return text
}

// secondTurnPrompt is the layout of a second turn: the first turn's user
// message and answer, then the question alone.
func secondTurnPrompt(m engine.Model, system, user, answer, query string) string {
	text, err := m.ChatPrompt([]engine.Message{
		{Role: engine.RoleSystem, Content: system}, {Role: engine.RoleUser, Content: user},
		{Role: engine.RoleAssistant, Content: answer}, {Role: engine.RoleUser, Content: "Question: " + query},
	}, true)
	if err != nil {
		return system + "\n\n" + user + "\n\nAnswer: " + answer + "\n\nQuestion: " + query + "\n\nAnswer: "
	}
	return text
}

// TestHistoryExtendsLastTurn: with the real model's ChatML template and
// with plain text, in output aggregation over 2 passages, context
// aggregation and without passages, every prompt of a chat's second turn
// begins with the first turn's prompt and answer token for token (and,
// with a template, the answer's end-of-generation token next), which is
// what lets a KV prefix cache prefill only the new turn; and without
// history the prompts are the single-turn ones. The second turn's layout
// is checked too: passages in the first user turn only.
func TestHistoryExtendsLastTurn(t *testing.T) {
	smol, err := llamacpp.Load(testmodel.Path(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer smol.Close()
	const q1, q2 = "Who lit the lamp?", "And when?"
	passages := threePassages[:2]
	withClosedBook := append(slices.Clone(passages), Passage{Score: -1, Source: "closed book"})
	models := []struct {
		name     string
		model    engine.Model
		template bool
	}{
		{"chatml", smol, true},
		{"plain", noTemplate{fake.New(fake.Config{Seed: 3, Vocab: 300})}, false},
	}
	layouts := []struct {
		name     string
		passages []Passage
		mode     Mode
		users    []string // the single-turn user message of each sequence
	}{
		{"output", passages, OutputAggregation, []string{
			"Passage:\n" + passages[0].Text + "\n\nQuestion: " + q1,
			"Passage:\n" + passages[1].Text + "\n\nQuestion: " + q1,
		}},
		{"context", passages, ContextAggregation, []string{
			"Passage 1:\n" + passages[0].Text + "\n\nPassage 2:\n" + passages[1].Text + "\n\nQuestion: " + q1,
		}},
		{"no passages", nil, OutputAggregation, []string{"Question: " + q1}},
		// The closed-book document (no text) is the question alone, and
		// adds nothing to a context-aggregation prompt.
		{"output, closed book", withClosedBook, OutputAggregation, []string{
			"Passage:\n" + passages[0].Text + "\n\nQuestion: " + q1,
			"Passage:\n" + passages[1].Text + "\n\nQuestion: " + q1,
			"Question: " + q1,
		}},
		{"context, closed book", withClosedBook, ContextAggregation, []string{
			"Passage 1:\n" + passages[0].Text + "\n\nPassage 2:\n" + passages[1].Text + "\n\nQuestion: " + q1,
		}},
	}
	ctx := context.Background()
	for _, m := range models {
		d, err := New(m.model, Options{MaxPassages: 3, CtxPerSeq: 512})
		require.NoError(t, err)
		defer d.Close()
		for _, l := range layouts {
			t.Run(m.name+"/"+l.name, func(t *testing.T) {
				d.SetHistory(nil)
				turn1, err := d.Generate(ctx, Request{Query: q1, Passages: l.passages, MaxTokens: 12, Context: l.mode == ContextAggregation}, nil)
				require.NoError(t, err)
				require.NotEmpty(t, turn1.Text)
				require.Equal(t, len(l.users), d.Seqs())
				prompts := make([][]engine.Token, d.Seqs())
				for s, user := range l.users {
					want, err := m.model.Tokenize(singleTurnPrompt(m.model, DefaultSystem, user), true, true)
					require.NoError(t, err)
					assert.Equal(t, want, d.Prompt(s), "sequence %d without history", s)
					prompts[s] = slices.Clone(d.Prompt(s))
				}
				answer, err := m.model.Tokenize(turn1.Text, false, true)
				require.NoError(t, err)

				d.SetHistory([]engine.Message{{Role: engine.RoleUser, Content: q1}, {Role: engine.RoleAssistant, Content: turn1.Text}})
				require.NoError(t, d.StartMode(ctx, q2, l.passages, nil, l.mode))
				require.Equal(t, len(l.users), d.Seqs())
				for s, p1 := range prompts {
					p2 := d.Prompt(s)
					layout, err := m.model.Tokenize(secondTurnPrompt(m.model, DefaultSystem, l.users[s], turn1.Text, q2), true, true)
					require.NoError(t, err)
					assert.Equal(t, layout, p2, "sequence %d: turn 2's layout", s)
					want := append(slices.Clone(p1), answer...)
					require.Greater(t, len(p2), len(want), "sequence %d", s)
					assert.Equal(t, want, p2[:len(want)], "sequence %d: turn 2 extends turn 1's prompt and answer", s)
					if m.template {
						assert.True(t, m.model.IsEOG(p2[len(want)]), "sequence %d: the answer's end follows it", s)
					}
				}
			})
		}
	}
}
