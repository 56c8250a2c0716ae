package specdec

import (
	"fmt"
	"math/rand/v2"

	"github.com/dragon-rag/dragon/engine"
)

// Node is one token of a flattened token tree.
type Node struct {
	Token Token
	// Parent is the index of the parent node; -1 for the root.
	Parent int
	// Depth is the position offset from the root: the root (the pending
	// token) goes at KV position p, a node at p+Depth.
	Depth int
	// Branches are the branches (root-to-leaf paths, see Tree.Leaves) that
	// pass through the node, ascending. Map branch b to a KV sequence id
	// and tag the node's batch entry with the ids of all its branches.
	Branches []int
	// Reach is the estimated probability that verification reaches the node.
	Reach float64
}

// Tree is a token tree flattened for one batched verification. Nodes[0] is
// the root, the pending token; parents come before their children, so the
// nodes can go into the batch in order, one row each, row i = node i.
//
// Before decoding, every branch's sequence must hold the prefix before the
// root (engine.Context.CopySeq). After verification only the sequence of
// TreeVerdict.Branch is kept, cut by its Rollback.
type Tree struct {
	Nodes []Node
	// Leaves[b] is the leaf node ending branch b.
	Leaves []int
	// Gain is the expected number of emitted tokens (accepted + correction)
	// and Cost the predicted milliseconds of the step, as estimated when the
	// tree was built.
	Gain, Cost float64
}

// NewTree returns a tree holding only the root.
func NewTree(root Token) *Tree {
	return &Tree{Nodes: []Node{{Token: root, Parent: -1, Reach: 1}}, Gain: 1}
}

// Add appends a child of parent and returns its index.
func (t *Tree) Add(parent int, tok Token, reach float64) int {
	t.Nodes = append(t.Nodes, Node{Token: tok, Parent: parent, Depth: t.Nodes[parent].Depth + 1, Reach: reach})
	return len(t.Nodes) - 1
}

// ChainTree is the tree of a linear draft.
func ChainTree(root Token, draft []Token) *Tree {
	t := NewTree(root)
	for i, x := range draft {
		t.Add(i, x, 0)
	}
	t.Finish()
	return t
}

// Finish computes Leaves and Branches; call it after the last Add.
func (t *Tree) Finish() {
	hasChild := make([]bool, len(t.Nodes))
	for _, n := range t.Nodes[1:] {
		hasChild[n.Parent] = true
	}
	t.Leaves = t.Leaves[:0]
	for i := range t.Nodes {
		t.Nodes[i].Branches = t.Nodes[i].Branches[:0]
	}
	for i := range t.Nodes {
		if hasChild[i] {
			continue
		}
		b := len(t.Leaves)
		t.Leaves = append(t.Leaves, i)
		for j := i; j >= 0; j = t.Nodes[j].Parent {
			t.Nodes[j].Branches = append(t.Nodes[j].Branches, b)
		}
	}
}

// Size is the number of draft nodes (the root excluded).
func (t *Tree) Size() int { return len(t.Nodes) - 1 }

// Path returns the draft nodes from the root (excluded) to node i.
func (t *Tree) Path(i int) []int {
	path := make([]int, t.Nodes[i].Depth)
	for j := i; j > 0; j = t.Nodes[j].Parent {
		path[t.Nodes[j].Depth-1] = j
	}
	return path
}

// Tokens returns the tokens of the given nodes.
func (t *Tree) Tokens(nodes []int) []Token {
	out := make([]Token, len(nodes))
	for i, n := range nodes {
		out[i] = t.Nodes[n].Token
	}
	return out
}

// TreeVerdict is the outcome of verifying a tree.
type TreeVerdict struct {
	// Verdict: Accepted, Attempted and Emit as for a linear draft; Rollback
	// counts the positions to remove from the end of Branch's sequence.
	Verdict
	// Path holds the accepted nodes, root excluded.
	Path []int
	// Branch is a branch through the accepted path: keep its sequence.
	Branch int
}

func (t *Tree) children() [][]int {
	kids := make([][]int, len(t.Nodes))
	for i, n := range t.Nodes[1:] {
		kids[n.Parent] = append(kids[n.Parent], i+1)
	}
	return kids
}

// VerifyGreedy walks the tree along the target's greedy choices: argmax[i]
// is the target's choice after node i (row i).
func (t *Tree) VerifyGreedy(argmax []Token) (TreeVerdict, error) {
	if len(argmax) != len(t.Nodes) {
		return TreeVerdict{}, fmt.Errorf("%w: %d argmax rows for a tree of %d nodes", ErrInvalid, len(argmax), len(t.Nodes))
	}
	kids := t.children()
	v := 0
	var path []int
	for {
		next := -1
		for _, c := range kids[v] {
			if t.Nodes[c].Token == argmax[v] {
				next = c
				break
			}
		}
		if next < 0 {
			return t.verdict(path, kids[v] != nil, argmax[v]), nil
		}
		path = append(path, next)
		v = next
	}
}

// VerifySample is lossless speculative sampling over a tree of
// deterministic drafts. probs[i] is the processed target distribution after
// node i. At a node the children are tried in order: child c is accepted
// with probability r(c)/Σr, where r starts as p and loses each rejected
// child. Why the emitted token is distributed as p: let r have mass M and
// the next child be c. The procedure emits c with probability r(c)/M; with
// probability (M − r(c))/M it goes on with r' = r minus c, which (by
// induction on the number of children left, the base case being a plain
// sample from r/M) emits y ≠ c with probability r(y)/(M − r(c)); the
// product is r(y)/M. So each node emits from p exactly, and accepting a
// child only moves to the target's distribution after that child: the
// whole sequence is distributed as sampling from the target token by token.
// This is recursive rejection sampling (SpecInfer) with point-mass drafts.
func (t *Tree) VerifySample(probs [][]float32, rng *rand.Rand) (TreeVerdict, error) {
	if len(probs) != len(t.Nodes) {
		return TreeVerdict{}, fmt.Errorf("%w: %d distributions for a tree of %d nodes", ErrInvalid, len(probs), len(t.Nodes))
	}
	kids := t.children()
	var path []int
	var r []float32
	v := 0
	for {
		r = append(r[:0], probs[v]...)
		total := sum(r)
		if total <= 0 {
			return TreeVerdict{}, fmt.Errorf("%w: distribution of node %d has no mass", ErrInvalid, v)
		}
		mass := total
		next := -1
		for _, c := range kids[v] {
			x := t.Nodes[c].Token
			if int(x) < 0 || int(x) >= len(r) {
				return TreeVerdict{}, fmt.Errorf("%w: node token %d outside a vocabulary of %d", ErrInvalid, x, len(r))
			}
			// The second test catches rounding when x holds all that is left.
			if rng.Float64()*mass < float64(r[x]) || r[x] > 0 && mass-float64(r[x]) <= 1e-9*total {
				next = c
				break
			}
			mass -= float64(r[x])
			r[x] = 0
		}
		if next >= 0 {
			path = append(path, next)
			v = next
			continue
		}
		y, err := sample(r, mass, rng)
		if err != nil {
			// Rounding left no mass after rejections of probability ~1e-9.
			y = engine.TopK(probs[v], 1, nil)[0].Token
		}
		return t.verdict(path, kids[v] != nil, y), nil
	}
}

func (t *Tree) verdict(path []int, examined bool, next Token) TreeVerdict {
	a := len(path)
	last := 0
	if a > 0 {
		last = path[a-1]
	}
	b := t.Nodes[last].Branches[0]
	emit := append(t.Tokens(path), next)
	att := a
	if examined {
		att++
	}
	return TreeVerdict{
		Verdict: Verdict{Accepted: a, Attempted: att, Emit: emit, Rollback: t.Nodes[t.Leaves[b]].Depth - a},
		Path:    path,
		Branch:  b,
	}
}
