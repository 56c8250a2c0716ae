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

// Config is one decoder configuration of an ablation.
type Config struct {
	Name string
	Spec specdec.Options
	// NoCost verifies every draft whole (decoder.Options.NoCostModel).
	NoCost bool
	// HistoryTokens, when positive, gives the decoder a store of that many
	// tokens of its earlier answers over the prompt set, in order, to
	// draft from (decoder.Options.History; empty at each repeat's start).
	HistoryTokens int
	Note          string
}

// AblationConfigs are the linear rows of sd.npu's Table 4 style ablation,
// each adding one technique to the one before, then the cost model over
// all of them and over lookup alone. base supplies everything else
// (MaxDraft, ReuseBudget, the calibration shape).
func AblationConfigs(base specdec.Options) []Config {
	lookup := base
	lookup.Enabled, lookup.TreeBudget = true, 1
	lookup.Calibration, lookup.Reuse = false, false
	calib := lookup
	calib.Calibration = true
	reuse := calib
	reuse.Reuse = true
	return []Config{
		{Name: "+lookup", Spec: lookup, NoCost: true, Note: "suffix-automaton drafts, every draft verified whole"},
		{Name: "+calibration", Spec: calib, NoCost: true, Note: "every draft verified whole"},
		{Name: "+reuse", Spec: reuse, NoCost: true, Note: "every draft verified whole"},
		{Name: "lookup, cost model", Spec: lookup, Note: "the cost model chooses whether and how far to draft"},
		{Name: "lookup+calibration, cost model", Spec: calib},
		{Name: "lookup+calibration+reuse, cost model", Spec: reuse},
	}
}

// TreeAndHistoryConfigs are the rows beyond sd.npu's linear ones, under
// the cost model: token trees of at most specdec.DefaultTreeBudget nodes
// (Lever's) and lookup drafting from earlier answers too (SAM's history,
// historyTokens of them), each over lookup alone.
func TreeAndHistoryConfigs(base specdec.Options, historyTokens int) []Config {
	lookup := base
	lookup.Enabled, lookup.TreeBudget = true, 1
	lookup.Calibration, lookup.Reuse = false, false
	trees := lookup
	trees.TreeBudget = specdec.DefaultTreeBudget
	return []Config{
		{Name: "lookup trees, cost model", Spec: trees, Note: "token trees the cost model grows"},
		{Name: "lookup+history, cost model", Spec: lookup, HistoryTokens: historyTokens, Note: "drafts from the earlier answers too"},
	}
}

// CostModelOnly keeps the configurations the cost model drafts under, as
// the daemons run them.
func CostModelOnly(cs []Config) []Config {
	var out []Config
	for _, c := range cs {
		if !c.NoCost {
			out = append(out, c)
		}
	}
	return out
}

// AblateOptions are a run of Ablate.
type AblateOptions struct {
	Threads   int
	MaxTokens int
	Prompts   []promptset.Prompt
	Configs   []Config
	// Repeats of the whole set (≥ 1): tok/s and speedup are medians over
	// them, counts are those of the first (every repeat starts from fresh
	// decoders, so counts repeat exactly unless the cost model decides).
	Repeats int
	// MaxPassages of each decoder (default 4).
	MaxPassages int
	Log         func(format string, args ...any)
}

// Counted is one configuration's row: counts are totals over the prompt
// set (first repeat), tok/s and speedup medians over the repeats.
type Counted struct {
	Config string `json:"config"`
	Note   string `json:"note,omitempty"`
	// Tokens are the tokens emitted after each answer's first, Passes the
	// forward passes after the prefill.
	Tokens int `json:"tokens"`
	Passes int `json:"passes"`
	// Drafts are the verified drafts, DraftedTokens their tokens,
	// AcceptedTokens the draft tokens verification accepted.
	Drafts         int `json:"drafts"`
	DraftedTokens  int `json:"drafted_tokens"`
	AcceptedTokens int `json:"accepted_tokens"`
	// NoDraftSteps are passes that verified no draft (nothing to propose,
	// or the cost model declined).
	NoDraftSteps int `json:"no_draft_steps"`
	// ByOrigin splits the verified drafts by where they came from
	// (specdec.Origin: lookup, calibrated, reuse).
	ByOrigin map[string]OriginCount `json:"by_origin"`
	// Displaced judges, for drafts that calibration or reuse changed, the
	// draft they displaced at the same position (the lookup-only draft for
	// calibrated ones, the index's draft for reused ones) against the
	// answer: greedy decoding makes the answer the same in every
	// configuration, so a draft's accepted prefix is its common prefix with
	// the answer from its position. The displaced draft is judged whole, as
	// verifying every draft whole (NoCost) would have; under the cost model
	// it may have been cut shorter.
	Displaced map[string]Displacement `json:"displaced"`
	// MeanAccepted is accepted tokens per verified draft, TokensPerPass
	// tokens emitted per forward pass after each answer's first token.
	MeanAccepted  float64 `json:"mean_accepted"`
	TokensPerPass float64 `json:"tokens_per_pass"`
	// Identical is how many answers equal plain decoding's, of Prompts.
	Identical int `json:"identical"`
	Prompts   int `json:"prompts"`
	// TokS is decode throughput after the first token (all prompts of a
	// repeat pooled), Speedup against plain decoding interleaved with it
	// prompt by prompt; medians over repeats.
	TokS      float64 `json:"tok_s"`
	Speedup   float64 `json:"speedup"`
	PrefillMS float64 `json:"prefill_ms"` // median over prompts, first repeat
	// PerPrompt are each prompt's tokens and passes as Tokens and Passes
	// count them, in the prompts' order (first repeat): a prompt set of
	// originals and their follow-ups is judged on the follow-ups too.
	PerPrompt []PromptCount `json:"per_prompt"`
}

// PromptCount is one prompt's tokens after the first and passes after
// the prefill.
type PromptCount struct {
	Tokens int `json:"tokens"`
	Passes int `json:"passes"`
}

// OriginCount counts the verified drafts of one origin.
type OriginCount struct {
	Drafts         int `json:"drafts"`
	DraftedTokens  int `json:"drafted_tokens"`
	AcceptedTokens int `json:"accepted_tokens"`
}

// Displacement compares drafts of one origin with the drafts they
// displaced, judged against the answer at the same positions.
type Displacement struct {
	Drafts int `json:"drafts"`
	// Accepted is what the drafts themselves got, AltAccepted what the
	// displaced drafts would have got (both judged against the answer and
	// cut where it ends).
	Accepted    int `json:"accepted"`
	AltAccepted int `json:"alt_accepted"`
	// AltEmpty counts drafts at steps where the displaced draft was empty
	// (lookup alone proposed nothing there).
	AltEmpty int `json:"alt_empty"`
	// Better and Worse count drafts that got more, or fewer, accepted
	// tokens than the draft they displaced.
	Better int `json:"better"`
	Worse  int `json:"worse"`
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Plain is the name of the plain-decoding row Ablate puts first.
const Plain = "plain"

// Ablate runs plain decoding and every configuration on every prompt, one
// prompt at a time in turn (plain first), so that all of them see the
// same state of the machine; greedy, so the answers must agree. It
// returns the plain row first, then one per configuration.
func Ablate(ctx context.Context, m engine.Model, o AblateOptions) ([]Counted, error) {
	if o.Repeats < 1 {
		o.Repeats = 1
	}
	if o.MaxPassages < 1 {
		o.MaxPassages = 4
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	cfgs := append([]Config{{Name: Plain, Note: "no speculation"}}, o.Configs...)
	rows := make([]Counted, len(cfgs))
	toks := make([][]float64, len(cfgs)) // tok/s per repeat
	speed := make([][]float64, len(cfgs))
	for rep := range o.Repeats {
		runs, err := ablateOnce(ctx, m, o, cfgs, rep == 0)
		if err != nil {
			return nil, err
		}
		plainTokS := tokS(runs[0].runs)
		for i, c := range cfgs {
			t := tokS(runs[i].runs)
			toks[i] = append(toks[i], t)
			speed[i] = append(speed[i], t/plainTokS)
			if rep == 0 {
				rows[i] = runs[i].count(c, runs[0].runs)
			}
		}
		o.Log("spec ablation: repeat %d of %d done", rep+1, o.Repeats)
	}
	for i := range rows {
		rows[i].TokS = timing.Median(toks[i])
		rows[i].Speedup = timing.Median(speed[i])
	}
	return rows, nil
}

// traced is one configuration's runs over the prompt set with its steps.
type traced struct {
	runs   []run
	events [][]decoder.SpecEvent // per prompt
}

func ablateOnce(ctx context.Context, m engine.Model, o AblateOptions, cfgs []Config, first bool) ([]traced, error) {
	out := make([]traced, len(cfgs))
	decs := make([]*decoder.Decoder, len(cfgs))
	defer func() {
		for _, d := range decs {
			if d != nil {
				d.Close()
			}
		}
	}()
	for i, c := range cfgs {
		var hist *specdec.History
		if c.HistoryTokens > 0 {
			var err error
			if hist, err = specdec.NewHistory(c.HistoryTokens); err != nil {
				return nil, err
			}
		}
		var err error
		decs[i], err = decoder.New(m, decoder.Options{
			MaxPassages: o.MaxPassages, CtxPerSeq: 1024, Threads: o.Threads, Spec: c.Spec, NoCostModel: c.NoCost, History: hist,
			SpecTrace: func(e decoder.SpecEvent) {
				ev := &out[i].events[len(out[i].events)-1]
				*ev = append(*ev, e)
			},
		})
		if err != nil {
			return nil, err
		}
	}
	for pi, p := range o.Prompts {
		for i := range cfgs {
			out[i].events = append(out[i].events, nil)
			r, err := generateOne(ctx, decs[i], p, o.MaxTokens)
			if err != nil {
				return nil, err
			}
			out[i].runs = append(out[i].runs, r)
		}
		if first {
			o.Log("spec ablation: prompt %d of %d", pi+1, len(o.Prompts))
		}
	}
	return out, nil
}

// count totals one configuration's traced runs; plain are plain
// decoding's runs of the same prompts.
func (t traced) count(c Config, plain []run) Counted {
	row := Counted{Config: c.Name, Note: c.Note, Prompts: len(t.runs), ByOrigin: map[string]OriginCount{}, Displaced: map[string]Displacement{}}
	var st specdec.Stats
	for pi, r := range t.runs {
		row.Tokens += max(r.tokens-1, 0)
		row.Passes += r.steps
		row.PerPrompt = append(row.PerPrompt, PromptCount{Tokens: max(r.tokens-1, 0), Passes: r.steps})
		st.Add(r.stats)
		if slices.Equal(r.out, plain[pi].out) {
			row.Identical++
		}
		answer := plain[pi].out
		for _, e := range t.events[pi] {
			if !e.Verified {
				row.NoDraftSteps++
				continue
			}
			if e.Draft.Origin != specdec.OriginCalibrated && e.Draft.Origin != specdec.OriginReuse {
				continue
			}
			d := row.Displaced[e.Draft.Origin.String()]
			d.Drafts++
			got := judge(e.Draft.Tokens, answer, e.Pos)
			alt := judge(e.Draft.Alt, answer, e.Pos)
			if len(e.Draft.Alt) == 0 {
				d.AltEmpty++
			}
			d.Accepted += got
			d.AltAccepted += alt
			switch {
			case got > alt:
				d.Better++
			case got < alt:
				d.Worse++
			}
			row.Displaced[e.Draft.Origin.String()] = d
		}
	}
	row.Drafts, row.DraftedTokens, row.AcceptedTokens = int(st.Drafts), int(st.DraftedTokens), int(st.AcceptedTokens)
	for i, b := range st.ByOrigin {
		if b.Drafts > 0 {
			row.ByOrigin[specdec.Origin(i).String()] = OriginCount{Drafts: int(b.Drafts), DraftedTokens: int(b.DraftedTokens), AcceptedTokens: int(b.AcceptedTokens)}
		}
	}
	row.MeanAccepted, row.TokensPerPass = ratio(row.AcceptedTokens, row.Drafts), ratio(row.Tokens, row.Passes)
	row.PrefillMS = medianPrefill(t.runs)
	return row
}

// judge is how many tokens of draft verification would accept at answer
// position pos: its common prefix with the answer from there.
func judge(draft, answer []engine.Token, pos int) int {
	n := 0
	for n < len(draft) && pos+n < len(answer) && draft[n] == answer[pos+n] {
		n++
	}
	return n
}

// String is a one-line summary of a row.
func (c Counted) String() string {
	return fmt.Sprintf("%s: %d drafts, %d drafted, %d accepted (%.2f/draft), %d tokens in %d passes (%.3f/pass), %.1f tok/s, ×%.2f",
		c.Config, c.Drafts, c.DraftedTokens, c.AcceptedTokens, c.MeanAccepted, c.Tokens, c.Passes, c.TokensPerPass, c.TokS, c.Speedup)
}
