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
	d := newTestDrafter(t, func(o *Options) { o.ReuseBudget = 6 })
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
	d := newTestDrafter(t, nil)
	d.StartAnswer(toks("P"))
	d.Verified(toks("Xuv"), toks("Quvz"))
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
