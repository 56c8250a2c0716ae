package aggregator

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// markov is a side's next-token distribution given the previous token: a
// stand-in for a decoder whose distribution depends on the prefix.
type markov [][]float32

// randomMarkov draws a vocab×vocab table of peaked random distributions;
// start is row vocab (the first step has no previous token).
func randomMarkov(r *rand.Rand, vocab int) markov {
	m := make(markov, vocab+1)
	for i := range m {
		row := make([]float32, vocab)
		var sum float32
		for j := range row {
			row[j] = float32(r.ExpFloat64()) * float32(r.ExpFloat64())
			sum += row[j]
		}
		for j := range row {
			row[j] /= sum
		}
		m[i] = row
	}
	return m
}

// next is the distribution after a prefix of length n ending in last.
func (m markov) next(n int, last int32) []float32 {
	if n == 0 {
		return m[len(m)-1]
	}
	return m[last]
}

// world runs both sides' Nodes against each other without clocks: at each
// turn it picks at random one enabled thing to happen (a side drafts, a
// drafted burst reaches its Node, a message crosses the link, the
// aggregator is asked to switch). Links are FIFO per direction, as a gRPC
// stream is; everything else interleaves freely.
type world struct {
	t   testing.TB
	r   *rand.Rand
	cfg worldConfig

	nodes [2]*Node
	sides [2]*producer
	links [2][]Event // links[i] carries events to side i, FIFO

	decided [2][]int32 // target tokens as each side's Node emitted them
	// decidedHash[i] is the hash of decided[i].
	decidedHash [2]uint64
	truth       []int32 // target tokens as the aggregating rule decided them
	// truthHash[k] is prefixHash(truth[:k]).
	truthHash []uint64
	// prefixes[(side, step, epoch)] is the hash of the prefix the draft was
	// computed on.
	prefixes map[draftKey]uint64
	switches int
	verified int
	// redecided counts steps decided by both Nodes.
	redecided int
	// beside counts drafts made beside a peer draft; moved those whose
	// token that changed.
	beside, moved int
}

type draftKey struct {
	side  Side
	step  uint64
	epoch uint32
	fork  uint64
}

func keyOf(d *Draft) draftKey { return draftKey{d.side, d.step, d.origin.epoch, d.origin.fork} }

type worldConfig struct {
	seed       uint64
	greedy     bool
	topP       float64
	dist       [2]markov
	logMass    [2]float64
	maxBurst   int     // drafts per burst, 1..maxBurst
	lookahead  int     // most undecided drafts a side keeps in flight
	switchProb float64 // chance per turn of a switch request
	staleProb  float64 // chance that a burst computed before a rollback is still submitted
	first      Side
	share      bool   // Config.Share, and greedy drafts beside the peer's
	steps      uint64 // stop once this many steps are decided
	// rule replaces Algorithm 1 on both Nodes (nil: the real one).
	rule func(p pair, greedy bool, seed, step uint64) int32
	// rescoreEvery > 0 gives dynamic weights: the h̃ a side drafts with at
	// step s is logMass(rescore(prefix[:⌊s/rescoreEvery⌋·rescoreEvery]))
	// over its own prefix, as a side re-scoring its passages against the
	// answer so far does; logMass is then unused.
	rescoreEvery int
	rescore      func(prefix []int32) float64
	// confidence is Config.Confidence on both Nodes and Proposers.
	confidence float64
	// hedges and hedgeDepth are Config.Hedges and HedgeDepth; a side that
	// does not aggregate hedges its runner-up with chance hedgeProb per
	// main draft while it has fewer than hedges open.
	hedges, hedgeDepth int
	hedgeProb          float64
}

// massAt is the h̃ side i drafts step with, given its prefix.
func (w *world) massAt(i int, step uint64, prefix []int32) float64 {
	if w.cfg.rescoreEvery <= 0 {
		return w.cfg.logMass[i]
	}
	b := int(step) / w.cfg.rescoreEvery * w.cfg.rescoreEvery
	return logMass(w.cfg.rescore(prefix[:b]))[i]
}

// producer is one side's decoder: it drafts on its own prefix (the targets
// up to its last rollback, then its own drafts).
type producer struct {
	side Side
	prop *Proposer
	chain
	epoch   uint32
	pending []Draft // computed, not yet handed to the Node (a pass in flight)
	// branches are the live hedge branches, by fork step.
	branches []*branch
	// hedgeHits counts adoptions of a branch.
	hedgeHits int
}

// chain is a prefix: its length, last token and hash, and its tokens.
type chain struct {
	n    int
	last int32
	hash uint64
	toks []int32
}

func (c *chain) extend(tok int32) {
	c.n, c.last, c.hash = c.n+1, tok, extendHash(c.hash, tok)
	c.toks = append(c.toks, tok)
}

func (c chain) clone() chain {
	c.toks = slices.Clone(c.toks)
	return c
}

// branch is a hedge branch: the prefix with the hedged token at fork,
// drafted under the main chain's epoch then.
type branch struct {
	chain
	fork  uint64
	epoch uint32
}

func newWorld(t testing.TB, cfg worldConfig) *world {
	w := &world{t: t, r: rand.New(rand.NewPCG(cfg.seed, 99)), cfg: cfg, prefixes: map[draftKey]uint64{}, truthHash: []uint64{0}}
	for i, side := range Sides {
		n, err := New(Config{Self: side, Aggregator: cfg.first, Greedy: cfg.greedy, Seed: cfg.seed, Share: cfg.share, Confidence: cfg.confidence,
			Hedges: cfg.hedges, HedgeDepth: cfg.hedgeDepth})
		require.NoError(t, err)
		if cfg.rule != nil {
			n.rule = cfg.rule
		}
		inner := n.rule
		n.rule = func(p pair, greedy bool, seed, step uint64) int32 {
			w.checkPrefixes(p, step)
			t := inner(p, greedy, seed, step)
			if step < uint64(len(w.truth)) {
				// The other Node decided this step first (shared drafts: the
				// side that does not aggregate decides what it can).
				w.must(t == w.truth[step], "both Nodes decide step %d alike: %d and %d", step, w.truth[step], t)
				w.redecided++
				return t
			}
			w.truth = append(w.truth, t)
			w.truthHash = append(w.truthHash, extendHash(w.truthHash[step], t))
			return t
		}
		w.nodes[i] = n
		prop, err := NewProposer(side, cfg.seed, cfg.greedy, cfg.topP)
		require.NoError(t, err)
		prop.SetConfidence(cfg.confidence)
		w.sides[i] = &producer{side: side, prop: prop}
	}
	return w
}

// checkPrefixes asserts that both drafts of a verified step were computed
// on the decided prefix: a stale draft is never verified.
func (w *world) checkPrefixes(p pair, step uint64) {
	w.verified++
	w.must(step <= uint64(len(w.truth)), "steps are decided in order: step %d after %d", step, len(w.truth))
	for _, d := range p.draft {
		got, ok := w.prefixes[keyOf(d)]
		w.must(ok, "%v was verified but never drafted", d)
		w.must(d.step == step, "%v verified as step %d", d, step)
		w.must(got == w.truthHash[step], "%v was verified on the wrong prefix", d)
	}
}

// must fails the test unless cond holds. The world checks its invariants
// on every turn, so it walks the stack (t.Helper) only on a failure:
// testify's checks do it on every call, which took a third of the time.
func (w *world) must(cond bool, format string, args ...any) {
	if !cond {
		w.t.Helper()
		w.t.Fatalf(format, args...)
	}
}

// noError is must for an error.
func (w *world) noError(err error) {
	if err != nil {
		w.t.Helper()
		w.t.Fatalf("%v", err)
	}
}

func (w *world) done() bool {
	return uint64(len(w.decided[0])) >= w.cfg.steps && uint64(len(w.decided[1])) >= w.cfg.steps
}

// run turns the world until both sides decided cfg.steps steps.
func (w *world) run() {
	for turns := 0; !w.done(); turns++ {
		w.must(turns < int(w.cfg.steps)*200, "no progress after %d turns", turns)
		var moves []func()
		for i := range w.sides {
			if p := w.sides[i]; p.pending == nil && w.canDraft(i) {
				moves = append(moves, func() { w.draft(i) })
			}
			if w.sides[i].pending != nil {
				moves = append(moves, func() { w.submit(i) })
			}
			if len(w.links[i]) > 0 {
				moves = append(moves, func() { w.deliver(i) })
			}
		}
		if w.r.Float64() < w.cfg.switchProb {
			for i := range w.nodes {
				if w.nodes[i].Aggregating() {
					moves = append(moves, func() { w.apply(i, SwitchRequest{}) })
				}
			}
		}
		w.must(len(moves) > 0, "deadlock")
		moves[w.r.IntN(len(moves))]()
	}
}

func (w *world) canDraft(i int) bool {
	p := w.sides[i]
	decided := uint64(len(w.decided[i]))
	return uint64(p.n) < decided+uint64(w.cfg.lookahead) && uint64(p.n) < w.cfg.steps+4
}

// draft computes a burst on the producer's prefix, as one forward pass of
// local speculation would.
func (w *world) draft(i int) {
	p := w.sides[i]
	n := 1 + w.r.IntN(w.cfg.maxBurst)
	// Branches whose fork the Node decided on the main chain's draft died.
	decided := len(w.decided[i])
	p.branches = slices.DeleteFunc(p.branches, func(b *branch) bool { return int(b.fork) < decided })
	for range n {
		step := uint64(p.n)
		probs := w.cfg.dist[i].next(p.n, p.last)
		var (
			d   Draft
			err error
		)
		if peer := w.peerDraft(i); peer != nil {
			w.beside++
			d, err = p.prop.ProposeBeside(probs, step, p.epoch, w.massAt(i, step, p.toks), peer)
			if d.Meta.Moved {
				w.moved++
			}
		} else {
			d, err = p.prop.Propose(probs, step, p.epoch, w.massAt(i, step, p.toks))
		}
		w.noError(err)
		w.prefixes[keyOf(&d)] = p.hash
		if alt, ok := d.RunnerUp(); ok && !w.nodes[i].Aggregating() && len(p.branches) < w.cfg.hedges && w.r.Float64() < w.cfg.hedgeProb {
			d, err = d.WithHedge(alt)
			w.noError(err)
			b := &branch{chain: p.chain.clone(), fork: step, epoch: p.epoch}
			b.extend(alt)
			p.branches = append(p.branches, b)
		}
		p.extend(d.Token())
		p.pending = append(p.pending, d)
	}
	// The same pass decodes each branch a step further, to its depth.
	for _, b := range p.branches {
		for range n {
			step := uint64(b.n)
			if step-b.fork > uint64(w.cfg.hedgeDepth) {
				break
			}
			d, err := p.prop.ProposeBranch(w.cfg.dist[i].next(b.n, b.last), step, b.epoch, w.massAt(i, step, b.toks), b.fork)
			w.noError(err)
			w.prefixes[keyOf(&d)] = b.hash
			b.extend(d.Token())
			p.pending = append(p.pending, d)
		}
	}
}

// peerDraft finds the peer's draft of side i's next step as a session does
// (its Node's epoch for the side is the producer's, and the peer's chain
// before the step holds the producer's tokens) and checks against the
// recorded prefixes that it was drafted on the producer's prefix.
func (w *world) peerDraft(i int) *Draft {
	p, node := w.sides[i], w.nodes[i]
	if !w.cfg.share || !w.cfg.greedy || node.Epoch(p.side) != p.epoch {
		return nil
	}
	chain := node.PeerDrafts()
	if len(chain) == 0 {
		return nil
	}
	from := int(chain[0].Step())
	if p.n < from || p.n >= from+len(chain) {
		return nil
	}
	for k, d := range chain[:p.n-from] {
		if d.Token() != p.toks[from+k] {
			return nil
		}
	}
	d := chain[p.n-from]
	w.must(w.prefixes[keyOf(&d)] == p.hash, "%v is on another prefix than %v's step %d", &d, p.side, p.n)
	return &d
}

func (w *world) submit(i int) {
	p := w.sides[i]
	burst := p.pending
	p.pending = nil
	w.apply(i, LocalDrafts{Drafts: burst})
}

func (w *world) deliver(i int) {
	ev := w.links[i][0]
	w.links[i] = w.links[i][1:]
	w.apply(i, ev)
}

// apply steps side i's Node and carries out its actions.
func (w *world) apply(i int, ev Event) {
	acts, err := w.nodes[i].Step(ev)
	w.noError(err)
	peer := 1 - i
	for _, a := range acts {
		switch a := a.(type) {
		case SendDrafts:
			w.links[peer] = append(w.links[peer], RemoteDrafts(a))
		case SendVerdicts:
			w.links[peer] = append(w.links[peer], RemoteVerdicts(a))
		case SendHandover:
			w.switches++
			w.links[peer] = append(w.links[peer], RemoteHandover(a))
		case Decided:
			w.must(a.Verdict.Step == uint64(len(w.decided[i])), "steps decided in order: step %d after %d", a.Verdict.Step, len(w.decided[i]))
			w.decided[i] = append(w.decided[i], a.Verdict.Target)
			w.decidedHash[i] = extendHash(w.decidedHash[i], a.Verdict.Target)
		case Rollback:
			p := w.sides[i]
			w.must(a.Step == uint64(len(w.decided[i])-1), "rollback to step %d, the last decided is %d", a.Step, len(w.decided[i])-1)
			p.epoch = a.Epoch
			if a.Hedged {
				// The branch becomes the chain; its drafts in the pass in
				// flight are the new epoch's, so the pass is kept.
				k := slices.IndexFunc(p.branches, func(b *branch) bool { return b.fork == a.Step })
				require.GreaterOrEqual(w.t, k, 0, "adopted a branch this side has not got")
				require.Equal(w.t, w.decidedHash[i], extendHash(w.prefixes[draftKey{p.side, a.Step, p.branches[k].epoch, 0}], a.Target))
				p.chain = p.branches[k].chain
				p.branches = nil
				p.hedgeHits++
				continue
			}
			p.branches = nil
			p.n, p.last, p.hash = len(w.decided[i]), a.Target, w.decidedHash[i]
			p.toks = append(p.toks[:0], w.decided[i]...)
			if p.pending != nil && w.r.Float64() >= w.cfg.staleProb {
				p.pending = nil // the pass in flight was aborted
			}
		case Done:
		default:
			w.t.Fatalf("unexpected action %T", a)
		}
	}
}

// agreed checks that both sides emitted the same targets and returns them.
func (w *world) agreed() []int32 {
	n := min(len(w.decided[0]), len(w.decided[1]))
	require.Equal(w.t, w.decided[0][:n], w.decided[1][:n], "both sides emit the same targets")
	return w.decided[0][:n]
}

func (c worldConfig) String() string {
	return fmt.Sprintf("seed %d greedy %v burst %d lookahead %d switch %.2f", c.seed, c.greedy, c.maxBurst, c.lookahead, c.switchProb)
}

// extendHash is the hash of a prefix extended by tok.
func extendHash(h uint64, tok int32) uint64 { return mix64(h ^ uint64(tok)*0x100000001b3) }
