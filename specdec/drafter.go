package specdec

import (
	"fmt"
	"slices"
)

// DocID names a document of a Drafter.
type DocID int

// Drafter proposes drafts from the context itself (context-aligned
// drafting, sd.npu §3.1): an Index over the retrieved passages, the prompt,
// calibrated paths, the answer so far and earlier answers of the session.
// The open answer is one document that starts with the prompt, so the
// current suffix is simply its last state, and drafts continue the longest
// suffix of prompt+answer that occurs elsewhere followed by something.
//
// A Drafter is not safe for concurrent use.
type Drafter struct {
	opts Options
	idx  *Index
	acc  *Acceptance
	docs []doc
	// gen is the open answer (-1: none) and genPrompt its prompt length.
	gen       DocID
	genPrompt int
	reuse     reuseHolder
	kids      []Child
}

type doc struct {
	toks   []Token
	states []int32 // states[i]: the state of toks[:i+1]
}

// NewDrafter returns an empty drafter. acc supplies the acceptance rates
// that rank reuse against matches and weigh tree candidates; share it with
// the CostModel so both learn from the same observations (nil: a private
// one with prior 0.5).
func NewDrafter(opts Options, acc *Acceptance) (*Drafter, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("new drafter: %w", err)
	}
	if acc == nil {
		acc = NewAcceptance(0.5)
	}
	return &Drafter{opts: opts, idx: NewIndex(), acc: acc, gen: -1}, nil
}

// AddDocument indexes a sequence: a retrieved passage (as prefilled, so
// that Calibrate can use its prefill logits), or any other context.
func (d *Drafter) AddDocument(toks []Token) DocID {
	id := d.newDoc()
	d.extend(id, toks)
	return id
}

func (d *Drafter) newDoc() DocID {
	d.docs = append(d.docs, doc{})
	return DocID(len(d.docs) - 1)
}

func (d *Drafter) extend(id DocID, toks []Token) {
	dc := &d.docs[id]
	last := int32(0)
	if n := len(dc.states); n > 0 {
		last = dc.states[n-1]
	}
	for _, t := range toks {
		last = d.idx.Extend(last, t, 1)
		dc.states = append(dc.states, last)
	}
	dc.toks = append(dc.toks, toks...)
}

// Calibrate hangs the model's likely successors off the positions of a
// document (in-context calibration, sd.npu §3.3). succ[i] holds the top
// successors predicted at position i of the document, from its prefill
// logits (SuccessorsFromTopK); missing rows are skipped. Call it once per
// document: a second call counts the same evidence twice. It returns the
// number of calibrated nodes inserted (0 when calibration is off).
func (d *Drafter) Calibrate(id DocID, succ [][]Successor) (int, error) {
	if id < 0 || int(id) >= len(d.docs) {
		return 0, fmt.Errorf("%w: calibrate unknown document %d", ErrInvalid, id)
	}
	dc := d.docs[id]
	if len(succ) > len(dc.toks) {
		return 0, fmt.Errorf("%w: %d successor rows for document %d of %d tokens", ErrInvalid, len(succ), id, len(dc.toks))
	}
	if !d.opts.Calibration {
		return 0, nil
	}
	w := d.opts.Calibrate.Weight
	c := newCalibrator(dc.toks, succ, d.opts.Calibrate, func(parent int32, t Token, joint float32) int32 {
		return d.idx.ExtendCalibrated(parent, t, w*joint)
	})
	return c.run(func(i int) int32 { return dc.states[i] }), nil
}

// StartAnswer opens a new answer after prompt (closing any open one). The
// prompt's tokens are indexed as the head of the answer's document.
func (d *Drafter) StartAnswer(prompt []Token) DocID {
	d.EndAnswer()
	d.gen = d.newDoc()
	d.genPrompt = len(prompt)
	d.extend(d.gen, prompt)
	return d.gen
}

// Append adds emitted tokens to the open answer.
func (d *Drafter) Append(toks ...Token) error {
	if d.gen < 0 {
		return fmt.Errorf("%w: append with no open answer", ErrInvalid)
	}
	d.extend(d.gen, toks)
	return nil
}

// Rollback removes the last n tokens of the open answer (the aggregator
// rejected them): they stop counting, and the answer goes on from the
// earlier prefix's state.
func (d *Drafter) Rollback(n int) error {
	if d.gen < 0 {
		return fmt.Errorf("%w: rollback with no open answer", ErrInvalid)
	}
	dc := &d.docs[d.gen]
	if n < 0 || n > len(dc.toks)-d.genPrompt {
		return fmt.Errorf("%w: rollback of %d tokens with %d generated", ErrInvalid, n, len(dc.toks)-d.genPrompt)
	}
	keep := len(dc.toks) - n
	for i := len(dc.states) - 1; i >= keep; i-- {
		d.idx.Remove(dc.states[i], 1)
	}
	dc.toks, dc.states = dc.toks[:keep], dc.states[:keep]
	d.reuse.clear()
	return nil
}

// AnswerOpen reports whether an answer is open (between StartAnswer and
// EndAnswer).
func (d *Drafter) AnswerOpen() bool { return d.gen >= 0 }

// EndAnswer closes the open answer; it stays indexed as an earlier answer
// of the session.
func (d *Drafter) EndAnswer() {
	d.gen = -1
	d.reuse.clear()
}

// Match returns the state and length of the longest suffix of the open
// answer (prompt included) that occurs in the index followed by at least
// one token. Length 0 means nothing to continue.
func (d *Drafter) Match() (int32, int) {
	if d.gen < 0 || len(d.docs[d.gen].states) == 0 {
		return 0, 0
	}
	s := d.docs[d.gen].states[len(d.docs[d.gen].states)-1]
	for s > 0 && !d.idx.HasChildren(s) {
		s = d.idx.Link(s)
	}
	return s, d.idx.Len(s)
}

// minBackoff is the shortest context a draft backs off to when the text it
// spelled so far is never continued (a calibrated path ends, say): a
// bigram still predicts well, a lone token does not.
const minBackoff = 2

// backoff returns s, or its longest suffix state of at least minBackoff
// tokens, that has a continuation.
func (d *Drafter) backoff(s int32) (int32, bool) { return d.backoffBy(s, d.idx.HasChildren) }

func (d *Drafter) backoffBy(s int32, has func(int32) bool) (int32, bool) {
	for !has(s) {
		s = d.idx.Link(s)
		if s <= 0 || d.idx.Len(s) < minBackoff {
			return 0, false
		}
	}
	return s, true
}

// Candidates appends the continuations of the current match, heaviest
// first; Weight/ΣWeight is a cheap estimate of their probability.
func (d *Drafter) Candidates(dst []Child) []Child {
	s, n := d.Match()
	if n == 0 {
		return dst
	}
	return d.idx.Children(s, dst)
}

// Draft is a linear draft.
type Draft struct {
	Tokens []Token
	// MatchLen is the length of the matched suffix the draft continues, or
	// MatchReuse for a reused segment: the acceptance bucket to plan and
	// observe it with.
	MatchLen int
	// Origin says where the draft came from.
	Origin Origin
	// Alt is the draft this one displaced, for measurements: the lookup-only
	// draft (no calibrated paths) when Origin is OriginCalibrated, the
	// index's draft when it is OriginReuse; nil otherwise.
	Alt []Token
}

// Origin is where a draft came from.
type Origin uint8

// Draft origins.
const (
	// OriginNone: no draft.
	OriginNone Origin = iota
	// OriginLookup: the context's own continuation, the draft an index
	// without calibrated paths makes.
	OriginLookup
	// OriginCalibrated: calibrated paths changed the draft (a token the
	// lookup-only draft does not have at that place, or a longer draft).
	OriginCalibrated
	// OriginReuse: a held segment of a rejected draft (draft reuse).
	OriginReuse
	// OriginModel: a smaller model's greedy continuation (a decoder's
	// assistant), not this drafter's.
	OriginModel
	numOrigins
)

func (s Origin) String() string {
	return [...]string{"none", "lookup", "calibrated", "reuse", "model"}[s]
}

// Draft proposes up to MaxDraft tokens: from the longest match, following
// the heaviest (then most recent) continuation at each step, or the held
// reuse segment when its measured acceptance promises more tokens.
func (d *Drafter) Draft() Draft {
	if !d.opts.Enabled {
		return Draft{}
	}
	s, n := d.Match()
	out := d.walk(s, n, d.idx.HasChildren, d.idx.Best)
	if d.opts.Calibration && len(out.Tokens) > 0 {
		// Did calibration change it? Compare with the lookup-only draft.
		if plain := d.LookupDraft(); !slices.Equal(plain.Tokens, out.Tokens) {
			out.Origin, out.Alt = OriginCalibrated, plain.Tokens
		}
	}
	if seg := d.heldSegment(); len(seg) > 0 {
		seg = seg[:min(len(seg), d.opts.MaxDraft)]
		if ExpectedTokens(d.acc.Alpha(MatchReuse), len(seg)) > ExpectedTokens(d.acc.Alpha(n), len(out.Tokens)) {
			out = Draft{Tokens: slices.Clone(seg), MatchLen: MatchReuse, Origin: OriginReuse, Alt: out.Tokens}
		}
	}
	return out
}

// LookupDraft is the draft an index without calibrated paths would make,
// reuse aside: the context's own continuation of the longest suffix of the
// answer that the context continues.
func (d *Drafter) LookupDraft() Draft {
	if !d.opts.Enabled || d.gen < 0 || len(d.docs[d.gen].states) == 0 {
		return Draft{}
	}
	s := d.docs[d.gen].states[len(d.docs[d.gen].states)-1]
	for s > 0 && !d.idx.HasPlainChildren(s) {
		s = d.idx.Link(s)
	}
	return d.walk(s, d.idx.Len(max(s, 0)), d.idx.HasPlainChildren, d.idx.BestPlain)
}

// walk drafts from state s (matched length n) following best, backing off
// (see backoff) to states that has reports as continued.
func (d *Drafter) walk(s int32, n int, has func(int32) bool, best func(int32) (Child, bool)) Draft {
	out := Draft{MatchLen: n}
	if n > 0 {
		out.Origin = OriginLookup
	}
	for ok := n > 0; ok && len(out.Tokens) < d.opts.MaxDraft; s, ok = d.backoffBy(s, has) {
		c, _ := best(s)
		out.Tokens = append(out.Tokens, c.Token)
		s = c.State
	}
	return out
}

// heldSegment is the held reuse segment where it fits the answer (see
// reuseHolder), else nil.
func (d *Drafter) heldSegment() []Token {
	if !d.opts.Reuse || d.gen < 0 {
		return nil
	}
	seg := d.reuse.take(d.opts.ReuseBudget)
	if toks := d.docs[d.gen].toks; len(seg) == 0 || len(toks) != d.reuse.at && (len(toks) == 0 || toks[len(toks)-1] != d.reuse.after) {
		return nil
	}
	return seg
}

// Verified feeds draft reuse with the outcome of verifying a linear draft:
// argmax[i] is the target's choice at draft position i (len(draft)+1
// entries, as for VerifyGreedy; in sampling mode, the argmax of each row).
func (d *Drafter) Verified(draft, argmax []Token) {
	d.verified(draft, argmax, len(draft))
}

// VerifiedTree is Verified for a tree: Eq. 3 runs on the verified branch.
// argmax[i] is the target's choice after node i.
func (d *Drafter) VerifiedTree(t *Tree, argmax []Token, v TreeVerdict) {
	path := t.Path(t.Leaves[v.Branch])
	am := make([]Token, 0, len(path)+1)
	am = append(am, argmax[0])
	for _, n := range path {
		am = append(am, argmax[n])
	}
	d.verified(t.Tokens(path), am, t.Size())
}

func (d *Drafter) verified(draft, argmax []Token, drafted int) {
	if !d.opts.Reuse || d.gen < 0 {
		return
	}
	d.reuse.spent += drafted
	if held := d.reuse.seg; len(held) > 0 && len(draft) <= len(held) && slices.Equal(draft, held[:len(draft)]) {
		// The held segment was verified where it fitted: absorbed, or
		// rejected there. Either way it is spent; shifted to a later
		// position it would be misaligned.
		d.reuse.clear()
	}
	if start, end, ok := ReuseSpan(draft, argmax); ok {
		e := 0
		for draft[e] == argmax[e] {
			e++
		}
		// The emitted tokens (draft[:e] and the correction) join the
		// answer next.
		d.reuse.store(draft[start:end], len(d.docs[d.gen].toks)+e+1, draft[start-1])
	}
}

// TreeSource offers the drafter's candidates to BuildTree: the
// continuations of the current match (with probability α·weight share,
// α measured for the match's bucket) and the held reuse segment as one
// more branch (probability α of reused drafts per token).
type TreeSource struct {
	d          *Drafter
	start      int32
	MatchLen   int // acceptance bucket of the tree, for CostModel.PlanTree
	alpha      float64
	alphaReuse float64
	seg        []Token
}

// TreeSource snapshots the current match and reuse segment.
func (d *Drafter) TreeSource() *TreeSource {
	s, n := d.Match()
	ts := &TreeSource{d: d, start: s, MatchLen: n, alpha: d.acc.Alpha(n), alphaReuse: d.acc.Alpha(MatchReuse)}
	if d.opts.Enabled {
		ts.seg = slices.Clone(d.heldSegment())
	}
	return ts
}

// Children implements Source. Handles: RootHandle, an index state s > 0 as
// Handle(s), reuse position k as Handle(-k-1).
func (ts *TreeSource) Children(h Handle, dst []Candidate) []Candidate {
	d := ts.d
	if !d.opts.Enabled {
		return dst
	}
	switch {
	case h == RootHandle:
		if ts.MatchLen > 0 {
			dst = ts.indexChildren(ts.start, dst)
		}
		if len(ts.seg) > 0 {
			dst = append(dst, Candidate{Token: ts.seg[0], Prob: ts.alphaReuse, Handle: -1})
		}
	case h > 0:
		dst = ts.indexChildren(int32(h), dst)
	default:
		if k := int(-h - 1); k+1 < len(ts.seg) {
			dst = append(dst, Candidate{Token: ts.seg[k+1], Prob: ts.alphaReuse, Handle: h - 1})
		}
	}
	return dst
}

func (ts *TreeSource) indexChildren(s int32, dst []Candidate) []Candidate {
	d := ts.d
	s, ok := d.backoff(s)
	if !ok {
		return dst
	}
	d.kids = d.idx.Children(s, d.kids[:0])
	var total float64
	for _, c := range d.kids {
		total += float64(c.Weight)
	}
	for _, c := range d.kids[:min(len(d.kids), d.opts.Branching)] {
		dst = append(dst, Candidate{Token: c.Token, Prob: ts.alpha * float64(c.Weight) / total, Handle: Handle(c.State)})
	}
	return dst
}
