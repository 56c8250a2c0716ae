package decoder

import (
	"context"
	"fmt"
	"time"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/sampling"
)

// The assistant (Options.Assistant) is Lever's draft model: a smaller model
// of the same tokenizer whose weights stay in memory while the target's are
// read from storage by every pass. A pass of the target then costs nearly
// the same for one row or nine, so a draft that is right more often than
// the context's pays for the assistant's own passes. It reads the same
// passages and question, follows the answer lazily (only when asked to
// draft), and drafts its own greedy continuation. Verification stays the
// target's: a draft token is kept only when it equals the target's own
// choice, so the answer is the one plain decoding gives.

// checkAssistant refuses an assistant that cannot draft for d.
func (d *Decoder) checkAssistant(a *Decoder) error {
	switch {
	case !d.opts.Spec.Enabled:
		return fmt.Errorf("decoder: %w: an assistant drafts for local speculation, which is off", engine.ErrInvalidInput)
	case a.opts.Spec.Enabled:
		return fmt.Errorf("decoder: %w: the assistant must not speculate itself", engine.ErrInvalidInput)
	case a.model.Info().Fingerprint != d.model.Info().Fingerprint:
		return fmt.Errorf("decoder: %w: the assistant's tokenizer (%s) is not the model's (%s)",
			engine.ErrInvalidInput, a.model.Info().Fingerprint, d.model.Info().Fingerprint)
	case a.opts.MaxPassages < d.opts.MaxPassages || a.opts.CtxPerSeq < d.opts.CtxPerSeq:
		return fmt.Errorf("decoder: %w: the assistant holds %d passages of %d positions, the decoder %d of %d",
			engine.ErrInvalidInput, a.opts.MaxPassages, a.opts.CtxPerSeq, d.opts.MaxPassages, d.opts.CtxPerSeq)
	}
	return nil
}

// assistantStart is a generation the assistant is still to begin: it
// prefills on the first draft asked of it, so that the answer's first
// token, decided by the target's prefill alone, does not wait for it.
type assistantStart struct {
	query    string
	passages []Passage
	mode     Mode
	system   string
	history  []engine.Message
}

// beginAssistant prefills the assistant on d's system message,
// conversation, question and passages. Sequences imported from another
// context are the target model's, so the assistant has only the passages.
func (d *Decoder) beginAssistant(ctx context.Context) error {
	a, s := d.opts.Assistant, d.assistStart
	a.system, a.history = s.system, s.history
	if err := a.StartMode(ctx, s.query, s.passages, nil, s.mode); err != nil {
		return fmt.Errorf("decoder: the assistant: %w", err)
	}
	d.assistStart = nil
	return nil
}

// assistantDraft brings the assistant up to the answer (keeping what it
// holds of it) and has it draft at most n tokens greedily, stopping after
// an end of generation. It returns the draft and the milliseconds it took,
// catching up included (the assistant's prefill is not: it is paid once).
func (d *Decoder) assistantDraft(ctx context.Context, n int) ([]engine.Token, float64, error) {
	a := d.opts.Assistant
	if d.assistStart != nil {
		if err := d.beginAssistant(ctx); err != nil {
			return nil, 0, err
		}
	}
	start := time.Now()
	k := 0
	for k < len(a.gen) && k < len(d.gen) && a.gen[k] == d.gen[k] {
		k++
	}
	if err := a.Rewind(k, d.gen[k:]...); err != nil {
		return nil, 0, fmt.Errorf("decoder: the assistant: %w", err)
	}
	n = min(n, a.Room())
	draft := make([]engine.Token, 0, n)
	for len(draft) < n {
		mix, err := a.Next(ctx)
		if err != nil {
			return nil, 0, fmt.Errorf("decoder: the assistant: %w", err)
		}
		tok := engine.Token(sampling.Argmax(mix))
		a.Push(tok)
		draft = append(draft, tok)
		if a.model.IsEOG(tok) {
			break
		}
	}
	return draft, since(start), nil
}
