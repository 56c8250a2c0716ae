package specdec

import (
	"math"
	"slices"

	"github.com/dragon-rag/dragon/engine"
)

// Successor is a likely next token after a context position, with its
// probability under the model, read from prefill logits.
type Successor struct {
	Token Token
	Prob  float32
}

// SuccessorsFromTopK turns one row of engine.Context.TopK (largest logits
// first) into successors by a softmax over those k logits. That ignores the
// rest of the vocabulary, so it overestimates the probabilities, but it
// needs no full row per prefill position; use a smaller MinProb with a
// larger k, or real probabilities when the full row is at hand anyway.
func SuccessorsFromTopK(top []engine.TokenLogit, dst []Successor) []Successor {
	dst = dst[:0]
	if len(top) == 0 {
		return dst
	}
	var z float64
	for _, t := range top {
		z += math.Exp(float64(t.Logit - top[0].Logit))
	}
	for _, t := range top {
		dst = append(dst, Successor{Token: t.Token, Prob: float32(math.Exp(float64(t.Logit-top[0].Logit)) / z)})
	}
	return dst
}

// calibrator walks the calibrated token tree of one context (sd.npu §3.3):
// the successors the model predicted at each context position (Sample),
// each extended depth-first by the successors read at an occurrence of the
// path's trailing n-gram in the context (Search), so that "Clinton" grows
// "Clinton arrived at" when the model prefers "arrived" and "arrived"
// occurs later followed by a predicted "at". Nodes are handed to insert as
// children of the context position they hang off, so the drafter sees them
// as continuations of every suffix of that context prefix.
type calibrator struct {
	ctx  []Token
	succ [][]Successor
	o    CalibrationOptions
	// ends[k-1] maps an order-k n-gram hash to the ascending positions where
	// such an n-gram ends (hash collisions are filtered by comparing tokens).
	ends   []map[uint64][]int32
	insert func(parent int32, t Token, joint float32) int32
	nodes  int
}

func newCalibrator(ctx []Token, succ [][]Successor, o CalibrationOptions, insert func(int32, Token, float32) int32) *calibrator {
	c := &calibrator{ctx: ctx, succ: succ, o: o, insert: insert, ends: make([]map[uint64][]int32, o.MaxOrder)}
	for k := range c.ends {
		c.ends[k] = make(map[uint64][]int32)
	}
	for j := range ctx {
		for k := 1; k <= min(o.MaxOrder, j+1); k++ {
			h := ngramHash(ctx[j-k+1 : j+1])
			c.ends[k-1][h] = append(c.ends[k-1][h], int32(j))
		}
	}
	return c
}

func ngramHash(g []Token) uint64 {
	h := uint64(14695981039346656037)
	for _, t := range g {
		h = (h ^ uint64(uint32(t))) * 1099511628211
	}
	return h
}

// run calibrates every position i < len(succ); at(i) is the state of the
// context prefix ending at position i.
func (c *calibrator) run(at func(i int) int32) int {
	for i := range min(len(c.ctx), len(c.succ)) {
		tail := c.ctx[max(0, i+1-c.o.MaxOrder) : i+1]
		c.expand(at(i), tail, i, 1, 1)
	}
	return c.nodes
}

// expand inserts the successors read at position pos below parent. tail is
// the path's trailing tokens; depth counts calibrated tokens.
func (c *calibrator) expand(parent int32, tail []Token, pos int, joint float32, depth int) {
	if pos >= len(c.succ) {
		return
	}
	for _, s := range c.succ[pos] {
		j := joint * s.Prob
		if s.Prob < c.o.MinProb || j < c.o.MinJoint {
			continue
		}
		node := c.insert(parent, s.Token, j)
		c.nodes++
		if depth >= c.o.MaxDepth {
			continue
		}
		next := append(slices.Clone(tail[max(0, len(tail)+1-c.o.MaxOrder):]), s.Token)
		if q, ok := c.find(next, pos); ok {
			c.expand(node, next, q, j, depth+1)
		}
	}
}

// find locates where to read the successors of a path ending in tail: the
// end of the longest trailing n-gram of tail that occurs in the context,
// preferring the first occurrence after pos (text read on), else the last
// before it.
func (c *calibrator) find(tail []Token, pos int) (int, bool) {
	for k := len(tail); k >= 1; k-- {
		g := tail[len(tail)-k:]
		ends := c.ends[k-1][ngramHash(g)]
		ok := func(j int32) bool {
			return int(j) != pos && slices.Equal(c.ctx[int(j)-k+1:j+1], g) && int(j) < len(c.succ) && len(c.succ[j]) > 0
		}
		i, _ := slices.BinarySearch(ends, int32(pos+1))
		for _, j := range ends[i:] {
			if ok(j) {
				return int(j), true
			}
		}
		for n := i - 1; n >= 0; n-- {
			if ok(ends[n]) {
				return int(ends[n]), true
			}
		}
	}
	return 0, false
}
