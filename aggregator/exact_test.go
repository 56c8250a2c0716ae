package aggregator

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/stat/distuv"
)

// chiSquare tests a sequence of targets against the Markov chain whose
// kernel is the η-mixture of the two sides' tables: given the previous
// target, the next must be distributed as η·p^device + (1-η)·p^cloud. It
// returns the p-value.
func chiSquare(t *testing.T, targets []int32, dist [2]markov, eta float64) float64 {
	return chiSquareAt(t, targets, dist, func([]int32) float64 { return eta })
}

// chiSquareAt is chiSquare with η a function of the targets before each
// position (dynamic weights); rows are counted per (previous target, η).
func chiSquareAt(t *testing.T, targets []int32, dist [2]markov, etaAt func(prefix []int32) float64) float64 {
	vocab := len(dist[0][len(dist[0])-1])
	type cell struct {
		row int
		eta float64
	}
	// Rows are made as they are reached: a large vocabulary reaches few.
	counts := map[cell][]float64{}
	prev := vocab // the start row
	for i, tok := range targets {
		c := cell{prev, etaAt(targets[:i])}
		if counts[c] == nil {
			counts[c] = make([]float64, vocab)
		}
		counts[c][tok]++
		prev = int(tok)
	}
	var stat float64
	df := 0
	for c, obs := range counts {
		var n float64
		for _, o := range obs {
			n += o
		}
		cells := 0
		for tok, o := range obs {
			p := c.eta*float64(dist[0][c.row][tok]) + (1-c.eta)*float64(dist[1][c.row][tok])
			e := n * p
			if e == 0 {
				require.Zero(t, o, "token %d after %d has probability 0", tok, c.row)
				continue
			}
			stat += (o - e) * (o - e) / e
			cells++
		}
		df += cells - 1
	}
	return distuv.ChiSquared{K: float64(df)}.Survival(stat)
}

// disagreeing is a pair of tables over 5 tokens whose rows put their mass
// on different tokens, so that drafts are often rejected.
func disagreeing(seed uint64) [2]markov {
	r := rand.New(rand.NewPCG(seed, 7))
	return [2]markov{randomMarkov(r, 5), randomMarkov(r, 5)}
}

func logMass(eta float64) [2]float64 { return [2]float64{math.Log(eta), math.Log(1 - eta)} }

type exactCase struct {
	name       string
	maxBurst   int
	lookahead  int
	switchProb float64
	// share: Config.Share, so the side that does not aggregate decides
	// the steps it holds both drafts of itself.
	share bool
	// hedge: the side that does not aggregate hedges its runner-up
	// (hedgedWorld).
	hedge bool
}

var exactCases = []exactCase{
	{"one draft at a time", 1, 1, 0, false, false},
	{"bursts", 4, 8, 0, false, false},
	{"bursts and handovers", 4, 8, 0.2, false, false},
	{"bursts, handovers and shared drafts", 4, 8, 0.2, true, false},
	{"bursts, handovers, shared drafts and hedges", 4, 8, 0.2, true, true},
}

// hedged sets cfg to hedge: up to 3 hedges open a side, branches 6 deep,
// the runner-up of half the main drafts of a side that does not
// aggregate.
func (c exactCase) hedged(cfg worldConfig) worldConfig {
	if c.hedge {
		cfg.hedges, cfg.hedgeDepth, cfg.hedgeProb = 3, 6, 0.5
	}
	return cfg
}

// checkHedges asserts that a hedged run adopted branches on both Nodes
// alike and produced as many adoptions as the Nodes counted.
func checkHedges(t *testing.T, w *world) {
	hits := 0
	for i, side := range Sides {
		st := w.nodes[i].Stats(side)
		hits += w.sides[i].hedgeHits
		assert.Equal(t, uint64(w.sides[i].hedgeHits), st.HedgeHits, "%v adopted a branch for each hedge hit its Node counted", side)
		assert.Positive(t, st.Hedges, "%v hedged", side)
	}
	t.Logf("%d branches adopted", hits)
	assert.Greater(t, hits, 100, "rejections landed on hedges")
}

// TestSpeculativeAggregationIsExact runs ≥ 20,000 aggregations per case on
// disagreeing distributions and checks the targets against the mixture.
func TestSpeculativeAggregationIsExact(t *testing.T) {
	const steps = 20000
	for _, eta := range []float64{0.1, 0.5, 0.9} {
		for i, c := range exactCases {
			t.Run(fmt.Sprintf("eta=%.1f/%s", eta, c.name), func(t *testing.T) {
				dist := disagreeing(11)
				w := newWorld(t, c.hedged(worldConfig{
					seed: uint64(1000*eta) + uint64(i), topP: 1, dist: dist, logMass: logMass(eta),
					maxBurst: c.maxBurst, lookahead: c.lookahead, switchProb: c.switchProb, staleProb: 0.5,
					first: Device, steps: steps, share: c.share,
				}))
				w.run()
				targets := w.agreed()
				require.GreaterOrEqual(t, len(targets), steps)
				p := chiSquare(t, targets, dist, eta)
				st := w.nodes[0].Stats(Device)
				t.Logf("p = %.4f; device drafts accepted %d, rejected %d, stale %d; %d handovers", p, st.Accepted, st.Rejected, w.nodes[0].Stats(Device).Stale+w.nodes[1].Stats(Device).Stale, w.switches)
				assert.Greater(t, p, 0.001, "targets follow the η-mixture")
				assert.Positive(t, st.Rejected, "the distributions disagree")
				if c.switchProb > 0 {
					assert.Greater(t, w.switches, 100, "the aggregator moved")
				}
				if c.share {
					t.Logf("%d steps decided by both Nodes", w.redecided)
					assert.Greater(t, w.redecided, steps/20, "the side that does not aggregate decided steps itself")
				}
				if c.hedge {
					checkHedges(t, w)
				}
			})
		}
	}
}

// qwenVocab is Qwen2.5's vocabulary size, DRAGON's model family: ids past
// 65,535 must survive drafting, the codec and verification (the public
// DRAGON code packed them into 16 bits).
const qwenVocab = 151936

// sparseMarkov is a Markov table over a vocabulary of vocab ids whose mass
// sits on the ids of support: only their rows (and the start row) exist.
func sparseMarkov(r *rand.Rand, vocab int, support []int32) markov {
	m := make(markov, vocab+1)
	for _, row := range append([]int{vocab}, toInts(support)...) {
		dist := make([]float32, vocab)
		var sum float32
		for _, tok := range support {
			dist[tok] = float32(r.ExpFloat64()) * float32(r.ExpFloat64())
			sum += dist[tok]
		}
		for _, tok := range support {
			dist[tok] /= sum
		}
		m[row] = dist
	}
	return m
}

func toInts(ts []int32) []int {
	out := make([]int, len(ts))
	for i, t := range ts {
		out[i] = int(t)
	}
	return out
}

// TestSpeculativeAggregationIsExactOverQwenVocabulary is the exactness
// test over a 151,936-id vocabulary, its mass on ids spread across it
// (the last ones among them), with bursts and handovers.
func TestSpeculativeAggregationIsExactOverQwenVocabulary(t *testing.T) {
	support := []int32{7, 40_000, 65_535, 65_536, 100_003, 151_645, qwenVocab - 1}
	r := rand.New(rand.NewPCG(17, 7))
	dist := [2]markov{sparseMarkov(r, qwenVocab, support), sparseMarkov(r, qwenVocab, support)}
	const eta = 0.4
	steps := uint64(4000)
	if raceDetector {
		steps = 1500
	}
	w := newWorld(t, worldConfig{
		seed: 21, topP: 1, dist: dist, logMass: logMass(eta),
		maxBurst: 4, lookahead: 8, switchProb: 0.2, staleProb: 0.5, first: Cloud, steps: steps,
	})
	w.run()
	targets := w.agreed()
	require.GreaterOrEqual(t, uint64(len(targets)), steps)
	seen := map[int32]bool{}
	for _, tok := range targets {
		seen[tok] = true
	}
	assert.Len(t, seen, len(support), "every id of the support was emitted, the high ones too")
	p := chiSquare(t, targets, dist, eta)
	t.Logf("p = %.4f; %d handovers", p, w.switches)
	assert.Greater(t, p, 0.001, "targets follow the η-mixture")
	assert.Greater(t, w.switches, 20, "the aggregator moved")
}

// TestSpeculativeAggregationIsExactWithDynamicWeights: each side's h̃
// changes every 3 steps as a function of the answer before the boundary
// (re-scoring its passages against it), drafts computed on a prefix that is
// later rolled back carry that prefix's h̃, and the targets still follow
// the η-mixture of each position's weights.
func TestSpeculativeAggregationIsExactWithDynamicWeights(t *testing.T) {
	const every = 3
	etas := []float64{0.15, 0.5, 0.85}
	// The answer's last every tokens before the boundary choose h̃: a
	// hash of the whole answer would cost quadratic time over 20,000 steps.
	rescore := func(prefix []int32) float64 {
		var h uint64 = 1469598103934665603
		for _, tok := range prefix[max(0, len(prefix)-every):] {
			h = (h ^ uint64(tok)) * 1099511628211
		}
		return etas[h%uint64(len(etas))]
	}
	etaAt := func(prefix []int32) float64 { return rescore(prefix[:len(prefix)/every*every]) }
	for i, c := range exactCases {
		t.Run(c.name, func(t *testing.T) {
			dist := disagreeing(13)
			w, targets := runExactCase(t, c, worldConfig{seed: 77 + uint64(i), dist: dist, rescoreEvery: every, rescore: rescore})
			p := chiSquareAt(t, targets, dist, etaAt)
			t.Logf("p = %.4f; %d handovers", p, w.switches)
			assert.Greater(t, p, 0.001, "targets follow each position's η-mixture")
			// The test can tell: weights taking effect one rescoring late do
			// not fit these targets.
			late := func(prefix []int32) float64 { return rescore(prefix[:max(0, len(prefix)/every*every-every)]) }
			assert.Less(t, chiSquareAt(t, targets, dist, late), 0.001)
		})
	}
}

// TestSpeculativeAggregationIsExactWithConfidenceWeights: each step's η
// comes from both views' entropies as well as h̃, so it changes with the
// prefix; the targets follow each step's mixture, with bursts, handovers
// and shared drafts, and do not fit the mixture of the h̃ weights alone.
func TestSpeculativeAggregationIsExactWithConfidenceWeights(t *testing.T) {
	const tau = 0.5
	dist := disagreeing(19)
	mass := logMass(0.5)
	// etaAt is the device's weight of the step after prefix, from the
	// views its drafts carry (the codec's, as on the wire). The tables are
	// Markov, so it depends on the last target alone and is computed once
	// per table row.
	etaAt := func(confidence float64) func(prefix []int32) float64 {
		var proposers [2]*Proposer
		for i, side := range Sides {
			var err error
			proposers[i], err = NewProposer(side, 1, false, 1)
			require.NoError(t, err)
		}
		byRow := map[int32]float64{}
		return func(prefix []int32) float64 {
			last := int32(-1)
			if len(prefix) > 0 {
				last = prefix[len(prefix)-1]
			}
			if eta, ok := byRow[last]; ok {
				return eta
			}
			var d [2]Draft
			for i := range Sides {
				var err error
				d[i], err = proposers[i].Propose(dist[i].next(len(prefix), last), 0, 0, mass[i])
				require.NoError(t, err)
			}
			eta := newPair(&d[0], &d[1], confidence).eta[0]
			byRow[last] = eta
			return eta
		}
	}
	for i, c := range exactCases {
		t.Run(c.name, func(t *testing.T) {
			w, targets := runExactCase(t, c, worldConfig{seed: 31 + uint64(i), dist: dist, logMass: mass, confidence: tau})
			p := chiSquareAt(t, targets, dist, etaAt(tau))
			t.Logf("p = %.4f; %d handovers", p, w.switches)
			assert.Greater(t, p, 0.001, "targets follow each step's confidence-weighted mixture")
			assert.Less(t, chiSquareAt(t, targets, dist, etaAt(0)), 0.001, "and not the h̃ weights alone")
		})
	}
}

// runExactCase runs 20,000 sampled steps of cfg (seed, tables, weights)
// under case c's schedule, the cloud aggregating first, and returns the
// world and its targets.
func runExactCase(t *testing.T, c exactCase, cfg worldConfig) (*world, []int32) {
	cfg.topP, cfg.maxBurst, cfg.lookahead, cfg.switchProb, cfg.staleProb = 1, c.maxBurst, c.lookahead, c.switchProb, 0.5
	cfg.first, cfg.steps, cfg.share = Cloud, 20000, c.share
	w := newWorld(t, c.hedged(cfg))
	w.run()
	targets := w.agreed()
	require.GreaterOrEqual(t, len(targets), 20000)
	return w, targets
}

// brokenResample is Algorithm 1 with a plausible bug: a rejected draft is
// redrawn from the other side's distribution instead of from
// norm(max(0, p^b - p^a)).
func brokenResample(p pair, _ bool, seed, step uint64) int32 {
	pick := func(a, b *Draft, eta float64, sigma, u float64) int32 {
		qa, qb := float64(a.dist.Prob(a.token)), float64(b.dist.Prob(a.token))
		if !(qa > qb) || sigma >= eta*(1-qb/qa) {
			return a.token
		}
		return drawU(&b.dist, u)
	}
	d, c := p.draft[0], p.draft[1]
	xd := pick(d, c, p.eta[1], uniform(seed, step, streamSigmaDevice), uniform(seed, step, streamResampleDevice))
	xc := pick(c, d, p.eta[0], uniform(seed, step, streamSigmaCloud), uniform(seed, step, streamResampleCloud))
	if uniform(seed, step, streamPick) < 0.5 {
		return xd
	}
	return xc
}

// TestBrokenRuleFailsExactnessTest shows the exactness test has teeth: the
// same run with a wrong resampling distribution is rejected.
func TestBrokenRuleFailsExactnessTest(t *testing.T) {
	for _, eta := range []float64{0.1, 0.5, 0.9} {
		t.Run(fmt.Sprintf("eta=%.1f", eta), func(t *testing.T) {
			dist := disagreeing(11)
			w := newWorld(t, worldConfig{
				seed: uint64(1000 * eta), topP: 1, dist: dist, logMass: logMass(eta),
				maxBurst: 4, lookahead: 8, switchProb: 0.2, staleProb: 0.5, first: Device, steps: 20000,
				rule: brokenResample,
			})
			w.run()
			p := chiSquare(t, w.agreed(), dist, eta)
			t.Logf("p = %.3g", p)
			assert.Less(t, p, 0.001, "a broken rule must fail")
		})
	}
}

// TestGreedyTargetIsMixtureArgmax: with temperature 0 every target is the
// argmax of the mixture of the two distributions given the prefix, whether
// or not drafts are shared and made beside the peer's (which must cut the
// rejections; the harness checks each such peer draft's prefix).
func TestGreedyTargetIsMixtureArgmax(t *testing.T) {
	rejected := map[bool]uint64{}
	hedgeHits := 0
	for _, c := range []struct {
		eta          float64
		share, hedge bool
	}{{0.2, false, false}, {0.5, false, false}, {0.8, false, false}, {0.2, true, false}, {0.5, true, false}, {0.8, true, false}, {0.2, true, true}, {0.5, true, true}, {0.8, true, true}} {
		eta := c.eta
		dist := disagreeing(5)
		w := newWorld(t, exactCase{hedge: c.hedge}.hedged(worldConfig{
			seed: 3, greedy: true, topP: 1, dist: dist, logMass: logMass(eta), share: c.share,
			maxBurst: 3, lookahead: 6, switchProb: 0.3, staleProb: 0.5, first: Cloud, steps: 500,
		}))
		w.run()
		targets := w.agreed()
		if c.hedge {
			hedgeHits += w.sides[0].hedgeHits + w.sides[1].hedgeHits
		}
		if c.share {
			assert.Positive(t, w.moved, "eta %.1f: drafts moved to the mixture's argmax", eta)
		} else {
			assert.Zero(t, w.beside, "eta %.1f", eta)
		}
		st := [2]Stats{w.nodes[0].Stats(Device), w.nodes[0].Stats(Cloud)}
		if !c.hedge {
			rejected[c.share] += st[0].Rejected + st[1].Rejected
		}
		prev := len(dist[0][0])
		for step, tok := range targets {
			best, bestP := -1, -1.0
			for x := range dist[0][prev] {
				if m := eta*float64(dist[0][prev][x]) + (1-eta)*float64(dist[1][prev][x]); m > bestP+1e-6 {
					best, bestP = x, m
				}
			}
			require.Equal(t, int32(best), tok, "eta %.1f step %d", eta, step)
			prev = int(tok)
		}
	}
	t.Logf("rejected drafts: %d blind, %d beside the peer's; %d adopted hedge branches", rejected[false], rejected[true], hedgeHits)
	assert.Positive(t, hedgeHits, "greedy rejections landed on hedges")
	assert.Less(t, rejected[true], rejected[false]*3/4, "shared drafts cut rejections")
}
