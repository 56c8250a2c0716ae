package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/internal/testmodel"
)

// TestRerankedPairGreedyDragonEqualsTokenWise: with both sides re-ranking
// their candidates by the cross-encoder (R its logit on both), and with
// dynamic weights rescored every 4 tokens, or posterior weights every 2,
// or with the closed-book document beside the passages, greedy DRAGON, the
// aggregator moving every 3 steps over a 15 ms link, emits what greedy
// token-wise synchronisation does.
func TestRerankedPairGreedyDragonEqualsTokenWise(t *testing.T) {
	for name, extra := range map[string][]string{
		"rerank":      nil,
		"dynamic":     {"--rescore-every", "4"},
		"closed book": {"--closed-book", "0"},
		"posterior":   {"--posterior-every", "2"},
	} {
		t.Run(name, func(t *testing.T) {
			rr := append([]string{"--rerank-model", testmodel.RerankPath(t), "--rerank-candidates", "6"}, extra...)
			client, dev, cld := pairWith(t, 15*time.Millisecond, rr, rr, nil)
			// Two questions a variant: make test's time (the four run 70 s
			// under -race with three).
			for i, q := range promptset.Questions[:2] {
				dr := greedyDragonEqualsTW(t, client, dev, cld, i, q, 16)
				assert.Equal(t, uint32(2), dr.Summary.GetPassagesDevice())
				assert.Equal(t, uint32(2), dr.Summary.GetPassagesCloud())
			}
			for _, d := range []string{dev.Logs(), cld.Logs()} {
				assert.Contains(t, d, "re-ranking")
				if name == "closed book" {
					assert.Contains(t, d, "closed-book document in every retrieval")
				}
			}
		})
	}
}

// TestRerankModelThatDoesNotRankIsRefused: a daemon given an embedding
// model as its cross-encoder, or re-ranking or closed-book flags that cannot
// work, does not start, and says why.
func TestRerankModelThatDoesNotRankIsRefused(t *testing.T) {
	for name, args := range map[string][]string{
		"not a ranker": {"--rerank-model", testmodel.EmbedPath(t), "--index", testmodel.IndexDir(t, "cloud")},
		"no index":     {"--rerank-model", testmodel.RerankPath(t), "--index", ""},
		"no candidates": {"--rerank-model", testmodel.RerankPath(t), "--index", testmodel.IndexDir(t, "cloud"),
			"--rerank-candidates", "0"},
		"rescore without a model":      {"--rescore-every", "8", "--index", testmodel.IndexDir(t, "cloud")},
		"closed book not a number":     {"--closed-book", "even", "--index", testmodel.IndexDir(t, "cloud")},
		"closed book without an index": {"--closed-book", "0", "--index", ""},
		"closed book rescored": {"--closed-book", "0", "--rerank-model", testmodel.RerankPath(t), "--rescore-every", "8",
			"--index", testmodel.IndexDir(t, "cloud")},
	} {
		t.Run(name, func(t *testing.T) {
			argv := append([]string{"cloud", "--listen", "127.0.0.1:0", "--http", "", "--model", testmodel.Path(t), "--threads", "1", "--profile", "", "--rerank-model", ""}, args...)
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), "DRAGON_CHILD_ARGS="+strings.Join(argv, "\n"))
			out, err := cmd.CombinedOutput()
			require.Error(t, err, "%s", out)
			assert.Contains(t, string(out), map[string]string{
				"not a ranker": "not a ranking model", "no index": "needs an --index", "no candidates": "--rerank-candidates 0",
				"rescore without a model":  "--rescore-every 8",
				"closed book not a number": `--closed-book "even"`, "closed book without an index": "--closed-book needs an --index",
				"closed book rescored": "cannot re-score a document without text",
			}[name])
		})
	}
}
