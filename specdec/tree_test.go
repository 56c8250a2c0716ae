package specdec

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// exampleTree:
//
//	0:r ─ 1:a ─ 3:c ─ 5:e
//	    │     └ 4:d
//	    └ 2:b
func exampleTree() *Tree {
	t := NewTree('r')
	a := t.Add(0, 'a', 0.8)
	t.Add(0, 'b', 0.1)
	c := t.Add(a, 'c', 0.5)
	t.Add(a, 'd', 0.2)
	t.Add(c, 'e', 0.3)
	t.Finish()
	return t
}

func TestTreeFlattening(t *testing.T) {
	tr := exampleTree()
	require.Equal(t, []int{2, 4, 5}, tr.Leaves)
	for i, want := range []struct {
		depth, parent int
		branches      []int
	}{
		{0, -1, []int{0, 1, 2}},
		{1, 0, []int{1, 2}},
		{1, 0, []int{0}},
		{2, 1, []int{2}},
		{2, 1, []int{1}},
		{3, 3, []int{2}},
	} {
		n := tr.Nodes[i]
		require.Equal(t, want.depth, n.Depth, "node %d", i)
		require.Equal(t, want.parent, n.Parent, "node %d", i)
		require.Equal(t, want.branches, n.Branches, "node %d", i)
	}
	require.Equal(t, []int{1, 3, 5}, tr.Path(5))
	require.Equal(t, 5, tr.Size())
}

func TestTreeVerifyGreedy(t *testing.T) {
	tr := exampleTree()
	tests := []struct {
		name   string
		argmax string // target choice after each node
		emit   string
		path   []int
		branch int
		roll   int
	}{
		{"deepest branch fully", "acxexz", "acez", []int{1, 3, 5}, 2, 0},
		{"second child at depth 2", "adxxxx", "adx", []int{1, 4}, 1, 0},
		{"stop inside a branch", "acxyxx", "acy", []int{1, 3}, 2, 1},
		{"other first child", "bxqxxx", "bq", []int{2}, 0, 0},
		{"nothing accepted", "zxxxxx", "z", nil, 0, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := tr.VerifyGreedy(toks(tc.argmax))
			require.NoError(t, err)
			require.Equal(t, tc.emit, str(v.Emit))
			require.Equal(t, tc.path, v.Path)
			require.Equal(t, tc.branch, v.Branch)
			require.Equal(t, tc.roll, v.Rollback)
			require.Equal(t, len(tc.path), v.Accepted)
			require.Contains(t, tr.Nodes[tr.Leaves[v.Branch]].Branches, v.Branch)
		})
	}
	_, err := tr.VerifyGreedy(toks("ab"))
	require.ErrorIs(t, err, ErrInvalid)
}

func TestChainTreeVerifiesLikeLinear(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 500 {
		draft := make([]Token, rng.IntN(6))
		argmax := make([]Token, len(draft)+1)
		for i := range draft {
			draft[i] = Token(rng.IntN(3))
		}
		for i := range argmax {
			argmax[i] = Token(rng.IntN(3))
		}
		lin, err := VerifyGreedy(draft, argmax)
		require.NoError(t, err)
		tv, err := ChainTree(9, draft).VerifyGreedy(argmax)
		require.NoError(t, err)
		require.Equal(t, lin, tv.Verdict, "draft %v argmax %v", draft, argmax)
		require.Zero(t, tv.Branch)
	}
}

// mapSource is a candidate trie for BuildTree tests: handle h's children.
type mapSource map[Handle][]Candidate

func (m mapSource) Children(h Handle, dst []Candidate) []Candidate { return append(dst, m[h]...) }

func linearCost(perNode, perLeaf float64) CostFunc {
	return func(nodes, leaves int) float64 { return 1 + perNode*float64(nodes) + perLeaf*float64(leaves-1) }
}

func TestBuildTree(t *testing.T) {
	// Root: a likely chain a→c→e and an unlikely sibling b.
	src := mapSource{
		RootHandle: {{Token: 'b', Prob: 0.1, Handle: 2}, {Token: 'a', Prob: 0.9, Handle: 1}},
		1:          {{Token: 'c', Prob: 0.9, Handle: 3}, {Token: 'd', Prob: 0.05, Handle: 4}},
		3:          {{Token: 'e', Prob: 0.9, Handle: 5}},
		5:          {{Token: 'f', Prob: 0.9, Handle: 6}},
	}
	tokensOf := func(tr *Tree) string {
		var s []Token
		for _, n := range tr.Nodes[1:] {
			s = append(s, n.Token)
		}
		return str(s)
	}
	tests := []struct {
		name      string
		cost      CostFunc
		maxNodes  int
		maxLeaves int
		maxDepth  int
		want      string
	}{
		{"cheap nodes take everything", linearCost(0.01, 0), 10, 10, 10, "acefbd"},
		{"budget keeps the likeliest", linearCost(0.01, 0), 3, 10, 10, "ace"},
		{"depth limit", linearCost(0.01, 0), 10, 10, 2, "acbd"},
		{"leaf limit keeps the likelier branch", linearCost(0.01, 0), 10, 2, 10, "acefb"},
		{"one leaf: a chain", linearCost(0.01, 0), 10, 1, 10, "acef"},
		{"costly leaves keep a chain", linearCost(0.05, 1), 10, 10, 10, "acef"},
		{"costly nodes: plain decoding", linearCost(2, 0), 10, 10, 10, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := BuildTree(src, 'r', tc.cost, tc.maxNodes, tc.maxLeaves, tc.maxDepth)
			require.Equal(t, tc.want, tokensOf(tr))
			require.LessOrEqual(t, tr.Size(), tc.maxNodes)
			require.LessOrEqual(t, len(tr.Leaves), tc.maxLeaves)
			require.InDelta(t, tc.cost(tr.Size(), len(tr.Leaves)), tr.Cost, 1e-9)
			gain := 1.0
			for _, n := range tr.Nodes[1:] {
				gain += n.Reach
			}
			require.InDelta(t, gain, tr.Gain, 1e-9)
		})
	}
	// The greedy rule only adds what raises G/C, so the tree beats plain
	// decoding whenever it is not empty.
	tr := BuildTree(src, 'r', linearCost(0.3, 0), 10, 10, 10)
	require.NotZero(t, tr.Size())
	require.Greater(t, tr.Gain/tr.Cost, 1/linearCost(0.3, 0)(0, 1))
	require.InDelta(t, 0.9*0.9*0.9, tr.Nodes[3].Reach, 1e-9, "reach multiplies along the path")
}

func TestBuildTreeDedupesSiblings(t *testing.T) {
	src := mapSource{RootHandle: {{Token: 'a', Prob: 0.3, Handle: 1}, {Token: 'a', Prob: 0.6, Handle: 2}}}
	tr := BuildTree(src, 'r', linearCost(0.01, 0), 10, 10, 10)
	require.Equal(t, 1, tr.Size())
	require.InDelta(t, 0.6, tr.Nodes[1].Reach, 1e-9)
}
