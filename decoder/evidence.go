package decoder

import (
	"context"
	"fmt"
	"math"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/internal/vecmath"
)

// Evidence is what each passage sequence says of the answer: the terms
//
//	log p(x_t | d, x_<t)
//
// whose sums give each passage's share of the answer, the mixture's
// posterior p(d | x) ∝ η·ω(d)·Π_t p(x_t | d, x_<t). Every pass computes
// each passage's distribution at the positions it mixes, but the token
// decided there is often known only later: the side's own choice after the
// pass, a local draft's correction, the peer's target a round trip on.
// So the decoder keeps the distributions of the latest positions (the
// ring) and takes a token's terms from there when it joins the answer. A
// position whose distribution is gone (decided long after it was drafted,
// or reached without a pass of this side's, as a hedge branch's tokens)
// is decoded again in the next pass, one row per passage (a term row):
// rows of a pass are computed each on its own, so the extra rows change
// no other row's logits and no answer.

// evidenceWindow is how many positions before the answer's end keep their
// distributions (each costs a vocabulary of floats per passage). A token
// decided further back than that, and not settled, costs a term row.
const evidenceWindow = 8

// evidence is a decoder's per-passage terms of the current generation.
type evidence struct {
	on bool
	// terms[q][s] is log p(gen[q] | passage s, gen[:q]), NaN while not
	// known; len(terms) is len(gen) once bound.
	terms [][]float64
	// complete is how many leading positions have every term.
	complete int
	// ring holds the distributions of recent positions, by ascending
	// position; pass those of the pass in flight, by mixture index (tree
	// node for token trees), until it ends.
	ring, pass []*dist
	spare      []*dist
	// settled: positions below it are decided for good (Settle); their
	// distributions are dropped.
	settled int
}

// dist is each passage's next-token distribution at one answer position:
// the masked logits and their log partition.
type dist struct {
	pos    int
	logits [][]float32 // by sequence; empty while not decoded
	logZ   []float64
}

// filled reports whether every sequence's row is in.
func (d *dist) filled() bool {
	for _, l := range d.logits {
		if len(l) == 0 {
			return false
		}
	}
	return len(d.logits) > 0
}

// SetEvidence turns the per-passage terms on or off for the generations
// that begin after it (Evidence needs them on; off, nothing is kept or
// decoded for them).
func (d *Decoder) SetEvidence(on bool) { d.wantEvidence = on }

// EvidenceOn reports whether the current generation keeps its terms.
func (d *Decoder) EvidenceOn() bool { return d.ev.on }

// Settle says that the first n tokens of the answer are decided for good:
// no rewind will go below n, so their distributions need not be kept.
func (d *Decoder) Settle(n int) {
	if n > d.ev.settled {
		d.ev.settled = n
		d.ev.trim(len(d.gen))
	}
}

// Evidence returns, for each sequence s of the current generation, the
// log-likelihood of the answer's first n tokens under it:
// Σ_{t<n} log p(gen[t] | passage s, gen[:t]) in nats, from the model's own
// distribution (temperature 1, before any sampling transform). Terms not
// known yet are decoded first (one pass). It needs SetEvidence(true) from
// before the generation's Start.
func (d *Decoder) Evidence(ctx context.Context, n int) ([]float64, error) {
	switch {
	case !d.ev.on:
		return nil, fmt.Errorf("decoder: %w: evidence is off for this generation", engine.ErrInvalidInput)
	case n < 0 || n > len(d.gen):
		return nil, fmt.Errorf("decoder: %w: evidence of %d tokens of %d", engine.ErrInvalidInput, n, len(d.gen))
	}
	if d.ev.firstMissing(n) >= 0 {
		if err := d.forward(ctx, nil, false, nil); err != nil {
			return nil, err
		}
		if q := d.ev.firstMissing(n); q >= 0 {
			return nil, fmt.Errorf("decoder: internal error: no term for answer position %d after a pass", q)
		}
	}
	sums := make([]float64, len(d.prompts))
	for _, row := range d.ev.terms[:n] {
		for s, v := range row {
			sums[s] += v
		}
	}
	return sums, nil
}

// reset starts a generation, keeping terms when on.
func (e *evidence) reset(on bool) {
	e.on = on
	e.terms, e.complete, e.settled = e.terms[:0], 0, 0
	for _, dd := range e.ring {
		e.release(dd)
	}
	e.ring = e.ring[:0]
	e.dropPass()
}

// release keeps dd's buffers for a later position.
func (e *evidence) release(dd *dist) {
	for s := range dd.logits {
		dd.logits[s] = dd.logits[s][:0]
	}
	e.spare = append(e.spare, dd)
}

func (e *evidence) dropPass() {
	for _, dd := range e.pass {
		if dd != nil {
			e.release(dd)
		}
	}
	e.pass = e.pass[:0]
}

// slot is the buffer the logits of mixture row out of sequence seq are
// read into, in a pass of seqs sequences.
func (e *evidence) slot(out, seq, seqs int) []float32 {
	for len(e.pass) <= out {
		e.pass = append(e.pass, nil)
	}
	dd := e.pass[out]
	if dd == nil {
		if n := len(e.spare); n > 0 {
			dd, e.spare = e.spare[n-1], e.spare[:n-1]
		} else {
			dd = &dist{}
		}
		for len(dd.logits) < seqs {
			dd.logits = append(dd.logits, nil)
		}
		dd.logits = dd.logits[:seqs]
		for s := range dd.logits {
			dd.logits[s] = dd.logits[s][:0]
		}
		dd.logZ = append(dd.logZ[:0], make([]float64, seqs)...)
		e.pass[out] = dd
	}
	return dd.logits[seq][:0]
}

// set records the masked logits read into slot(out, seq) (the slice the
// read returned, which may have grown) and their log partition.
func (e *evidence) set(out, seq int, logits []float32, logZ float64) {
	dd := e.pass[out]
	dd.logits[seq], dd.logZ[seq] = logits, logZ
}

// endPass moves the mixture rows of a linear pass into the ring: row i is
// the distribution at answer position base+i. A row this pass did not
// decode (the first, when it was known before the pass) keeps the ring's.
func (e *evidence) endPass(base int) {
	for i, dd := range e.pass {
		if dd != nil && dd.filled() {
			dd.pos = base + i
			e.put(dd)
		} else if dd != nil {
			e.release(dd)
		}
	}
	e.pass = e.pass[:0]
}

// put stores dd in the ring, replacing any distribution at its position.
func (e *evidence) put(dd *dist) {
	i := 0
	for i < len(e.ring) && e.ring[i].pos < dd.pos {
		i++
	}
	if i < len(e.ring) && e.ring[i].pos == dd.pos {
		e.release(e.ring[i])
		e.ring[i] = dd
		return
	}
	e.ring = append(e.ring, nil)
	copy(e.ring[i+1:], e.ring[i:])
	e.ring[i] = dd
}

func (e *evidence) at(pos int) *dist {
	for _, dd := range e.ring {
		if dd.pos == pos {
			return dd
		}
	}
	return nil
}

// dropAfter forgets the distributions past answer position pos: their
// prefixes are no longer the answer's.
func (e *evidence) dropAfter(pos int) {
	k := 0
	for _, dd := range e.ring {
		if dd.pos <= pos {
			e.ring[k] = dd
			k++
		} else {
			e.release(dd)
		}
	}
	e.ring = e.ring[:k]
}

// cut forgets everything from answer position n on (a rewind to n keeps
// the distribution at n: its prefix is the kept answer).
func (e *evidence) cut(n int) {
	if n < len(e.terms) {
		e.terms = e.terms[:n]
	}
	e.complete = min(e.complete, n)
	e.dropAfter(n)
}

// trim drops the distributions no token can be decided at any more: below
// the settled positions, or further back than the window from next, the
// position the answer's next token takes.
func (e *evidence) trim(next int) {
	floor := max(e.settled, next-evidenceWindow)
	k := 0
	for _, dd := range e.ring {
		if dd.pos >= floor {
			e.ring[k] = dd
			k++
		} else {
			e.release(dd)
		}
	}
	e.ring = e.ring[:k]
}

// bind takes the terms of the answer's tokens that have none yet from the
// ring, as far as it holds their positions, and trims it.
func (e *evidence) bind(gen []engine.Token, seqs int) {
	for q := len(e.terms); q < len(gen); q++ {
		row := make([]float64, seqs)
		dd := e.at(q)
		for s := range row {
			row[s] = math.NaN()
			if dd != nil && s < len(dd.logits) && len(dd.logits[s]) > int(gen[q]) {
				row[s] = float64(dd.logits[s][gen[q]]) - dd.logZ[s]
			}
		}
		e.terms = append(e.terms, row)
	}
	e.trim(len(gen))
}

// firstMissing is the first answer position below n lacking a term, or -1.
func (e *evidence) firstMissing(n int) int {
	for e.complete < len(e.terms) && rowComplete(e.terms[e.complete]) {
		e.complete++
	}
	for q := e.complete; q < n && q < len(e.terms); q++ {
		if !rowComplete(e.terms[q]) {
			return q
		}
	}
	return -1
}

// missing reports whether passage seq lacks the term of answer position q.
func (e *evidence) missing(q, seq int) bool {
	return q < len(e.terms) && seq < len(e.terms[q]) && math.IsNaN(e.terms[q][seq])
}

func rowComplete(row []float64) bool {
	for _, v := range row {
		if math.IsNaN(v) {
			return false
		}
	}
	return true
}

// termRow records the term that a term row's logits give answer position
// q of sequence seq: logits are the row's, masked.
func (d *Decoder) termRow(q, seq int, logits []float32) error {
	logZ, err := vecmath.LogSumExp(logits)
	if err != nil {
		return fmt.Errorf("decoder: passage %d: %w", seq, err)
	}
	d.ev.terms[q][seq] = float64(logits[d.gen[q]]) - logZ
	return nil
}
