package specdec

import (
	"cmp"
	"slices"

	"github.com/dragon-rag/dragon/engine"
)

// Token is a vocabulary id.
type Token = engine.Token

// maxBump bounds how far a new occurrence is propagated up the suffix-link
// chain. Exact weights would need the whole chain, which is as long as the
// longest repeated suffix: short for natural text, but linear in repetition
// loops ("a a a a ..."). Capping keeps appends O(1) amortized; beyond the cap
// only the shortest contexts (which already carry large weights) stop
// counting, and their recency goes stale.
const maxBump = 64

// Index is a generalized suffix automaton over token sequences: the prompt,
// retrieved passages, calibrated paths, generated text, earlier answers.
// Sequences may grow interleaved and may branch from any stored prefix state
// (calibration hangs model predictions off context positions; a rollback
// continues the answer from an earlier prefix).
//
// Each state knows the weighted number of occurrences of its strings and the
// clock tick of its latest occurrence, so the continuations of a context can
// be ranked by frequency, then recency. Positions are never stored: a walk
// along transitions always spells text that occurs in the index.
type Index struct {
	st    []state
	edges []edge
	next  map[uint64]int32 // (state, token) -> index in edges
	clock uint32
}

type state struct {
	len  int32   // length of the longest string of the state
	link int32   // suffix link; -1 for the root
	head int32   // first outgoing edge; -1 for none
	occ  float32 // weighted occurrences
	tick uint32  // clock of the latest occurrence
	// pocc and ptick are occ and tick without calibrated paths: what a
	// lookup-only index would hold, so that a draft can tell whether
	// calibration changed it (Draft.Origin).
	pocc  float32
	ptick uint32
}

type edge struct {
	tok Token
	to  int32
	sib int32 // next edge of the same state; -1 ends the list
}

// Child is one continuation of a state.
type Child struct {
	Token  Token
	State  int32
	Weight float32 // weighted occurrences of the context followed by Token
	Tick   uint32  // clock of the latest such occurrence
	// Calibrated: only calibrated paths continue the context with Token.
	Calibrated bool
}

// NewIndex returns an index holding only the root (the empty string, state 0).
func NewIndex() *Index {
	return &Index{
		st:   []state{{link: -1, head: -1}},
		next: make(map[uint64]int32),
	}
}

// Len is the length of the longest string of state s.
func (x *Index) Len(s int32) int { return int(x.st[s].len) }

// Link is the suffix link of s (-1 for the root).
func (x *Index) Link(s int32) int32 { return x.st[s].link }

// States is the number of states, a measure of memory use.
func (x *Index) States() int { return len(x.st) }

// HasChildren reports whether some occurrence of s is followed by a token.
func (x *Index) HasChildren(s int32) bool {
	for e := x.st[s].head; e >= 0; e = x.edges[e].sib {
		if x.live(x.edges[e].to) {
			return true
		}
	}
	return false
}

// live: a state whose occurrences were all removed keeps its transitions
// (automata do not shrink) but is no longer offered.
func (x *Index) live(s int32) bool { return x.st[s].occ > 1e-6 }

func key(s int32, t Token) uint64 { return uint64(uint32(s))<<32 | uint64(uint32(t)) }

// Next follows the transition of s by t; ok is false when s·t never occurs.
func (x *Index) Next(s int32, t Token) (int32, bool) {
	e, ok := x.next[key(s, t)]
	if !ok {
		return 0, false
	}
	return x.edges[e].to, true
}

// Children appends the continuations of s to dst in the order Best
// ranks them: those a sequence holds first, then those only calibrated
// paths hold; within each, heaviest first, ties broken by recency, then by
// token id (for determinism).
func (x *Index) Children(s int32, dst []Child) []Child {
	start := len(dst)
	for e := x.st[s].head; e >= 0; e = x.edges[e].sib {
		to := x.edges[e].to
		if !x.live(to) {
			continue
		}
		dst = append(dst, Child{Token: x.edges[e].tok, State: to, Weight: x.st[to].occ, Tick: x.st[to].tick, Calibrated: !x.plainLive(to)})
	}
	slices.SortFunc(dst[start:], func(a, b Child) int {
		return cmp.Or(cmpBool(a.Calibrated, b.Calibrated), cmp.Compare(b.Weight, a.Weight), cmp.Compare(b.Tick, a.Tick), cmp.Compare(a.Token, b.Token))
	})
	return dst
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// Best returns the continuation of s to draft. A continuation that some
// sequence holds (the text itself) always comes before one that only
// calibrated paths hold: calibration ranks the text's continuations by
// the model's predictions (their weights add up) and continues where the
// text does not, but never displaces the text. The model's prediction at
// a passage position is its guess before it has read the next token, and
// an answer that copies the passage follows the passage, not the guess
// (docs/EXPERIMENTS.md, E5). Among equals: the heaviest, then the most
// recent, then the lowest token id.
func (x *Index) Best(s int32) (Child, bool) {
	return x.bestOf(s, x.live, func(c *Child) {
		c.Weight, c.Tick, c.Calibrated = x.st[c.State].occ, x.st[c.State].tick, !x.plainLive(c.State)
	})
}

// bestOf is the best child of s among those live says are, each weighed
// by weigh (which sets Weight, Tick and Calibrated).
func (x *Index) bestOf(s int32, live func(int32) bool, weigh func(*Child)) (Child, bool) {
	var best Child
	found := false
	for e := x.st[s].head; e >= 0; e = x.edges[e].sib {
		to := x.edges[e].to
		if !live(to) {
			continue
		}
		c := Child{Token: x.edges[e].tok, State: to}
		weigh(&c)
		if !found || better(c, best) {
			best, found = c, true
		}
	}
	return best, found
}

func better(c, best Child) bool {
	if c.Calibrated != best.Calibrated {
		return !c.Calibrated
	}
	return c.Weight > best.Weight || c.Weight == best.Weight && (c.Tick > best.Tick || c.Tick == best.Tick && c.Token < best.Token)
}

// Extend appends t to the sequence whose longest string ends in state last
// (0 starts a new sequence) with weight w, and returns the state of the
// extended sequence. The caller keeps the returned states of its sequences:
// a sequence's prefix always stays the longest string of its state, so any
// of them can be extended later to branch.
func (x *Index) Extend(last int32, t Token, w float32) int32 {
	return x.extend(last, t, w, false)
}

// ExtendCalibrated is Extend for a calibrated path: a continuation the
// model predicted rather than one the text holds. It counts like any
// other occurrence; BestPlain and HasPlainChildren leave it out.
func (x *Index) ExtendCalibrated(last int32, t Token, w float32) int32 {
	return x.extend(last, t, w, true)
}

func (x *Index) extend(last int32, t Token, w float32, cal bool) int32 {
	x.clock++
	if e, ok := x.next[key(last, t)]; ok {
		// The extended string already occurs (another sequence, or a branch).
		q := x.edges[e].to
		if x.st[last].len+1 == x.st[q].len {
			x.bump(q, w, cal)
			return q
		}
		c := x.split(last, t, q)
		x.bump(c, w, cal)
		return c
	}
	cur := x.newState(x.st[last].len+1, 0, 0)
	x.st[cur].link = 0 // unless a suffix of the new string occurred before
	p := last
	for p >= 0 {
		if _, ok := x.next[key(p, t)]; ok {
			break
		}
		x.addEdge(p, t, cur)
		p = x.st[p].link
	}
	if p >= 0 {
		q, _ := x.Next(p, t)
		if x.st[p].len+1 == x.st[q].len {
			x.st[cur].link = q
		} else {
			x.st[cur].link = x.split(p, t, q)
		}
	}
	x.bump(cur, w, cal)
	return cur
}

// Remove withdraws an occurrence of weight w that ended in s, as returned
// by Extend: an answer's rolled-back tokens stop counting as evidence.
// Recency is not rewound.
func (x *Index) Remove(s int32, w float32) {
	for i := 0; s > 0 && i < maxBump; i++ {
		x.st[s].occ -= w
		x.st[s].pocc -= w
		s = x.st[s].link
	}
}

// split clones q so that the strings of q up to length len(p)+1 get their
// own state, and redirects the transitions of p's suffixes to it.
func (x *Index) split(p int32, t Token, q int32) int32 {
	c := x.newState(x.st[p].len+1, x.st[q].occ, x.st[q].tick)
	x.st[c].pocc, x.st[c].ptick = x.st[q].pocc, x.st[q].ptick
	x.st[c].link = x.st[q].link
	for e := x.st[q].head; e >= 0; e = x.edges[e].sib {
		x.addEdge(c, x.edges[e].tok, x.edges[e].to)
	}
	x.st[q].link = c
	for ; p >= 0; p = x.st[p].link {
		e, ok := x.next[key(p, t)]
		if !ok || x.edges[e].to != q {
			break
		}
		x.edges[e].to = c
	}
	return c
}

func (x *Index) newState(n int32, occ float32, tick uint32) int32 {
	x.st = append(x.st, state{len: n, link: -1, head: -1, occ: occ, tick: tick})
	return int32(len(x.st) - 1)
}

func (x *Index) addEdge(p int32, t Token, to int32) {
	x.edges = append(x.edges, edge{tok: t, to: to, sib: x.st[p].head})
	x.st[p].head = int32(len(x.edges) - 1)
	x.next[key(p, t)] = x.st[p].head
}

// bump records a new occurrence ending in s: every suffix of it (the
// suffix-link chain) occurs once more.
func (x *Index) bump(s int32, w float32, cal bool) {
	for i := 0; s > 0 && i < maxBump; i++ {
		x.st[s].occ += w
		x.st[s].tick = x.clock
		if !cal {
			x.st[s].pocc += w
			x.st[s].ptick = x.clock
		}
		s = x.st[s].link
	}
}

// plainLive: some occurrence of s is in a sequence, not only in
// calibrated paths.
func (x *Index) plainLive(s int32) bool { return x.st[s].pocc > 1e-6 }

// HasPlainChildren is HasChildren without calibrated paths.
func (x *Index) HasPlainChildren(s int32) bool {
	for e := x.st[s].head; e >= 0; e = x.edges[e].sib {
		if x.plainLive(x.edges[e].to) {
			return true
		}
	}
	return false
}

// BestPlain is Best as an index without calibrated paths would answer:
// weights and recency of the sequences' own occurrences only.
func (x *Index) BestPlain(s int32) (Child, bool) {
	return x.bestOf(s, x.plainLive, func(c *Child) { c.Weight, c.Tick = x.st[c.State].pocc, x.st[c.State].ptick })
}
