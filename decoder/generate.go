package decoder

import (
	"context"
	"errors"
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
	// Context concatenates the passages into one prompt for this request
	// (context aggregation) whatever the decoder's mode.
	Context bool
	// Imported are passage sequences prefilled elsewhere, decoded after
	// Passages' own.
	Imported []Imported
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
	// LogProbs are the natural logs of each token's probability under the
	// locally-aggregated mixture it was chosen from.
	LogProbs []float64
}

// TokensPerSecond is the decode throughput after the first token.
func (r Result) TokensPerSecond() float64 {
	if r.DecodeMS <= 0 || len(r.Tokens) < 2 {
		return 0
	}
	return float64(len(r.Tokens)-1) / (r.DecodeMS / 1000)
}

// Chooser decides the token at answer position pos from the
// locally-aggregated mixture there, given the answer before it. A verified
// draft token is accepted exactly when it equals the choice, so a side's
// tokens are the same whether or not it speculated.
type Chooser func(mix []float32, pos int, history []engine.Token) (engine.Token, error)

// Start begins a generation like Begin and, when speculation is on, opens
// the drafter on its prompts (calibrated from the prefill's logits when
// configured).
func (d *Decoder) Start(ctx context.Context, query string, passages []Passage) error {
	return d.StartMode(ctx, query, passages, nil, d.opts.Mode)
}

// StartMode is Start with the passages entering the model as mode says for
// this generation (a decoder made for output aggregation can concatenate
// passages into one prompt, the DRCG baseline, and the other way round as
// far as MaxPassages allows), and with sequences another context prefilled
// after this side's own (output aggregation only).
func (d *Decoder) StartMode(ctx context.Context, query string, passages []Passage, imported []Imported, mode Mode) error {
	d.steps = 0
	d.shadow.Reset()
	if !d.opts.Spec.Enabled {
		return d.beginMode(ctx, query, passages, imported, mode, nil)
	}
	var err error
	if d.drafter, err = specdec.NewDrafter(d.opts.Spec, d.acc); err != nil {
		return err
	}
	var calib func(int, [][]engine.TokenLogit) error
	if d.opts.Spec.Calibration {
		calib = d.calibrate
	}
	if err := d.beginMode(ctx, query, passages, imported, mode, calib); err != nil {
		return err
	}
	if calib == nil {
		for s := range d.prompts {
			d.drafter.AddDocument(d.prompts[s])
		}
	}
	if d.opts.History != nil {
		for _, seq := range d.opts.History.Sequences() {
			d.drafter.AddDocument(seq)
		}
	}
	d.drafter.StartAnswer(d.prompts[0])
	d.cost.Seqs = len(d.prompts)
	if d.assist != nil {
		d.assist.Seqs = len(d.prompts)
		d.assistStart = &assistantStart{query: query, passages: passages, mode: mode, system: d.system, history: d.history}
	}
	return nil
}

// Finish closes the generation's answer in the drafter, which keeps it as
// an earlier answer to draft from.
func (d *Decoder) Finish() {
	if d.drafter != nil && d.drafter.AnswerOpen() {
		d.drafter.EndAnswer()
		if d.opts.History != nil {
			d.opts.History.Add(d.gen)
		}
	}
}

// Room is how many more tokens the answer can take.
func (d *Decoder) Room() int { return d.opts.CtxPerSeq - d.longestPrompt() - len(d.gen) - 1 }

// Steps is the number of forward passes since Start.
func (d *Decoder) Steps() int { return d.steps }

// SpecStats are local speculation's counters since Start.
func (d *Decoder) SpecStats() specdec.Stats { return d.stats }

// Step runs one forward pass after the answer so far and returns the tokens
// it decides, which join the answer: one for a plain step; for a verified
// local draft (when speculation is on and the cost model expects a gain),
// the accepted draft tokens and the choice after them. It decides at most
// limit tokens (≥ 1). On error the decoder is as it was before the call;
// an abort (Abort, or ctx cancelled) returns an error wrapping
// engine.ErrAborted.
func (d *Decoder) Step(ctx context.Context, choose Chooser, limit int) ([]engine.Token, error) {
	room := d.Room()
	if room <= 0 {
		return nil, fmt.Errorf("decoder: %w: the answer fills the context of %d per sequence", engine.ErrContextFull, d.opts.CtxPerSeq)
	}
	if limit < 1 {
		return nil, fmt.Errorf("decoder: %w: step limit %d", engine.ErrInvalidInput, limit)
	}
	hold, err := d.syncWeights(ctx)
	if err != nil {
		return nil, err
	}
	limit = min(limit, hold)
	specOn := d.opts.Spec.Enabled
	if specOn && d.branches > 1 {
		return d.treeStep(ctx, choose, min(room, limit))
	}
	var draft specdec.Draft
	plan := specdec.Plan{}
	// After a Begin the distribution of the next token is known already
	// (prefilled, or cached with its prefix): that token is decided for
	// free and goes out at once rather than after a verification pass;
	// speculation resumes from the next step.
	free := d.nextValid
	// cost is the model that planned the step: the context drafter's, or
	// the assistant's when its draft was taken (the context's draft is
	// then shadowed, so that its acceptance still learns).
	cost, shadowed := d.cost, specdec.Draft{}
	var draftMS float64
	if specOn && !free {
		avail := max(0, min(room-1, limit-1)) // draft tokens the step can take
		draft = d.drafter.Draft()
		draft.Tokens = draft.Tokens[:min(len(draft.Tokens), avail)]
		plan = d.cost.Choose(draft.MatchLen, len(draft.Tokens))
		if d.opts.NoCostModel && len(draft.Tokens) > 0 {
			plan = d.cost.Plan(draft.MatchLen, len(draft.Tokens))
		}
		if d.assist != nil {
			if ap := d.assist.Choose(0, avail); ap.Gamma > 0 && ap.Tokens/ap.Ms > plan.Tokens/plan.Ms {
				toks, ms, err := d.assistantDraft(ctx, ap.Gamma)
				if err != nil {
					return nil, err
				}
				if len(toks) > 0 {
					shadowed, draft = draft, specdec.Draft{Tokens: toks, Origin: specdec.OriginModel}
					cost, plan, draftMS = d.assist, d.assist.Plan(0, len(toks)), ms
				}
			}
		}
	}
	stepStart := time.Now()
	if plan.Gamma == 0 {
		mix, err := d.Next(ctx)
		if err != nil {
			return nil, err
		}
		tok, err := choose(mix, len(d.gen), d.gen)
		if err != nil {
			return nil, err
		}
		d.steps++
		d.Push(tok)
		if specOn && free {
			if err := d.drafter.Append(tok); err != nil {
				return nil, err
			}
		} else if specOn {
			passMS := since(stepStart)
			if d.opts.SpecTrace != nil {
				d.opts.SpecTrace(SpecEvent{Pos: len(d.gen) - 1, Draft: draft, PassMs: passMS})
			}
			d.cost.Observe(plan, specdec.Outcome{Rows: len(d.prompts), Seqs: len(d.prompts), VerifyMs: passMS})
			d.shadow.Offer(draft)
			d.shadow.Emitted(d.acc, tok)
			if err := d.drafter.Append(tok); err != nil {
				return nil, err
			}
		}
		return []engine.Token{tok}, nil
	}
	d.shadow.Reset()
	d.shadow.Offer(shadowed)
	toks := draft.Tokens[:plan.Gamma]
	rows, err := d.Verify(ctx, toks)
	if err != nil {
		return nil, err
	}
	verifyMS := since(stepStart)
	// The target's own choice at each row; a draft token is accepted while
	// it equals that choice (see Chooser).
	chosen := make([]engine.Token, len(rows))
	hist := d.gen
	for i, r := range rows {
		if chosen[i], err = choose(r, len(d.gen)+i, hist); err != nil {
			return nil, errors.Join(err, d.truncateKV(len(d.gen)))
		}
		if i < len(toks) {
			hist = append(hist[:len(hist):len(hist)], toks[i])
		}
	}
	v, err := specdec.VerifyGreedy(toks, chosen)
	if err != nil {
		return nil, err
	}
	if err := d.Commit(toks, v.Accepted, v.Emit); err != nil {
		return nil, err
	}
	d.steps++
	d.drafter.Verified(toks, chosen)
	d.shadow.Emitted(d.acc, v.Emit...)
	if err := d.drafter.Append(v.Emit...); err != nil {
		return nil, err
	}
	cost.Observe(plan, specdec.Outcome{
		Accepted: v.Accepted, Attempted: v.Attempted,
		Rows: (len(toks) + 1) * len(d.prompts), Seqs: len(d.prompts), DraftMs: draftMS, VerifyMs: verifyMS,
	})
	d.stats.RecordDraft(draft.Origin, len(toks), v.Accepted)
	if d.opts.SpecTrace != nil {
		draft.Tokens = toks
		d.opts.SpecTrace(SpecEvent{Pos: len(d.gen) - len(v.Emit), Draft: draft, Accepted: v.Accepted, Verified: true, PassMs: verifyMS})
	}
	return v.Emit, nil
}

// SpecEvent is one linear step of local speculation, for measurements
// (Options.SpecTrace).
type SpecEvent struct {
	// Pos is the answer position the draft's first token would take.
	Pos int
	// Draft is what the drafter proposed; Tokens are cut to what was
	// verified, the rest of it (Origin, Alt) as drafted. A step that
	// verified nothing (no draft, or the cost model said no) carries the
	// draft it left unverified and Accepted 0.
	Draft    specdec.Draft
	Accepted int
	// Verified is false for a plain step.
	Verified bool
	// PassMs is the step's forward pass: the verification of
	// len(Draft.Tokens)+1 rows a sequence when Verified, else the
	// one-token pass.
	PassMs float64
}

// Rewind keeps the first n tokens of the answer and continues it with toks:
// what the other side's aggregator decided instead of this side's draft.
// The KV cache keeps everything it holds of the kept prefix.
func (d *Decoder) Rewind(n int, toks ...engine.Token) error {
	if n < 0 || n > len(d.gen) {
		return fmt.Errorf("decoder: %w: rewind to %d of %d tokens", engine.ErrInvalidInput, n, len(d.gen))
	}
	if d.drafter != nil && d.drafter.AnswerOpen() {
		if err := d.drafter.Rollback(len(d.gen) - n); err != nil {
			return fmt.Errorf("decoder: %w", err)
		}
		if err := d.drafter.Append(toks...); err != nil {
			return fmt.Errorf("decoder: %w", err)
		}
	}
	d.shadow.Reset()
	if err := d.dropBranches(); err != nil {
		return err
	}
	d.ev.cut(n)
	d.dropEpochsAfter(n)
	if n < len(d.gen) {
		d.gen = d.gen[:n]
		d.nextValid = false
		if err := d.truncateKV(n); err != nil {
			return err
		}
	}
	d.Push(toks...)
	return nil
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
	start := time.Now()
	mode := d.opts.Mode
	if req.Context {
		mode = ContextAggregation
	}
	if err := d.StartMode(ctx, req.Query, req.Passages, req.Imported, mode); err != nil {
		return res, err
	}
	defer d.Finish()
	res.PrefillMS = since(start)

	detok := engine.NewDetokenizer(d.model)
	// chosenProb[pos] is the mixture probability of the token chosen at pos.
	var chosenProb []float32
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
			res.LogProbs = append(res.LogProbs, math.Log(float64(chosenProb[len(res.Tokens)])))
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
	choose := func(mix []float32, pos int, history []engine.Token) (engine.Token, error) {
		var tok engine.Token
		if greedyPlain {
			tok = engine.Token(sampling.Argmax(mix))
		} else {
			scores = slices.Grow(scores[:0], len(mix))[:len(mix)]
			for i, p := range mix {
				scores[i] = float32(math.Log(float64(p)))
			}
			probs = req.Sampling.Dist(scores, history, probs)
			tok = sampling.DrawU(probs, req.Sampling.Uniform(pos))
		}
		if pos >= len(chosenProb) {
			chosenProb = append(chosenProb, make([]float32, pos+1-len(chosenProb))...)
		}
		chosenProb[pos] = mix[tok]
		return tok, nil
	}
	finish := func(err error) (Result, error) {
		res.Text = text.String() + detok.Flush()
		res.DecodeMS = sinceOr(decodeStart)
		res.Steps = d.steps
		res.Spec = d.stats
		return res, err
	}
	for {
		if d.Room() <= 0 {
			res.Stopped = "context"
			return finish(nil)
		}
		toks, err := d.Step(ctx, choose, d.Room())
		if err != nil {
			return finish(err)
		}
		// A local answer's tokens are final once decided: no distribution
		// before the next token's need be kept for their evidence.
		d.Settle(len(d.gen))
		if done, err := decide(toks); err != nil || done {
			return finish(err)
		}
	}
}

// treeStep is one step with a token tree (Lever §4.2): grown from the
// drafter's candidates while it raises expected tokens per millisecond
// (with NoCostModel: as far as the candidates and the budget go), verified
// in one batch, walked along the target's own choices. A tree of the root
// alone is a plain decoding step. It decides at most limit tokens.
func (d *Decoder) treeStep(ctx context.Context, choose Chooser, limit int) ([]engine.Token, error) {
	var root engine.Token
	if len(d.gen) > 0 {
		root = d.gen[len(d.gen)-1]
	}
	ctxSrc := d.drafter.TreeSource()
	var src specdec.Source = ctxSrc
	tree := specdec.NewTree(root)
	tree.Finish()
	free := func(int, int) float64 { return 1 } // grows a tree as far as the candidates go
	// The assistant's greedy draft, when its cost model expects it to pay
	// as a linear draft would, joins the tree as a branch of its own,
	// merged with the context's candidates where they agree.
	var chain []engine.Token
	var chainPlan specdec.Plan
	var chainMS float64
	if depth := min(d.opts.Spec.MaxDraft, limit-1); depth > 0 {
		if d.assist != nil && !d.nextValid {
			if chainPlan = d.assist.Choose(0, depth); chainPlan.Gamma > 0 {
				var err error
				if chain, chainMS, err = d.assistantDraft(ctx, chainPlan.Gamma); err != nil {
					return nil, err
				}
				chainPlan = d.assist.Plan(0, len(chain))
				src = specdec.NewChainSource(ctxSrc, chain, d.assist.Acc.Alpha(0))
			}
		}
		cost := d.cost.TreeCost
		if d.opts.NoCostModel {
			cost = free
		}
		tree = specdec.BuildTree(src, root, cost, d.opts.Spec.TreeBudget, d.branches, depth)
	}
	plan := d.cost.PlanTree(tree, ctxSrc.MatchLen)
	if tree.Size() == 0 {
		// The likeliest linear draft, shadowed: trees are weighed with
		// the same per-bucket acceptance.
		draft := d.drafter.Draft()
		draft.Tokens = draft.Tokens[:max(0, min(len(draft.Tokens), limit-1))]
		d.shadow.Offer(draft)
	} else {
		d.shadow.Reset()
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
		return nil, err
	}
	verifyMS := since(start)
	// The target's own choice after each node, given the node's path (see
	// Chooser): following the matching child reproduces plain decoding.
	chosen := make([]engine.Token, len(rows))
	for i, r := range rows {
		path := tree.Tokens(tree.Path(i))
		if chosen[i], err = choose(r, len(d.gen)+len(path), append(d.gen[:len(d.gen):len(d.gen)], path...)); err != nil {
			if tree.Size() > 0 {
				err = errors.Join(err, d.dropTree(tree))
			}
			return nil, err
		}
	}
	v, err := tree.VerifyGreedy(chosen)
	if err != nil {
		return nil, err
	}
	if tree.Size() == 0 {
		d.Push(v.Emit...)
	} else if err := d.CommitTree(tree, v); err != nil {
		return nil, err
	}
	d.steps++
	if tree.Size() > 0 {
		d.drafter.VerifiedTree(tree, chosen, v)
		d.stats.RecordTree(tree, v.Accepted)
	}
	if tree.Size() == 0 {
		d.shadow.Emitted(d.acc, v.Emit...)
	}
	if err := d.drafter.Append(v.Emit...); err != nil {
		return nil, err
	}
	d.cost.Observe(plan, specdec.Outcome{
		Accepted: v.Accepted, Attempted: v.Attempted,
		Rows: len(rows) * len(d.prompts), Seqs: len(tree.Leaves) * len(d.prompts), VerifyMs: verifyMS,
	})
	if len(chain) > 0 {
		// The chain's own acceptance and cost, whichever branch was
		// taken: the verification pass is the tree's, priced above.
		acc, att := specdec.ChainAccepted(chain, v.Emit)
		d.assist.Observe(chainPlan, specdec.Outcome{Accepted: acc, Attempted: att, DraftMs: chainMS})
		d.stats.CountOrigin(specdec.OriginModel, len(chain), acc)
	}
	return v.Emit, nil
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
