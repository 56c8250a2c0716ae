package specdec

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestChainSourceMergesWhereTheyAgree(t *testing.T) {
	// The context proposes a→b and c; the chain a→x→y.
	inner := mapSource{
		RootHandle: {{Token: 'a', Prob: 0.6, Handle: 1}, {Token: 'c', Prob: 0.2, Handle: 2}},
		1:          {{Token: 'b', Prob: 0.5, Handle: 3}},
	}
	tr := BuildTree(NewChainSource(inner, toks("axy"), 0.7), 'r', linearCost(0.01, 0), 16, 4, 8)
	var paths []string
	for _, l := range tr.Leaves {
		paths = append(paths, str(tr.Tokens(tr.Path(l))))
	}
	require.ElementsMatch(t, []string{"ab", "axy", "c"}, paths, "one a, with the context's and the chain's children")
	for _, n := range tr.Nodes {
		if n.Token == 'a' {
			require.InDelta(t, 0.7, n.Reach, 1e-9, "a merged node is as likely as the likelier source")
		}
	}
}

func TestChainSourceAlone(t *testing.T) {
	tests := []struct {
		name  string
		inner mapSource
		chain string
		want  []string
	}{
		{"no context candidates", mapSource{}, "xyz", []string{"xyz"}},
		{"no chain", mapSource{RootHandle: {{Token: 'a', Prob: 0.6, Handle: 1}}}, "", []string{"a"}},
		{"disagreeing at once", mapSource{RootHandle: {{Token: 'a', Prob: 0.6, Handle: 1}}}, "xy", []string{"a", "xy"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := BuildTree(NewChainSource(tc.inner, toks(tc.chain), 0.9), 'r', linearCost(0.01, 0), 16, 4, 8)
			var paths []string
			for _, l := range tr.Leaves {
				if p := str(tr.Tokens(tr.Path(l))); p != "" {
					paths = append(paths, p)
				}
			}
			require.ElementsMatch(t, tc.want, paths)
		})
	}
	require.Empty(t, NewChainSource(mapSource{}, toks("x"), 0.9).Children(99, nil), "an unknown handle has no children")
}

func TestChainAccepted(t *testing.T) {
	tests := []struct {
		chain, emit   string
		acc, attempts int
	}{
		{"abc", "abx", 2, 3},  // the third compared and rejected
		{"abc", "ab", 2, 2},   // the tree ended before the third was compared
		{"abc", "abcd", 3, 3}, // all taken
		{"abc", "x", 0, 1},
		{"", "ab", 0, 0},
	}
	for _, tc := range tests {
		acc, att := ChainAccepted(toks(tc.chain), toks(tc.emit))
		require.Equal(t, tc.acc, acc, "%s against %s", tc.chain, tc.emit)
		require.Equal(t, tc.attempts, att, "%s against %s", tc.chain, tc.emit)
	}
}
