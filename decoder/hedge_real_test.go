package decoder_test

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/testmodel"
	"github.com/dragon-rag/dragon/specdec"
)

func argmax(p []float32) engine.Token {
	best := 0
	for i, v := range p {
		if v > p[best] {
			best = i
		}
	}
	return engine.Token(best)
}

func runnerUp(p []float32, not engine.Token) engine.Token {
	best := -1
	for i, v := range p {
		if engine.Token(i) != not && (best < 0 || v > p[best]) {
			best = i
		}
	}
	return engine.Token(best)
}

// greedy is a Chooser of the mixture's argmax that records each position's
// mixture.
func greedy(seen map[int][]float32) decoder.Chooser {
	return func(mix []float32, pos int, _ []engine.Token) (engine.Token, error) {
		if seen != nil {
			seen[pos] = slices.Clone(mix)
		}
		return argmax(mix), nil
	}
}

// TestBranchEqualsRollback: with the real model, a hedge branch forked at
// an answer position with the runner-up token and decoded beside the main
// chain (plain and speculative steps, 2 passages) computes, bit for bit,
// the mixtures the main chain computes after rolling back to that token;
// adopting the branch leaves the decoder where the rollback does, so the
// answer goes on identically; a branch that is dropped leaves the main
// chain as if it had never been.
func TestBranchEqualsRollback(t *testing.T) {
	m, err := llamacpp.Load(testmodel.Path(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	ctx := context.Background()
	prompts, err := promptset.BuiltIn(testmodel.CorpusDir(t), 3, 2)
	require.NoError(t, err)
	const fork, branchLen, after = 3, 6, 6
	for _, spec := range []bool{false, true} {
		opts := decoder.Options{MaxPassages: 2, CtxPerSeq: 512, Hedges: 2}
		if spec {
			opts.Spec, opts.NoCostModel = specdec.DefaultOptions(), true
		}
		hedged, err := decoder.New(m, opts)
		require.NoError(t, err)
		plain, err := decoder.New(m, opts)
		require.NoError(t, err)
		for i, p := range prompts {
			// The main chain up to the fork, then a branch of the runner-up
			// beside it.
			require.NoError(t, hedged.Start(ctx, p.Query, p.Passages))
			seen := map[int][]float32{}
			for len(hedged.Generated()) <= fork {
				_, err := hedged.Step(ctx, greedy(seen), fork+1-len(hedged.Generated()))
				require.NoError(t, err)
			}
			alt := runnerUp(seen[fork], hedged.Generated()[fork])
			h, err := hedged.Fork(fork, alt)
			require.NoError(t, err)
			// A second branch, dropped, must not disturb anything.
			other, err := hedged.Fork(fork, runnerUp(seen[fork], alt))
			require.NoError(t, err)
			var branchMix [][]float32
			for len(branchMix) < branchLen {
				_, err := hedged.Step(ctx, greedy(nil), 4)
				require.NoError(t, err)
				next := hedged.BranchNext(h)
				require.NotNil(t, next, "the pass decoded the branch too")
				branchMix = append(branchMix, slices.Clone(next))
				require.NoError(t, hedged.PushBranch(h, argmax(next)))
				if len(branchMix) == 2 {
					require.NoError(t, hedged.DropBranch(other))
				}
			}
			mainAnswer := slices.Clone(hedged.Generated())
			_, branchToks, ok := hedged.Branch(h)
			require.True(t, ok)
			require.NoError(t, hedged.AdoptBranch(h))
			_, _, ok = hedged.Branch(h)
			assert.False(t, ok, "adopting frees the slots")
			assert.Equal(t, append(slices.Clone(mainAnswer[:fork]), branchToks...), hedged.Generated())
			for range after {
				_, err := hedged.Step(ctx, greedy(nil), 4)
				require.NoError(t, err)
			}

			// The reference: the same main chain, then a rollback to alt.
			require.NoError(t, plain.Start(ctx, p.Query, p.Passages))
			for len(plain.Generated()) < len(mainAnswer) {
				_, err := plain.Step(ctx, greedy(nil), len(mainAnswer)-len(plain.Generated()))
				require.NoError(t, err)
			}
			require.Equal(t, mainAnswer, plain.Generated()[:len(mainAnswer)], "prompt %d: the branches left the main chain alone", i)
			require.NoError(t, plain.Rewind(fork, alt))
			for k := range branchLen {
				mix, err := plain.Next(ctx)
				require.NoError(t, err)
				require.Equal(t, branchMix[k], mix, "prompt %d (speculation %v): the branch's mixture %d after the fork", i, spec, k)
				plain.Push(argmax(mix))
			}
			for len(plain.Generated()) < len(hedged.Generated()) {
				_, err := plain.Step(ctx, greedy(nil), len(hedged.Generated())-len(plain.Generated()))
				require.NoError(t, err)
			}
			assert.Equal(t, hedged.Generated(), plain.Generated()[:len(hedged.Generated())], "prompt %d: adopting is rolling back", i)
		}
		hedged.Close()
		plain.Close()
	}
}
