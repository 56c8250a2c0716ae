package specdec

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/stat/distuv"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
)

const draws = 20000

// target gives post-processed (top-k, softmax) next-token distributions of
// the fake model, cached by history.
type target struct {
	m     *fake.Model
	k     int
	cache map[string]dist
}

type dist struct {
	p   []float32
	top []engine.TokenLogit
}

func newTarget() *target {
	return &target{m: fake.New(fake.Config{Seed: 3, Scale: 1}), k: 5, cache: map[string]dist{}}
}

func (tg *target) dist(h []Token) dist {
	key := make([]byte, 0, 2*len(h))
	for _, t := range h {
		key = append(key, byte(t), byte(t>>8))
	}
	if d, ok := tg.cache[string(key)]; ok {
		return d
	}
	logits := tg.m.Distribution(h)
	d := dist{p: make([]float32, len(logits)), top: engine.TopK(logits, tg.k, nil)}
	for _, s := range SuccessorsFromTopK(d.top, nil) {
		d.p[s.Token] = s.Prob
	}
	tg.cache[string(key)] = d
	return d
}

func (tg *target) probs(h []Token) []float32 { return tg.dist(h).p }

// ranked returns the token of rank r (0: most likely) after h.
func (tg *target) ranked(h []Token, r int) Token { return tg.dist(h).top[r].Token }

func cat(h []Token, more ...Token) []Token { return append(slices.Clone(h), more...) }

// stepFunc verifies a draft tree and returns the emitted tokens.
type stepFunc func(t *Tree, probs [][]float32, rng *rand.Rand) []Token

func sampleStep(t *Tree, probs [][]float32, rng *rand.Rand) []Token {
	v, err := t.VerifySample(probs, rng)
	if err != nil {
		panic(err)
	}
	return v.Emit
}

// linearStep runs VerifySample, so that it is tested as the decoder calls it.
func linearStep(t *Tree, probs [][]float32, rng *rand.Rand) []Token {
	draft := t.Tokens(t.Path(t.Leaves[0]))
	v, err := VerifySample(draft, probs, rng)
	if err != nil {
		panic(err)
	}
	return v.Emit
}

// firstTwo generates until two tokens are out: each step drafts a tree
// with build, verifies it with step, and takes what it emits.
func firstTwo(tg *target, h0 []Token, build func(h []Token) *Tree, step stepFunc, rng *rand.Rand) [2]Token {
	var out []Token
	for len(out) < 2 {
		h := cat(h0, out...)
		tr := build(h)
		probs := make([][]float32, len(tr.Nodes))
		for i := range tr.Nodes {
			probs[i] = tg.probs(cat(h, tr.Tokens(tr.Path(i))...))
		}
		out = append(out, step(tr, probs, rng)...)
	}
	return [2]Token{out[0], out[1]}
}

// chiSquare compares counts with n·p over the cells where p > 0, failing if
// a cell of probability zero was drawn; it returns the p-value.
func chiSquare(t *testing.T, counts map[[2]Token]int, want map[[2]Token]float64, n int) float64 {
	t.Helper()
	for c, k := range counts {
		require.Positive(t, want[c], "drew %v (%d times), which has probability 0", c, k)
	}
	var stat float64
	for c, p := range want {
		e := p * float64(n)
		require.GreaterOrEqual(t, e, 5.0, "cell %v too rare for a chi-square test", c)
		d := float64(counts[c]) - e
		stat += d * d / e
	}
	return distuv.ChiSquared{K: float64(len(want) - 1)}.Survival(stat)
}

// joint is the target's distribution of the first two tokens (and, with
// second=false, of the first alone, as pairs (a, -1)).
func joint(tg *target, h0 []Token, second bool) map[[2]Token]float64 {
	want := map[[2]Token]float64{}
	for a, pa := range tg.probs(h0) {
		if pa == 0 {
			continue
		}
		if !second {
			want[[2]Token{Token(a), -1}] = float64(pa)
			continue
		}
		for b, pb := range tg.probs(cat(h0, Token(a))) {
			if pb > 0 {
				want[[2]Token{Token(a), Token(b)}] = float64(pa) * float64(pb)
			}
		}
	}
	return want
}

// pValues draws the first two tokens and tests both their joint law and
// the first token's marginal against the target.
func pValues(t *testing.T, build func(h []Token) *Tree, step stepFunc, seed uint64) (first, both float64) {
	t.Helper()
	tg := newTarget()
	h0, err := tg.m.Tokenize("the cat", false, false)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(seed, 99))
	c1, c2 := map[[2]Token]int{}, map[[2]Token]int{}
	for range draws {
		two := firstTwo(tg, h0, build, step, rng)
		c1[[2]Token{two[0], -1}]++
		c2[two]++
	}
	return chiSquare(t, c1, joint(tg, h0, false), draws), chiSquare(t, c2, joint(tg, h0, true), draws)
}

// chainBuilder drafts the target's rank-1 and rank-2 tokens (likely but
// not certain, so both acceptance and rejection happen often).
func chainBuilder(tg *target) func(h []Token) *Tree {
	return func(h []Token) *Tree {
		x0 := tg.ranked(h, 1)
		return ChainTree(h[len(h)-1], []Token{x0, tg.ranked(cat(h, x0), 2)})
	}
}

// treeBuilder drafts two first tokens (ranks 1 and 0) and two children
// under the first.
func treeBuilder(tg *target) func(h []Token) *Tree {
	return func(h []Token) *Tree {
		tr := NewTree(h[len(h)-1])
		a := tr.Add(0, tg.ranked(h, 1), 0)
		tr.Add(0, tg.ranked(h, 0), 0)
		ha := cat(h, tr.Nodes[a].Token)
		tr.Add(a, tg.ranked(ha, 2), 0)
		tr.Add(a, tg.ranked(ha, 0), 0)
		tr.Finish()
		return tr
	}
}

func TestSpeculativeSamplingPreservesDistribution(t *testing.T) {
	tg := newTarget()
	for _, tc := range []struct {
		name  string
		build func(h []Token) *Tree
		step  stepFunc
	}{
		{"single draft", chainBuilder(tg), linearStep},
		{"tree", treeBuilder(tg), sampleStep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, both := pValues(t, tc.build, tc.step, 1)
			require.Greater(t, first, 0.001, "first token")
			require.Greater(t, both, 0.001, "first two tokens")
		})
	}
}

// brokenStep is deliberately wrong verification: keepRejected samples the
// replacement from p without removing rejected drafts (and tries each child
// against the full p); otherwise every draft is accepted.
func brokenStep(keepRejected bool) stepFunc {
	return func(t *Tree, probs [][]float32, rng *rand.Rand) []Token {
		kids := t.children()
		var out []Token
		for v := 0; ; {
			next := -1
			for _, c := range kids[v] {
				if !keepRejected || rng.Float64()*sum(probs[v]) < float64(probs[v][t.Nodes[c].Token]) {
					next = c
					break
				}
			}
			if next < 0 {
				y, err := sample(probs[v], sum(probs[v]), rng)
				if err != nil {
					panic(err)
				}
				return append(out, y)
			}
			out = append(out, t.Nodes[next].Token)
			v = next
		}
	}
}

// The statistical test has teeth: it rejects broken rules.
func TestSpeculativeSamplingTestDetectsBrokenRules(t *testing.T) {
	tg := newTarget()
	for _, tc := range []struct {
		name  string
		build func(h []Token) *Tree
		step  stepFunc
	}{
		{"single draft, rejection keeps x", chainBuilder(tg), brokenStep(true)},
		{"single draft, always accept", chainBuilder(tg), brokenStep(false)},
		{"tree, rejection keeps children", treeBuilder(tg), brokenStep(true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, both := pValues(t, tc.build, tc.step, 2)
			require.Less(t, math.Min(first, both), 0.001)
		})
	}
}
