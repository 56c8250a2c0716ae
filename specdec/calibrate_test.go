package specdec

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
)

// vocab spells words as tokens.
type vocab map[string]Token

func (v vocab) toks(s string) []Token {
	var out []Token
	for _, w := range strings.Fields(s) {
		if _, ok := v[w]; !ok {
			v[w] = Token(len(v) + 1)
		}
		out = append(out, v[w])
	}
	return out
}

func (v vocab) words(ts []Token) string {
	names := map[Token]string{}
	for w, t := range v {
		names[t] = w
	}
	var out []string
	for _, t := range ts {
		out = append(out, names[t])
	}
	return strings.Join(out, " ")
}

// The example of sd.npu Fig. 9: the context says "Clinton 's security
// detail has arrived at Des Moines", the model prefers "Clinton arrived at".
func clintonTable(v vocab, ctx []Token) [][]Successor {
	succ := make([][]Successor, len(ctx))
	succ[0] = []Successor{{v["arrived"], 0.6}, {v["'s"], 0.3}, {v["has"], 0.05}}
	succ[5] = []Successor{{v["at"], 0.9}, {v["in"], 0.08}}
	succ[6] = []Successor{{v["Des"], 0.95}}
	succ[7] = []Successor{{v["Moines"], 0.99}}
	return succ
}

func TestCalibrationNeverDisplacesTheText(t *testing.T) {
	// The model prefers "Clinton arrived" (weight 4·0.6 against 1 + 4·0.3
	// for the context's "'s"), but the context holds "Clinton 's": the
	// draft follows the text. Calibrated successors used to outvote it,
	// and on held-out RAG prompts the answers followed the text: the
	// drafts calibration changed that way got 179 tokens accepted where
	// the text's drafts would have got 511 (E5).
	for _, on := range []bool{true, false} {
		v := vocab{}
		ctx := v.toks("Clinton 's security detail has arrived at Des Moines .")
		d := newTestDrafter(t, func(o *Options) { o.Calibration = on; o.MaxDraft = 5 })
		id := d.AddDocument(ctx)
		n, err := d.Calibrate(id, clintonTable(v, ctx))
		require.NoError(t, err)
		require.Equal(t, on, n > 0)
		d.StartAnswer(v.toks("summary : Clinton"))
		dr := d.Draft()
		require.Equal(t, "'s security detail has arrived", v.words(dr.Tokens), "calibration %v", on)
		require.Equal(t, OriginLookup, dr.Origin)
		// Once the answer has taken the model's way, the calibrated path
		// (and the text after it) continues it.
		require.NoError(t, d.Append(v.toks("arrived")...))
		require.Equal(t, "at Des Moines .", v.words(d.Draft().Tokens))
	}
}

func TestCalibrationContinuesWhereTheTextEnds(t *testing.T) {
	// The prompt's last position predicts the answer's first token in the
	// very context the answer starts from: nothing in the text continues
	// it, the calibrated successor does.
	for _, on := range []bool{true, false} {
		v := vocab{}
		ctx := v.toks("question : who came ? answer")
		d := newTestDrafter(t, func(o *Options) { o.Calibration = on })
		id := d.AddDocument(ctx)
		succ := make([][]Successor, len(ctx))
		succ[len(ctx)-1] = []Successor{{v.toks("Clinton")[0], 0.8}}
		_, err := d.Calibrate(id, succ)
		require.NoError(t, err)
		d.StartAnswer(ctx)
		dr := d.Draft()
		if !on {
			require.Empty(t, dr.Tokens)
			continue
		}
		require.Equal(t, "Clinton", v.words(dr.Tokens))
		require.Equal(t, OriginCalibrated, dr.Origin)
		require.Empty(t, dr.Alt, "lookup alone proposes nothing here")
	}
}

func TestCalibrationRanksTheTextsContinuations(t *testing.T) {
	// Two passages continue "a b" differently; lookup alone takes the more
	// recent, calibration the one the model predicted.
	for _, on := range []bool{true, false} {
		v := vocab{}
		d := newTestDrafter(t, func(o *Options) { o.Calibration = on; o.MaxDraft = 1 })
		first := v.toks("a b one")
		id := d.AddDocument(first)
		d.AddDocument(v.toks("a b two"))
		_, err := d.Calibrate(id, [][]Successor{1: {{v["one"], 0.9}}})
		require.NoError(t, err)
		d.StartAnswer(v.toks("x a b"))
		dr := d.Draft()
		if !on {
			require.Equal(t, "two", v.words(dr.Tokens))
			continue
		}
		require.Equal(t, "one", v.words(dr.Tokens))
		require.Equal(t, OriginCalibrated, dr.Origin)
		require.Equal(t, "two", v.words(dr.Alt))
		require.Equal(t, "two", v.words(d.LookupDraft().Tokens))
	}
}

func TestCalibratedPathsArePure(t *testing.T) {
	v := vocab{}
	ctx := v.toks("Clinton 's security detail has arrived at Des Moines .")
	o := DefaultOptions().Calibrate
	type ins struct {
		parent int32
		tok    Token
		joint  float32
	}
	var got []ins
	c := newCalibrator(ctx, clintonTable(v, ctx), o, func(parent int32, t Token, joint float32) int32 {
		got = append(got, ins{parent, t, joint})
		return int32(1000 + len(got)) // node ids
	})
	n := c.run(func(i int) int32 { return int32(i) })
	require.Equal(t, len(got), n)
	want := []ins{
		{0, v["arrived"], 0.6}, // Sample at "Clinton"
		{1001, v["at"], 0.54},  // Search: "arrived" occurs at 5
		{1002, v["Des"], 0.513},
		{1003, v["Moines"], 0.50787}, // depth 4: stop
		{0, v["'s"], 0.3},            // "'s" at 1 has no successors; "has" < MinProb
		// The context's own positions, "in" < MinProb.
		{5, v["at"], 0.9}, {1006, v["Des"], 0.855}, {1007, v["Moines"], 0.84645},
		{6, v["Des"], 0.95}, {1009, v["Moines"], 0.9405},
		{7, v["Moines"], 0.99},
	}
	require.Len(t, got, len(want))
	for i := range want {
		require.Equal(t, want[i].parent, got[i].parent, "insertion %d", i)
		require.Equal(t, want[i].tok, got[i].tok, "insertion %d", i)
		require.InDelta(t, want[i].joint, got[i].joint, 1e-5, "insertion %d", i)
	}
}

func TestCalibrationPrefersLaterOccurrence(t *testing.T) {
	// "b" occurs at 1 and 4; from position 2 the search must read the
	// successors at 4 (after), not at 1.
	ctx := []Token{1, 2, 3, 9, 2, 5}
	succ := [][]Successor{1: {{7, 1}}, 2: {{2, 1}}, 4: {{6, 1}}}
	var got []Token
	c := newCalibrator(ctx, succ, CalibrationOptions{MinProb: 0.1, MinJoint: 0.1, MaxDepth: 2, Weight: 1, MaxOrder: 1}, func(parent int32, t Token, _ float32) int32 {
		got = append(got, t)
		return 0
	})
	c.run(func(int) int32 { return 0 })
	// pos 1: 7 (no occurrence of 7); pos 2: 2 → found at 4 → 6; pos 4: 6.
	require.Equal(t, []Token{7, 2, 6, 6}, got)
}

func TestSuccessorsFromTopK(t *testing.T) {
	top := []engine.TokenLogit{{Token: 4, Logit: 2}, {Token: 9, Logit: 1}, {Token: 1, Logit: 1}}
	got := SuccessorsFromTopK(top, nil)
	z := math.E*math.E + 2*math.E
	require.Len(t, got, 3)
	require.InDelta(t, math.E*math.E/z, got[0].Prob, 1e-6)
	require.InDelta(t, math.E/z, got[2].Prob, 1e-6)
	require.Equal(t, Token(9), got[1].Token)
	require.Empty(t, SuccessorsFromTopK(nil, got))
}

func TestCalibrateRejectsBadInput(t *testing.T) {
	d := newTestDrafter(t, nil)
	id := d.AddDocument([]Token{1, 2})
	_, err := d.Calibrate(id+1, nil)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = d.Calibrate(id, make([][]Successor, 3))
	require.ErrorIs(t, err, ErrInvalid)
}
