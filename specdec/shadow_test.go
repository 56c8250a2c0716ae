package specdec

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestShadowRecordsWhatVerificationWould(t *testing.T) {
	cases := []struct {
		name    string
		draft   []Token
		emitted []Token
		// want is the observation a verification would have made; nil: none.
		want *[2]int
	}{
		{"rejected at the third token", []Token{1, 2, 3}, []Token{1, 2, 9}, &[2]int{2, 3}},
		{"rejected at once", []Token{1, 2, 3}, []Token{7}, &[2]int{0, 1}},
		{"all accepted", []Token{1, 2, 3}, []Token{1, 2, 3}, &[2]int{3, 3}},
		{"all accepted, tokens left over", []Token{1, 2}, []Token{1, 2, 5, 6}, &[2]int{2, 2}},
		{"not settled yet", []Token{1, 2, 3}, []Token{1, 2}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, want := NewAcceptance(0.5), NewAcceptance(0.5)
			var s Shadow
			s.Offer(Draft{Tokens: c.draft, MatchLen: 5})
			for _, tok := range c.emitted {
				s.Emitted(got, tok) // one token per plain step
			}
			if c.want != nil {
				want.Observe(5, c.want[0], c.want[1])
				assert.False(t, s.Pending())
			} else {
				assert.True(t, s.Pending())
			}
			assert.Equal(t, want.Attempts(5), got.Attempts(5))
			assert.Equal(t, want.Alpha(5), got.Alpha(5))
			assert.Zero(t, got.Attempts(0), "other buckets untouched")
		})
	}
}

func TestShadowMatchesVerifyGreedy(t *testing.T) {
	// Whatever the target emits, the shadow's observation equals the
	// Verdict of verifying the draft against those choices.
	draft := []Token{4, 5, 6, 7}
	for _, emitted := range [][]Token{{4, 5, 6, 7, 8}, {4, 5, 0, 1, 2}, {0, 5, 6, 7, 8}, {4, 5, 6, 0, 8}} {
		v, err := VerifyGreedy(draft, emitted)
		assert.NoError(t, err)
		got, want := NewAcceptance(0.5), NewAcceptance(0.5)
		want.Observe(3, v.Accepted, v.Attempted)
		var s Shadow
		s.Offer(Draft{Tokens: draft, MatchLen: 3})
		s.Emitted(got, emitted...)
		assert.Equal(t, want.Alpha(3), got.Alpha(3), "emitted %v", emitted)
		assert.Equal(t, want.Attempts(3), got.Attempts(3), "emitted %v", emitted)
	}
}

func TestShadowOneDraftAtATime(t *testing.T) {
	acc := NewAcceptance(0.5)
	var s Shadow
	s.Offer(Draft{}) // empty drafts are not shadowed
	assert.False(t, s.Pending())
	s.Offer(Draft{Tokens: []Token{1, 2}, MatchLen: 1})
	s.Offer(Draft{Tokens: []Token{9}, MatchLen: 2}) // ignored: one pending
	s.Emitted(acc, 1, 2)
	assert.Equal(t, 2.0, acc.Attempts(1))
	assert.Zero(t, acc.Attempts(2))

	s.Offer(Draft{Tokens: []Token{3}, MatchLen: 2})
	s.Reset()
	s.Emitted(acc, 3)
	assert.Zero(t, acc.Attempts(2), "a reset draft is never recorded")
}
