package specdec

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// toks spells a string as one token per byte.
func toks(s string) []Token {
	out := make([]Token, len(s))
	for i := range len(s) {
		out[i] = Token(s[i])
	}
	return out
}

func str(ts []Token) string {
	var b strings.Builder
	for _, t := range ts {
		b.WriteByte(byte(t))
	}
	return b.String()
}

func newTestDrafter(t *testing.T, mod func(*Options)) *Drafter {
	t.Helper()
	o := DefaultOptions()
	o.MaxDraft = 16
	if mod != nil {
		mod(&o)
	}
	d, err := NewDrafter(o, NewAcceptance(0.6))
	require.NoError(t, err)
	return d
}

func TestDraftFollowsLongestMatch(t *testing.T) {
	tests := []struct {
		name   string
		docs   []string
		prompt string
		answer string
		want   string
		match  int
	}{
		{"copies a passage", []string{"the cat sat on the mat."}, "Q: where? A:", " sat on", " the mat.", 7},
		{"longer match wins over frequent short one",
			[]string{"xa1 xa1 xa1", "yyxa2"}, "", "yyxa", "2", 4},
		{"most frequent continuation", []string{"ab1", "ab2", "ab1"}, "", "ab", "1", 2},
		{"recency breaks ties", []string{"ab1", "ab2"}, "", "ab", "2", 2},
		{"a loop is drafted round and round", nil, "", "hello world. hello", " world. hello wo", 5},
		{"no match", []string{"abc"}, "", "xyz", "", 0},
		{"match across prompt and answer", []string{"the capital is Paris!"}, "the capi", "tal", " is Paris!", 11},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDrafter(t, nil)
			for _, doc := range tc.docs {
				d.AddDocument(toks(doc))
			}
			d.StartAnswer(toks(tc.prompt))
			require.NoError(t, d.Append(toks(tc.answer)...))
			dr := d.Draft()
			require.Equal(t, tc.want, str(dr.Tokens))
			require.Equal(t, tc.match, dr.MatchLen)
		})
	}
}

func TestDraftIsIncremental(t *testing.T) {
	d := newTestDrafter(t, func(o *Options) { o.MaxDraft = 4 })
	d.AddDocument(toks("alpha beta gamma delta"))
	d.StartAnswer(nil)
	require.Empty(t, d.Draft().Tokens)
	for _, step := range []struct {
		add, want string
		match     int
	}{
		{"x", "", 0},
		{" beta", " gam", 5},
		{" gam", "ma d", 9},
		{"ma delta", " gam", 2}, // the passage ends; "ta" was followed by " gam"
	} {
		require.NoError(t, d.Append(toks(step.add)...))
		dr := d.Draft()
		require.Equal(t, step.want, str(dr.Tokens), "after %q", step.add)
		require.Equal(t, step.match, dr.MatchLen, "after %q", step.add)
	}
	// A document added mid-answer is used at once.
	d.AddDocument(toks("delta epsilon"))
	require.Equal(t, " eps", str(d.Draft().Tokens))
}

func TestCandidatesCountOccurrences(t *testing.T) {
	d := newTestDrafter(t, nil)
	for _, doc := range []string{"ab1", "ab2", "ab1", "zab3"} {
		d.AddDocument(toks(doc))
	}
	d.StartAnswer(toks("ab"))
	got := d.Candidates(nil)
	require.Len(t, got, 3)
	require.Equal(t, []Token{'1', '3', '2'}, []Token{got[0].Token, got[1].Token, got[2].Token}, "by weight, then recency")
	require.Equal(t, []float32{2, 1, 1}, []float32{got[0].Weight, got[1].Weight, got[2].Weight})
	require.Greater(t, got[1].Tick, got[2].Tick)
}

func TestRollbackBranches(t *testing.T) {
	d := newTestDrafter(t, nil)
	d.AddDocument(toks("one two three"))
	d.StartAnswer(toks("P"))
	require.NoError(t, d.Append(toks("one tw")...))
	require.Equal(t, "o three", str(d.Draft().Tokens))
	require.NoError(t, d.Append(toks("ins")...))
	require.Empty(t, d.Draft().Tokens)
	require.NoError(t, d.Rollback(3))
	require.Equal(t, "o three", str(d.Draft().Tokens))
	require.ErrorIs(t, d.Rollback(7), ErrInvalid, "the prompt cannot be rolled back")
	require.NoError(t, d.Rollback(6))
	d.EndAnswer()
	require.ErrorIs(t, d.Append(1), ErrInvalid)
}

func TestEarlierAnswersAreDrafted(t *testing.T) {
	d := newTestDrafter(t, nil)
	d.StartAnswer(toks("Q1"))
	require.NoError(t, d.Append(toks(" the answer is 42.")...))
	d.EndAnswer()
	d.StartAnswer(toks("Q2"))
	require.NoError(t, d.Append(toks(" the ans")...))
	require.Equal(t, "wer is 42.", str(d.Draft().Tokens))
}

func TestRepetitionLoopStaysCheap(t *testing.T) {
	// A loop makes the suffix-link chain as long as the text; the capped
	// propagation keeps this linear.
	d := newTestDrafter(t, func(o *Options) { o.MaxDraft = 8 })
	d.StartAnswer(nil)
	for range 20000 {
		require.NoError(t, d.Append('a'))
	}
	require.Equal(t, "aaaaaaaa", str(d.Draft().Tokens))
	require.Less(t, d.idx.States(), 40002)
}

// brute is the reference: every Extend is an insertion of the whole
// extended string, and a string's weight and recency come from the
// insertions it ends.
type brute struct {
	ins []insertion
}

type insertion struct {
	s    []Token
	tick uint32
	dead bool // rolled back: still recent, no longer counted
}

// insertAll inserts prefix+toks[:i+1] for each i and returns their indices.
func (b *brute) insertAll(prefix, toks []Token) []int {
	var ids []int
	for i := range toks {
		b.ins = append(b.ins, insertion{s: append(slices.Clone(prefix), toks[:i+1]...), tick: uint32(len(b.ins) + 1)})
		ids = append(ids, len(b.ins)-1)
	}
	return ids
}

// children of string w: continuations with weights and recency.
func (b *brute) children(w []Token) []Child {
	m := map[Token]*Child{}
	for _, in := range b.ins {
		n := len(in.s)
		if n < len(w)+1 || !slices.Equal(in.s[n-1-len(w):n-1], w) {
			continue
		}
		c := in.s[n-1]
		if m[c] == nil {
			m[c] = &Child{Token: c}
		}
		if !in.dead {
			m[c].Weight++
		}
		m[c].Tick = max(m[c].Tick, in.tick)
	}
	var out []Child
	for _, c := range m {
		if c.Weight > 0 {
			out = append(out, *c)
		}
	}
	slices.SortFunc(out, func(a, b Child) int {
		return cmp.Or(cmp.Compare(b.Weight, a.Weight), cmp.Compare(b.Tick, a.Tick), cmp.Compare(a.Token, b.Token))
	})
	return out
}

// match: the longest suffix of text with a continuation, at least min long.
func (b *brute) match(text []Token, minLen int) ([]Token, bool) {
	for l := len(text); l >= max(minLen, 1); l-- {
		if len(b.children(text[len(text)-l:])) > 0 {
			return text[len(text)-l:], true
		}
	}
	return nil, false
}

func (b *brute) draft(text []Token, maxLen int) []Token {
	w, ok := b.match(text, 1)
	var out []Token
	for ok && len(out) < maxLen {
		c := b.children(w)[0]
		out = append(out, c.Token)
		w, ok = b.match(append(slices.Clone(w), c.Token), minBackoff)
	}
	return out
}

func TestIndexMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	randToks := func(n, alpha int) []Token {
		out := make([]Token, n)
		for i := range out {
			out[i] = Token('a' + rng.IntN(alpha))
		}
		return out
	}
	for trial := range 60 {
		alpha := 2 + trial%4
		d := newTestDrafter(t, func(o *Options) { o.MaxDraft = 6; o.Reuse = false })
		var b brute
		for range 1 + rng.IntN(3) {
			doc := randToks(rng.IntN(40), alpha)
			d.AddDocument(doc)
			b.insertAll(nil, doc)
		}
		prompt := randToks(rng.IntN(6), alpha)
		d.StartAnswer(prompt)
		ids := b.insertAll(nil, prompt) // insertion of each answer token
		text := slices.Clone(prompt)
		for op := range 60 {
			switch r := rng.IntN(10); {
			case r < 7:
				add := randToks(1+rng.IntN(3), alpha)
				require.NoError(t, d.Append(add...))
				ids = append(ids, b.insertAll(text, add)...)
				text = append(text, add...)
			case r < 9:
				n := rng.IntN(len(text) - len(prompt) + 1)
				require.NoError(t, d.Rollback(n))
				for _, id := range ids[len(ids)-n:] {
					b.ins[id].dead = true
				}
				ids, text = ids[:len(ids)-n], text[:len(text)-n]
			default:
				doc := randToks(rng.IntN(20), alpha)
				d.AddDocument(doc)
				b.insertAll(nil, doc)
			}
			w, ok := b.match(text, 1)
			_, n := d.Match()
			require.Equal(t, len(w), n, "trial %d op %d: match of %q", trial, op, str(text))
			if ok {
				got := d.Candidates(nil)
				for i := range got {
					got[i].State = 0
				}
				require.Equal(t, b.children(w), got, "trial %d op %d", trial, op)
			}
			require.Equal(t, str(b.draft(text, 6)), str(d.Draft().Tokens), "trial %d op %d", trial, op)
		}
	}
}

func TestBestPlainLeavesCalibratedPathsOut(t *testing.T) {
	x := NewIndex()
	var s int32
	for _, tk := range toks("ab1") {
		s = x.Extend(s, tk, 1)
	}
	// "a b" is followed by "1" in the text; a calibrated path adds "2",
	// heavier, and reinforces "1" a little.
	ab, ok := x.Next(0, 'a')
	require.True(t, ok)
	ab, ok = x.Next(ab, 'b')
	require.True(t, ok)
	x.ExtendCalibrated(ab, '2', 3)
	x.ExtendCalibrated(ab, '1', 0.5)
	c, ok := x.BestPlain(ab)
	require.True(t, ok)
	require.Equal(t, Token('1'), c.Token)
	require.InDelta(t, 1, c.Weight, 1e-6, "plain weight: the text's occurrences only")
	require.True(t, x.HasPlainChildren(ab))
	two, _ := x.Next(ab, '2')
	require.False(t, x.HasPlainChildren(two))

	// Best and Children put the text's continuation before the heavier
	// calibrated one, with the calibrated evidence added to its weight.
	c, ok = x.Best(ab)
	require.True(t, ok)
	require.Equal(t, Token('1'), c.Token)
	require.InDelta(t, 1.5, c.Weight, 1e-6)
	require.False(t, c.Calibrated)
	kids := x.Children(ab, nil)
	require.Len(t, kids, 2)
	require.Equal(t, []Token{'1', '2'}, []Token{kids[0].Token, kids[1].Token})
	require.True(t, kids[1].Calibrated)
	c, ok = x.Best(two)
	require.False(t, ok, "nothing follows the calibrated token")
	_, ok = x.BestPlain(s)
	require.False(t, ok, "nothing follows the end of the text")
}
