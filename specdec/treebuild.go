package specdec

import (
	"cmp"
	"math"
	"slices"
)

// Handle identifies a candidate node to its Source.
type Handle int64

// RootHandle identifies the root (the pending token).
const RootHandle Handle = 0

// Candidate is a possible child of a tree node.
type Candidate struct {
	Token Token
	// Prob estimates the chance that verification accepts this child given
	// that it reached the parent.
	Prob   float64
	Handle Handle
}

// Source proposes the children of tree nodes.
type Source interface {
	// Children appends the candidates after the node h to dst.
	Children(h Handle, dst []Candidate) []Candidate
}

// CostFunc predicts the milliseconds of a step with a tree of nodes draft
// nodes and leaves branches, e.g. CostModel.TreeCost.
type CostFunc func(nodes, leaves int) float64

// BuildTree grows a token tree greedily by expected tokens per unit of cost
// (Lever §4.2, Algorithm 1). The tree starts as the root alone: gain G = 1
// (the correction token) at cost C = cost(0, 1), plain decoding. Each round
// takes the frontier node v with the best marginal rate reach(v)/ΔC(v),
// where reach is the product of Prob along its path and ΔC the cost of one
// more node (and one more leaf, unless its parent is a leaf), and inserts it
// while that rate beats the tree's own G/C, which is exactly when the
// insertion raises G/C. So a tree is only grown when it beats plain
// decoding. At most maxNodes draft nodes in at most maxLeaves branches, at
// most maxDepth deep.
func BuildTree(src Source, root Token, cost CostFunc, maxNodes, maxLeaves, maxDepth int) *Tree {
	t := NewTree(root)
	t.Cost = cost(0, 1)
	type front struct {
		parent int
		c      Candidate
		reach  float64
	}
	hasChild := []bool{false}
	// children of a tree node, deduplicated by token (only one sibling per
	// token can ever be accepted), most likely first.
	var buf []Candidate
	expand := func(parent int, h Handle, reach float64, fr []front) []front {
		buf = src.Children(h, buf[:0])
		slices.SortStableFunc(buf, func(a, b Candidate) int { return cmp.Compare(b.Prob, a.Prob) })
		seen := map[Token]bool{}
		for _, c := range buf {
			if !seen[c.Token] && c.Prob > 0 {
				seen[c.Token] = true
				fr = append(fr, front{parent: parent, c: c, reach: reach * c.Prob})
			}
		}
		return fr
	}
	fr := expand(0, RootHandle, 1, nil)
	leaves := 1
	for t.Size() < maxNodes && len(fr) > 0 {
		best, bestRate, bestCost, bestLeaves := -1, math.Inf(-1), 0.0, 0
		for i, f := range fr {
			l := leaves
			if hasChild[f.parent] {
				l++
			}
			if l > maxLeaves {
				continue
			}
			c := cost(t.Size()+1, l)
			rate := math.Inf(1)
			if dc := c - t.Cost; dc > 0 {
				rate = f.reach / dc
			}
			if rate > bestRate {
				best, bestRate, bestCost, bestLeaves = i, rate, c, l
			}
		}
		if best < 0 || bestRate <= t.Gain/t.Cost {
			break
		}
		f := fr[best]
		fr = slices.Delete(fr, best, best+1)
		v := t.Add(f.parent, f.c.Token, f.reach)
		hasChild[f.parent] = true
		hasChild = append(hasChild, false)
		t.Gain += f.reach
		t.Cost = bestCost
		leaves = bestLeaves
		if t.Nodes[v].Depth < maxDepth {
			fr = expand(v, f.c.Handle, f.reach, fr)
		}
	}
	t.Finish()
	return t
}
