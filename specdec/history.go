package specdec

import (
	"fmt"
	"slices"
	"sync"
)

// History is a bounded store of earlier answers that drafters draft from
// beside the current context (SAM's drafting from history in sd.npu and
// CoordGen): an owner who asks about the same mail thread twice, or
// follows a question up, gets answers that repeat much of the earlier
// ones, which the retrieved passages alone do not hold. It keeps the most
// recent sequences up to a token budget. It belongs to one daemon, is
// never sent anywhere, and is safe for concurrent use; package
// historyfile keeps it across restarts.
type History struct {
	mu        sync.Mutex
	maxTokens int
	seqs      [][]Token
	total     int
}

// NewHistory returns an empty store of at most maxTokens tokens.
func NewHistory(maxTokens int) (*History, error) {
	if maxTokens <= 0 {
		return nil, fmt.Errorf("%w: history of %d tokens", ErrInvalid, maxTokens)
	}
	return &History{maxTokens: maxTokens}, nil
}

// Add keeps a copy of seq as the most recent sequence, dropping the oldest
// ones past the budget (a sequence longer than the budget keeps its end).
func (h *History) Add(seq []Token) {
	if len(seq) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(seq) > h.maxTokens {
		seq = seq[len(seq)-h.maxTokens:]
	}
	h.seqs = append(h.seqs, slices.Clone(seq))
	h.total += len(seq)
	drop := 0
	for h.total > h.maxTokens {
		h.total -= len(h.seqs[drop])
		drop++
	}
	h.seqs = slices.Delete(h.seqs, 0, drop)
}

// Sequences are the stored sequences, oldest first. They are shared: the
// caller must not change them.
func (h *History) Sequences() [][]Token {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.seqs)
}

// Tokens is how many tokens the store holds.
func (h *History) Tokens() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.total
}
