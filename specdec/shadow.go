package specdec

// Shadow learns acceptance from drafts that were never verified. While the
// cost model keeps speculation off, the decoder still asks the drafter for
// a draft at each plain step and offers it here; the tokens plain decoding
// then emits show how much of it verification would have accepted, exactly
// as VerifyGreedy would have judged it (or the coupled speculative sampling
// rule: a draft token is accepted when it equals the token chosen at its
// position). So no step is spent verifying a draft just to learn α, and a
// match-length bucket whose drafts turn good is noticed while speculation
// is off.
//
// One draft is shadowed at a time. A Shadow is not safe for concurrent use.
type Shadow struct {
	draft    []Token
	matchLen int
	matched  int
}

// Pending reports whether a draft is being shadowed.
func (s *Shadow) Pending() bool { return len(s.draft) > 0 }

// Offer starts shadowing d unless a draft is already pending or d is empty.
func (s *Shadow) Offer(d Draft) {
	if s.Pending() || len(d.Tokens) == 0 {
		return
	}
	s.draft = append(s.draft[:0], d.Tokens...)
	s.matchLen, s.matched = d.MatchLen, 0
}

// Emitted feeds the tokens the answer grew by, in order. When they settle
// the pending draft (a token differs from it, or all of it came true), the
// outcome is recorded in acc under the draft's match length, with the
// accepted and attempted counts a verification would have produced.
func (s *Shadow) Emitted(acc *Acceptance, toks ...Token) {
	for _, t := range toks {
		if !s.Pending() {
			return
		}
		if t != s.draft[s.matched] {
			acc.Observe(s.matchLen, s.matched, s.matched+1)
			s.Reset()
			continue
		}
		s.matched++
		if s.matched == len(s.draft) {
			acc.Observe(s.matchLen, s.matched, s.matched)
			s.Reset()
		}
	}
}

// Reset drops the pending draft unrecorded: the answer is about to change
// by other means (a verified draft, a rollback, a new generation).
func (s *Shadow) Reset() {
	s.draft = s.draft[:0]
	s.matched = 0
}
