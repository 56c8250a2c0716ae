package cachebench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/internal/timing"
)

// RestoreResult compares prefilling a passage sequence's prompt with
// restoring its saved KV state, per passage: medians over passages and
// repeats.
type RestoreResult struct {
	PrefillMS float64 `json:"prefill_ms_per_passage"`
	RestoreMS float64 `json:"restore_ms_per_passage"`
	// Ratio is RestoreMS / PrefillMS (the target is ≤ 0.1).
	Ratio float64 `json:"restore_over_prefill"`
	// Passages measured, Repeats of each; the median prompt length in
	// tokens and state size in bytes.
	Passages     int     `json:"passages"`
	Repeats      int     `json:"repeats"`
	PromptTokens float64 `json:"prompt_tokens_median"`
	StateBytes   float64 `json:"state_bytes_median"`
	// PerPassage are each passage's medians over its repeats.
	PrefillPerPassageMS []float64 `json:"prefill_per_passage_ms"`
	RestorePerPassageMS []float64 `json:"restore_per_passage_ms"`
	Threads             int       `json:"threads"`
	Core                string    `json:"core,omitempty"`
}

// PassagePrompts renders each passage of prompts as a passage sequence of
// the daemons' decoders renders it (the default system message, output
// aggregation, the prompt's question): a decoder of one passage begins
// over it, and its prompt is read back.
func PassagePrompts(ctx context.Context, m engine.Model, prompts []promptset.Prompt) ([][]engine.Token, error) {
	dec, err := decoder.New(m, decoder.Options{MaxPassages: 1, CtxPerSeq: 1024, Threads: 1})
	if err != nil {
		return nil, err
	}
	defer dec.Close()
	var out [][]engine.Token
	for _, p := range prompts {
		for _, ps := range p.Passages {
			if err := dec.Begin(ctx, p.Query, []decoder.Passage{ps}, nil); err != nil {
				return nil, fmt.Errorf("cachebench: prompt of %q: %w", p.Query, err)
			}
			out = append(out, append([]engine.Token(nil), dec.Prompt(0)...))
		}
	}
	return out, nil
}

// MeasureRestore times, on a fresh one-sequence context of m with threads
// compute threads, for each prompt and repeats times: (a) prefilling the
// whole prompt into the empty sequence (engine.Prefill: the last row's
// logits, as a decoder asks), and (b) loading the state that prefill left
// (saved once per prompt) into the empty sequence with SetSeqState,
// computing nothing else. The calling goroutine is locked to its thread
// while it measures; pin the process to a core beforehand for quiet
// numbers.
func MeasureRestore(ctx context.Context, m engine.Model, prompts [][]engine.Token, repeats, threads int) (RestoreResult, error) {
	if len(prompts) == 0 || repeats < 1 {
		return RestoreResult{}, errors.New("cachebench: need prompts and repeats ≥ 1")
	}
	if threads < 1 {
		threads = 1
	}
	longest := 0
	for _, p := range prompts {
		longest = max(longest, len(p))
	}
	c, err := m.NewContext(engine.ContextOptions{CtxPerSeq: max(1024, longest+1), MaxSeqs: 1, BatchSize: 512, Threads: threads})
	if err != nil {
		return RestoreResult{}, err
	}
	defer c.Close()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	var b *engine.Batch
	prefill := func(p []engine.Token) (time.Duration, error) {
		if err := c.Truncate(0, 0); err != nil {
			return 0, err
		}
		start := time.Now()
		b, err = engine.Prefill(ctx, c, 0, p, b)
		return time.Since(start), err
	}
	// One prefill to warm the context's buffers up, untimed.
	if _, err := prefill(prompts[0]); err != nil {
		return RestoreResult{}, err
	}
	res := RestoreResult{Passages: len(prompts), Repeats: repeats, Threads: threads}
	var all [2][]float64
	var lens, sizes []float64
	for i, p := range prompts {
		var state []byte
		var pre, rest []float64
		for r := range repeats {
			d, err := prefill(p)
			if err != nil {
				return res, fmt.Errorf("cachebench: prefill of passage %d: %w", i, err)
			}
			pre = append(pre, timing.MS(d))
			if r == 0 {
				if state, err = c.SeqState(0); err != nil {
					return res, err
				}
			}
			if err := c.Truncate(0, 0); err != nil {
				return res, err
			}
			start := time.Now()
			if err := c.SetSeqState(0, state, len(p)); err != nil {
				return res, fmt.Errorf("cachebench: restore of passage %d: %w", i, err)
			}
			rest = append(rest, timing.MS(time.Since(start)))
			if c.SeqLen(0) != len(p) {
				return res, fmt.Errorf("cachebench: restored passage %d holds %d positions, want %d", i, c.SeqLen(0), len(p))
			}
		}
		all[0] = append(all[0], pre...)
		all[1] = append(all[1], rest...)
		res.PrefillPerPassageMS = append(res.PrefillPerPassageMS, timing.Median(pre))
		res.RestorePerPassageMS = append(res.RestorePerPassageMS, timing.Median(rest))
		lens = append(lens, float64(len(p)))
		sizes = append(sizes, float64(len(state)))
	}
	res.PrefillMS = timing.Median(all[0])
	res.RestoreMS = timing.Median(all[1])
	if res.PrefillMS > 0 {
		res.Ratio = res.RestoreMS / res.PrefillMS
	}
	res.PromptTokens = timing.Median(lens)
	res.StateBytes = timing.Median(sizes)
	return res, nil
}
