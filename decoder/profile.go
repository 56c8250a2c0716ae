package decoder

import (
	"context"
	"fmt"
	"time"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/internal/timing"
	"github.com/dragon-rag/dragon/sampling"
	"github.com/dragon-rag/dragon/specdec"
)

// profileSizes are the pass sizes (batch rows) the verification table is
// measured at; the cost model interpolates between them.
var profileSizes = []int{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128}

// profileContext is the context a profiled pass decodes after: about a
// passage and a question (at most half of a small context).
const profileContext = 96

// ProfileVerify measures the verification table the cost model starts from
// (Lever's profile of t_verify by batch rows): for each size up to maxRows,
// the best of reps forward passes of that many rows of sequence 0 of c,
// after profileContext tokens of context, all rows asking for logits, as
// far as the context has room. c must hold nothing in sequence 0; it is
// left that way.
//
// The table matters because costs learned online only cover the sizes the
// cost model happens to try. On a CPU where a second row costs as much as a
// whole decode but later rows a third of that (docs/BENCHMARKS.md), a table
// extrapolated from one- and two-row passes would price long drafts at
// twice their cost and never try them.
func ProfileVerify(ctx context.Context, c engine.Context, maxRows, reps int) (*specdec.VerifyTable, error) {
	opts := c.Options()
	held := min(profileContext, opts.CtxPerSeq/2) // small contexts: half for the context
	limit := min(maxRows, opts.CtxPerSeq-held)
	if opts.BatchSize > 0 {
		limit = min(limit, opts.BatchSize)
	}
	if held < 1 || limit < 1 || reps < 1 {
		return nil, fmt.Errorf("decoder: %w: profile up to %d rows (context %d) with %d repetitions", engine.ErrInvalidInput, maxRows, opts.CtxPerSeq, reps)
	}
	vocab := c.VocabSize()
	tok := func(i int) engine.Token { return engine.Token((i*7919 + 11) % vocab) }
	filler := make([]engine.Token, held)
	for i := range filler {
		filler[i] = tok(i)
	}
	b, err := engine.Prefill(ctx, c, 0, filler, nil)
	if err != nil {
		return nil, fmt.Errorf("decoder: profile: %w", err)
	}
	defer c.Truncate(0, 0)
	table := &specdec.VerifyTable{}
	for _, rows := range profileSizes {
		if rows > limit {
			break
		}
		best := time.Duration(-1)
		for range reps {
			b.Reset()
			for j := range rows {
				b.Add(tok(held+j), held+j, true, 0)
			}
			start := time.Now()
			if err := c.Decode(ctx, b); err != nil {
				return nil, fmt.Errorf("decoder: profile %d rows: %w", rows, err)
			}
			if d := time.Since(start); best < 0 || d < best {
				best = d
			}
			if err := c.Truncate(0, held); err != nil {
				return nil, fmt.Errorf("decoder: profile: %w", err)
			}
		}
		table.Set(rows, timing.MS(best))
	}
	return table, nil
}

// ProfileDecode measures what one decoding step costs as the context grows
// (DRAGON §5.2's offline profile): d decodes after prompts, one sequence per
// prompt weighted alike, as a generation over that many passages would,
// for steps tokens (fewer if the context fills), repeated runs times. It
// returns each step's context length (the longest sequence) and its median
// time in milliseconds. The tokens decoded are the model's own greedy
// choices.
func ProfileDecode(ctx context.Context, d *Decoder, prompts []string, steps, runs int) (ctxLens, ms []float64, err error) {
	if steps < 2 || runs < 1 || len(prompts) == 0 {
		return nil, nil, fmt.Errorf("decoder: %w: profile %d steps, %d runs, %d prompts", engine.ErrInvalidInput, steps, runs, len(prompts))
	}
	times := make([][]float64, steps)
	lens := make([]float64, steps)
	n := steps
	for range runs {
		if err := d.BeginRaw(ctx, prompts, make([]float64, len(prompts))); err != nil {
			return nil, nil, fmt.Errorf("decoder: profile: %w", err)
		}
		for step := range steps {
			if d.Room() <= 0 {
				n = min(n, step)
				break
			}
			start := time.Now()
			mix, err := d.Next(ctx)
			if err != nil {
				return nil, nil, fmt.Errorf("decoder: profile: %w", err)
			}
			times[step] = append(times[step], timing.MS(time.Since(start)))
			lens[step] = float64(d.longestPrompt() + len(d.gen))
			d.Push(engine.Token(sampling.Argmax(mix)))
		}
	}
	for step := range n {
		ms = append(ms, timing.Median(times[step]))
	}
	return lens[:n], ms, nil
}
