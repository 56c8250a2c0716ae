package decoder

import (
	"slices"

	"github.com/dragon-rag/dragon/engine"
)

// SetHistory sets the earlier turns of the conversation (user and
// assistant messages, oldest first) of the generations that follow; nil
// clears them.
func (d *Decoder) SetHistory(h []engine.Message) { d.history = slices.Clone(h) }

// renderChat renders one sequence's prompt: the system message, then the
// history and the query as a conversation whose first user turn is led by
// context (the passages; "" for none) and whose user turns are questions.
// A turn's text is the last turn's prompt and answer followed by the new
// turn, so the last turn's KV is a prefix of this one's (the template's
// special tokens keep the answer's tokens apart from what follows).
func (d *Decoder) renderChat(system, context, query string) string {
	msgs := make([]engine.Message, 0, len(d.history)+2)
	msgs = append(msgs, engine.Message{Role: engine.RoleSystem, Content: system})
	msgs = append(msgs, d.history...)
	msgs = append(msgs, engine.Message{Role: engine.RoleUser, Content: query})
	for i, m := range msgs {
		if m.Role == engine.RoleUser {
			msgs[i].Content = context + "Question: " + m.Content
			context = ""
		}
	}
	if text, err := d.model.ChatPrompt(msgs, true); err == nil {
		return text
	}
	// Models without a template get plain text, laid out the same way.
	text := system + "\n\n"
	for _, m := range msgs[1:] {
		if m.Role == engine.RoleUser {
			text += m.Content + "\n\nAnswer: "
		} else {
			text += m.Content + "\n\n"
		}
	}
	return text
}
