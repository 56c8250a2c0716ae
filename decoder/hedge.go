package decoder

import (
	"fmt"
	"slices"

	"github.com/dragon-rag/dragon/engine"
)

// Hedge branches (issue 42): an alternative answer that forks from the
// main one at a position, with another token there, and is decoded beside
// it. Each passage decodes the branch on a KV sequence of its own, which
// starts as a copy of the passage's sequence up to the fork. The branch's
// rows join whatever pass the main chain runs next (Next, Verify), one
// token per pass, so a branch costs rows, not passes. When the token the
// branch hedged turns out to be the answer's, AdoptBranch makes the branch
// the main chain with its distributions already computed; Rewind drops
// every branch.
//
// Without a unified KV buffer a copy takes the whole sequence (then the
// tail is cut), which keeps the cell layout of the main chain, so a
// branch's distributions are bit for bit those the main chain computes
// after rolling back to the hedged token (TestBranchEqualsRollback).

// branch is one live hedge branch.
type branch struct {
	fork int            // answer position of the hedged token
	toks []engine.Token // the branch's answer from fork on
	held []int          // KV positions each passage's branch sequence holds
	// next is the mixture after toks, valid when nextValid.
	next      []float32
	nextValid bool
}

// Hedges is how many branches may be live at once (Options.Hedges).
func (d *Decoder) Hedges() int { return d.opts.Hedges }

// hedgeSeq is the KV sequence of passage s in branch slot h.
func (d *Decoder) hedgeSeq(h, s int) int {
	return d.opts.MaxPassages*d.branches + h*d.opts.MaxPassages + s
}

// Fork opens a branch whose answer is the main one's first at tokens, then
// tok, and returns its slot. The main chain's KV must hold those tokens'
// prefix (any position the last Step decided qualifies).
func (d *Decoder) Fork(at int, tok engine.Token) (int, error) {
	switch {
	case d.opts.Hedges == 0:
		return 0, fmt.Errorf("decoder: %w: hedge branches are off (Options.Hedges = 0)", engine.ErrInvalidInput)
	case d.branches > 1:
		return 0, fmt.Errorf("decoder: %w: hedge branches and token trees do not mix", engine.ErrInvalidInput)
	case d.dynamic():
		return 0, fmt.Errorf("decoder: %w: hedge branches need static weights", engine.ErrInvalidInput)
	case at < 0 || at > len(d.gen):
		return 0, fmt.Errorf("decoder: %w: fork at %d of %d tokens", engine.ErrInvalidInput, at, len(d.gen))
	}
	h := slices.Index(d.hedges, nil)
	if h < 0 {
		if len(d.hedges) >= d.opts.Hedges {
			return 0, fmt.Errorf("decoder: %w: %d hedge branches are live already", engine.ErrInvalidInput, len(d.hedges))
		}
		d.hedges = append(d.hedges, nil)
		h = len(d.hedges) - 1
	}
	b := &branch{fork: at, toks: []engine.Token{tok}, held: make([]int, len(d.prompts)), next: make([]float32, d.vocab)}
	unified := d.ectx.Options().Unified
	for s, p := range d.prompts {
		keep := len(p) + at
		if d.held[s] < keep {
			return 0, d.dropSlot(h, fmt.Errorf("decoder: %w: fork at %d, but passage %d holds %d of its %d positions", engine.ErrInvalidInput, at, s, d.held[s], keep))
		}
		seq := d.hedgeSeq(h, s)
		var err error
		if unified {
			err = d.ectx.CopySeq(s, seq, 0, keep)
		} else if err = d.ectx.CopySeq(s, seq, 0, d.held[s]); err == nil {
			err = d.ectx.Truncate(seq, keep)
		}
		if err != nil {
			return 0, d.dropSlot(h, fmt.Errorf("decoder: fork passage %d: %w", s, err))
		}
		b.held[s] = keep
	}
	d.hedges[h] = b
	return h, nil
}

// Branch is slot h's answer from its fork on and the fork's position; ok
// is false for a slot without a live branch.
func (d *Decoder) Branch(h int) (fork int, toks []engine.Token, ok bool) {
	b := d.branch(h)
	if b == nil {
		return 0, nil, false
	}
	return b.fork, b.toks, true
}

// BranchNext is the mixture after slot h's tokens, when the last pass
// computed it (nil otherwise). It is owned by the decoder.
func (d *Decoder) BranchNext(h int) []float32 {
	if b := d.branch(h); b != nil && b.nextValid {
		return b.next
	}
	return nil
}

// PushBranch appends tok to slot h's answer; the next pass decodes it.
func (d *Decoder) PushBranch(h int, tok engine.Token) error {
	b := d.branch(h)
	if b == nil {
		return fmt.Errorf("decoder: %w: no branch in slot %d", engine.ErrInvalidInput, h)
	}
	if len(d.prompts[0])+b.fork+len(b.toks) >= d.opts.CtxPerSeq {
		return fmt.Errorf("decoder: %w: branch %d fills the context of %d per sequence", engine.ErrContextFull, h, d.opts.CtxPerSeq)
	}
	b.toks = append(b.toks, tok)
	b.nextValid = false
	return nil
}

// DropBranch frees slot h.
func (d *Decoder) DropBranch(h int) error {
	if d.branch(h) == nil {
		return nil
	}
	return d.dropSlot(h, nil)
}

// dropBranches frees every slot.
func (d *Decoder) dropBranches() error {
	for h := range d.hedges {
		if d.hedges[h] != nil {
			if err := d.dropSlot(h, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

func (d *Decoder) dropSlot(h int, cause error) error {
	d.hedges[h] = nil
	for s := range d.prompts {
		if err := d.ectx.Truncate(d.hedgeSeq(h, s), 0); err != nil {
			return fmt.Errorf("decoder: drop branch %d: %w", h, err)
		}
	}
	return cause
}

func (d *Decoder) branch(h int) *branch {
	if h < 0 || h >= len(d.hedges) {
		return nil
	}
	return d.hedges[h]
}

// AdoptBranch makes slot h's branch the main chain: the answer becomes
// its fork's prefix followed by its tokens, each passage's KV its branch
// sequence's, and the next distribution the branch's; every branch is
// then dropped. It is Rewind(fork, branch tokens...) without decoding
// again what the branch decoded.
func (d *Decoder) AdoptBranch(h int) error {
	b := d.branch(h)
	if b == nil {
		return fmt.Errorf("decoder: %w: no branch in slot %d", engine.ErrInvalidInput, h)
	}
	if d.drafter != nil && d.drafter.AnswerOpen() {
		if err := d.drafter.Rollback(len(d.gen) - b.fork); err != nil {
			return fmt.Errorf("decoder: %w", err)
		}
		if err := d.drafter.Append(b.toks...); err != nil {
			return fmt.Errorf("decoder: %w", err)
		}
	}
	d.shadow.Reset()
	for s := range d.prompts {
		seq := d.hedgeSeq(h, s)
		if err := d.ectx.Truncate(s, 0); err != nil {
			return fmt.Errorf("decoder: adopt branch %d: %w", h, err)
		}
		if err := d.ectx.CopySeq(seq, s, 0, b.held[s]); err != nil {
			return fmt.Errorf("decoder: adopt branch %d: %w", h, err)
		}
		d.held[s] = b.held[s]
	}
	d.gen = append(d.gen[:b.fork], b.toks...)
	d.nextValid = b.nextValid
	if b.nextValid {
		copy(d.next, b.next)
	}
	// The hedged token's terms come from the main chain's distribution at
	// the fork; the branch's later tokens are decoded again for theirs.
	d.ev.cut(b.fork)
	d.dropEpochsAfter(b.fork)
	d.bindEvidence()
	return d.dropBranches()
}

// addBranchRows adds to the pass in the making each live branch's tokens
// that its sequences do not hold yet, the last one's row producing the
// branch's next mixture; add is forward's.
func (d *Decoder) addBranchRows(add func(w rowWant, tok engine.Token, pos int, seq int) error) error {
	for h, b := range d.hedges {
		if b == nil {
			continue
		}
		for s, p := range d.prompts {
			full := len(p) + b.fork + len(b.toks)
			for pos := b.held[s]; pos < full; pos++ {
				w := rowWant{seq: s, out: -1, prow: -1}
				if pos == full-1 {
					w.hedge = h + 1
					if s == 0 {
						clear(b.next)
					}
				}
				if err := add(w, b.toks[pos-len(p)-b.fork], pos, d.hedgeSeq(h, s)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// branchesDecoded records that the pass decoded every branch's pending
// tokens (their mixtures are complete).
func (d *Decoder) branchesDecoded() {
	for _, b := range d.hedges {
		if b == nil {
			continue
		}
		for s, p := range d.prompts {
			b.held[s] = len(p) + b.fork + len(b.toks)
		}
		b.nextValid = true
	}
}

// undoBranches returns every branch sequence to what it held before a
// failed pass.
func (d *Decoder) undoBranches() error {
	for h, b := range d.hedges {
		if b == nil {
			continue
		}
		for s, n := range b.held {
			if err := d.ectx.Truncate(d.hedgeSeq(h, s), n); err != nil {
				return err
			}
		}
	}
	return nil
}
