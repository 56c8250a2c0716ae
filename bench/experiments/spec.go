package experiments

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/bench/specbench"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/specdec"
)

// SpecOptions configure E5, the local speculative-decoding ablation.
type SpecOptions struct {
	Model   engine.Model
	Threads int
	// Corpus holds the two demo corpora (sotu/, mail/) the held-out prompts
	// are drawn from (promptset.HeldOut).
	Corpus    string
	Prompts   int
	MaxTokens int
	Repeats   int
	// FollowUps asks each held-out prompt's follow-up right after it
	// (promptset.WithFollowUps): Prompts originals, as many follow-ups.
	FollowUps bool
	// CostModelOnly leaves out the rows that verify every draft whole.
	CostModelOnly bool
	// HistoryTokens bounds the history row's store of earlier answers.
	HistoryTokens int
	Log           func(format string, args ...any)
}

// DefaultSpecHistoryTokens is E5's history store: the device's
// --history-tokens default would hold every answer of the prompt set too.
const DefaultSpecHistoryTokens = 4096

// SpecResults are E5: one row per configuration, plain decoding first.
// Counts are totals over the prompts (one pass over them); tok/s and
// speedup are medians over the repeats.
type SpecResults struct {
	Meta
	Set       string `json:"prompt_set"`
	Prompts   int    `json:"prompts"`
	Passages  int    `json:"passages"`
	MaxTokens int    `json:"max_tokens"`
	Repeats   int    `json:"repeats"`
	// Model is the model's file name (empty: the default model, as runs
	// before it said).
	Model string `json:"model,omitempty"`
	// FollowUps: every other prompt is the one before it asked again in
	// other words (SpecOptions.FollowUps).
	FollowUps bool                `json:"follow_ups,omitempty"`
	Rows      []specbench.Counted `json:"rows"`
	// Defaults is what specdec.DefaultOptions turned on when it ran.
	Defaults string `json:"defaults"`
}

// Spec measures E5: greedy answers to held-out RAG prompts (one passage
// each), plain and with each configuration of local speculation in turn.
func Spec(ctx context.Context, o SpecOptions) (*SpecResults, error) {
	if o.Model == nil || o.Prompts < 1 || o.MaxTokens < 2 {
		return nil, errors.New("experiments: E5 needs a model, prompts and ≥ 2 tokens")
	}
	ps, err := promptset.HeldOut(o.Corpus, o.Prompts, 1)
	if err != nil {
		return nil, err
	}
	set := "held-out (promptset.HeldOut)"
	if o.FollowUps {
		if ps, err = promptset.WithFollowUps(ps); err != nil {
			return nil, err
		}
		set = "held-out (promptset.HeldOut), each followed by its question in other words over the same passage (promptset.WithFollowUps),"
	}
	def := specdec.DefaultOptions()
	cfgs := append(specbench.AblationConfigs(def), specbench.TreeAndHistoryConfigs(def, cmp.Or(o.HistoryTokens, DefaultSpecHistoryTokens))...)
	if o.CostModelOnly {
		cfgs = specbench.CostModelOnly(cfgs)
	}
	rows, err := specbench.Ablate(ctx, o.Model, specbench.AblateOptions{
		Threads: o.Threads, MaxTokens: o.MaxTokens, Prompts: ps, Configs: cfgs,
		Repeats: o.Repeats, MaxPassages: 1, Log: o.Log,
	})
	if err != nil {
		return nil, err
	}
	return &SpecResults{
		Set: set, Prompts: len(ps), Passages: 1, MaxTokens: o.MaxTokens, Repeats: max(o.Repeats, 1),
		Model: filepath.Base(o.Model.Info().Path), FollowUps: o.FollowUps,
		Rows: rows, Defaults: fmt.Sprintf("calibration %v, reuse %v", def.Calibration, def.Reuse),
	}, nil
}

// specFamilyName is the CSV and plot name of one model's E5 on the family.
func specFamilyName(r *SpecResults) string {
	return "e5-" + strings.TrimSuffix(r.Model, filepath.Ext(r.Model))
}

// followUpRate is tokens per pass over a row's follow-up prompts (every
// other prompt, from the second), or 0 without them.
func followUpRate(c specbench.Counted) float64 {
	var tokens, passes int
	for i := 1; i < len(c.PerPrompt); i += 2 {
		tokens += c.PerPrompt[i].Tokens
		passes += c.PerPrompt[i].Passes
	}
	if passes == 0 {
		return 0
	}
	return float64(tokens) / float64(passes)
}

var e5Header = []string{"config", "drafts", "drafted_tokens", "accepted_tokens", "mean_accepted_per_draft", "tokens_per_pass", "tok_s", "speedup"}

func writeSpec(out, name string, r *SpecResults) error {
	var rows [][]string
	for _, c := range r.Rows {
		rows = append(rows, []string{
			c.Config, strconv.Itoa(c.Drafts), strconv.Itoa(c.DraftedTokens), strconv.Itoa(c.AcceptedTokens),
			f3(c.MeanAccepted), f3(c.TokensPerPass), num(c.TokS), f3(c.Speedup),
		})
	}
	if err := writeCSV(filepath.Join(out, name+".csv"), e5Header, rows); err != nil {
		return err
	}
	if err := plotSpec(filepath.Join(out, name+".png"), r); err != nil {
		return fmt.Errorf("experiments: plot %s.png: %w", name, err)
	}
	return nil
}

func f3(x float64) string { return strconv.FormatFloat(x, 'f', 3, 64) }

// plotSpec draws tokens per pass and speedup of each configuration as
// grouped bars.
func plotSpec(path string, r *SpecResults) error {
	p := plot.New()
	p.Title.Text = "E5: local speculation, held-out prompts"
	if r.Model != "" {
		p.Title.Text = "E5: " + r.Model
	}
	p.Y.Label.Text = "tokens per pass / speedup"
	p.Legend.Top = true
	var names []string
	var tpp, speed plotter.Values
	for i, c := range r.Rows {
		names = append(names, strconv.Itoa(i+1))
		tpp = append(tpp, c.TokensPerPass)
		speed = append(speed, c.Speedup)
	}
	w := vg.Points(12)
	for i, s := range []struct {
		name string
		v    plotter.Values
	}{{"tokens per forward pass", tpp}, {"speedup (tok/s vs plain)", speed}} {
		b, err := plotter.NewBarChart(s.v, w)
		if err != nil {
			return err
		}
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		b.Offset = w * vg.Length(2*i-1) / 2
		p.Add(b)
		p.Legend.Add(s.name, b)
	}
	p.NominalX(names...)
	p.X.Label.Text = "configuration (row of the table)"
	return p.Save(6*vg.Inch, 4*vg.Inch, path)
}

// specReport is EXPERIMENTS.md's E5 section.
func specReport(pr func(string, ...any), r *SpecResults) {
	pr("## E5: local speculative decoding ablation (sd.npu Table 4)\n\n![E5](experiments/e5.png)\n\n")
	pr("Measured with `%s` on %s, %s (%.0f minutes). ", r.Command, r.Date, r.Machine, r.Minutes)
	pr("%d %s RAG prompts (questions and documents no benchmark or default was tuned on), %d passage each, greedy, %d tokens; ",
		r.Prompts, r.Set, r.Passages, r.MaxTokens)
	pr("plain decoding and each configuration run prompt by prompt in turn. Counts are totals over the prompts; tok/s (decode after the first token) ")
	pr("and speedup (against plain decoding beside it) are medians over %d repeats. The defaults at the time: %s.\n\n", r.Repeats, r.Defaults)

	row := func(name string) (specbench.Counted, bool) {
		for _, c := range r.Rows {
			if c.Config == name {
				return c, true
			}
		}
		return specbench.Counted{}, false
	}
	pr("**Why the mean accepted tokens per draft fell.** Measured before the fix (commit da87215, the same harness and prompts): ")
	pr("calibrated successors outvoted the passage's own next token (weight 4·p with p normalized over the top 4 beats one occurrence of the text whenever p > 0.25), ")
	pr("so wherever the small model's guess at a passage position, made before it reads the next token, differed from the text, the draft left the text the answer was copying: ")
	pr("the 331 drafts calibration changed got 179 tokens accepted where the lookup drafts they displaced would have got 511 (mean per draft 0.82 → 0.63, tokens per pass 1.456 → 1.383). ")
	pr("Draft reuse offered a held segment at whatever position the answer had reached until its budget ran out: 152 of its 157 drafts came at steps where nothing else was proposed, and they got 7 of 336 tokens accepted, ")
	pr("a denominator effect (mean 0.63 → 0.46) that buys a wider pass each time. Now the text's continuation always comes first (calibration ranks the text's continuations and continues where the text does not) ")
	pr("and a held segment is offered only where it fits (right after the correction, or after the draft token it followed)")
	if c, ok := row("+calibration"); ok {
		if d, ok := c.Displaced["calibrated"]; ok {
			pr(": in this run the %d drafts calibration changed got %d tokens accepted against %d for the lookup drafts they displaced (better %d times, worse %d)",
				d.Drafts, d.Accepted, d.AltAccepted, d.Better, d.Worse)
		}
	}
	if c, ok := row("+reuse"); ok {
		if o, ok := c.ByOrigin["reuse"]; ok {
			d := c.Displaced["reuse"]
			pr("; reused segments: %d drafts, %d of %d tokens accepted, %d of the drafts where nothing else was proposed", o.Drafts, o.AcceptedTokens, o.DraftedTokens, d.AltEmpty)
		}
	}
	pr(".\n\n")
	lk, ok1 := row("+lookup")
	cal, ok2 := row("+calibration")
	ru, ok3 := row("+reuse")
	cl, ok4 := row("lookup, cost model")
	cc, ok5 := row("lookup+calibration, cost model")
	ca, ok6 := row("lookup+calibration+reuse, cost model")
	if ok1 && ok2 && ok3 && ok4 && ok5 && ok6 {
		pr("**What pays.** With every draft verified, tokens per forward pass go %.3f (+lookup) → %.3f (+calibration) → %.3f (+reuse), at %.2f, %.2f and %.2f of plain decoding's tok/s. ",
			lk.TokensPerPass, cal.TokensPerPass, ru.TokensPerPass, lk.Speedup, cal.Speedup, ru.Speedup)
		pr("Under the cost model, which drafts only where it expects a gain, they give %.3f, %.3f and %.3f tokens per pass and speedups of %.2f, %.2f and %.2f, ",
			cl.TokensPerPass, cc.TokensPerPass, ca.TokensPerPass, cl.Speedup, cc.Speedup, ca.Speedup)
		pr("while calibration's prefill, which asks for the logits of every prompt row, takes %.0f ms against %.0f (medians). ", cc.PrefillMS, cl.PrefillMS)
		pr("On the 2-core VM of 2026-11-23 that is why specdec.DefaultOptions leaves both off (Options.Calibration and Options.Reuse turn them on): ")
		pr("calibration, fixed, makes better drafts, but under the cost model it adds little next to its prefill; reuse adds nothing.\n\n")
	}

	specTable(pr, r)
	pr("\nRows: plain decoding; +lookup, +calibration and +reuse each add one technique and verify every draft whole; ")
	pr("the cost model's rows choose whether and how far to draft, the trees' also how wide. Identical greedy answers to plain decoding:")
	identical(pr, r)
	pr(" (`e5.csv`: the same counts; the plot's bars are numbered by row, 1 = plain.)\n\n")
}

// specTable is E5's table of rows.
func specTable(pr func(string, ...any), r *SpecResults) {
	pr("| config | drafts | drafted tokens | accepted tokens | mean accepted per draft | tokens per pass | tokens per pass, follow-ups | tok/s | speedup | prefill ms | drafts by origin (accepted/drafted tokens) |\n")
	pr("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range r.Rows {
		var origins []string
		for _, o := range []string{"lookup", "calibrated", "reuse"} {
			if b, ok := c.ByOrigin[o]; ok {
				origins = append(origins, fmt.Sprintf("%s %d (%d/%d)", o, b.Drafts, b.AcceptedTokens, b.DraftedTokens))
			}
		}
		follow := "–"
		if r.FollowUps {
			follow = f3(followUpRate(c))
		}
		pr("| %s | %d | %d | %d | %.2f | %.3f | %s | %.1f | %.2f | %.0f | %s |\n", c.Config, c.Drafts, c.DraftedTokens, c.AcceptedTokens,
			c.MeanAccepted, c.TokensPerPass, follow, c.TokS, c.Speedup, c.PrefillMS, strings.Join(origins, ", "))
	}
}

func identical(pr func(string, ...any), r *SpecResults) {
	for _, c := range r.Rows[1:] {
		pr(" %s %d/%d;", c.Config, c.Identical, c.Prompts)
	}
}

// specFamilyReport is E5 on DRAGON's model family: one table per model.
func specFamilyReport(pr func(string, ...any), rs []*SpecResults) {
	pr("## E5 on the Qwen pair, with trees and drafts from earlier answers\n\n")
	pr("The ablation again, on each model of DRAGON's family that the daemons run (the device's and the cloud's), with the configurations the cost model drafts under, ")
	pr("token trees (Lever's, `specdec.DefaultTreeBudget` nodes at most) and drafts from a store of the earlier answers (SAM's history, as `dragon device --history-tokens` keeps it). ")
	pr("The prompts are held-out ones, each followed by its question in other words over the same passage, so that the history has an earlier answer to draft from; ")
	pr("*tokens per pass, follow-ups* counts the follow-ups alone (the issue's target: history ≥ 1.15× lookup's).\n\n")
	for _, r := range rs {
		name := specFamilyName(r)
		pr("### %s\n\n![%s](experiments/%s.png)\n\n", r.Model, name, name)
		pr("Measured with `%s` on %s, %s (%.0f minutes). %d prompts: %d %s %d passage each, greedy, %d tokens; ",
			r.Command, r.Date, r.Machine, r.Minutes, r.Prompts, r.Prompts/2, r.Set, r.Passages, r.MaxTokens)
		pr("plain decoding and each configuration run prompt by prompt in turn; tok/s and speedup are medians over %d repeats.\n\n", r.Repeats)
		specTable(pr, r)
		pr("\nIdentical greedy answers to plain decoding:")
		identical(pr, r)
		pr(" (`%s.csv`).\n\n", name)
		var lookup, hist, trees specbench.Counted
		for _, c := range r.Rows {
			switch c.Config {
			case "lookup, cost model":
				lookup = c
			case "lookup+history, cost model":
				hist = c
			case "lookup trees, cost model":
				trees = c
			}
		}
		if l := followUpRate(lookup); l > 0 {
			pr("On the follow-ups, drafts from earlier answers give %.3f tokens per pass against lookup's %.3f (%.2f×); token trees give %.3f over all prompts against %.3f, at a speedup of %.2f against %.2f.\n\n",
				followUpRate(hist), l, followUpRate(hist)/l, trees.TokensPerPass, lookup.TokensPerPass, trees.Speedup, lookup.Speedup)
		}
	}
}
