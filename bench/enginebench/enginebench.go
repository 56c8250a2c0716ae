// Package enginebench measures the costs the speculative decoders are sized
// by: one-token decode, k-token verification of one sequence, one token for
// each of k sequences in one call, and prefill throughput; and, to compare
// with llama.cpp's llama-bench, k tokens of one sequence with only the last
// row's logits.
package enginebench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/internal/timing"
)

// Result is the JSON printed by `dragon bench engine`.
type Result struct {
	Model     string             `json:"model"`
	Threads   int                `json:"threads"`
	CtxTokens int                `json:"ctx_tokens"`
	Reps      int                `json:"reps"`
	DecodeMS  float64            `json:"decode_ms"`
	VerifyMS  map[string]float64 `json:"verify_ms"`
	// PromptMS is VerifyMS's passes with the logits of the last row only:
	// the work llama-bench's -p k -d CtxTokens times. Verification needs
	// every row's (a 576 × 49,152 output product per row for SmolLM2).
	PromptMS    map[string]float64 `json:"prompt_ms"`
	MultiseqMS  map[string]float64 `json:"multiseq_ms"`
	PrefillTokS float64            `json:"prefill_tok_s"`
	// Ratios the targets are stated in.
	Verify16OverDecode  float64 `json:"verify16_over_decode"`
	Multiseq8OverMulti1 float64 `json:"multiseq8_over_multiseq1"`
	DecodeOverheadMS    float64 `json:"decode_overhead_ms"`
	DecodeOverheadShare float64 `json:"decode_overhead_share"`
}

// Options of a run.
type Options struct {
	Threads   int
	CtxTokens int // context already held when decoding (default 256)
	Reps      int // measured repetitions per figure (median reported)
	Unified   bool
	// InsideDecode, when set, reports how long the last Decode spent inside
	// llama_decode, so the bench can tell what our wrapper costs around it.
	InsideDecode func(c engine.Context) time.Duration
}

// VerifySizes and MultiseqSizes are the keys of the result maps.
var (
	VerifySizes   = []int{1, 2, 4, 8, 16}
	MultiseqSizes = []int{1, 2, 4, 8}
)

// Run measures m.
func Run(ctx context.Context, m engine.Model, opts Options) (*Result, error) {
	if opts.CtxTokens <= 0 {
		opts.CtxTokens = 256
	}
	if opts.Reps <= 0 {
		opts.Reps = 20
	}
	prompt, err := filler(m, opts.CtxTokens)
	if err != nil {
		return nil, err
	}
	res := &Result{
		Model: m.Info().Name, Threads: opts.Threads, CtxTokens: opts.CtxTokens, Reps: opts.Reps,
		VerifyMS: map[string]float64{}, PromptMS: map[string]float64{}, MultiseqMS: map[string]float64{},
	}
	maxSeqs := MultiseqSizes[len(MultiseqSizes)-1]
	c, err := m.NewContext(engine.ContextOptions{
		CtxPerSeq: opts.CtxTokens + 64, MaxSeqs: maxSeqs, BatchSize: opts.CtxTokens, Threads: opts.Threads, Unified: opts.Unified,
	})
	if err != nil {
		return nil, err
	}
	defer c.Close()

	// Prefill throughput: the whole prompt into an empty sequence.
	var b *engine.Batch
	prefill, err := median(opts.Reps/4+1, func() (time.Duration, error) {
		if err := c.Truncate(0, 0); err != nil {
			return 0, err
		}
		start := time.Now()
		b, err = engine.Prefill(ctx, c, 0, prompt, b)
		return time.Since(start), err
	})
	if err != nil {
		return nil, fmt.Errorf("prefill: %w", err)
	}
	res.PrefillTokS = float64(len(prompt)) / (prefill / 1000)

	// The other sequences hold the same context.
	for s := 1; s < maxSeqs; s++ {
		if err := c.CopySeq(0, s, 0, len(prompt)); err != nil {
			return nil, err
		}
	}
	next := prompt[:16]
	pos := len(prompt)
	for _, k := range VerifySizes {
		for _, every := range []bool{true, false} {
			v, err := median(opts.Reps, func() (time.Duration, error) {
				b.Reset()
				for j := range k {
					b.Add(next[j], pos+j, every || j == k-1, 0)
				}
				return timed(ctx, c, b, func() error { return c.Truncate(0, pos) })
			})
			if err != nil {
				return nil, fmt.Errorf("verify %d (logits of every row: %v): %w", k, every, err)
			}
			if every {
				res.VerifyMS[strconv.Itoa(k)] = v
			} else {
				res.PromptMS[strconv.Itoa(k)] = v
			}
		}
	}
	res.DecodeMS = res.VerifyMS["1"]
	for _, k := range MultiseqSizes {
		v, err := median(opts.Reps, func() (time.Duration, error) {
			b.Reset()
			for s := range k {
				b.Add(next[s], pos, true, s)
			}
			return timed(ctx, c, b, func() error { return truncateSeqs(c, k, pos) })
		})
		if err != nil {
			return nil, fmt.Errorf("multiseq %d: %w", k, err)
		}
		res.MultiseqMS[strconv.Itoa(k)] = v
	}
	res.Verify16OverDecode = res.VerifyMS["16"] / res.DecodeMS
	res.Multiseq8OverMulti1 = res.MultiseqMS["8"] / res.MultiseqMS["1"]
	if opts.InsideDecode != nil {
		// One decode step as the decoder runs it: Decode, then copy the row.
		var outs, totals []float64
		var logits []float32
		for range opts.Reps {
			b.Reset()
			b.Add(next[0], pos, true, 0)
			start := time.Now()
			if err := c.Decode(ctx, b); err != nil {
				return nil, err
			}
			if logits, err = c.Logits(0, logits); err != nil {
				return nil, err
			}
			total := time.Since(start)
			outs = append(outs, timing.MS(total-opts.InsideDecode(c)))
			totals = append(totals, timing.MS(total))
			if err := c.Truncate(0, pos); err != nil {
				return nil, err
			}
		}
		res.DecodeOverheadMS = timing.Median(outs)
		res.DecodeOverheadShare = timing.Median(outs) / timing.Median(totals)
	}
	return res, nil
}

// filler is n tokens of ordinary English text.
func filler(m engine.Model, n int) ([]engine.Token, error) {
	const text = "The committee met on Tuesday to review the annual budget. Members discussed the cost of " +
		"maintaining roads, schools and parks, and agreed that the city should publish its accounts every " +
		"quarter so that residents can follow how their taxes are spent. "
	var toks []engine.Token
	for len(toks) < n {
		t, err := m.Tokenize(text, false, false)
		if err != nil {
			return nil, err
		}
		toks = append(toks, t...)
	}
	return toks[:n], nil
}

// median runs f reps times after one warm-up and returns the median of the
// durations it reports, in ms.
func median(reps int, f func() (time.Duration, error)) (float64, error) {
	if _, err := f(); err != nil {
		return 0, err
	}
	ts := make([]float64, 0, reps)
	for range reps {
		d, err := f()
		if err != nil {
			return 0, err
		}
		ts = append(ts, timing.MS(d))
	}
	return timing.Median(ts), nil
}

// timed measures decode alone; undo (rollback to the measured state) is not
// counted.
func timed(ctx context.Context, c engine.Context, b *engine.Batch, undo func() error) (time.Duration, error) {
	start := time.Now()
	if err := c.Decode(ctx, b); err != nil {
		return 0, err
	}
	d := time.Since(start)
	return d, undo()
}

// truncateSeqs cuts sequences 0..n-1 back to pos positions.
func truncateSeqs(c engine.Context, n, pos int) error {
	for s := range n {
		if err := c.Truncate(s, pos); err != nil {
			return err
		}
	}
	return nil
}

// Repeat decodes passes of rows tokens of each of seqs sequences (all rows
// asking for logits, as verification and multi-passage decoding do) at
// CtxTokens of context, over and over for about dur, and returns the mean
// ms per pass. It exists for an outside profiler: `perf record -g dragon
// bench engine --only-rows 2` shows which kernels a pass of that many rows
// runs, without the other figures' passes mixed in.
func Repeat(ctx context.Context, m engine.Model, opts Options, rows, seqs int, dur time.Duration) (float64, error) {
	if opts.CtxTokens <= 0 {
		opts.CtxTokens = 256
	}
	if rows < 1 || rows > opts.CtxTokens {
		return 0, fmt.Errorf("%w: %d rows per pass (want 1..%d)", engine.ErrInvalidInput, rows, opts.CtxTokens)
	}
	if seqs < 1 {
		return 0, fmt.Errorf("%w: %d sequences (want at least 1)", engine.ErrInvalidInput, seqs)
	}
	prompt, err := filler(m, opts.CtxTokens)
	if err != nil {
		return 0, err
	}
	c, err := m.NewContext(engine.ContextOptions{
		CtxPerSeq: opts.CtxTokens + rows, MaxSeqs: seqs, BatchSize: max(opts.CtxTokens, rows*seqs), Threads: opts.Threads, Unified: opts.Unified,
	})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	b, err := engine.Prefill(ctx, c, 0, prompt, nil)
	if err != nil {
		return 0, fmt.Errorf("prefill: %w", err)
	}
	pos := len(prompt)
	for s := 1; s < seqs; s++ {
		if err := c.CopySeq(0, s, 0, pos); err != nil {
			return 0, err
		}
	}
	var spent time.Duration
	passes := 0
	for passes == 0 || spent < dur {
		b.Reset()
		for s := range seqs {
			for j := range rows {
				b.Add(prompt[j], pos+j, true, s)
			}
		}
		d, err := timed(ctx, c, b, func() error { return truncateSeqs(c, seqs, pos) })
		if err != nil {
			return 0, err
		}
		spent += d
		passes++
	}
	return timing.MS(spent) / float64(passes), nil
}
