// Package specbench measures local speculative decoding on the real model:
// tokens per second against plain decoding over a RAG prompt set, with 1
// and 4 passages, the acceptance figures, the cost model's error, the worst
// case where drafts fail, and an ablation in the style of sd.npu's Tables
// 3 and 4.
package specbench

import (
	"context"
	"fmt"
	"slices"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/internal/timing"
	"github.com/dragon-rag/dragon/specdec"
)

// Result is the JSON printed by `dragon bench spec`.
type Result struct {
	Prompts        int     `json:"prompts"`
	Threads        int     `json:"threads"`
	MaxTokens      int     `json:"max_tokens"`
	PlainTokS      float64 `json:"plain_tok_s"`
	SpecTokS       float64 `json:"spec_tok_s"`
	Speedup        float64 `json:"speedup"`
	Speedup4       float64 `json:"speedup_4"`
	AcceptanceRate float64 `json:"acceptance_rate"`
	MeanAccepted   float64 `json:"mean_accepted"`
	Identical      int     `json:"identical"`
	Identical4     int     `json:"identical_4"`
	CostModelMAPE  float64 `json:"cost_model_mape"`
	WorstCaseRatio float64 `json:"worst_case_ratio"`
	// Ablation rows are totals over the 1-passage prompts (Ablate).
	Ablation   []Counted `json:"ablation"`
	Mismatches []string  `json:"mismatches,omitempty"`
}

// Options of a run.
type Options struct {
	Threads   int
	MaxTokens int
	Prompts1  []promptset.Prompt // 1 passage each
	Prompts4  []promptset.Prompt // 4 passages each
	// Hard are prompts where context drafts are expected to fail.
	Hard []promptset.Prompt
}

type run struct {
	tokens    int
	steps     int
	ms        float64
	prefillMS float64
	stats     specdec.Stats
	out       []engine.Token
}

func generateOne(ctx context.Context, d *decoder.Decoder, p promptset.Prompt, maxTokens int) (run, error) {
	r, err := d.Generate(ctx, decoder.Request{Query: p.Query, Passages: p.Passages, MaxTokens: maxTokens}, nil)
	if err != nil {
		return run{}, fmt.Errorf("specbench: %q: %w", p.Query, err)
	}
	return run{tokens: len(r.Tokens), steps: r.Steps, ms: r.DecodeMS, prefillMS: r.PrefillMS, stats: r.Spec, out: r.Tokens}, nil
}

// sideBySide runs each prompt on a then b, so that both see the same
// machine state (these VMs drift by tens of percent over minutes).
func sideBySide(ctx context.Context, a, b *decoder.Decoder, ps []promptset.Prompt, maxTokens int) ([]run, []run, error) {
	var ra, rb []run
	for _, p := range ps {
		x, err := generateOne(ctx, a, p, maxTokens)
		if err != nil {
			return nil, nil, err
		}
		y, err := generateOne(ctx, b, p, maxTokens)
		if err != nil {
			return nil, nil, err
		}
		ra, rb = append(ra, x), append(rb, y)
	}
	return ra, rb, nil
}

// tokS is the aggregate decode throughput after the first token.
func tokS(rs []run) float64 {
	var n, ms float64
	for _, r := range rs {
		if r.tokens > 1 {
			n += float64(r.tokens - 1)
			ms += r.ms
		}
	}
	if ms == 0 {
		return 0
	}
	return n / (ms / 1000)
}

// tokensPerPass is tokens after the first per forward pass after prefill.
func tokensPerPass(rs []run) float64 {
	var n, passes int
	for _, r := range rs {
		n += max(r.tokens-1, 0)
		passes += r.steps
	}
	if passes == 0 {
		return 0
	}
	return float64(n) / float64(passes)
}

func sum(rs []run) specdec.Stats {
	var s specdec.Stats
	for _, r := range rs {
		s.Steps += r.stats.Steps
		s.Drafts += r.stats.Drafts
		s.DraftedTokens += r.stats.DraftedTokens
		s.AcceptedTokens += r.stats.AcceptedTokens
		s.ReusedDrafts += r.stats.ReusedDrafts
	}
	return s
}

func identical(a, b []run) (int, []int) {
	n := 0
	var bad []int
	for i := range a {
		if slices.Equal(a[i].out, b[i].out) {
			n++
		} else {
			bad = append(bad, i)
		}
	}
	return n, bad
}

// Run measures.
func Run(ctx context.Context, m engine.Model, opts Options) (*Result, error) {
	newDec := func(o specdec.Options, noCost bool) (*decoder.Decoder, error) {
		return decoder.New(m, decoder.Options{MaxPassages: 4, CtxPerSeq: 1024, Threads: opts.Threads, Spec: o, NoCostModel: noCost})
	}
	full := specdec.DefaultOptions()

	res := &Result{Prompts: len(opts.Prompts1), Threads: opts.Threads, MaxTokens: opts.MaxTokens}
	plainDec, err := newDec(specdec.Options{}, false)
	if err != nil {
		return nil, err
	}
	defer plainDec.Close()
	specDec, err := newDec(full, false)
	if err != nil {
		return nil, err
	}
	defer specDec.Close()

	plain1, spec1, err := sideBySide(ctx, plainDec, specDec, opts.Prompts1, opts.MaxTokens)
	if err != nil {
		return nil, err
	}
	res.PlainTokS, res.SpecTokS = tokS(plain1), tokS(spec1)
	res.Speedup = res.SpecTokS / res.PlainTokS
	var bad []int
	res.Identical, bad = identical(plain1, spec1)
	for _, i := range bad {
		res.Mismatches = append(res.Mismatches, fmt.Sprintf("1 passage, prompt %d: %q", i, opts.Prompts1[i].Query))
	}
	st := sum(spec1)
	if st.DraftedTokens > 0 {
		res.AcceptanceRate = float64(st.AcceptedTokens) / float64(st.DraftedTokens)
	}
	res.MeanAccepted = st.MeanAccepted()

	plain4, spec4, err := sideBySide(ctx, plainDec, specDec, opts.Prompts4, opts.MaxTokens)
	if err != nil {
		return nil, err
	}
	res.Speedup4 = tokS(spec4) / tokS(plain4)
	res.Identical4, bad = identical(plain4, spec4)
	for _, i := range bad {
		res.Mismatches = append(res.Mismatches, fmt.Sprintf("4 passages, prompt %d: %q", i, opts.Prompts4[i].Query))
	}
	res.CostModelMAPE = specDec.CostLog().MAPE()

	if len(opts.Hard) > 0 {
		hp, hs, err := sideBySide(ctx, plainDec, specDec, opts.Hard, opts.MaxTokens)
		if err != nil {
			return nil, err
		}
		res.WorstCaseRatio = tokS(hs) / tokS(hp)
	}

	// Ablation on the 1-passage set: each row adds one technique; plain
	// decoding runs beside them, prompt by prompt.
	cfgs := AblationConfigs(full)
	trees := cfgs[2].Spec // lookup + calibration + reuse
	trees.TreeBudget = specdec.DefaultTreeBudget
	cfgs = append(cfgs,
		Config{Name: "+tree", Spec: trees, NoCost: true, Note: "token trees of up to 16 nodes, grown as far as the candidates go (a KV stream a branch)"},
		Config{Name: "+tree, cost-model", Spec: trees, Note: "the cost model chooses whether and how large a tree to draft"},
		Config{Name: "default", Spec: full, Note: "specdec.DefaultOptions under the cost model"},
	)
	rows, err := Ablate(ctx, m, AblateOptions{Threads: opts.Threads, MaxTokens: opts.MaxTokens, Prompts: opts.Prompts1, Configs: cfgs, MaxPassages: 4})
	if err != nil {
		return nil, err
	}
	res.Ablation = rows[1:]
	return res, nil
}

func medianPrefill(rs []run) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = r.prefillMS
	}
	return timing.Median(v)
}
