package engine

import (
	"context"
	"fmt"
)

// Prefill appends tokens to sequence seq in batches of at most the context's
// batch size, asking for the logits of the last token only. On success the
// last token is row Len()-1 of b, so c.Logits(b.Len()-1, ...) gives the
// next-token logits. b is scratch storage (may be nil).
func Prefill(ctx context.Context, c Context, seq int, tokens []Token, b *Batch) (*Batch, error) {
	if len(tokens) == 0 {
		return b, fmt.Errorf("%w: empty prompt", ErrInvalidInput)
	}
	opts := c.Options()
	start := c.SeqLen(seq)
	if start+len(tokens) > opts.CtxPerSeq {
		return b, fmt.Errorf("%w: prompt of %d tokens (after %d held) exceeds the context of %d per sequence",
			ErrContextFull, len(tokens), start, opts.CtxPerSeq)
	}
	if b == nil {
		b = &Batch{}
	}
	step := opts.BatchSize
	if step <= 0 {
		step = len(tokens)
	}
	for i := 0; i < len(tokens); i += step {
		b.Reset()
		end := min(i+step, len(tokens))
		for j := i; j < end; j++ {
			b.Add(tokens[j], start+j, j == len(tokens)-1, seq)
		}
		if err := c.Decode(ctx, b); err != nil {
			// Leave the sequence as it was: all or nothing.
			if terr := c.Truncate(seq, start); terr != nil {
				return b, fmt.Errorf("prefill: %w (and rollback failed: %v)", err, terr)
			}
			return b, fmt.Errorf("prefill: %w", err)
		}
	}
	return b, nil
}
