package specdec

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReuseSpan(t *testing.T) {
	tests := []struct {
		name          string
		draft, argmax string
		want          string
	}{
		// x = draft, y = target's prediction at each position; e = first x≠y.
		{"fully accepted", "abcd", "abcde", ""},
		{"synonym: tail survives", "abXcde", "abYcdeZ", "cde"},
		{"missing: the run right after e", "abXde", "abQdeZ", "de"},
		{"longest run wins", "aXbYcdeWfg", "aQbRcdeSfgZ", "cde"},
		{"earliest of equal runs", "XabYcd", "QabRcdZ", "ab"},
		{"redundant: nothing agrees", "aXYZ", "aQRST", ""},
		{"mismatch at the last position", "abX", "abQZ", ""},
		{"mismatch first", "Xbc", "Qbcd", "bc"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := toks(tc.draft)
			start, end, ok := ReuseSpan(d, toks(tc.argmax))
			require.Equal(t, tc.want != "", ok)
			require.Equal(t, tc.want, str(d[start:end]))
		})
	}
}

func TestDrafterReusesRejectedTail(t *testing.T) {
	d := newTestDrafter(t, func(o *Options) { o.Reuse, o.ReuseBudget = true, 6 })
	d.StartAnswer(toks("P"))
	// A draft "XYZuvw" is rejected at X, but uvw agreed with the target.
	draft, argmax := toks("XYZuvw"), toks("QRSuvwT")
	v, err := VerifyGreedy(draft, argmax)
	require.NoError(t, err)
	d.Verified(draft, argmax)
	require.NoError(t, d.Append(v.Emit...))
	dr := d.Draft()
	require.Equal(t, "uvw", str(dr.Tokens), "nothing in the index continues the answer")
	require.Equal(t, MatchReuse, dr.MatchLen)

	// Held for at least one more step, then dropped once drafts made while
	// holding it pass the budget.
	other := toks("mn")
	d.Verified(other, toks("mnq"))
	require.Equal(t, "uvw", str(d.Draft().Tokens))
	d.Verified(other, toks("mnq"))
	d.Verified(other, toks("mnq"))
	d.Verified(other, toks("mnq"))
	require.Empty(t, d.Draft().Tokens, "8 drafted tokens > budget 6")
}

func TestDrafterDropsAbsorbedSegment(t *testing.T) {
	d := newTestDrafter(t, func(o *Options) { o.Reuse = true })
	d.StartAnswer(toks("P"))
	d.Verified(toks("Xuv"), toks("Quvz"))
	require.NoError(t, d.Append(toks("Q")...))
	dr := d.Draft()
	require.Equal(t, "uv", str(dr.Tokens))
	d.Verified(dr.Tokens, toks("uvz"))
	require.Empty(t, d.Draft().Tokens, "accepted in full, nothing left to reuse")
}

func TestDrafterPrefersBetterDraftOverReuse(t *testing.T) {
	acc := NewAcceptance(0.6)
	for range 50 {
		acc.Observe(MatchReuse, 0, 1) // reuse never works
	}
	o := DefaultOptions()
	o.Reuse = true
	d, err := NewDrafter(o, acc)
	require.NoError(t, err)
	d.AddDocument(toks("hello world"))
	d.StartAnswer(toks("hello"))
	d.Verified(toks("Xab"), toks("Qabz"))
	require.Equal(t, " wor", str(d.Draft().Tokens[:4]))

	o.Reuse = false
	d, err = NewDrafter(o, acc)
	require.NoError(t, err)
	d.StartAnswer(nil)
	d.Verified(toks("Xab"), toks("Qabz"))
	require.Empty(t, d.Draft().Tokens, "reuse off")
}

func TestDrafterOffersHeldSegmentOnlyWhereItFits(t *testing.T) {
	d := newTestDrafter(t, func(o *Options) { o.Reuse = true })
	d.StartAnswer(toks("P"))
	// "XYZuvw" rejected at X; "uvw" agreed with the target after it.
	draft, argmax := toks("XYZuvw"), toks("QRSuvwT")
	d.Verified(draft, argmax)
	require.NoError(t, d.Append(toks("Q")...))
	require.Equal(t, "uvw", str(d.Draft().Tokens), "synonym: right after the correction")

	// A plain step moves the answer on: the segment no longer fits (it
	// used to be offered at every later position until the budget ran
	// out, and was then almost never accepted).
	require.NoError(t, d.Append(toks("m")...))
	require.Empty(t, d.Draft().Tokens)
	require.NoError(t, d.Append(toks("n")...))
	require.Empty(t, d.Draft().Tokens)

	// Missing: once the answer reaches the draft token the segment
	// followed, it fits again.
	require.NoError(t, d.Append(toks("Z")...))
	dr := d.Draft()
	require.Equal(t, "uvw", str(dr.Tokens))
	require.Equal(t, OriginReuse, dr.Origin)
}

func TestDrafterDropsHeldSegmentOnceVerified(t *testing.T) {
	d := newTestDrafter(t, func(o *Options) { o.Reuse = true })
	d.StartAnswer(toks("P"))
	d.Verified(toks("Xuvw"), toks("Quvwz"))
	require.NoError(t, d.Append(toks("Q")...))
	dr := d.Draft()
	require.Equal(t, "uvw", str(dr.Tokens))
	// Two of its tokens are accepted, the third rejected: re-offered at
	// the next position it would be shifted by two.
	v, err := VerifyGreedy(dr.Tokens, toks("uvqr"))
	require.NoError(t, err)
	d.Verified(dr.Tokens, toks("uvqr"))
	require.NoError(t, d.Append(v.Emit...))
	require.Empty(t, d.Draft().Tokens)
}
