package specdec

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
)

const passage = "Retrieval-augmented generation conditions a language model on passages " +
	"retrieved for the query. Each retrieved passage is decoded as its own sequence, " +
	"and the next-token distributions of the passages are mixed by relevance. "

func argmaxOf(m *fake.Model, h []Token) Token {
	return engine.TopK(m.Distribution(h), 1, nil)[0].Token
}

// greedyRun decodes n tokens after h one at a time: the reference.
func greedyRun(m *fake.Model, h []Token, n int) []Token {
	h = slices.Clone(h)
	for range n {
		h = append(h, argmaxOf(m, h))
	}
	return h
}

type e2e struct {
	m     *fake.Model
	seq   []Token // passage + query, as prefilled
	query []Token
	d     *Drafter
	cm    *CostModel
	stats Stats
}

func newE2E(t *testing.T, calibrate bool) *e2e {
	// A strong copy bonus: answers that copy spans of their context.
	m := fake.New(fake.Config{Seed: 11, Copy: 7, Scale: 1.5})
	p, err := m.Tokenize(passage, true, false)
	require.NoError(t, err)
	q, err := m.Tokenize("Q: what is RAG? A: Retrieval-augmented generation", false, false)
	require.NoError(t, err)
	acc := NewAcceptance(0.5)
	e := &e2e{m: m, seq: append(p, q...), query: q, cm: NewCostModel(acc, &VerifyTable{}, 8)}
	e.d, err = NewDrafter(DefaultOptions(), acc)
	require.NoError(t, err)
	id := e.d.AddDocument(e.seq)
	if calibrate {
		succ := make([][]Successor, len(e.seq))
		for i := range e.seq {
			succ[i] = SuccessorsFromTopK(engine.TopK(m.Distribution(e.seq[:i+1]), 3, nil), nil)
		}
		_, err := e.d.Calibrate(id, succ)
		require.NoError(t, err)
	}
	e.d.StartAnswer(q)
	return e
}

// linear runs speculative greedy decoding with linear drafts until n
// tokens are out, with verification costing 10 ms + 1 ms per row.
func (e *e2e) linear(t *testing.T, n int) []Token {
	h := slices.Clone(e.seq)
	for len(h) < len(e.seq)+n {
		dr := e.d.Draft()
		plan := e.cm.Choose(dr.MatchLen, len(dr.Tokens))
		draft := dr.Tokens[:plan.Gamma]
		argmax := make([]Token, len(draft)+1)
		for i := range argmax {
			argmax[i] = argmaxOf(e.m, append(slices.Clone(h), draft[:i]...))
		}
		v, err := VerifyGreedy(draft, argmax)
		require.NoError(t, err)
		e.d.Verified(draft, argmax)
		require.NoError(t, e.d.Append(v.Emit...))
		h = append(h, v.Emit...)
		e.cm.Observe(plan, Outcome{Accepted: v.Accepted, Attempted: v.Attempted, Rows: len(draft) + 1, Seqs: 1, DraftMs: 0.01, VerifyMs: float64(11 + len(draft))})
		e.stats.Record(len(draft), v.Accepted, dr.MatchLen == MatchReuse)
	}
	return h
}

// tree does the same with token trees.
func (e *e2e) tree(t *testing.T, n int) []Token {
	h := slices.Clone(e.seq)
	for len(h) < len(e.seq)+n {
		src := e.d.TreeSource()
		tr := BuildTree(src, h[len(h)-1], e.cm.TreeCost, 12, 12, 8)
		plan := e.cm.PlanTree(tr, src.MatchLen)
		argmax := make([]Token, len(tr.Nodes))
		for i := range tr.Nodes {
			argmax[i] = argmaxOf(e.m, append(slices.Clone(h), tr.Tokens(tr.Path(i))...))
		}
		v, err := tr.VerifyGreedy(argmax)
		require.NoError(t, err)
		e.d.VerifiedTree(tr, argmax, v)
		require.NoError(t, e.d.Append(v.Emit...))
		h = append(h, v.Emit...)
		e.cm.Observe(plan, Outcome{Accepted: v.Accepted, Attempted: v.Attempted, Rows: len(tr.Nodes), Seqs: len(tr.Leaves), DraftMs: 0.01, VerifyMs: float64(10 + len(tr.Nodes))})
		e.stats.Record(tr.Size(), v.Accepted, false)
	}
	return h
}

// Speculation with the fake model (which copies bigrams from its context,
// as RAG answers copy passages) must emit exactly the greedy text, in far
// fewer passes. (Calibration costs a few passes here: the fake model's
// predictions at a passage's first occurrence lack the copy bonus it gets
// when the answer repeats the passage.)
func TestSpeculativeGreedyIsLossless(t *testing.T) {
	const n = 120
	for _, tc := range []struct {
		name      string
		calibrate bool
		tree      bool
	}{
		{"linear", false, false},
		{"linear calibrated", true, false},
		{"tree", false, true},
		{"tree calibrated", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newE2E(t, tc.calibrate)
			want := greedyRun(e.m, e.seq, n)
			var got []Token
			if tc.tree {
				got = e.tree(t, n)
			} else {
				got = e.linear(t, n)
			}
			require.Equal(t, want, got[:len(want)])
			t.Logf("%d passes for %d tokens, %.2f accepted per draft, MAPE %.1f%%", e.stats.Steps, n, e.stats.MeanAccepted(), e.cm.Log.MAPE())
			require.Less(t, e.stats.Steps, uint64(n/3))
		})
	}
}
