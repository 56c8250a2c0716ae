package decoder_test

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/testmodel"
	"github.com/dragon-rag/dragon/sampling"
	"github.com/dragon-rag/dragon/specdec"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	os.Exit(m.Run())
}

// TestRealSpeculativeGreedyIsPlainGreedy: with the real model, speculative
// decoding must give plain greedy output token for token, over prompts of
// both corpora with 1 and 4 passages. A mismatch is reported with the
// prompt, never tolerated. Ten prompts a passage count: the test is the
// model's own compute (prefills above all), and engine/llamacpp checks
// batched = one by one bit for bit on its own.
func TestRealSpeculativeGreedyIsPlainGreedy(t *testing.T) {
	m, err := llamacpp.Load(testmodel.Path(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	ctx := context.Background()
	for _, n := range []int{1, 4} {
		prompts, err := promptset.BuiltIn(testmodel.CorpusDir(t), 10, n)
		require.NoError(t, err)
		plain, err := decoder.New(m, decoder.Options{MaxPassages: 4, CtxPerSeq: 512})
		require.NoError(t, err)
		// Every draft verified whole: on this CPU the cost model would
		// verify few drafts with one passage, and each verification is
		// what this test checks. Calibration and reuse (opt-in) on, so
		// that drafts come from every source.
		spec := specdec.DefaultOptions()
		spec.Calibration, spec.Reuse = true, true
		fast, err := decoder.New(m, decoder.Options{MaxPassages: 4, CtxPerSeq: 512, Spec: spec, NoCostModel: true})
		require.NoError(t, err)
		var accepted uint64
		for i, p := range prompts {
			req := decoder.Request{Query: p.Query, Passages: p.Passages, MaxTokens: 32}
			a, err := plain.Generate(ctx, req, nil)
			require.NoError(t, err)
			b, err := fast.Generate(ctx, req, nil)
			require.NoError(t, err)
			if !assert.Equal(t, a.Tokens, b.Tokens, "prompt %d (%s, %d passages): %q", i, p.Corpus, n, p.Query) {
				t.Logf("plain: %q\nspec:  %q", a.Text, b.Text)
			}
			accepted += b.Spec.AcceptedTokens
		}
		t.Logf("%d passages: %d draft tokens accepted over %d prompts", n, accepted, len(prompts))
		assert.Positive(t, accepted, "speculation happened")
		plain.Close()
		fast.Close()
	}
}

// TestRealTreeRowsAndCommits: with the real model, verifying a tree of
// several branches gives every node below the root exactly the mixture
// plain decoding computes after the node's path, bit for bit, and
// committing any path, on the passage's own sequence or another branch's,
// leaves the passages exactly as if only that path had been decoded. The
// reference is a plain decoder (no speculation, one stream a passage):
// each branch is a whole copy of its passage's stream (tree.go), so its
// cells lie as plain decoding's would. One passage keeps it short; the
// fake-backend tests cover several passages.
func TestRealTreeRowsAndCommits(t *testing.T) {
	m, err := llamacpp.Load(testmodel.Path(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	ctx := context.Background()
	trees := specdec.DefaultOptions()
	trees.TreeBudget = specdec.DefaultTreeBudget
	tok := func(s string) engine.Token {
		toks, err := m.Tokenize(s, false, false)
		require.NoError(t, err)
		return toks[0]
	}
	d, err := decoder.New(m, decoder.Options{MaxPassages: 4, CtxPerSeq: 512, Spec: trees})
	require.NoError(t, err)
	defer d.Close()
	ref, err := decoder.New(m, decoder.Options{MaxPassages: 4, CtxPerSeq: 512})
	require.NoError(t, err)
	defer ref.Close()
	require.Greater(t, d.TreeBranches(), 2)

	//   The ─ answer ─ is
	//       │        └ was
	//       └ report
	first := tok(" The")
	tree := specdec.NewTree(first)
	answer := tree.Add(0, tok(" answer"), 0.5)
	tree.Add(answer, tok(" is"), 0.3)
	was := tree.Add(answer, tok(" was"), 0.2)
	report := tree.Add(0, tok(" report"), 0.1)
	tree.Finish()
	require.Len(t, tree.Leaves, 3)
	corr := tok(" not")
	const n = 1 // passages
	prompts, err := promptset.BuiltIn(testmodel.CorpusDir(t), 4, n)
	require.NoError(t, err)
	for _, p := range prompts {
		for _, end := range []int{answer, was, report} {
			require.NoError(t, d.Begin(ctx, p.Query, p.Passages, nil))
			d.Push(first)
			rows, err := d.VerifyTree(ctx, tree)
			require.NoError(t, err)
			for i := 1; i < len(tree.Nodes); i++ {
				require.NoError(t, ref.Begin(ctx, p.Query, p.Passages, nil))
				ref.Push(first)
				ref.Push(tree.Tokens(tree.Path(i))...)
				want, err := ref.Next(ctx)
				require.NoError(t, err)
				assert.Equal(t, want, rows[i], "%d passages, node %d: %q", n, i, p.Query)
			}

			path := tree.Path(end)
			branch := tree.Nodes[end].Branches[0]
			emit := append(tree.Tokens(path), corr)
			v := specdec.TreeVerdict{Verdict: specdec.Verdict{Accepted: len(path), Attempted: len(path) + 1, Emit: emit}, Path: path, Branch: branch}
			require.NoError(t, d.CommitTree(tree, v))
			got, err := d.Next(ctx)
			require.NoError(t, err)
			require.NoError(t, ref.Begin(ctx, p.Query, p.Passages, nil))
			ref.Push(first)
			ref.Push(tree.Tokens(path)...)
			_, err = ref.Next(ctx)
			require.NoError(t, err)
			ref.Push(corr)
			want, err := ref.Next(ctx)
			require.NoError(t, err)
			assert.Equal(t, want, got, "%d passages, after committing node %d (branch %d): %q", n, end, branch, p.Query)
		}
	}
}

// TestRealTreesArePlainDecoding: with the real model, token trees grown as
// far as the drafter's candidates go (up to the decoder's branches) emit
// plain decoding's answer token for token, greedy and sampled under a seed,
// since every tree row is plain decoding's row bit for bit. Sampled answers
// being plain sampling's, they are distributed as the target
// (specdec's TestSpeculativeSamplingPreservesDistribution checks the walk
// itself with a χ² test and its broken controls).
func TestRealTreesArePlainDecoding(t *testing.T) {
	m, err := llamacpp.Load(testmodel.Path(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	ctx := context.Background()
	prompts, err := promptset.BuiltIn(testmodel.CorpusDir(t), 4, 2)
	require.NoError(t, err)
	plain, err := decoder.New(m, decoder.Options{MaxPassages: 2, CtxPerSeq: 512})
	require.NoError(t, err)
	defer plain.Close()
	trees := specdec.DefaultOptions()
	trees.TreeBudget = specdec.DefaultTreeBudget
	fast, err := decoder.New(m, decoder.Options{MaxPassages: 2, CtxPerSeq: 512, Spec: trees, NoCostModel: true})
	require.NoError(t, err)
	defer fast.Close()
	// Trees with a draft model's branch (the same model as its own
	// assistant: its greedy drafts are long and mostly right).
	asst, err := decoder.New(m, decoder.Options{MaxPassages: 2, CtxPerSeq: 512})
	require.NoError(t, err)
	defer asst.Close()
	assisted, err := decoder.New(m, decoder.Options{MaxPassages: 2, CtxPerSeq: 512, Spec: trees, NoCostModel: true, Assistant: asst})
	require.NoError(t, err)
	defer assisted.Close()
	var branched, modelAccepted uint64
	for i, p := range prompts {
		for _, sp := range []sampling.Params{{}, {Temperature: 0.8, TopP: 0.95, Seed: uint64(i + 1)}} {
			req := decoder.Request{Query: p.Query, Passages: p.Passages, MaxTokens: 24, Sampling: sp}
			a, err := plain.Generate(ctx, req, nil)
			require.NoError(t, err)
			b, err := fast.Generate(ctx, req, nil)
			require.NoError(t, err)
			assert.Equal(t, a.Tokens, b.Tokens, "prompt %d, sampling %+v: %q", i, sp, p.Query)
			branched += b.Spec.BranchedTrees
			c, err := assisted.Generate(ctx, req, nil)
			require.NoError(t, err)
			assert.Equal(t, a.Tokens, c.Tokens, "with a draft model: prompt %d, sampling %+v: %q", i, sp, p.Query)
			modelAccepted += c.Spec.ByOrigin[specdec.OriginModel].AcceptedTokens
		}
	}
	assert.Positive(t, branched, "trees of several branches were verified")
	assert.Positive(t, modelAccepted, "the draft model's branches were verified and taken")
}

// BenchmarkEvidence: what keeping each passage's evidence costs a local
// generation on the real model (a greedy 32-token answer over 3 passages,
// local speculation on): off against on, side by side per iteration so
// that the machine's drift falls on both alike. ns/op is both answers;
// off_ms and on_ms are medians over the iterations.
func BenchmarkEvidence(b *testing.B) {
	m, err := llamacpp.Load(testmodel.Path(b), llamacpp.Options{Threads: 1})
	require.NoError(b, err)
	defer m.Close()
	ctx := context.Background()
	prompts, err := promptset.BuiltIn(testmodel.CorpusDir(b), 8, 3)
	require.NoError(b, err)
	decs := map[bool]*decoder.Decoder{}
	for _, on := range []bool{false, true} {
		d, err := decoder.New(m, decoder.Options{MaxPassages: 3, CtxPerSeq: 512, Spec: specdec.DefaultOptions()})
		require.NoError(b, err)
		defer d.Close()
		d.SetEvidence(on)
		decs[on] = d
	}
	var ms [2][]float64
	i := 0
	for b.Loop() {
		p := prompts[i%len(prompts)]
		req := decoder.Request{Query: p.Query, Passages: p.Passages, MaxTokens: 32}
		var toks [2][]engine.Token
		for _, on := range []bool{i%2 == 0, i%2 != 0} { // alternate which goes first
			start := time.Now()
			res, err := decs[on].Generate(ctx, req, nil)
			require.NoError(b, err)
			if on {
				// What the answer's sources read at its end.
				_, err := decs[on].Evidence(ctx, len(decs[on].Generated()))
				require.NoError(b, err)
			}
			idx := 0
			if on {
				idx = 1
			}
			ms[idx] = append(ms[idx], float64(time.Since(start).Microseconds())/1000)
			toks[idx] = res.Tokens
		}
		require.Equal(b, toks[0], toks[1], "evidence changes no token")
		i++
	}
	b.ReportMetric(median(ms[0]), "off_ms")
	b.ReportMetric(median(ms[1]), "on_ms")
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
