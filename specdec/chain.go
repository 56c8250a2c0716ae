package specdec

// ChainSource adds a linear draft (a draft model's greedy continuation,
// Lever's DRAM draft) to another Source as one more branch of the tree,
// merged with it where they agree: a node both propose is one node, and
// its children are both sources' (the inner source's continuations after
// it, and the chain's next token). Merged rather than offered side by side
// because BuildTree keeps one sibling per token, and with it only one
// source's descendants.
type ChainSource struct {
	inner Source
	chain []Token
	alpha float64
	// nodes[h] is what composite handle h stands for; nodes[0] is the root.
	nodes []chainNode
	buf   []Candidate
}

type chainNode struct {
	inner    Handle
	hasInner bool
	depth    int // tokens of the chain on this node's path; -1 when off it
}

// NewChainSource offers inner's candidates and chain's tokens, each chain
// token with probability alpha of acceptance given its parent's.
func NewChainSource(inner Source, chain []Token, alpha float64) *ChainSource {
	return &ChainSource{inner: inner, chain: chain, alpha: alpha, nodes: []chainNode{{inner: RootHandle, hasInner: true}}}
}

// Children implements Source.
func (c *ChainSource) Children(h Handle, dst []Candidate) []Candidate {
	if h < 0 || int(h) >= len(c.nodes) {
		return dst
	}
	n := c.nodes[h]
	c.buf = c.buf[:0]
	if n.hasInner {
		c.buf = c.inner.Children(n.inner, c.buf)
	}
	var next Token
	onChain := n.depth >= 0 && n.depth < len(c.chain)
	if onChain {
		next = c.chain[n.depth]
	}
	for _, cand := range c.buf {
		node := chainNode{inner: cand.Handle, hasInner: true, depth: -1}
		if onChain && cand.Token == next {
			// Both propose it: one node on both paths, as likely as the
			// likelier source says.
			node.depth, cand.Prob, onChain = n.depth+1, max(cand.Prob, c.alpha), false
		}
		cand.Handle = c.add(node)
		dst = append(dst, cand)
	}
	if onChain {
		dst = append(dst, Candidate{Token: next, Prob: c.alpha, Handle: c.add(chainNode{depth: n.depth + 1})})
	}
	return dst
}

func (c *ChainSource) add(n chainNode) Handle {
	c.nodes = append(c.nodes, n)
	return Handle(len(c.nodes) - 1)
}

// ChainAccepted is how many of chain's tokens the target chose in a row
// along emit (the tokens a step emitted: its accepted path and the
// correction), and how many of them were compared: the chain's own
// acceptance, whichever branch the tree's walk took.
func ChainAccepted(chain, emit []Token) (accepted, attempted int) {
	for accepted < len(chain) && accepted < len(emit) && chain[accepted] == emit[accepted] {
		accepted++
	}
	attempted = min(len(chain), len(emit), accepted+1)
	return accepted, attempted
}
