package decoder

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/sampling"
	"github.com/dragon-rag/dragon/specdec"
)

// Request is one local generation.
type Request struct {
	Query     string
	Passages  []Passage
	Sampling  sampling.Params
	MaxTokens int
	Stop      []string
}

// Result summarizes a generation.
type Result struct {
	Text      string
	Tokens    []engine.Token
	Stopped   string  // "eog", "stop", "max_tokens" or "context"
	PrefillMS float64 // Begin
	TTFTMS    float64 // Begin + first token decided
	DecodeMS  float64 // after the first token
	Steps     int     // forward passes after the prefill
	Spec      specdec.Stats
}

// TokensPerSecond is the decode throughput after the first token.
func (r Result) TokensPerSecond() float64 {
	if r.DecodeMS <= 0 || len(r.Tokens) < 2 {
		return 0
	}
	return float64(len(r.Tokens)-1) / (r.DecodeMS / 1000)
}

// Generate runs a local generation: retrieval-conditioned decoding with
// sampling, accelerated by speculative decoding when Options.Spec is on.
// emit, when not nil, receives each decided token with the text it
// completes.
func (d *Decoder) Generate(ctx context.Context, req Request, emit func(tok engine.Token, text string) error) (Result, error) {
	var res Result
	if err := req.Sampling.Validate(); err != nil {
		return res, err
	}
	if req.MaxTokens <= 0 {
		req.MaxTokens = 256
	}
	specOn := d.opts.Spec.Enabled
	var calib func(int, [][]engine.TokenLogit) error
	if specOn {
		// The drafter's documents are this generation's prompts (passage +
		// query); calibration hangs the model's own top successors, read
		// from the prefill, off their positions.
		var err error
		if d.drafter, err = specdec.NewDrafter(d.opts.Spec, d.acc); err != nil {
			return res, err
		}
		if d.opts.Spec.Calibration {
			calib = d.calibrate
		}
	}
	start := time.Now()
	if err := d.Begin(ctx, req.Query, req.Passages, calib); err != nil {
		return res, err
	}
	if specOn {
		if calib == nil {
			for s := range d.prompts {
				d.drafter.AddDocument(d.prompts[s])
			}
		}
		d.drafter.StartAnswer(d.prompts[0])
		defer d.drafter.EndAnswer()
	}
	d.cost.Seqs = len(d.prompts)
	res.PrefillMS = since(start)

	detok := engine.NewDetokenizer(d.model)
	var text strings.Builder
	var probs []float32
	decodeStart := time.Time{}
	// decide appends tokens decided by a step; it reports whether the
	// generation is over.
	decide := func(toks []engine.Token) (bool, error) {
		for _, t := range toks {
			if d.model.IsEOG(t) {
				res.Stopped = "eog"
				return true, nil
			}
			piece := detok.Add(t)
			text.WriteString(piece)
			res.Tokens = append(res.Tokens, t)
			if len(res.Tokens) == 1 {
				res.TTFTMS = since(start)
				decodeStart = time.Now()
			}
			if emit != nil {
				if err := emit(t, piece); err != nil {
					return true, err
				}
			}
			if stop := matchStop(text.String(), req.Stop); stop >= 0 {
				res.Stopped = "stop"
				full := text.String()
				text.Reset()
				text.WriteString(full[:stop])
				detok.Flush() // held-back bytes come after the stop string
				return true, nil
			}
			if len(res.Tokens) >= req.MaxTokens {
				res.Stopped = "max_tokens"
				return true, nil
			}
			if d.opts.RescoreEvery > 0 && len(res.Tokens)%d.opts.RescoreEvery == 0 {
				if err := d.rescore(ctx, text.String()); err != nil {
					return true, err
				}
			}
		}
		return false, nil
	}
	greedyPlain := req.Sampling.Greedy() && (req.Sampling.RepeatPenalty == 0 || req.Sampling.RepeatPenalty == 1)
	// choose decides the token at answer position pos from the mixture
	// there, given the tokens before it: the argmax, or the inverse-CDF
	// sample of the processed distribution at the position's own uniform
	// (sampling.Params.Uniform). Plain and speculative decoding both decide
	// every position this way, so they emit the same answer for a seed.
	var scores []float32
	choose := func(mix []float32, pos int, history []engine.Token) engine.Token {
		if greedyPlain {
			return engine.Token(sampling.Argmax(mix))
		}
		scores = slices.Grow(scores[:0], len(mix))[:len(mix)]
		for i, p := range mix {
			scores[i] = float32(math.Log(float64(p)))
		}
		probs = req.Sampling.Dist(scores, history, probs)
		return sampling.DrawU(probs, req.Sampling.Uniform(pos))
	}
	room := func() int { return d.opts.CtxPerSeq - d.longestPrompt() - len(d.gen) - 1 }
	// While the cost model keeps drafts unverified, the shadow learns their
	// acceptance from what plain decoding emits, at no cost.
	var shadow specdec.Shadow

	for {
		if room() <= 0 {
			res.Stopped = "context"
			break
		}
		var draft specdec.Draft
		plan := specdec.Plan{}
		if specOn && d.branches > 1 {
			done, err := d.treeStep(ctx, &res, &shadow, choose, decide, room())
			if err != nil || done {
				res.Text = text.String() + detok.Flush()
				res.DecodeMS = sinceOr(decodeStart)
				return res, err
			}
			continue
		}
		if specOn {
			draft = d.drafter.Draft()
			draft.Tokens = draft.Tokens[:max(0, min(len(draft.Tokens), room()-1))]
			plan = d.cost.Choose(draft.MatchLen, len(draft.Tokens))
			if d.opts.NoCostModel && len(draft.Tokens) > 0 {
				plan = d.cost.Plan(draft.MatchLen, len(draft.Tokens))
			}
		}
		stepStart := time.Now()
		if plan.Gamma == 0 {
			if specOn {
				shadow.Offer(draft)
			}
			mix, err := d.Next(ctx)
			if err != nil {
				return res, err
			}
			tok := choose(mix, len(d.gen), d.gen)
			if specOn {
				d.cost.Observe(plan, specdec.Outcome{Rows: len(d.prompts), Seqs: len(d.prompts), VerifyMs: since(stepStart)})
			}
			res.Steps++
			d.Push(tok)
			if specOn {
				shadow.Emitted(d.acc, tok)
				if err := d.drafter.Append(tok); err != nil {
					return res, err
				}
			}
			done, err := decide([]engine.Token{tok})
			if err != nil || done {
				res.Text = text.String() + detok.Flush()
				res.DecodeMS = sinceOr(decodeStart)
				return res, err
			}
			continue
		}
		shadow.Reset()
		toks := draft.Tokens[:plan.Gamma]
		rows, err := d.Verify(ctx, toks)
		if err != nil {
			return res, err
		}
		verifyMS := since(stepStart)
		// The target's own choice at each row; a draft token is accepted
		// while it equals that choice. Greedy: the argmax. Sampling: the
		// sample at the position's uniform, which accepts draft x with
		// probability p(x) and otherwise emits a token distributed as p
		// without x, renormalized: lossless speculative sampling for a
		// deterministic draft, coupled to plain sampling's randomness.
		chosen := make([]engine.Token, len(rows))
		hist := d.gen
		for i, r := range rows {
			chosen[i] = choose(r, len(d.gen)+i, hist)
			if i < len(toks) {
				hist = append(hist[:len(hist):len(hist)], toks[i])
			}
		}
		v, err := specdec.VerifyGreedy(toks, chosen)
		if err != nil {
			return res, err
		}
		if err := d.Commit(toks, v.Accepted, v.Emit); err != nil {
			return res, err
		}
		res.Steps++
		d.drafter.Verified(toks, chosen)
		if err := d.drafter.Append(v.Emit...); err != nil {
			return res, err
		}
		d.cost.Observe(plan, specdec.Outcome{
			Accepted: v.Accepted, Attempted: v.Attempted,
			Rows: (len(toks) + 1) * len(d.prompts), Seqs: len(d.prompts), VerifyMs: verifyMS,
		})
		d.stats.Record(len(toks), v.Accepted, draft.MatchLen == specdec.MatchReuse)
		res.Spec = d.stats
		done, err := decide(v.Emit)
		if err != nil || done {
			res.Text = text.String() + detok.Flush()
			res.DecodeMS = sinceOr(decodeStart)
			return res, err
		}
	}
	res.Text = text.String() + detok.Flush()
	res.DecodeMS = sinceOr(decodeStart)
	return res, nil
}

// treeStep is one step with a token tree (Lever §4.2): grown from the
// drafter's candidates while it raises expected tokens per millisecond
// (with NoCostModel: as far as the candidates and the budget go), verified
// in one batch, walked along the target's own choices. A tree of the root
// alone is a plain decoding step.
func (d *Decoder) treeStep(ctx context.Context, res *Result, shadow *specdec.Shadow, choose func([]float32, int, []engine.Token) engine.Token,
	decide func([]engine.Token) (bool, error), room int) (bool, error) {
	var root engine.Token
	if len(d.gen) > 0 {
		root = d.gen[len(d.gen)-1]
	}
	src := d.drafter.TreeSource()
	tree := specdec.NewTree(root)
	tree.Finish()
	free := func(int, int) float64 { return 1 } // grows a tree as far as the candidates go
	if depth := min(d.opts.Spec.MaxDraft, room-1); depth > 0 {
		cost := d.cost.TreeCost
		if d.opts.NoCostModel {
			cost = free
		}
		tree = specdec.BuildTree(src, root, cost, min(d.opts.Spec.TreeBudget, d.branches), depth)
	}
	plan := d.cost.PlanTree(tree, src.MatchLen)
	if tree.Size() == 0 {
		// The likeliest linear draft, shadowed: trees are weighed with
		// the same per-bucket acceptance.
		draft := d.drafter.Draft()
		draft.Tokens = draft.Tokens[:max(0, min(len(draft.Tokens), room-1))]
		shadow.Offer(draft)
	} else {
		shadow.Reset()
	}
	start := time.Now()
	var (
		rows [][]float32
		err  error
	)
	if tree.Size() == 0 {
		var mix []float32
		mix, err = d.Next(ctx)
		rows = [][]float32{mix}
	} else {
		rows, err = d.VerifyTree(ctx, tree)
	}
	if err != nil {
		return true, err
	}
	verifyMS := since(start)
	// The target's own choice after each node, given the node's path (see
	// choose): following the matching child reproduces plain decoding.
	chosen := make([]engine.Token, len(rows))
	for i, r := range rows {
		path := tree.Tokens(tree.Path(i))
		chosen[i] = choose(r, len(d.gen)+len(path), append(d.gen[:len(d.gen):len(d.gen)], path...))
	}
	v, err := tree.VerifyGreedy(chosen)
	if err != nil {
		return true, err
	}
	if tree.Size() == 0 {
		d.Push(v.Emit...)
	} else if err := d.CommitTree(tree, v); err != nil {
		return true, err
	}
	res.Steps++
	if tree.Size() > 0 {
		d.drafter.VerifiedTree(tree, chosen, v)
		d.stats.RecordTree(tree, v.Accepted)
		res.Spec = d.stats
	}
	if tree.Size() == 0 {
		shadow.Emitted(d.acc, v.Emit...)
	}
	if err := d.drafter.Append(v.Emit...); err != nil {
		return true, err
	}
	d.cost.Observe(plan, specdec.Outcome{
		Accepted: v.Accepted, Attempted: v.Attempted,
		Rows: len(rows) * len(d.prompts), Seqs: len(tree.Leaves) * len(d.prompts), VerifyMs: verifyMS,
	})
	return decide(v.Emit)
}

func sinceOr(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return since(t)
}

// calibrate feeds the drafter with a prompt and its prefill top-k rows.
func (d *Decoder) calibrate(seq int, rows [][]engine.TokenLogit) error {
	id := d.drafter.AddDocument(d.prompts[seq])
	succ := make([][]specdec.Successor, len(rows))
	for i, r := range rows {
		succ[i] = specdec.SuccessorsFromTopK(r, nil)
	}
	if _, err := d.drafter.Calibrate(id, succ); err != nil {
		return fmt.Errorf("decoder: calibrate: %w", err)
	}
	return nil
}

func (d *Decoder) longestPrompt() int {
	n := 0
	for _, p := range d.prompts {
		n = max(n, len(p))
	}
	return n
}

// matchStop is the index where the earliest stop string starts, or -1.
func matchStop(text string, stops []string) int {
	at := -1
	for _, s := range stops {
		if s == "" {
			continue
		}
		if i := strings.Index(text, s); i >= 0 && (at < 0 || i < at) {
			at = i
		}
	}
	return at
}

// CostLog is the cost model's predicted-vs-measured throughput log.
func (d *Decoder) CostLog() *specdec.PredictionLog { return &d.cost.Log }
