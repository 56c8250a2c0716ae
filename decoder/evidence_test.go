package decoder

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
	"github.com/dragon-rag/dragon/kvcache"
	"github.com/dragon-rag/dragon/sampling"
	"github.com/dragon-rag/dragon/specdec"
)

// handEvidence is Σ_t log softmax(logits after prompt_s + gen[:t])[gen[t]]
// for each sequence s, from the fake model's own distributions, with the
// unused ids masked as the decoder masks them.
func handEvidence(m *fake.Model, d *Decoder, gen []engine.Token, unused ...engine.Token) []float64 {
	sums := make([]float64, d.Seqs())
	for s := range sums {
		hist := append([]engine.Token(nil), d.Prompt(s)...)
		for _, tok := range gen {
			logits := m.Distribution(hist)
			for _, u := range unused {
				logits[u] = float32(math.Inf(-1))
			}
			sums[s] += math.Log(softmax64(logits)[tok])
			hist = append(hist, tok)
		}
	}
	return sums
}

// copier copies text from its context, so that local drafts land; its
// every logit also depends on the whole context, so that the passages
// disagree about each token (their evidence differs).
var copier = fake.Config{Seed: 3, Vocab: 300, Copy: 6, CopyOrder: 1, Order: 1 << 20}

const copyQuery = "Repeat: the lamp, the lamp, the lamp at dusk; the lamp at dawn"

// TestEvidenceOfGenerate: whatever way the tokens were decided (one a
// pass, verified local drafts and their corrections, token trees), each
// passage's evidence is the log-likelihood of the answer under it.
func TestEvidenceOfGenerate(t *testing.T) {
	variants := specVariants()
	variants["plain"] = specVariant{}
	for name, v := range variants {
		m, d := newFakeWith(t, copier, Options{Spec: v.spec, NoCostModel: v.noCost})
		d.SetEvidence(true)
		res, err := d.Generate(context.Background(), Request{Query: copyQuery, Passages: threePassages, MaxTokens: 40}, nil)
		require.NoError(t, err, name)
		gen := d.Generated()
		require.GreaterOrEqual(t, len(gen), len(res.Tokens), name)
		got, err := d.Evidence(context.Background(), len(gen))
		require.NoError(t, err, name)
		assert.InDeltaSlice(t, handEvidence(m, d, gen), got, 1e-4, name)
		for s := range got {
			assert.Less(t, got[s], 0.0, "%s: a log-likelihood", name)
		}
		assert.NotEqual(t, got[0], got[1], "%s: the passages disagree", name)
		assert.LessOrEqual(t, len(d.ev.ring), 1, "%s: a local answer keeps no distribution of its decided tokens", name)
	}
}

// TestEvidenceAfterRewinds: a peer's target replacing this side's draft at
// a position still kept, one further back than the window (decoded again),
// and several at once: the evidence is always the answer's.
func TestEvidenceAfterRewinds(t *testing.T) {
	m, d := newFakeWith(t, copier, Options{Spec: allOn(), NoCostModel: true})
	d.SetEvidence(true)
	ctx := context.Background()
	require.NoError(t, d.Start(ctx, copyQuery, threePassages))
	defer d.Finish()
	greedy := func(mix []float32, _ int, _ []engine.Token) (engine.Token, error) {
		return engine.Token(sampling.Argmax(mix)), nil
	}
	step := func(n int) {
		for len(d.Generated()) < n {
			_, err := d.Step(ctx, greedy, 1+len(d.Generated())%4)
			require.NoError(t, err)
		}
	}
	other := engine.Token(fake.ByteOffset + 'Z')
	check := func(what string) {
		t.Helper()
		gen := d.Generated()
		got, err := d.Evidence(ctx, len(gen))
		require.NoError(t, err, what)
		assert.InDeltaSlice(t, handEvidence(m, d, gen), got, 1e-4, what)
	}
	step(30)
	check("own tokens")
	require.NoError(t, d.Rewind(len(d.Generated())-2, other))
	check("a target two back")
	require.NoError(t, d.Rewind(3, other))
	assert.Equal(t, -1, d.ev.firstMissing(3), "the kept prefix keeps its terms")
	check("a target further back than the window")
	step(20)
	require.NoError(t, d.Rewind(10, other, other, other))
	check("three targets")
	step(26)
	check("after decoding on")
	// Part of the answer.
	got, err := d.Evidence(ctx, 7)
	require.NoError(t, err)
	assert.InDeltaSlice(t, handEvidence(m, d, d.Generated()[:7]), got, 1e-4)
}

// TestEvidenceKeepsNoOldDistributions: the ring holds no more than the
// window's positions, and none below a settled point.
func TestEvidenceKeepsNoOldDistributions(t *testing.T) {
	_, d := newFakeWith(t, copier, Options{})
	d.SetEvidence(true)
	ctx := context.Background()
	require.NoError(t, d.Start(ctx, copyQuery, threePassages))
	greedy := func(mix []float32, _ int, _ []engine.Token) (engine.Token, error) {
		return engine.Token(sampling.Argmax(mix)), nil
	}
	for range 20 {
		_, err := d.Step(ctx, greedy, 1)
		require.NoError(t, err)
		assert.LessOrEqual(t, len(d.ev.ring), evidenceWindow+1)
	}
	d.Settle(18)
	for _, dd := range d.ev.ring {
		assert.GreaterOrEqual(t, dd.pos, 18)
	}
}

// TestEvidenceOfAnAdoptedBranch: adopting a hedge branch gives its tokens
// the terms of the answer they make.
func TestEvidenceOfAnAdoptedBranch(t *testing.T) {
	m, d := newFakeWith(t, copier, Options{Hedges: 1})
	d.SetEvidence(true)
	ctx := context.Background()
	require.NoError(t, d.Start(ctx, copyQuery, threePassages))
	greedy := func(mix []float32, _ int, _ []engine.Token) (engine.Token, error) {
		return engine.Token(sampling.Argmax(mix)), nil
	}
	for range 6 {
		_, err := d.Step(ctx, greedy, 1)
		require.NoError(t, err)
	}
	h, err := d.Fork(5, fake.ByteOffset+'Q')
	require.NoError(t, err)
	for range 3 {
		_, err := d.Step(ctx, greedy, 1) // the branch's rows ride along
		require.NoError(t, err)
		require.NoError(t, d.PushBranch(h, engine.Token(sampling.Argmax(d.BranchNext(h)))))
	}
	require.NoError(t, d.AdoptBranch(h))
	gen := d.Generated()
	got, err := d.Evidence(ctx, len(gen))
	require.NoError(t, err)
	assert.InDeltaSlice(t, handEvidence(m, d, gen), got, 1e-4)
}

// TestEvidenceWithUnusedIdsAndACache: masked ids are masked in the terms
// too, and a prompt restored from the KV cache gives the same terms.
func TestEvidenceWithUnusedIdsAndACache(t *testing.T) {
	unused := []engine.Token{250, 260, 299}
	cfg := copier
	cfg.Unused = unused
	cache, err := kvcache.New(kvcache.Config{Namespace: "evidence", MemoryBytes: 64 << 20})
	require.NoError(t, err)
	m, d := newFakeWith(t, cfg, Options{Cache: cache})
	d.SetEvidence(true)
	ctx := context.Background()
	for round := range 2 { // the second round restores the prompts
		res, err := d.Generate(ctx, Request{Query: copyQuery, Passages: threePassages, MaxTokens: 20}, nil)
		require.NoError(t, err)
		require.NotEmpty(t, res.Tokens)
		gen := d.Generated()
		got, err := d.Evidence(ctx, len(gen))
		require.NoError(t, err)
		assert.InDeltaSlice(t, handEvidence(m, d, gen, unused...), got, 1e-4, "round %d", round)
		d.Retain()
	}
	assert.Positive(t, d.Restored(), "the second round began from the cache")
}

// TestEvidenceChangesNoToken: with evidence on, sampled and greedy answers
// are the same tokens as with it off, and Evidence refuses what it cannot
// know.
func TestEvidenceChangesNoToken(t *testing.T) {
	slow := copier
	slow.CallLatency, slow.Latency = time.Millisecond, 20*time.Microsecond
	for _, sp := range []sampling.Params{{}, {Temperature: 0.8, TopP: 0.9, Seed: 7}} {
		var answers [2][]engine.Token
		for i, on := range []bool{false, true} {
			_, d := newFakeWith(t, slow, Options{Spec: specdec.DefaultOptions()})
			d.SetEvidence(on)
			res, err := d.Generate(context.Background(), Request{Query: copyQuery, Passages: threePassages, MaxTokens: 40, Sampling: sp}, nil)
			require.NoError(t, err)
			answers[i] = res.Tokens
			if !on {
				_, err := d.Evidence(context.Background(), 1)
				assert.ErrorIs(t, err, engine.ErrInvalidInput, "off: no evidence")
			} else {
				_, err := d.Evidence(context.Background(), len(d.Generated())+1)
				assert.ErrorIs(t, err, engine.ErrInvalidInput, "beyond the answer")
			}
		}
		assert.Equal(t, answers[0], answers[1], "%+v", sp)
	}
}

// TestPosteriorWeights: with PosteriorEvery k, the mixture at answer
// position p weighs each passage by softmax(R + its log-likelihood of the
// answer's first ⌊p/k⌋·k tokens), computed by hand; plain decoding, local
// drafts and a rewind decide the same tokens; the weights move toward the
// passages that predicted the answer.
func TestPosteriorWeights(t *testing.T) {
	const every = 3
	var answers [][]engine.Token
	for _, spec := range []bool{false, true} {
		opts := Options{PosteriorEvery: every}
		if spec {
			opts.Spec, opts.NoCostModel = specdec.DefaultOptions(), true
		}
		m, d := newFakeWith(t, copier, opts)
		ctx := context.Background()
		require.NoError(t, d.Start(ctx, copyQuery, threePassages))
		prior := passageScores(threePassages)
		choose := func(mix []float32, pos int, hist []engine.Token) (engine.Token, error) {
			b := pos / every * every
			ll := handEvidence(m, d, hist[:b])
			scores := make([]float64, len(prior))
			for i := range scores {
				scores[i] = prior[i] + ll[i]
			}
			w, hTilde := weights(scores)
			assert.InDeltaSlice(t, w, d.Weights(), 1e-5, "spec %v: weights at %d", spec, pos)
			assert.InDelta(t, hTilde, d.HTilde(), 1e-4, "spec %v: h̃ at %d", spec, pos)
			// The mixture under those weights, by hand.
			want := make([]float64, len(mix))
			for s := range threePassages {
				p := softmax64(m.Distribution(append(append([]engine.Token(nil), d.Prompt(s)...), hist...)))
				for i := range want {
					want[i] += float64(w[s]) * p[i]
				}
			}
			for i := range want {
				if want[i] > 1e-4 {
					assert.InDelta(t, want[i], float64(mix[i]), 1e-4*want[i]+1e-6, "spec %v: token %d at %d", spec, i, pos)
				}
			}
			return engine.Token(sampling.Argmax(mix)), nil
		}
		for len(d.Generated()) < 16 {
			_, err := d.Step(ctx, choose, 16-len(d.Generated()))
			require.NoError(t, err)
		}
		answers = append(answers, slices.Clone(d.Generated()))
		initial, _ := weights(prior)
		assert.NotEqual(t, initial, d.Weights(), "the evidence moved the weights")
		// A rewind below a boundary drops its epoch; the new answer's
		// evidence makes the next.
		require.NoError(t, d.Rewind(4, fake.ByteOffset+'z'))
		for len(d.Generated()) < 10 {
			_, err := d.Step(ctx, choose, 10-len(d.Generated()))
			require.NoError(t, err)
		}
		d.Finish()
	}
	assert.Equal(t, answers[0], answers[1], "speculation decides what plain decoding does")
}
