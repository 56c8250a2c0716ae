package engine_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
)

func TestDetokenizerHoldsBackPartialCharacters(t *testing.T) {
	m := fake.New(fake.Config{})
	text := "a€b🚀c"
	toks, err := m.Tokenize(text, false, false)
	require.NoError(t, err)
	require.Len(t, toks, len(text), "the fake tokenizes bytes")
	d := engine.NewDetokenizer(m)
	var got []string
	for _, tok := range toks {
		got = append(got, d.Add(tok))
	}
	assert.Equal(t, []string{"a", "", "", "€", "b", "", "", "", "🚀", "c"}, got)
	assert.Empty(t, d.Flush())
}

func TestDetokenizerFlushesInvalidBytes(t *testing.T) {
	m := fake.New(fake.Config{})
	d := engine.NewDetokenizer(m)
	assert.Empty(t, d.Add(0xE2+fake.ByteOffset)) // first byte of a 3-byte character
	assert.Equal(t, "\uFFFD", d.Flush())
	assert.Equal(t, "x", d.Add('x'+fake.ByteOffset))
}

func TestTopK(t *testing.T) {
	logits := []float32{0.5, 3, -1, 3, 2, 0}
	tests := []struct {
		k    int
		want []engine.TokenLogit
	}{
		{0, nil},
		{1, []engine.TokenLogit{{1, 3}}},
		{3, []engine.TokenLogit{{1, 3}, {3, 3}, {4, 2}}},
		{10, []engine.TokenLogit{{1, 3}, {3, 3}, {4, 2}, {0, 0.5}, {5, 0}, {2, -1}}},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, engine.TopK(logits, tt.k, nil), "k=%d", tt.k)
	}
}

func TestSeqLensValidation(t *testing.T) {
	s := engine.NewSeqLens(2, 4)
	var b engine.Batch
	b.Add(5, 0, true, 0)
	b.Add(6, 1, true, 0)
	b.Add(7, 0, true, 1)
	require.NoError(t, s.Check(&b, 10, 0))
	s.Apply(&b)
	assert.Equal(t, 2, s.Len(0))
	assert.Equal(t, 1, s.Len(1))

	tests := []struct {
		name  string
		build func(b *engine.Batch)
		err   error
	}{
		{"gap", func(b *engine.Batch) { b.Add(1, 3, true, 0) }, engine.ErrInvalidInput},
		{"unknown seq", func(b *engine.Batch) { b.Add(1, 0, true, 2) }, engine.ErrInvalidInput},
		{"token outside vocab", func(b *engine.Batch) { b.Add(10, 2, true, 0) }, engine.ErrInvalidInput},
		{"no seq", func(b *engine.Batch) { b.Add(1, 2, true) }, engine.ErrInvalidInput},
		{"full", func(b *engine.Batch) { b.Add(1, 2, false, 0); b.Add(1, 3, false, 0); b.Add(1, 4, false, 0) }, engine.ErrContextFull},
		{"shared token", func(b *engine.Batch) { b.Add(1, 1, true, 1); b.Add(2, 2, true, 0, 1) }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b engine.Batch
			tt.build(&b)
			err := s.Check(&b, 10, 0)
			if tt.err == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tt.err)
		})
	}
	require.ErrorIs(t, s.Check(&engine.Batch{}, 10, 0), engine.ErrInvalidInput)
	require.NoError(t, s.Truncate(0, 1))
	assert.Equal(t, 1, s.Len(0))
	require.ErrorIs(t, s.Copy(0, 1, 0, 1), engine.ErrInvalidInput, "dst must hold exactly p0 positions")
	require.NoError(t, s.Truncate(1, 0))
	require.NoError(t, s.Copy(0, 1, 0, 1))
	assert.Equal(t, 1, s.Len(1))
}

func TestFakeBatchedEqualsOneByOne(t *testing.T) {
	m := fake.New(fake.Config{Seed: 7, Vocab: 300})
	ctx := context.Background()
	toks, err := m.Tokenize("the cat sat on the mat, the cat", false, false)
	require.NoError(t, err)

	batched, err := m.NewContext(engine.ContextOptions{CtxPerSeq: 64, MaxSeqs: 1})
	require.NoError(t, err)
	var b engine.Batch
	for i, tok := range toks {
		b.Add(tok, i, true, 0)
	}
	require.NoError(t, batched.Decode(ctx, &b))

	single, err := m.NewContext(engine.ContextOptions{CtxPerSeq: 64, MaxSeqs: 1})
	require.NoError(t, err)
	for i, tok := range toks {
		b.Reset()
		b.Add(tok, i, true, 0)
		require.NoError(t, single.Decode(ctx, &b))
		want, err := single.Logits(0, nil)
		require.NoError(t, err)
		got, err := batched.Logits(i, nil)
		require.NoError(t, err)
		require.Equal(t, want, got, "row %d", i)
		assert.Equal(t, m.Distribution(toks[:i+1]), got)
	}
}

func TestFakeAbort(t *testing.T) {
	m := fake.New(fake.Config{Latency: 1000000}) // 1 ms per token
	c, err := m.NewContext(engine.ContextOptions{CtxPerSeq: 1024, MaxSeqs: 1})
	require.NoError(t, err)
	var b engine.Batch
	for i := range 1000 {
		b.Add(fake.ByteOffset+'a', i, false, 0)
	}
	done := make(chan error)
	go func() { done <- c.Decode(context.Background(), &b) }()
	for {
		// Abort is a no-op until the decode is in flight: retry until it lands.
		c.Abort()
		select {
		case err := <-done:
			require.ErrorIs(t, err, engine.ErrAborted)
			assert.Equal(t, 0, c.SeqLen(0))
			return
		default:
		}
	}
}

func TestPrefillErrors(t *testing.T) {
	m := fake.New(fake.Config{})
	c, err := m.NewContext(engine.ContextOptions{CtxPerSeq: 8, MaxSeqs: 1, BatchSize: 3})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = engine.Prefill(ctx, c, 0, nil, nil)
	require.ErrorIs(t, err, engine.ErrInvalidInput)
	_, err = engine.Prefill(ctx, c, 0, make([]engine.Token, 9), nil)
	require.ErrorIs(t, err, engine.ErrContextFull)
	b, err := engine.Prefill(ctx, c, 0, []engine.Token{10, 11, 12, 13, 14, 15, 16}, nil)
	require.NoError(t, err)
	assert.Equal(t, 7, c.SeqLen(0))
	_, err = c.Logits(b.Len()-1, nil)
	require.NoError(t, err, "the last token's logits are there")
}

func TestFakeSeqState(t *testing.T) {
	m := fake.New(fake.Config{Seed: 7, Vocab: 300})
	ctx := context.Background()
	toks, err := m.Tokenize("the cat sat", false, false)
	require.NoError(t, err)
	opts := engine.ContextOptions{CtxPerSeq: 64, MaxSeqs: 2}
	src, err := m.NewContext(opts)
	require.NoError(t, err)
	dst, err := m.NewContext(opts)
	require.NoError(t, err)
	_, err = engine.Prefill(ctx, src, 0, toks, nil)
	require.NoError(t, err)
	state, err := src.SeqState(0)
	require.NoError(t, err)
	require.NoError(t, dst.SetSeqState(1, state, len(toks)))
	var b engine.Batch
	b.Add(toks[0], len(toks), true, 1)
	require.NoError(t, dst.Decode(ctx, &b))
	got, err := dst.Logits(0, nil)
	require.NoError(t, err)
	assert.Equal(t, m.Distribution(append(toks, toks[0])), got)
	assert.ErrorIs(t, dst.SetSeqState(1, state, len(toks)), engine.ErrInvalidInput, "not empty")
	assert.ErrorIs(t, dst.SetSeqState(0, state, len(toks)+1), engine.ErrInvalidInput, "wrong length")
	assert.ErrorIs(t, dst.SetSeqState(0, []byte("junk"), 1), engine.ErrInvalidInput)
}
