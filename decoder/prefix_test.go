package decoder

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
	"github.com/dragon-rag/dragon/kvcache"
)

func newCache(t *testing.T) *kvcache.Cache {
	t.Helper()
	c, err := kvcache.New(kvcache.Config{Namespace: "fake", MemoryBytes: 64 << 20})
	require.NoError(t, err)
	return c
}

// passagesLong are passages long enough for their prompts to share blocks
// beyond the template.
var passagesLong = []Passage{
	{Text: "The lighthouse keeper lit the lamp at dusk and watched the ships pass the rocks until the morning came again over the sea.", Score: 1},
	{Text: "Tides rise twice a day along the coast, and the fishermen plan their work around them, leaving the harbour at high water.", Score: 0.5},
}

// checkHeld: the decoder's mirror of what each sequence holds matches the
// engine.
func checkHeld(t *testing.T, d *Decoder) {
	t.Helper()
	for s := range d.prompts {
		assert.Equal(t, d.ectx.SeqLen(s), d.held[s], "sequence %d", s)
	}
}

// TestCachedEqualsUncachedFake: on the fake engine, answers with the cache
// equal answers without it however the prefixes are found (cold, in the
// sequences, in memory on another decoder, a second turn), and the
// decoder's record of its sequences stays the engine's.
func TestCachedEqualsUncachedFake(t *testing.T) {
	ctx := context.Background()
	m := fake.New(fake.Config{Seed: 5, Vocab: 300})
	opts := Options{MaxPassages: 2, CtxPerSeq: 512}
	plain, err := New(m, opts)
	require.NoError(t, err)
	defer plain.Close()
	cache := newCache(t)
	opts.Cache = cache
	a, err := New(m, opts)
	require.NoError(t, err)
	defer a.Close()
	b, err := New(m, opts)
	require.NoError(t, err)
	defer b.Close()

	gen := func(d *Decoder, q string, history []engine.Message) []engine.Token {
		d.SetHistory(history)
		r, err := d.Generate(ctx, Request{Query: q, Passages: passagesLong, MaxTokens: 12}, nil)
		require.NoError(t, err)
		checkHeld(t, d)
		d.Retain()
		checkHeld(t, d)
		return r.Tokens
	}
	q1, q2 := "Who lit the lamp?", "When do tides rise?"
	want1, want2 := gen(plain, q1, nil), gen(plain, q2, nil)
	history := []engine.Message{{Role: engine.RoleUser, Content: q1}, {Role: engine.RoleAssistant, Content: "At dusk."}}
	wantTurn := gen(plain, q2, history)

	for _, step := range []struct {
		name     string
		d        *Decoder
		q        string
		history  []engine.Message
		want     []engine.Token
		restored int
	}{
		{"cold", a, q1, nil, want1, 0},
		{"in context", a, q1, nil, want1, 2},
		{"another question, same passages", a, q2, nil, want2, 2},
		{"memory, another decoder", b, q1, nil, want1, 2},
		{"second turn", b, q2, history, wantTurn, 2},
		{"second turn again, elsewhere", a, q2, history, wantTurn, 2},
	} {
		got := gen(step.d, step.q, step.history)
		assert.Equal(t, step.want, got, step.name)
		assert.Equal(t, step.restored, step.d.Restored(), step.name)
	}
	st := cache.Stats()
	assert.Positive(t, st.Hits[kvcache.Context])
	assert.Positive(t, st.Hits[kvcache.Memory])
}

// TestCachedBeginAbortedLeavesNothingBehind: a Begin aborted after it
// restored cached prefixes returns ErrAborted, adds nothing to the cache,
// leaves the decoder's record of its sequences equal to the engine's, and
// the next Begin answers as if nothing had happened.
func TestCachedBeginAbortedLeavesNothingBehind(t *testing.T) {
	m := fake.New(fake.Config{Seed: 5, Vocab: 300, CallLatency: 50 * time.Millisecond})
	cache := newCache(t)
	opts := Options{MaxPassages: 2, CtxPerSeq: 512, Cache: cache}
	warm, err := New(m, opts)
	require.NoError(t, err)
	defer warm.Close()
	d, err := New(m, opts)
	require.NoError(t, err)
	defer d.Close()
	plain, err := New(m, Options{MaxPassages: 2, CtxPerSeq: 512})
	require.NoError(t, err)
	defer plain.Close()
	ctx := context.Background()
	q := "Who lit the lamp?"
	want, err := plain.Generate(ctx, Request{Query: q, Passages: passagesLong, MaxTokens: 6}, nil)
	require.NoError(t, err)
	_, err = warm.Generate(ctx, Request{Query: q, Passages: passagesLong, MaxTokens: 6}, nil)
	require.NoError(t, err)
	before := cache.Stats()

	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	err = d.Begin(short, q+" Answer briefly.", passagesLong, nil)
	require.ErrorIs(t, err, engine.ErrAborted)
	checkHeld(t, d)
	after := cache.Stats()
	assert.Equal(t, before.Hits[kvcache.Memory]+2, after.Hits[kvcache.Memory], "both passages were restored before the abort")
	assert.Equal(t, before.Entries, after.Entries, "nothing of the aborted prefill was cached")

	got, err := d.Generate(ctx, Request{Query: q, Passages: passagesLong, MaxTokens: 6}, nil)
	require.NoError(t, err)
	assert.Equal(t, want.Tokens, got.Tokens)
	assert.Equal(t, 2, d.Restored())
}
