package decoder

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine/fake"
	"github.com/dragon-rag/dragon/sampling"
	"github.com/dragon-rag/dragon/specdec"
)

// TestAssistantDraftsKeepTheAnswer, with linear drafts and with token trees
// (the assistant's draft a branch of the tree): a target whose passes cost nearly the
// same for one row or many (the shape of weights read from storage), with
// an assistant: the same distributions cheaply (a perfect draft model) or
// other ones (a poor one). Greedy and sampled answers are plain decoding's
// token for token, and the good assistant's greedy drafts are taken and cut
// the passes (sampled at 0.8, its argmax is often not the sample, and the
// cost model may rightly stop asking).
func TestAssistantDraftsKeepTheAnswer(t *testing.T) {
	target := fake.Config{Seed: 3, Vocab: 300, Copy: 2, CallLatency: 4 * time.Millisecond, Latency: 20 * time.Microsecond}
	good := target
	good.CallLatency, good.Latency = 200*time.Microsecond, 10*time.Microsecond
	poor := good
	poor.Seed = 9
	reqs := map[string]Request{
		"greedy":  {Query: "Where is the lamp lit?", Passages: threePassages[:2], MaxTokens: 48},
		"sampled": {Query: "Where is the lamp lit?", Passages: threePassages[:2], MaxTokens: 48, Sampling: sampling.Params{Temperature: 0.8, TopP: 0.95, Seed: 5}},
	}
	specs := map[string]specdec.Options{"linear": specdec.DefaultOptions(), "trees": withTrees(specdec.DefaultOptions())}
	for name, req := range reqs {
		_, plain := newFakeWith(t, target, Options{})
		want, err := plain.Generate(context.Background(), req, nil)
		require.NoError(t, err)
		for shape, spec := range specs {
			for _, a := range []struct {
				name string
				cfg  fake.Config
			}{{"good", good}, {"poor", poor}} {
				_, asst := newFakeWith(t, a.cfg, Options{})
				// Pass costs as the fake sleeps them, not timed: a loaded
				// machine's oversleeping would price the passes by the load.
				costs := &specdec.VerifyTable{}
				for rows := 1; rows <= 16; rows++ {
					costs.Set(rows, float64(target.CallLatency+time.Duration(rows)*target.Latency)/float64(time.Millisecond))
				}
				_, d := newFakeWith(t, target, Options{Spec: spec, Assistant: asst, VerifyTable: costs})
				got, err := d.Generate(context.Background(), req, nil)
				require.NoError(t, err)
				assert.Equal(t, want.Tokens, got.Tokens, "%s, %s, %s assistant", name, shape, a.name)
				model := got.Spec.ByOrigin[specdec.OriginModel]
				t.Logf("%s, %s, %s assistant: %d passes against %d plain, model drafts %+v", name, shape, a.name, got.Steps, want.Steps, model)
				if a.name == "good" && req.Sampling.Greedy() {
					assert.Positive(t, model.AcceptedTokens, "%s, %s: the assistant's drafts were taken", name, shape)
					assert.Less(t, got.Steps, want.Steps, "%s, %s: fewer passes", name, shape)
				}
			}
		}
	}
}

func TestAssistantRefusedWhereItCannotDraft(t *testing.T) {
	_, asst := newFake(t, Options{})
	_, other := newFakeWith(t, fake.Config{Seed: 3, Vocab: 400}, Options{})
	_, speculating := newFake(t, Options{Spec: specdec.DefaultOptions()})
	for name, c := range map[string]struct {
		opts Options
		want string
	}{
		"no speculation":     {Options{Assistant: asst}, "speculation, which is off"},
		"another tokenizer":  {Options{Spec: specdec.DefaultOptions(), Assistant: other}, "tokenizer"},
		"it speculates":      {Options{Spec: specdec.DefaultOptions(), Assistant: speculating}, "must not speculate"},
		"a shorter sequence": {Options{Spec: specdec.DefaultOptions(), Assistant: asst, CtxPerSeq: 1024}, "positions"},
	} {
		_, err := New(fake.New(fake.Config{Seed: 3, Vocab: 300}), c.opts)
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), c.want, name)
	}
}
