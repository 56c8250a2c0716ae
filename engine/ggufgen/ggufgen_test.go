package ggufgen

import (
	"bytes"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ollama/ollama/llama"
	"github.com/ollama/ollama/ml"
	"github.com/stretchr/testify/require"
)

func write(t *testing.T, cfg Config) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	require.NoError(t, Write(path, cfg))
	return path
}

func TestWriteIsDeterministicAndSmall(t *testing.T) {
	a, err := os.ReadFile(write(t, Config{Seed: 7}))
	require.NoError(t, err)
	b, err := os.ReadFile(write(t, Config{Seed: 7}))
	require.NoError(t, err)
	c, err := os.ReadFile(write(t, Config{Seed: 8}))
	require.NoError(t, err)

	require.Equal(t, "GGUF", string(a[:4]))
	require.True(t, bytes.Equal(a, b), "same seed must give the same file")
	require.Len(t, c, len(a))
	require.False(t, bytes.Equal(a, c), "different seeds must give different weights")
	require.Less(t, len(a), 2<<20)

	untied, err := os.ReadFile(write(t, Config{Seed: 7, UntiedOutput: true}))
	require.NoError(t, err)
	require.Greater(t, len(untied), len(a), "output.weight adds a vocab×embd matrix")
}

func TestWriteRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Embd: 66, Heads: 4}, "Embd 66 is not divisible by Heads 4"},
		{Config{Embd: 12, Heads: 4}, "must be even for RoPE"},
		{Config{Heads: 4, HeadsKV: 3}, "Heads 4 is not a multiple of HeadsKV 3"},
		{Config{Layers: -1}, "Layers = -1, must be positive"},
		{Config{FFN: 1 << 20}, "too large"},
	} {
		path := filepath.Join(t.TempDir(), "bad.gguf")
		err := Write(path, tc.cfg)
		require.ErrorContains(t, err, tc.want, "%+v", tc.cfg)
		require.NoFileExists(t, path)
		entries, err := os.ReadDir(filepath.Dir(path))
		require.NoError(t, err)
		require.Empty(t, entries, "no temporary file left behind")
	}
}

func TestVocab(t *testing.T) {
	tokens, types, merges := vocab()
	require.Len(t, types, len(tokens))
	require.Equal(t, VocabSize(), len(tokens))
	require.Equal(t, 3+256+len(merges), len(tokens))
	require.Equal(t, "<|im_start|>", tokens[TokenIMStart])
	require.Equal(t, "<|im_end|>", tokens[TokenIMEnd])
	require.Equal(t, "<|endoftext|>", tokens[TokenEndOfText])
	sym := byteSymbols()
	require.Equal(t, "Ġ", sym[' '])
	require.Equal(t, "Ċ", sym['\n'])
	require.Equal(t, "a", sym['a'])
}

var backendOnce sync.Once

// TestMain keeps llama.cpp's load log (hundreds of lines per model, routed
// through slog's level by ollama's binding) out of the output; its errors
// still show.
func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	os.Exit(m.Run())
}

// load loads a model file into llama.cpp with a small context. Neither is
// freed: ollama's binding has no context free, and a model must outlive
// its contexts; both are tiny.
func load(t *testing.T, path string) (*llama.Model, *llama.Context) {
	t.Helper()
	backendOnce.Do(llama.BackendInit)
	m, err := llama.LoadModelFromFile(path, llama.ModelParams{UseMmap: true})
	require.NoError(t, err)
	lc, err := llama.NewContextWithModel(m, llama.NewContextParams(256, 64, 2, 1, ml.FlashAttentionDisabled, ""))
	require.NoError(t, err)
	return m, lc
}

// decode runs one batch of tokens at positions start... of sequence 0 and
// returns the logits of every position.
func decode(t *testing.T, lc *llama.Context, start int, tokens []int) [][]float32 {
	t.Helper()
	b, err := llama.NewBatch(64, 1, 0)
	require.NoError(t, err)
	defer b.Free()
	for i, tok := range tokens {
		b.Add(tok, nil, start+i, true, 0)
	}
	require.NoError(t, lc.Decode(b))
	out := make([][]float32, len(tokens))
	for i := range tokens {
		out[i] = lc.GetLogitsIth(i)
		require.Len(t, out[i], VocabSize())
		for _, v := range out[i] {
			require.False(t, math.IsNaN(float64(v)) || math.IsInf(float64(v), 0), "logit %v at position %d", v, i)
		}
	}
	return out
}

func TestLlamaCppLoadsAndRuns(t *testing.T) {
	m, lc := load(t, write(t, Config{Seed: 1}))
	require.Equal(t, VocabSize(), m.NumVocab())
	require.Equal(t, 64, m.NEmbd())
	require.False(t, m.AddBOSToken(), "like SmolLM2, no BOS is added")
	require.True(t, m.TokenIsEog(TokenIMEnd))
	require.False(t, m.TokenIsEog(TokenIMStart))

	// The merges make "hello" and " world" single tokens.
	toks, err := m.Tokenize("hello world", true, false)
	require.NoError(t, err)
	require.Len(t, toks, 2)
	require.Equal(t, "hello", m.TokenToPiece(toks[0]))
	require.Equal(t, " world", m.TokenToPiece(toks[1]))

	// Anything else falls back to bytes and still round-trips.
	for _, text := range []string{
		"the end\n\nof the world's text",
		"Ünïcode ✓ 日本語 123\t\x01",
	} {
		toks, err := m.Tokenize(text, false, false)
		require.NoError(t, err)
		var sb strings.Builder
		for _, tok := range toks {
			sb.WriteString(m.TokenToPiece(tok))
		}
		require.Equal(t, text, sb.String())
	}

	// ChatML markers are control tokens: parsed only when asked.
	toks, err = m.Tokenize("<|im_start|>user\nhi<|im_end|>", false, true)
	require.NoError(t, err)
	require.Equal(t, TokenIMStart, toks[0])
	require.Equal(t, TokenIMEnd, toks[len(toks)-1])
	plain, err := m.Tokenize("<|im_start|>", false, false)
	require.NoError(t, err)
	require.Greater(t, len(plain), 1, "without parseSpecial the marker is text")

	prompt, err := m.Tokenize("hello world, the world", false, false)
	require.NoError(t, err)
	logits := decode(t, lc, 0, prompt)
	require.NotEqual(t, logits[0], logits[1], "logits must depend on the position's context")
	require.NotEqual(t, spread(logits[0]), float32(0), "logits must not be flat")

	// Another seed: another model.
	_, lc2 := load(t, write(t, Config{Seed: 2}))
	logits2 := decode(t, lc2, 0, prompt)
	require.NotEqual(t, logits[0], logits2[0])

	// The same seed again, decoded in two batches through the KV cache:
	// the same logits, to the f16 cache's rounding.
	_, lc3 := load(t, write(t, Config{Seed: 1}))
	n := len(prompt)
	decode(t, lc3, 0, prompt[:n-1])
	last := decode(t, lc3, n-1, prompt[n-1:])[0]
	require.InDeltaSlice(t, logits[n-1], last, 1e-2)
}

func TestLlamaCppOtherShapes(t *testing.T) {
	// Untied output, MHA (HeadsKV = Heads), odd head count, more layers.
	m, lc := load(t, write(t, Config{Seed: 3, Layers: 3, Embd: 48, Heads: 3, FFN: 96, UntiedOutput: true, CtxLen: 512}))
	require.Equal(t, 48, m.NEmbd())
	toks, err := m.Tokenize("what is the answer", false, false)
	require.NoError(t, err)
	decode(t, lc, 0, toks)
}

// spread is max - min of the logits.
func spread(l []float32) float32 {
	lo, hi := l[0], l[0]
	for _, v := range l {
		lo, hi = min(lo, v), max(hi, v)
	}
	return hi - lo
}
