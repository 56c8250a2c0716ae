package llamacpp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/internal/testmodel"
	"github.com/dragon-rag/dragon/internal/vecmath"
	"github.com/dragon-rag/dragon/sampling"
)

func TestMain(m *testing.M) {
	// llama.cpp logs through slog's level: keep its info chatter out.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	os.Exit(m.Run())
}

func realModelPath(t testing.TB) string { return testmodel.Path(t) }

var (
	realOnce  sync.Once
	realModel *Model
	realErr   error
)

// loadReal shares one load of the real model across tests. One thread:
// `go test` runs packages side by side, and ggml's spinning barriers make an
// oversubscribed machine pathologically slow.
func loadReal(t *testing.T) *Model {
	t.Helper()
	path := realModelPath(t)
	realOnce.Do(func() { realModel, realErr = Load(path, Options{Threads: 1}) })
	require.NoError(t, realErr)
	return realModel
}

func newCtx(t *testing.T, m *Model, opts engine.ContextOptions) *Context {
	t.Helper()
	c, err := m.NewLlamaContext(opts)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func tokens(t *testing.T, m engine.Model, text string) []engine.Token {
	t.Helper()
	toks, err := m.Tokenize(text, false, false)
	require.NoError(t, err)
	require.NotEmpty(t, toks)
	return toks
}

const passage = "The river Thames flows through London and reaches the North Sea at its estuary, " +
	"where ships have anchored for centuries while waiting for the tide."

func maxAbsDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

func TestLinkedLibraryIsThePinnedOne(t *testing.T) {
	require.NoError(t, checkGGML(linkedGGML()), "the library this test binary links")
	err := checkGGML("0.9.4")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ggml 0.9.4")
	assert.Contains(t, err.Error(), "needs "+ggmlVersion)
}

// Every row of a pass is bit for bit the row decoded alone, whatever the
// pass size and thread count: 2 to 8 rows and 12, so 8 then 4, and later
// passes also read the KV cache of earlier ones; on SmolLM2 as Q4_1 and
// as Q8_0, and on Qwen's mixed K-quants. On x86 both weight types take our kernels
// (scripts/llama-kernels.patch): the default Q4_1 at every pass size, its
// rows' arithmetic the same in each; Q8_0 at 2 to 8 rows (tinyBLAS at 12),
// each row as ggml's one-row dot product.
func TestBatchRowsEqualOneByOne(t *testing.T) {
	t.Run("default", func(t *testing.T) { batchRowsEqualOneByOne(t, loadReal(t)) })
	t.Run("Q8_0", func(t *testing.T) {
		q8 := filepath.Join(t.TempDir(), "q8_0.gguf")
		require.NoError(t, Quantize(realModelPath(t), q8, "q8_0", 1))
		m, err := Load(q8, Options{Threads: 1})
		require.NoError(t, err)
		t.Cleanup(func() { m.Close() })
		batchRowsEqualOneByOne(t, m)
	})
	// Qwen's K-quants: upstream's repacked GEMM (from 4 rows) and tiled
	// matmul (from 8) sum in other orders than the one-row GEMV, so the
	// exact build turns both off, and passes of 2 rows and more over Q4_K
	// take our rows kernel (scripts/llama-repack.patch). The 0.5B repacks
	// only its few Q4_K matrices 256-divisible wide; the 1.5B is all Q4_K
	// and Q6_K.
	// Read in place, as a model streamed under a memory budget is, the
	// 1.5B's Q4_K matrices are not repacked: passes of 2 rows and more take
	// our in-place Q4_K kernel (scripts/llama-kernels.patch).
	for _, q := range []struct {
		name    string
		path    func(testing.TB) string
		inPlace bool
	}{{"Qwen 0.5B", testmodel.QwenDevicePath, false}, {"Qwen 1.5B", testmodel.QwenCloudPath, false}, {"Qwen 1.5B in place", testmodel.QwenCloudPath, true}} {
		t.Run(q.name, func(t *testing.T) {
			m, err := Load(q.path(t), Options{Threads: 1, InPlace: q.inPlace})
			require.NoError(t, err)
			t.Cleanup(func() { m.Close() })
			batchRowsEqualOneByOne(t, m)
		})
	}
}

// TestBatchRowsEqualOneByOneWithEachQ8Kernel: with AVX-512 VNNI two Q8_0
// kernels can take a pass, and a process keeps whichever it times the
// faster (after alternating them over its first passes). Each, fixed by
// DRAGON_Q8_KERNEL in a process of its own, keeps every row bit for bit
// (on other CPUs the variable changes nothing, and this repeats the test).
func TestBatchRowsEqualOneByOneWithEachQ8Kernel(t *testing.T) {
	if os.Getenv("DRAGON_Q8_KERNEL") != "" {
		t.Skip("a child process of this test")
	}
	realModelPath(t)
	for _, kernel := range []string{"rows", "pairs"} {
		t.Run(kernel, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestBatchRowsEqualOneByOne$/^Q8_0$", "-test.count=1")
			cmd.Env = append(os.Environ(), "DRAGON_Q8_KERNEL="+kernel)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			assert.NotContains(t, string(out), "no tests to run")
		})
	}
}

func batchRowsEqualOneByOne(t *testing.T, m *Model) {
	toks := tokens(t, m, passage)[:12]
	ctx := context.Background()

	single := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 256, MaxSeqs: 1, BatchSize: 64})
	var b engine.Batch
	want := make([][]float32, len(toks))
	for i, tok := range toks {
		b.Reset()
		b.Add(tok, i, true, 0)
		require.NoError(t, single.Decode(ctx, &b))
		var err error
		want[i], err = single.Logits(0, nil)
		require.NoError(t, err)
	}

	// Two threads split every weight matrix between them; a row's result
	// must not depend on which thread computes it. (More threads than this
	// VM's two cores spin at ggml's barriers for minutes.)
	cases := []struct{ size, threads int }{{2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}, {8, 1}, {12, 1}, {1, 2}, {8, 2}}
	for _, tc := range cases {
		size := tc.size
		t.Run(fmt.Sprintf("rows=%d/threads=%d", size, tc.threads), func(t *testing.T) {
			batched := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 256, MaxSeqs: 1, BatchSize: 64, Threads: tc.threads})
			for start := 0; start < len(toks); start += size {
				end := min(start+size, len(toks))
				b.Reset()
				for i := start; i < end; i++ {
					b.Add(toks[i], i, true, 0)
				}
				require.NoError(t, batched.Decode(ctx, &b))
				for i := start; i < end; i++ {
					got, err := batched.Logits(i-start, nil)
					require.NoError(t, err)
					// Bit for bit: every pass size computes a row as a one-row pass does.
					assert.Zero(t, maxAbsDiff(got, want[i]), "row %d", i)
					assert.Equal(t, sampling.Argmax(want[i]), sampling.Argmax(got), "argmax of row %d", i)
				}
			}
		})
	}
}

func TestTruncateThenRedecodeReproducesLogits(t *testing.T) {
	m := loadReal(t)
	toks := tokens(t, m, passage)
	ctx := context.Background()
	c := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 256, MaxSeqs: 1, BatchSize: 64})

	b, err := engine.Prefill(ctx, c, 0, toks, nil)
	require.NoError(t, err)
	want, err := c.Logits(b.Len()-1, nil)
	require.NoError(t, err)

	// Decode something else after a prefix, then roll back and redo.
	cut := len(toks) - 5
	require.NoError(t, c.Truncate(0, cut))
	require.Equal(t, cut, c.SeqLen(0))
	b.Reset()
	for i, tok := range tokens(t, m, " and then something else entirely happened") {
		b.Add(tok, cut+i, false, 0)
	}
	b.Entries[b.Len()-1].Logits = true
	require.NoError(t, c.Decode(ctx, b))
	require.NoError(t, c.Truncate(0, cut))
	b.Reset()
	for i, tok := range toks[cut:] {
		b.Add(tok, cut+i, i == len(toks)-cut-1, 0)
	}
	require.NoError(t, c.Decode(ctx, b))
	got, err := c.Logits(b.Len()-1, nil)
	require.NoError(t, err)
	assert.Zero(t, maxAbsDiff(got, want))
}

func TestSequencesInOneBatchDoNotLeak(t *testing.T) {
	m := loadReal(t)
	ctx := context.Background()
	prompts := [][]engine.Token{
		tokens(t, m, strings.Repeat(passage+" ", 3)),
		tokens(t, m, "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen in green leaves."),
	}
	// A pass attends over as many KV cells as its longest sequence fills,
	// in steps of 32: together, the short prompt attends over the long
	// one's window, most of it masked, and must not notice.
	require.Greater(t, len(prompts[0]), 64)
	require.Less(t, len(prompts[1]), 32)
	alone := make([][]float32, len(prompts))
	for s, toks := range prompts {
		c := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 256, MaxSeqs: 1, BatchSize: 128})
		b, err := engine.Prefill(ctx, c, 0, toks, nil)
		require.NoError(t, err)
		alone[s], err = c.Logits(b.Len()-1, nil)
		require.NoError(t, err)
	}

	c := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 256, MaxSeqs: 2, BatchSize: 128})
	var b engine.Batch
	last := make([]int, len(prompts))
	for s, toks := range prompts {
		for i, tok := range toks {
			b.Add(tok, i, i == len(toks)-1, s)
		}
		last[s] = b.Len() - 1
	}
	require.NoError(t, c.Decode(ctx, &b))
	for s := range prompts {
		got, err := c.Logits(last[s], nil)
		require.NoError(t, err)
		assert.Zero(t, maxAbsDiff(got, alone[s]), "sequence %d", s)
	}

	// Decode steps: one row of each sequence in one pass (the daemons'
	// step) against each sequence's own one-row passes.
	steps := tokens(t, m, " and so")
	for s, toks := range prompts {
		one := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 256, MaxSeqs: 1, BatchSize: 128})
		_, err := engine.Prefill(ctx, one, 0, toks, nil)
		require.NoError(t, err)
		var ob engine.Batch
		for i, tok := range steps {
			ob.Reset()
			ob.Add(tok, len(toks)+i, true, 0)
			require.NoError(t, one.Decode(ctx, &ob))
			alone[s], err = one.Logits(0, nil)
			require.NoError(t, err)
		}
	}
	for i, tok := range steps {
		b.Reset()
		for s, toks := range prompts {
			b.Add(tok, len(toks)+i, true, s)
		}
		require.NoError(t, c.Decode(ctx, &b))
	}
	for s := range prompts {
		got, err := c.Logits(s, nil)
		require.NoError(t, err)
		assert.Zero(t, maxAbsDiff(got, alone[s]), "sequence %d after %d one-row steps", s, len(steps))
	}
}

func TestAbortDuringPrefill(t *testing.T) {
	m := loadReal(t)
	ctx := context.Background()
	long := tokens(t, m, strings.Repeat(passage+" ", 40))[:1500]
	c := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 2048, MaxSeqs: 1, BatchSize: 2048})

	var b engine.Batch
	for i, tok := range long {
		b.Add(tok, i, i == len(long)-1, 0)
	}
	done := make(chan error, 1)
	var returned time.Time
	go func() {
		err := c.Decode(ctx, &b)
		returned = time.Now()
		done <- err
	}()
	time.Sleep(150 * time.Millisecond) // well inside a ~1 s prefill
	requested := time.Now()
	c.Abort()
	err := <-done
	require.ErrorIs(t, err, engine.ErrAborted)
	assert.False(t, errors.Is(err, engine.ErrContextFull))
	assert.Less(t, returned.Sub(requested), 100*time.Millisecond, "abort latency")
	assert.Equal(t, 0, c.SeqLen(0), "no position of the aborted batch stays")

	// The context is usable afterwards and computes what a fresh one does.
	short := long[:20]
	pb, err := engine.Prefill(ctx, c, 0, short, nil)
	require.NoError(t, err)
	got, err := c.Logits(pb.Len()-1, nil)
	require.NoError(t, err)
	fresh := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 256, MaxSeqs: 1, BatchSize: 64})
	fb, err := engine.Prefill(ctx, fresh, 0, short, nil)
	require.NoError(t, err)
	want, err := fresh.Logits(fb.Len()-1, nil)
	require.NoError(t, err)
	assert.Zero(t, maxAbsDiff(got, want))
}

func TestContextCancelAborts(t *testing.T) {
	m := loadReal(t)
	long := tokens(t, m, strings.Repeat(passage+" ", 40))[:1500]
	c := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 2048, MaxSeqs: 1, BatchSize: 2048})
	var b engine.Batch
	for i, tok := range long {
		b.Add(tok, i, false, 0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := c.Decode(ctx, &b)
	require.ErrorIs(t, err, engine.ErrAborted)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// greedy answers a chat question with plain greedy decoding.
func greedy(t *testing.T, m *Model, question string, n int) string {
	t.Helper()
	prompt, err := m.ChatPrompt([]engine.Message{{Role: engine.RoleUser, Content: question}}, true)
	require.NoError(t, err)
	toks, err := m.Tokenize(prompt, true, true)
	require.NoError(t, err)
	c := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 512, MaxSeqs: 1, BatchSize: 256})
	ctx := context.Background()
	b, err := engine.Prefill(ctx, c, 0, toks, nil)
	require.NoError(t, err)
	detok := engine.NewDetokenizer(m)
	var out strings.Builder
	var logits []float32
	row := b.Len() - 1
	for range n {
		logits, err = c.Logits(row, logits)
		require.NoError(t, err)
		tok := engine.Token(sampling.Argmax(logits))
		if m.IsEOG(tok) {
			break
		}
		out.WriteString(detok.Add(tok))
		b.Reset()
		b.Add(tok, c.SeqLen(0), true, 0)
		require.NoError(t, c.Decode(ctx, b))
		row = 0
	}
	out.WriteString(detok.Flush())
	return out.String()
}

func TestRealModelAnswersFluentlyAndDeterministically(t *testing.T) {
	m := loadReal(t)
	info := m.Info()
	assert.Equal(t, "llama", info.Arch)
	assert.Equal(t, 49152, info.VocabSize)

	first := greedy(t, m, "What is the capital of France?", 24)
	second := greedy(t, m, "What is the capital of France?", 24)
	t.Logf("answer: %q", first)
	assert.Equal(t, first, second, "greedy decoding is deterministic")
	assert.Contains(t, first, "Paris")
	words := strings.Fields(first)
	assert.GreaterOrEqual(t, len(words), 4, "a sentence, not a token")
}

func TestChatTemplateIsChatML(t *testing.T) {
	m := loadReal(t)
	p, err := m.ChatPrompt([]engine.Message{{Role: engine.RoleSystem, Content: "Be brief."}, {Role: engine.RoleUser, Content: "Hi"}}, true)
	require.NoError(t, err)
	assert.Equal(t, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", p)
	toks, err := m.Tokenize(p, false, true)
	require.NoError(t, err)
	assert.True(t, slices.ContainsFunc(toks, m.IsEOG), "<|im_end|> is parsed as a control token that ends generation")
}

func TestTokenizeDetokenizeRoundTrip(t *testing.T) {
	m := loadReal(t)
	for _, text := range []string{"Hello, world!", "naïve café — 東京 🚀 done", "  spaces\tand\nnewlines  "} {
		toks, err := m.Tokenize(text, false, false)
		require.NoError(t, err)
		d := engine.NewDetokenizer(m)
		var out strings.Builder
		for _, tok := range toks {
			piece := d.Add(tok)
			assert.True(t, isValidUTF8(piece), "never half a character: %q", piece)
			out.WriteString(piece)
		}
		out.WriteString(d.Flush())
		assert.Equal(t, text, out.String())
	}
}

func isValidUTF8(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	notGGUF := filepath.Join(dir, "notes.txt")
	require.NoError(t, os.WriteFile(notGGUF, []byte("just some text, not a model"), 0o644))
	corrupt := filepath.Join(dir, "corrupt.gguf")
	require.NoError(t, os.WriteFile(corrupt, append([]byte("GGUF"), make([]byte, 64)...), 0o644))
	truncated := filepath.Join(dir, "truncated.gguf")
	real, err := os.ReadFile(realModelPath(t))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(truncated, real[:len(real)/3], 0o644))

	for name, path := range map[string]string{
		"missing":   filepath.Join(dir, "nope.gguf"),
		"not gguf":  notGGUF,
		"corrupt":   corrupt,
		"truncated": truncated,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Load(path, Options{})
			require.ErrorIs(t, err, engine.ErrBadModel)
			assert.Contains(t, err.Error(), path)
		})
	}

	m := loadReal(t)
	ctx := context.Background()
	c := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 64, MaxSeqs: 2, BatchSize: 64})

	_, err = engine.Prefill(ctx, c, 0, nil, nil)
	require.ErrorIs(t, err, engine.ErrInvalidInput)
	assert.Contains(t, err.Error(), "empty prompt")

	long := tokens(t, m, strings.Repeat(passage, 5))
	_, err = engine.Prefill(ctx, c, 0, long, nil)
	require.ErrorIs(t, err, engine.ErrContextFull)
	assert.Contains(t, err.Error(), "exceeds the context")
	assert.Equal(t, 0, c.SeqLen(0))

	var b engine.Batch
	b.Add(1, 0, true, 2)
	require.ErrorIs(t, c.Decode(ctx, &b), engine.ErrInvalidInput)
	b.Reset()
	b.Add(engine.Token(m.Info().VocabSize), 0, true, 0)
	require.ErrorIs(t, c.Decode(ctx, &b), engine.ErrInvalidInput)
	b.Reset()
	b.Add(1, 5, true, 0) // a gap in the positions
	require.ErrorIs(t, c.Decode(ctx, &b), engine.ErrInvalidInput)
	require.ErrorIs(t, c.Decode(ctx, &engine.Batch{}), engine.ErrInvalidInput)

	_, err = c.Logits(0, nil)
	require.ErrorIs(t, err, engine.ErrInvalidInput, "no row has logits before a decode")
	require.ErrorIs(t, c.Truncate(7, 0), engine.ErrInvalidInput)

	_, err = m.NewContext(engine.ContextOptions{CtxPerSeq: 0, MaxSeqs: 1})
	require.ErrorIs(t, err, engine.ErrInvalidInput)
	_, err = m.ChatPrompt(nil, true)
	require.ErrorIs(t, err, engine.ErrInvalidInput)
}

func TestEmbeddings(t *testing.T) {
	m := loadReal(t)
	c := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 128, MaxSeqs: 1, BatchSize: 128, Embeddings: true})
	toks := tokens(t, m, passage)
	var b engine.Batch
	for i, tok := range toks {
		b.Add(tok, i, true, 0)
	}
	require.NoError(t, c.Decode(context.Background(), &b))
	e0, err := c.Embedding(0, nil)
	require.NoError(t, err)
	e1, err := c.Embedding(1, nil)
	require.NoError(t, err)
	assert.Len(t, e0, m.Info().EmbedDim)
	assert.Greater(t, maxAbsDiff(e0, e1), 1e-3, "per-token, not pooled")
	// Logits are still there with embeddings on.
	_, err = c.Logits(len(toks)-1, nil)
	require.NoError(t, err)

	plain := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 128, MaxSeqs: 1})
	_, err = plain.Embedding(0, nil)
	require.ErrorIs(t, err, engine.ErrInvalidInput)
}

func TestFingerprintStable(t *testing.T) {
	m := loadReal(t)
	other, err := Load(realModelPath(t), Options{})
	require.NoError(t, err)
	defer other.Close()
	assert.Equal(t, m.Info().Fingerprint, other.Info().Fingerprint)
	assert.True(t, strings.HasPrefix(m.Info().Fingerprint, "vocab/"))
}

// TestUnifiedLayoutsKeepLogitsClose: in a unified buffer a sequence's
// cells lie among other sequences' cells, and a removal leaves free cells
// that later tokens fill out of position order. Attention then sums over
// the cells in buffer order and over more of them, so the results move
// within rounding (which Q8_0's quantized activations magnify: 0.36 in a
// logit, 0.018 in a probability when measured), but never by what
// attending to another sequence's tokens does (the control: 7.8 and 0.23).
func TestUnifiedLayoutsKeepLogitsClose(t *testing.T) {
	m := loadReal(t)
	ctx := context.Background()
	a := tokens(t, m, "The lighthouse keeper lit the lamp at dusk and watched the sea.")
	b := tokens(t, m, "Tides rise twice a day along the rocky coast of the island, they say")
	decodeFrom := func(c *Context, toks []engine.Token, seq, from, pos0 int) []float32 {
		var bt engine.Batch
		for i := from; i < len(toks); i++ {
			bt.Add(toks[i], pos0+i, i == len(toks)-1, seq)
		}
		require.NoError(t, c.Decode(ctx, &bt))
		out, err := c.Logits(len(toks)-1-from, nil)
		require.NoError(t, err)
		return out
	}
	const probTolerance = 0.05
	opts := engine.ContextOptions{CtxPerSeq: 128, MaxSeqs: 2, Unified: true}
	want := decodeFrom(newCtx(t, m, opts), b, 0, 0, 0)

	c := newCtx(t, m, opts)
	decodeFrom(c, a, 0, 0, 0)
	decodeFrom(c, b[:6], 1, 0, 0)
	require.NoError(t, c.Truncate(0, 3)) // frees cells before sequence 1's
	got := decodeFrom(c, b, 1, 6, 0)     // b[6:] land in them, out of order
	assert.Equal(t, sampling.Argmax(want), sampling.Argmax(got))
	assert.LessOrEqual(t, maxAbsDiff(probs(t, want), probs(t, got)), probTolerance)

	leaky := newCtx(t, m, opts)
	decodeFrom(leaky, a, 0, 0, 0)
	leak := decodeFrom(leaky, b, 0, 0, len(a)) // b sees a: what a masking error does
	assert.Greater(t, maxAbsDiff(probs(t, want), probs(t, leak)), 2*probTolerance, "the control must fail the tolerance")
}

// probs is the softmax of a row of logits.
func probs(t *testing.T, logits []float32) []float32 {
	out := make([]float32, len(logits))
	_, err := vecmath.SoftmaxMix(out, logits, 1)
	require.NoError(t, err)
	return out
}

// TestSeqStateMovesBetweenContexts: a sequence prefilled in one context
// and loaded into another (DRCG/KV, the KV cache) continues exactly as the
// original, whatever either context's sequence count (llama.cpp's own
// state names the count of streams, one per sequence, and loads only into
// a context with the same).
func TestSeqStateMovesBetweenContexts(t *testing.T) {
	m := loadReal(t)
	toks := tokens(t, m, passage)
	ctx := context.Background()
	next := tokens(t, m, " The")
	for _, tc := range []struct{ srcSeqs, srcSeq, dstSeqs, dstSeq int }{
		{2, 1, 2, 0},
		{1, 0, 4, 2},
		{4, 3, 1, 0},
		{3, 1, 5, 4},
	} {
		t.Run(fmt.Sprintf("%d-of-%d_to_%d-of-%d", tc.srcSeq, tc.srcSeqs, tc.dstSeq, tc.dstSeqs), func(t *testing.T) {
			src := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 256, MaxSeqs: tc.srcSeqs, BatchSize: 64})
			dst := newCtx(t, m, engine.ContextOptions{CtxPerSeq: 256, MaxSeqs: tc.dstSeqs, BatchSize: 64})
			_, err := engine.Prefill(ctx, src, tc.srcSeq, toks, nil)
			require.NoError(t, err)
			state, err := src.SeqState(tc.srcSeq)
			require.NoError(t, err)
			require.NoError(t, dst.SetSeqState(tc.dstSeq, state, len(toks)))
			assert.Equal(t, len(toks), dst.SeqLen(tc.dstSeq))

			var b engine.Batch
			b.Add(next[0], len(toks), true, tc.srcSeq)
			require.NoError(t, src.Decode(ctx, &b))
			want, err := src.Logits(0, nil)
			require.NoError(t, err)
			b.Reset()
			b.Add(next[0], len(toks), true, tc.dstSeq)
			require.NoError(t, dst.Decode(ctx, &b))
			got, err := dst.Logits(0, nil)
			require.NoError(t, err)
			assert.Zero(t, maxAbsDiff(got, want), "the loaded sequence continues bit for bit")

			again, err := dst.SeqState(tc.dstSeq)
			require.NoError(t, err)
			assert.Greater(t, len(again), len(state), "one more position saved")
		})
	}

	opts := engine.ContextOptions{CtxPerSeq: 256, MaxSeqs: 2, BatchSize: 64}
	src, dst := newCtx(t, m, opts), newCtx(t, m, opts)
	_, err := engine.Prefill(ctx, src, 1, toks, nil)
	require.NoError(t, err)
	state, err := src.SeqState(1)
	require.NoError(t, err)
	require.NoError(t, dst.SetSeqState(0, state, len(toks)))
	assert.ErrorIs(t, dst.SetSeqState(0, state, len(toks)), engine.ErrInvalidInput, "the sequence is not empty")
	assert.ErrorIs(t, dst.SetSeqState(1, state, len(toks)+3), engine.ErrInvalidInput, "wrong length")
	assert.Zero(t, dst.SeqLen(1), "a failed load leaves the sequence empty")
	assert.ErrorIs(t, dst.SetSeqState(1, []byte("garbage"), 4), engine.ErrInvalidInput)
	assert.ErrorIs(t, dst.SetSeqState(1, append([]byte(nil), state[:len(seqStateMagic)+2]...), 4), engine.ErrInvalidInput, "truncated")
	_, err = dst.SeqState(1)
	assert.ErrorIs(t, err, engine.ErrInvalidInput, "nothing to save")
}

func TestPortableSeqStateRejectsWhatItCannotMove(t *testing.T) {
	le := func(vs ...uint32) []byte {
		var out []byte
		for _, v := range vs {
			out = binary.LittleEndian.AppendUint32(out, v)
		}
		return out
	}
	cells := []byte{9, 9, 9, 9, 9}
	head := func(seq, streams uint32) []byte { return le(0xaf143cd8, seq, streams) }
	cat := func(parts ...[]byte) []byte { return slices.Concat(parts...) }
	for name, tc := range map[string]struct {
		raw     []byte
		streams int
		ok      bool
	}{
		"one stream":            {cat(head(0, 1), le(2), cells), 1, true},
		"third of four":         {cat(head(2, 4), le(0, 0, 2), cells, le(0)), 4, true},
		"another stream count":  {cat(head(0, 2), le(2), cells), 4, false},
		"no cells":              {cat(head(1, 3), le(0, 0, 0)), 3, false},
		"cells in two streams":  {cat(head(0, 2), le(2), cells, le(7)), 2, false},
		"a count and no cells":  {cat(head(0, 1), le(2)), 1, false},
		"shorter than a header": {[]byte{1}, 1, false},
	} {
		t.Run(name, func(t *testing.T) {
			state, err := portableSeqState(tc.raw, tc.streams)
			if !tc.ok {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			back, ok := rawSeqState(nil, state, tc.streams)
			require.True(t, ok)
			// A reused buffer of old bytes gives the same.
			dirty := bytes.Repeat([]byte{0xff}, len(back)+8)
			again, ok := rawSeqState(dirty, state, tc.streams)
			require.True(t, ok)
			assert.Equal(t, back, again)
			// Back as stream 0 of the same count: the same cells, the
			// other streams empty.
			assert.Equal(t, cat(head(0, uint32(tc.streams)), le(2), cells, make([]byte, 4*(tc.streams-1))), back)
		})
	}
}

// TestFootprint: SmolLM2-135M keeps 30 layers × 3 KV heads × (64 + 64)
// dims × 2 bytes per position, which llama.cpp's own log confirms (180 MiB
// for 8192 cells), and its weights are most of the file.
func TestFootprint(t *testing.T) {
	m := loadReal(t)
	fp := m.Footprint()
	assert.Equal(t, int64(30*3*(64+64)*2), fp.KVPerToken)
	assert.Equal(t, 49152, fp.Vocab)
	assert.Equal(t, 9, fp.Heads)
	st, err := os.Stat(realModelPath(t))
	require.NoError(t, err)
	assert.InDelta(t, float64(st.Size()), float64(fp.Weights), 0.1*float64(st.Size()))
}

// TestUnloadLoadsBack: Unload waits for open contexts, frees the weights,
// and the next call loads them back and computes the same logits.
func TestUnloadLoadsBack(t *testing.T) {
	m, err := Load(realModelPath(t), Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	logits := func() []float32 {
		c, err := m.NewLlamaContext(engine.ContextOptions{MaxSeqs: 1, CtxPerSeq: 64})
		require.NoError(t, err)
		defer c.Close()
		b := &engine.Batch{}
		toks := tokens(t, m, "The capital of France is")
		for i, tok := range toks {
			b.Add(tok, i, i == len(toks)-1, 0)
		}
		require.NoError(t, c.Decode(context.Background(), b))
		out, err := c.Logits(len(b.Entries)-1, nil)
		require.NoError(t, err)
		assert.Error(t, m.Unload(), "a context is open")
		assert.True(t, m.Loaded())
		return out
	}
	want := logits()
	require.NoError(t, m.Unload())
	assert.False(t, m.Loaded())
	require.NoError(t, m.Unload(), "unloading twice is a no-op")
	assert.Equal(t, want, logits(), "loaded back: the same model")

	require.NoError(t, m.Unload())
	_, err = m.Tokenize("hello", false, false)
	require.NoError(t, err)
	assert.True(t, m.Loaded(), "a tokenization loads it back")

	require.NoError(t, m.Close())
	_, err = m.Tokenize("hello", false, false)
	assert.ErrorIs(t, err, engine.ErrClosed)
	assert.NoError(t, m.Unload())
}

// TestUnloadRacesTokenize: calls that need the weights never see them
// freed under them (run with -race; a use after free would crash).
func TestUnloadRacesTokenize(t *testing.T) {
	m, err := Load(realModelPath(t), Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for range 20 {
				toks, err := m.Tokenize("The capital of France is", false, false)
				assert.NoError(t, err)
				assert.NotEmpty(t, toks)
			}
		})
	}
	wg.Go(func() {
		for range 5 {
			assert.NoError(t, m.Unload())
			time.Sleep(time.Millisecond)
		}
	})
	wg.Wait()
}

// TestCloseEndsTheDecodeWorker: each context runs its passes on a thread
// of its own, which Close ends, with the descriptor the pass ends are read
// from.
func TestCloseEndsTheDecodeWorker(t *testing.T) {
	m := loadReal(t)
	threads := func() int {
		es, err := os.ReadDir("/proc/self/task")
		require.NoError(t, err)
		return len(es)
	}
	const n = 8
	cs := make([]*Context, 0, n)
	for range n {
		c, err := m.NewLlamaContext(engine.ContextOptions{MaxSeqs: 1, CtxPerSeq: 64})
		require.NoError(t, err)
		b := &engine.Batch{}
		b.Add(tokens(t, m, "Hello")[0], 0, true, 0)
		require.NoError(t, c.Decode(context.Background(), b), "a pass on the worker")
		cs = append(cs, c)
	}
	open := threads()
	for _, c := range cs {
		fd := c.done.Fd()
		require.NoError(t, c.Close())
		_, err := os.Stat(fmt.Sprintf("/proc/self/fd/%d", fd))
		assert.True(t, errors.Is(err, os.ErrNotExist), "descriptor %d closed", fd)
	}
	// Go never ends its own threads, so the count can only fall by the
	// workers' (less any thread Go starts meanwhile).
	assert.GreaterOrEqual(t, open-threads(), n-2, "the workers ended")
}
