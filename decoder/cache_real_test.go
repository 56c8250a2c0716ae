package decoder_test

import (
	"context"
	"fmt"
	"math"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/stat/distuv"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/testmodel"
	"github.com/dragon-rag/dragon/kvcache"
	"github.com/dragon-rag/dragon/sampling"
)

// margin is the gap between the two most probable tokens of the reference
// (uncached) mixture at step i of an answer: how close to a tie a
// divergence there was.
func margin(t *testing.T, ref *decoder.Decoder, p promptset.Prompt, history []engine.Message, toks []engine.Token, i int) float64 {
	t.Helper()
	ctx := context.Background()
	ref.SetHistory(history)
	require.NoError(t, ref.Begin(ctx, p.Query, p.Passages, nil))
	ref.Push(toks[:i]...)
	next, err := ref.Next(ctx)
	require.NoError(t, err)
	ps := append([]float32(nil), next...)
	sort.Slice(ps, func(a, b int) bool { return ps[a] > ps[b] })
	return float64(ps[0] - ps[1])
}

// TestRealCachedGreedyIsUncachedGreedy: with the real model, greedy
// answers with the KV prefix cache equal the answers without it, token for
// token, over the built-in prompts: cold (only other prompts' entries in
// the cache), warm from the sequences themselves, warm from host memory
// after other prompts, warm from disk in a new cache (a restarted daemon),
// and a chat's second turn, which extends the first turn's prompt and
// answer. A divergence is reported with the reference's margin between its
// two most probable tokens at that step, never tolerated.
func TestRealCachedGreedyIsUncachedGreedy(t *testing.T) {
	m, err := llamacpp.Load(testmodel.Path(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	ctx := context.Background()
	const passages = 2
	prompts, err := promptset.BuiltIn(testmodel.CorpusDir(t), 6, passages)
	require.NoError(t, err)

	opts := decoder.Options{MaxPassages: passages, CtxPerSeq: 512}
	ref, err := decoder.New(m, opts)
	require.NoError(t, err)
	defer ref.Close()
	answer := func(d *decoder.Decoder, p promptset.Prompt, history []engine.Message) []engine.Token {
		d.SetHistory(history)
		r, err := d.Generate(ctx, decoder.Request{Query: p.Query, Passages: p.Passages, MaxTokens: 24}, nil)
		require.NoError(t, err)
		return r.Tokens
	}
	followUp := "Say that again in fewer words."
	want := make([][]engine.Token, len(prompts))
	want2 := make([][]engine.Token, len(prompts))
	history := make([][]engine.Message, len(prompts))
	for i, p := range prompts {
		want[i] = answer(ref, p, nil)
		text, err := detok(m, want[i])
		require.NoError(t, err)
		history[i] = []engine.Message{{Role: engine.RoleUser, Content: p.Query}, {Role: engine.RoleAssistant, Content: text}}
		want2[i] = answer(ref, promptset.Prompt{Query: followUp, Passages: p.Passages}, history[i])
	}

	dir := t.TempDir()
	ns := kvcache.Namespace("test", "test")
	cache, err := kvcache.New(kvcache.Config{Namespace: ns, MemoryBytes: 256 << 20, Dir: dir, DiskBytes: 1 << 30})
	require.NoError(t, err)
	cached, err := decoder.New(m, decoder.Options{MaxPassages: passages, CtxPerSeq: 512, Cache: cache})
	require.NoError(t, err)
	defer cached.Close()

	check := func(stage string, d *decoder.Decoder, i int, history []engine.Message, query string, want []engine.Token) int {
		t.Helper()
		p := promptset.Prompt{Query: query, Passages: prompts[i].Passages}
		got := answer(d, p, history)
		restored := d.Restored()
		d.Retain()
		if !assert.Equal(t, want, got, "%s, prompt %d: %q", stage, i, query) {
			n := 0
			for n < min(len(got), len(want)) && got[n] == want[n] {
				n++
			}
			t.Logf("%s, prompt %d: diverges at token %d, where the reference's top two differ by %.3g in probability",
				stage, i, n, margin(t, ref, p, history, want, n))
		}
		return restored
	}
	seen := map[string]bool{}
	for i, p := range prompts {
		// The built-in prompts share neighbour passages: a prompt asked for
		// the first time restores those an earlier prompt prefilled.
		shared := 0
		for _, ps := range p.Passages {
			if seen[ps.Text] {
				shared++
			}
			seen[ps.Text] = true
		}
		assert.Equal(t, shared, check("cold", cached, i, nil, p.Query, want[i]), "cold prompt %d restored passages", i)
		assert.Equal(t, passages, check("in context", cached, i, nil, p.Query, want[i]), "prompt %d again at once", i)
	}
	for i, p := range prompts {
		assert.Equal(t, passages, check("memory", cached, i, nil, p.Query, want[i]), "prompt %d after the others", i)
	}
	before := cache.Stats()
	assert.Positive(t, before.Hits[kvcache.Memory], "memory hits")
	assert.Positive(t, before.Hits[kvcache.Context], "context hits")

	// A restarted daemon: a new cache over the same directory, no memory.
	disk, err := kvcache.New(kvcache.Config{Namespace: ns, Dir: dir, DiskBytes: 1 << 30})
	require.NoError(t, err)
	restarted, err := decoder.New(m, decoder.Options{MaxPassages: passages, CtxPerSeq: 512, Cache: disk})
	require.NoError(t, err)
	defer restarted.Close()
	for i, p := range prompts {
		assert.Equal(t, passages, check("disk", restarted, i, nil, p.Query, want[i]), "prompt %d from disk", i)
	}
	assert.Equal(t, uint64(len(prompts)*passages), disk.Stats().Hits[kvcache.Disk])

	// The second turn of each conversation, after all the first turns: it
	// extends the first turn's retained prompt and answer.
	for i := range prompts {
		assert.Equal(t, passages, check("second turn", cached, i, history[i], followUp, want2[i]), "prompt %d's second turn", i)
	}
}

func detok(m engine.Model, toks []engine.Token) (string, error) {
	var s []byte
	for _, t := range toks {
		if m.IsEOG(t) {
			break
		}
		s = append(s, m.Piece(t)...)
	}
	if len(s) == 0 {
		return "", fmt.Errorf("empty answer")
	}
	return string(s), nil
}

// TestRealCachedFirstTokenDistribution: sampled decoding draws its first
// token from the same distribution with the cache as without it. The
// mixture after a restored prefix equals the prefilled one bit for bit,
// and first tokens sampled through Generate from restored prefixes fit the
// uncached distribution (chi-square); the same samples tested against the
// distribution of another passage, the control, do not.
func TestRealCachedFirstTokenDistribution(t *testing.T) {
	m, err := llamacpp.Load(testmodel.Path(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	ctx := context.Background()
	prompts, err := promptset.BuiltIn(testmodel.CorpusDir(t), 2, 2)
	require.NoError(t, err)
	p, other := prompts[0], prompts[1]
	// Above 1, so that the first token has several likely values to draw.
	params := sampling.Params{Temperature: 1.5}
	firstDist := func(d *decoder.Decoder, p promptset.Prompt) []float64 {
		require.NoError(t, d.Begin(ctx, p.Query, p.Passages, nil))
		next, err := d.Next(ctx)
		require.NoError(t, err)
		// Generate samples from the mixture's logs as scores.
		scores := make([]float32, len(next))
		for i, v := range next {
			scores[i] = float32(math.Log(float64(v)))
		}
		probs := params.Dist(scores, nil, nil)
		out := make([]float64, len(probs))
		for i, v := range probs {
			out[i] = float64(v)
		}
		return out
	}
	plain, err := decoder.New(m, decoder.Options{MaxPassages: 2, CtxPerSeq: 512})
	require.NoError(t, err)
	defer plain.Close()
	want, control := firstDist(plain, p), firstDist(plain, other)

	cache, err := kvcache.New(kvcache.Config{Namespace: "test", MemoryBytes: 64 << 20})
	require.NoError(t, err)
	// Two decoders on one cache: the second restores from memory what the
	// first prefilled, and every later Begin on it restores again.
	warmer, err := decoder.New(m, decoder.Options{MaxPassages: 2, CtxPerSeq: 512, Cache: cache})
	require.NoError(t, err)
	defer warmer.Close()
	firstDist(warmer, p)
	cached, err := decoder.New(m, decoder.Options{MaxPassages: 2, CtxPerSeq: 512, Cache: cache})
	require.NoError(t, err)
	defer cached.Close()
	assert.Equal(t, want, firstDist(cached, p), "the mixture after restored prefixes")
	assert.Equal(t, 2, cached.Restored())

	const n = 400
	counts := map[engine.Token]int{}
	for i := range n {
		// Another decoder's Begin in between, so each draw restores from
		// memory rather than finding its prefix still in the sequences.
		if i%2 == 1 {
			require.NoError(t, cached.Begin(ctx, other.Query, other.Passages, nil))
		}
		params.Seed = uint64(i + 1)
		r, err := cached.Generate(ctx, decoder.Request{Query: p.Query, Passages: p.Passages, Sampling: params, MaxTokens: 1}, nil)
		require.NoError(t, err)
		require.Len(t, r.Tokens, 1)
		require.Equal(t, 2, cached.Restored())
		counts[r.Tokens[0]]++
	}
	pFit, pControl := goodnessOfFit(counts, want, n), goodnessOfFit(counts, control, n)
	t.Logf("chi-square p-value: %.3g against the uncached distribution, %.3g against the control", pFit, pControl)
	assert.Greater(t, pFit, 1e-3, "first tokens with the cache fit the distribution without it")
	assert.Less(t, pControl, 1e-6, "the control tells another distribution apart")
}

// goodnessOfFit is the chi-square p-value of counts (n draws) against
// probs, over the tokens expected at least 5 times, the rest pooled (into
// the smallest of those bins when the pool itself is expected less often).
func goodnessOfFit(counts map[engine.Token]int, probs []float64, n int) float64 {
	type bin struct{ want, got float64 }
	var bins []bin
	var rest bin
	for tok, p := range probs {
		b := bin{p * float64(n), float64(counts[engine.Token(tok)])}
		if b.want >= 5 {
			bins = append(bins, b)
		} else {
			rest.want, rest.got = rest.want+b.want, rest.got+b.got
		}
	}
	if len(bins) == 0 {
		return 0
	}
	if rest.want >= 5 {
		bins = append(bins, rest)
	} else {
		small := 0
		for i, b := range bins {
			if b.want < bins[small].want {
				small = i
			}
		}
		bins[small].want += rest.want
		bins[small].got += rest.got
	}
	if len(bins) < 2 {
		return 1 // one outcome: nothing to tell apart
	}
	stat := 0.0
	for _, b := range bins {
		stat += (b.got - b.want) * (b.got - b.want) / b.want
	}
	return distuv.ChiSquared{K: float64(len(bins) - 1)}.Survival(stat)
}
