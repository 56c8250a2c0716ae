// Package decoder is one side's RAG decoder (DRAGON §2.2, §4.1): one KV
// sequence per retrieved passage (passage + query), decoded together in one
// batch per step, and their next-token distributions mixed by relevance
// into the side's locally-aggregated distribution
//
//	p^s(x) = Σ_d softmax(R)_d · p(x | d, x_<t),   h̃^s = logsumexp(R).
//
// The decoder exposes the steps the distributed session needs (Start,
// Step, Rewind, Abort; underneath them Next, Push, Verify/Commit) and a
// local generation loop (Generate) with sampling and context-aligned
// speculative decoding.
package decoder

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/internal/vecmath"
	"github.com/dragon-rag/dragon/kvcache"
	"github.com/dragon-rag/dragon/specdec"
)

// Mode is how passages enter the model.
type Mode int

// Aggregation modes.
const (
	// OutputAggregation decodes one sequence per passage and mixes their
	// distributions (REPLUG / DRAGON).
	OutputAggregation Mode = iota
	// ContextAggregation concatenates all passages into one prompt (the
	// CRCG baseline).
	ContextAggregation
)

func (m Mode) String() string {
	if m == ContextAggregation {
		return "context"
	}
	return "output"
}

// ParseMode reads "output" or "context".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "output", "":
		return OutputAggregation, nil
	case "context":
		return ContextAggregation, nil
	}
	return 0, fmt.Errorf("decoder: unknown aggregation mode %q (want output or context)", s)
}

// Passage is a retrieved passage with its relevance score R(d, q). A
// passage without text is the closed-book document: its sequence holds the
// question alone, so the model's own knowledge enters the mixture as one
// more document, weighed by its Score like the others.
type Passage struct {
	Text   string
	Score  float64
	Source string
	// Where the passage comes from, for the answer's sources; the decoder
	// reads none of it. ID is the index's passage id, Start and End the
	// byte offsets of Text in its document, Meta its document's metadata
	// (subject, from, date, title, page).
	ID         uint64
	Start, End int
	Meta       map[string]string
}

// Imported is a passage sequence another context prefilled (DRCG/KV): its
// prompt tokens, its KV state (engine.Context.SeqState) and its relevance
// score. The decoder loads the state instead of prefilling the prompt.
type Imported struct {
	Prompt []engine.Token
	State  []byte
	Score  float64
}

// Options configure a decoder.
type Options struct {
	// MaxPassages is the most passages (KV sequences) one generation uses.
	MaxPassages int
	// CtxPerSeq bounds each sequence: passage + query + answer + draft.
	CtxPerSeq int
	BatchSize int
	Threads   int
	Mode      Mode
	// System is the system message of every prompt.
	System string
	// RescoreEvery > 0 turns on dynamic weights (DRAGON §4.1): the
	// passages' scores at answer position p are Rescore's against the
	// question and the answer's first ⌊p/RescoreEvery⌋·RescoreEvery tokens
	// (the first stage's below RescoreEvery). The positions at which the
	// weights change are a function of the token count alone, so a greedy
	// answer is the same however its tokens were decided (plain, verified
	// drafts, or the peer's corrections after a rewind). They apply to Step
	// and Generate.
	RescoreEvery int
	Rescore      func(ctx context.Context, query, answer string, passages []Passage) ([]float64, error)
	// PosteriorEvery > 0 turns on posterior weights instead: the passages'
	// scores at answer position p are R(d) + Σ_{t<b} log p(x_t | d, x_<t)
	// with b = ⌊p/PosteriorEvery⌋·PosteriorEvery, so the weights are the
	// mixture's posterior given the answer's first b tokens (their
	// log-sum-exp, h̃, weighs this side against the other by the same
	// posterior). Like RescoreEvery the positions are a function of the
	// token count alone, and it needs no model beside the passages'
	// sequences: their evidence (evidence.go) is kept for it.
	PosteriorEvery int
	// Spec configures local speculative decoding (Generate only).
	Spec specdec.Options
	// History, with Spec, is a store of earlier answers the drafter also
	// drafts from; each finished answer joins it.
	History *specdec.History
	// NoCostModel verifies every draft the drafter offers, whole, instead
	// of letting the cost model choose the length (for ablations).
	NoCostModel bool
	// SpecTrace, when set, receives every linear step of local
	// speculation (Generate and Step; not token trees), for measurements.
	SpecTrace func(SpecEvent)
	// Context, when set, is the engine context to decode in instead of a
	// new one (a batcher.Slot sharing a context with other decoders): it
	// must hold MaxPassages sequences of CtxPerSeq positions, and token
	// trees cannot use it.
	Context engine.Context
	// VerifyTable holds measured verification costs (ms by batch rows) for
	// the cost model, which refines it online; nil: New measures one with
	// ProfileVerify (about a second on a 2-core CPU) when the cost model
	// is on. The decoder updates the table: decoders that run at the same
	// time need tables of their own.
	VerifyTable *specdec.VerifyTable
	// Cache, when set, keeps the KV state of prompt prefixes: a sequence
	// whose prompt shares a prefix with a cached one restores it and
	// prefills only the rest (see prefix.go). Decoders may share one.
	Cache *kvcache.Cache
	// Assistant, with Spec, is a decoder on a smaller model of the same
	// tokenizer, kept in memory beside this one (Lever's DRAM draft): it
	// follows the answer and drafts its own greedy continuation beside the
	// context drafter, and at each step the cost model takes the draft with
	// the more expected tokens per millisecond (assistant.go); with token
	// trees its draft is a branch of the tree, merged with the context's
	// candidates where they agree. The assistant must not speculate itself.
	Assistant *Decoder
	// Hedges is how many hedge branches may be live at once (hedge.go):
	// each takes MaxPassages more KV sequences (a given Context must hold
	// them). 0: none.
	Hedges int
}

// DefaultSystem asks the model to answer from the passage.
const DefaultSystem = "You are a helpful assistant. Answer the question using the passage."

func (o *Options) defaults() {
	if o.MaxPassages <= 0 {
		o.MaxPassages = 8
	}
	if o.CtxPerSeq <= 0 {
		o.CtxPerSeq = 1024
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 512
	}
	if o.System == "" {
		o.System = DefaultSystem
	}
}

// Decoder runs generations on one engine context, one at a time.
type Decoder struct {
	model engine.Model
	ectx  engine.Context
	opts  Options
	vocab int
	// branches is how many KV sequences each passage has for token trees
	// (1: linear drafts only).
	branches int
	// hedges are the hedge branches by slot (nil: free).
	hedges []*branch

	// system overrides opts.System when not empty.
	system string
	// history is the conversation before the query (SetHistory).
	history []engine.Message

	// The current generation.
	mode     Mode
	passages []Passage
	prompts  [][]engine.Token // per sequence
	w        []float32        // ω = softmax(R)
	hTilde   float64
	query    string
	// epochs are the weights of the answer so far, by the position they
	// start at (dynamic weights; the first is the first stage's, at 0).
	epochs []weightEpoch
	gen    []engine.Token // accepted tokens
	// held[s] is how many positions sequence s holds in the KV cache: at
	// most its prompt + gen (+ a draft between Verify and Commit).
	held      []int
	next      []float32 // p^s at position len(gen), valid when nextValid
	nextValid bool

	batch  engine.Batch
	logits []float32
	// unused are the ids the model's tokenizer marks unused, masked out of
	// every distribution.
	unused []engine.Token
	mixes  [][]float32

	drafter *specdec.Drafter
	acc     *specdec.Acceptance
	cost    *specdec.CostModel
	// assist prices the assistant's drafts (Options.Assistant): its own
	// acceptance and drafting cost over the same verification table.
	assist      *specdec.CostModel
	assistStart *assistantStart
	stats       specdec.Stats
	steps       int
	// shadow learns the acceptance of drafts the cost model left
	// unverified, from what plain decoding then emits.
	shadow specdec.Shadow
	// own is how many of prompts are this decoder's (not imported);
	// restored how many of them began from a cached prefix.
	own      int
	restored int
	// tokens remembers the tokens of recent prompts.
	tokens promptTokens
	// header caches templateStart for one system message.
	header struct {
		system string
		n      int
	}
	// During a Begin with a cache: known[s] are the cached logits after
	// sequence s's whole prompt (nil: decode its last row), and lastRow[s]
	// the logits of the last row decoded for s, kept so that each
	// sequence's distribution joins the mixture in sequence order whether
	// it was decoded or cached (the mixture's sums then match a plain
	// prefill's bit for bit).
	known, lastRow [][]float32
	ordered        bool
	// ev keeps each passage's terms of the answer (evidence.go), for the
	// generations that begin while wantEvidence is set.
	ev           evidence
	wantEvidence bool
	// posterior is the current generation's posterior interval
	// (Options.PosteriorEvery, or SetPosteriorEvery's when set: wantPosterior
	// ≥ 0).
	posterior, wantPosterior int
}

// New creates a decoder and its engine context.
func New(m engine.Model, opts Options) (*Decoder, error) {
	opts.defaults()
	if opts.Spec.Enabled {
		if err := opts.Spec.Validate(); err != nil {
			return nil, err
		}
	}
	copts := engine.ContextOptions{
		CtxPerSeq: opts.CtxPerSeq, MaxSeqs: opts.MaxPassages, BatchSize: opts.BatchSize, Threads: opts.Threads,
	}
	branches := 1
	if opts.Spec.Enabled && opts.Spec.TreeBudget > 1 && opts.Mode == OutputAggregation {
		// Token trees: every passage gets one KV sequence per branch (tree.go).
		branches = max(1, min(opts.Spec.TreeBudget, maxTreeLeaves, maxSeqs/opts.MaxPassages))
	}
	if opts.Hedges < 0 {
		return nil, fmt.Errorf("decoder: %w: %d hedge branches", engine.ErrInvalidInput, opts.Hedges)
	}
	copts.MaxSeqs = opts.MaxPassages * (branches + opts.Hedges)
	if copts.MaxSeqs > maxSeqs {
		return nil, fmt.Errorf("decoder: %w: %d passages with %d branches and %d hedges need %d sequences, more than %d",
			engine.ErrInvalidInput, opts.MaxPassages, branches, opts.Hedges, copts.MaxSeqs, maxSeqs)
	}
	var c engine.Context
	if opts.Context != nil {
		co := opts.Context.Options()
		switch {
		case branches > 1:
			return nil, fmt.Errorf("decoder: %w: token trees need a context of their own", engine.ErrInvalidInput)
		case co.MaxSeqs < copts.MaxSeqs || co.CtxPerSeq < opts.CtxPerSeq:
			return nil, fmt.Errorf("decoder: %w: the given context holds %d sequences of %d positions, the decoder needs %d of %d",
				engine.ErrInvalidInput, co.MaxSeqs, co.CtxPerSeq, copts.MaxSeqs, opts.CtxPerSeq)
		}
		c = opts.Context
	} else {
		var err error
		if c, err = m.NewContext(copts); err != nil {
			return nil, fmt.Errorf("decoder: %w", err)
		}
	}
	d := &Decoder{model: m, ectx: c, opts: opts, vocab: c.VocabSize(), branches: branches, unused: m.Info().Unused, wantPosterior: -1}
	d.logits = make([]float32, d.vocab)
	d.next = make([]float32, d.vocab)
	d.acc = specdec.NewAcceptance(0.5)
	table := opts.VerifyTable
	if table == nil && opts.Spec.Enabled && !opts.NoCostModel {
		rows := d.verifyRows()
		var err error
		if table, err = ProfileVerify(context.Background(), c, rows, 2); err != nil {
			c.Close()
			return nil, err
		}
	}
	if table == nil {
		table = &specdec.VerifyTable{}
	}
	d.cost = specdec.NewCostModel(d.acc, table, max(opts.Spec.MaxDraft, 1))
	if opts.Assistant != nil {
		if err := d.checkAssistant(opts.Assistant); err != nil {
			c.Close()
			return nil, err
		}
		d.assist = specdec.NewCostModel(specdec.NewAcceptance(0.5), table, max(opts.Spec.MaxDraft, 1))
		d.assist.DraftMs = 0 // unknown until the first draft is timed
	}
	return d, nil
}

// SetSystem sets the system message of the generations that follow (""
// restores Options.System).
func (d *Decoder) SetSystem(system string) { d.system = system }

// SetPosteriorEvery sets the posterior weights' interval of the
// generations that begin after it (Options.PosteriorEvery; 0: static
// weights; negative: back to Options').
func (d *Decoder) SetPosteriorEvery(n int) { d.wantPosterior = max(n, -1) }

// Close frees the engine context.
func (d *Decoder) Close() error { return d.ectx.Close() }

// VerifyTable is the cost model's table of verification costs, refined
// while decoding: a decoder made again for the same model and threads
// (Options.VerifyTable) starts from it instead of measuring.
func (d *Decoder) VerifyTable() *specdec.VerifyTable { return d.cost.Verify }

// verifyRows is the most rows a verification pass holds.
func (d *Decoder) verifyRows() int {
	return (max(d.opts.Spec.MaxDraft, d.opts.Spec.TreeBudget) + 1) * d.opts.MaxPassages
}

// Reserve runs one pass of as many rows as a verification may hold, each
// with its logits, and forgets it: llama.cpp allocates a context's logits
// at the first pass that needs them, so a caller sizing memory around the
// decoder (bench lever's plan) measures after this.
func (d *Decoder) Reserve(ctx context.Context) error {
	rows := d.verifyRows()
	if b := d.ectx.Options().BatchSize; b > 0 {
		rows = min(rows, b)
	}
	var b engine.Batch
	for i := range rows {
		b.Add(engine.Token(i%d.vocab), i, true, 0)
	}
	if err := d.ectx.Decode(ctx, &b); err != nil {
		return fmt.Errorf("decoder: reserve: %w", err)
	}
	if err := d.ectx.Truncate(0, 0); err != nil {
		return fmt.Errorf("decoder: reserve: %w", err)
	}
	return nil
}

// Abort stops the forward pass in flight (from any goroutine): the call
// running it returns an error wrapping engine.ErrAborted and the decoder
// stays as it was before that call.
func (d *Decoder) Abort() { d.ectx.Abort() }

// Model is the decoder's model.
func (d *Decoder) Model() engine.Model { return d.model }

// HTilde is logsumexp(R) of this side's passages (DRAGON Appendix A.1).
func (d *Decoder) HTilde() float64 { return d.hTilde }

// Weights are the current document weights softmax(R).
func (d *Decoder) Weights() []float32 { return d.w }

// Generated returns the tokens accepted so far.
func (d *Decoder) Generated() []engine.Token { return d.gen }

// Seqs is the number of KV sequences of the current generation.
func (d *Decoder) Seqs() int { return len(d.prompts) }

// Prompt is the token sequence of sequence i's prompt.
func (d *Decoder) Prompt(i int) []engine.Token { return d.prompts[i] }

// Begin starts a generation for query over passages (none: the model
// alone) and prefills every sequence. calib, when not nil, receives the
// top-k successors of every prompt position (for in-context calibration);
// asking for them makes the prefill compute logits for every row.
func (d *Decoder) Begin(ctx context.Context, query string, passages []Passage, calib func(seq int, rows [][]engine.TokenLogit) error) error {
	return d.beginMode(ctx, query, passages, nil, d.opts.Mode, calib)
}

func (d *Decoder) beginMode(ctx context.Context, query string, passages []Passage, imported []Imported, mode Mode, calib func(seq int, rows [][]engine.TokenLogit) error) error {
	if query == "" {
		return fmt.Errorf("decoder: %w: empty query", engine.ErrInvalidInput)
	}
	if len(imported) > 0 && mode != OutputAggregation {
		return fmt.Errorf("decoder: %w: imported sequences need output aggregation", engine.ErrInvalidInput)
	}
	if n := len(passages) + len(imported); n > d.opts.MaxPassages && mode == OutputAggregation {
		return fmt.Errorf("decoder: %w: %d passages, at most %d", engine.ErrInvalidInput, n, d.opts.MaxPassages)
	}
	d.mode = mode
	d.query = query
	d.passages = append(d.passages[:0], passages...)
	texts, scores := d.promptTexts(query)
	if len(passages) == 0 && len(imported) > 0 {
		texts, scores = nil, nil // the imported passages are the documents
	}
	for _, im := range imported {
		scores = append(scores, im.Score)
	}
	hTilde := math.Inf(-1) // no documents: no weight in a cross-side mixture
	if len(passages)+len(imported) > 0 {
		_, hTilde = weights(scores)
	}
	return d.begin(ctx, texts, imported, scores, hTilde, calib)
}

// BeginRaw starts a generation over prompts given as text, one sequence
// each, weighted by softmax(scores), without the chat template: language
// modelling (perplexity) and callers that render their own prompts.
func (d *Decoder) BeginRaw(ctx context.Context, prompts []string, scores []float64) error {
	if len(prompts) == 0 || len(prompts) != len(scores) {
		return fmt.Errorf("decoder: %w: %d prompts with %d scores", engine.ErrInvalidInput, len(prompts), len(scores))
	}
	if len(prompts) > d.opts.MaxPassages {
		return fmt.Errorf("decoder: %w: %d prompts, at most %d", engine.ErrInvalidInput, len(prompts), d.opts.MaxPassages)
	}
	d.passages = d.passages[:0]
	_, hTilde := weights(scores)
	return d.begin(ctx, prompts, nil, scores, hTilde, nil)
}

// begin tokenizes texts and prefills one sequence per text, then loads the
// imported sequences after them.
func (d *Decoder) begin(ctx context.Context, texts []string, imported []Imported, scores []float64, hTilde float64, calib func(int, [][]engine.TokenLogit) error) error {
	// The prompts replace the decoder's only once they are valid: until
	// then prompts, answer and held still describe what the KV holds,
	// which the prefix reuse below relies on.
	prompts := make([][]engine.Token, 0, len(texts)+len(imported))
	for _, text := range texts {
		toks, err := d.tokens.tokenize(d.model, text)
		if err != nil {
			return err
		}
		if len(toks) == 0 {
			return fmt.Errorf("decoder: %w: empty prompt", engine.ErrInvalidInput)
		}
		if len(toks) >= d.opts.CtxPerSeq {
			return fmt.Errorf("decoder: %w: prompt of %d tokens does not fit the context of %d per sequence",
				engine.ErrContextFull, len(toks), d.opts.CtxPerSeq)
		}
		prompts = append(prompts, toks)
	}
	own := len(prompts)
	for _, im := range imported {
		if len(im.Prompt) == 0 || len(im.Prompt) >= d.opts.CtxPerSeq {
			return fmt.Errorf("decoder: %w: imported prompt of %d tokens for sequences of %d", engine.ErrInvalidInput, len(im.Prompt), d.opts.CtxPerSeq)
		}
		prompts = append(prompts, im.Prompt)
	}
	resident := d.resident()
	d.prompts = prompts
	d.w, _ = weights(scores)
	d.hTilde = hTilde
	d.epochs = append(d.epochs[:0], weightEpoch{from: 0, w: d.w, hTilde: hTilde})
	d.gen = d.gen[:0]
	d.posterior = d.opts.PosteriorEvery
	if d.wantPosterior >= 0 {
		d.posterior = d.wantPosterior
	}
	d.ev.reset(d.wantEvidence || d.posterior > 0)
	d.own, d.restored = own, 0
	d.held = make([]int, len(d.prompts))
	d.known = make([][]float32, len(d.prompts))
	for len(d.lastRow) < len(d.prompts) {
		d.lastRow = append(d.lastRow, nil)
	}
	for s := range d.lastRow {
		d.lastRow[s] = d.lastRow[s][:0]
	}
	cached := d.cacheable(calib != nil)
	d.hedges = d.hedges[:0]
	for s := d.opts.MaxPassages * d.branches; s < d.opts.MaxPassages*(d.branches+d.opts.Hedges); s++ {
		if err := d.ectx.Truncate(s, 0); err != nil {
			return err
		}
	}
	for s := range d.opts.MaxPassages * d.branches {
		if cached && s < own {
			if err := d.reuse(s, resident); err != nil {
				return err
			}
			continue
		}
		if err := d.ectx.Truncate(s, 0); err != nil {
			return err
		}
	}
	for i, im := range imported {
		s := own + i
		if err := d.ectx.SetSeqState(s, im.State, len(im.Prompt)); err != nil {
			return fmt.Errorf("decoder: imported passage %d: %w", i, err)
		}
		d.held[s] = len(im.Prompt)
	}
	d.nextValid = false
	d.stats = specdec.Stats{}
	before := append([]int(nil), d.held...)
	d.ordered = cached
	defer func() { d.ordered, d.known = false, nil }()
	if err := d.forward(ctx, nil, false, calib); err != nil {
		return err
	}
	if cached {
		d.keepPrompts(before)
	}
	return nil
}

// SeqState is the KV state of sequence i of the current generation, for
// another decoder to import (DRCG/KV).
func (d *Decoder) SeqState(i int) ([]byte, error) {
	if i < 0 || i >= len(d.prompts) {
		return nil, fmt.Errorf("decoder: %w: sequence %d of %d", engine.ErrInvalidInput, i, len(d.prompts))
	}
	return d.ectx.SeqState(i)
}

func passageScores(ps []Passage) []float64 {
	s := make([]float64, len(ps))
	for i, p := range ps {
		s[i] = p.Score
	}
	return s
}

// promptTexts renders one prompt per sequence and the scores that weight
// them.
func (d *Decoder) promptTexts(query string) ([]string, []float64) {
	system := d.opts.System
	if d.system != "" {
		system = d.system
	}
	switch {
	case len(d.passages) == 0:
		return []string{d.renderChat(system, "", query)}, []float64{0}
	case d.mode == ContextAggregation:
		passages, n := "", 0
		for _, p := range d.passages {
			if p.Text == "" {
				continue // one prompt is closed-book and open-book at once
			}
			n++
			passages += fmt.Sprintf("Passage %d:\n%s\n\n", n, p.Text)
		}
		return []string{d.renderChat(system, passages, query)}, []float64{0}
	}
	texts := make([]string, len(d.passages))
	for i, p := range d.passages {
		context := ""
		if p.Text != "" {
			context = "Passage:\n" + p.Text + "\n\n"
		}
		texts[i] = d.renderChat(system, context, query)
	}
	return texts, passageScores(d.passages)
}

// Next returns p^s for the next position (len(Generated())), decoding the
// pending tokens if needed. The slice is owned by the decoder and valid
// until the next call that changes its state.
func (d *Decoder) Next(ctx context.Context) ([]float32, error) {
	if d.nextValid {
		return d.next, nil
	}
	if err := d.forward(ctx, nil, false, nil); err != nil {
		return nil, err
	}
	return d.next, nil
}

// Push appends accepted tokens; they are decoded by the next Next or Verify.
func (d *Decoder) Push(toks ...engine.Token) {
	if len(toks) > 0 {
		d.gen = append(d.gen, toks...)
		d.nextValid = false
		d.bindEvidence()
	}
}

// bindEvidence gives the answer's new tokens their terms, as far as the
// kept distributions hold them.
func (d *Decoder) bindEvidence() {
	if d.ev.on {
		d.ev.bind(d.gen, len(d.prompts))
	}
}

// truncateKV keeps at most prompt + gen[:n] in every sequence.
func (d *Decoder) truncateKV(n int) error {
	for s, p := range d.prompts {
		keep := len(p) + n
		if keep >= d.held[s] {
			continue
		}
		if err := d.ectx.Truncate(s, keep); err != nil {
			return fmt.Errorf("decoder: rollback sequence %d: %w", s, err)
		}
		d.held[s] = keep
	}
	return nil
}

// Verify decodes the pending tokens and then draft on every sequence in one
// batch, and returns the len(draft)+1 mixtures: rows[i] is p^s after the
// pending tokens and draft[:i]. Follow it with Commit. The rows are owned by
// the decoder until the next Verify.
func (d *Decoder) Verify(ctx context.Context, draft []engine.Token) ([][]float32, error) {
	if len(draft) == 0 && d.nextValid {
		// The one row is the distribution already known: nothing to decode.
		d.resetMixes(1)
		copy(d.mixes[0], d.next)
		return d.mixes[:1], nil
	}
	if err := d.forward(ctx, draft, true, nil); err != nil {
		return nil, err
	}
	return d.mixes[:len(draft)+1], nil
}

// Commit records the outcome of a Verify: the first accepted draft tokens
// stay in the KV cache and emit (accepted draft tokens then the correction)
// joins the answer; the rejected draft positions are removed everywhere.
func (d *Decoder) Commit(draft []engine.Token, accepted int, emit []engine.Token) error {
	if accepted < 0 || accepted > len(draft) || len(emit) != accepted+1 {
		return fmt.Errorf("decoder: %w: commit of %d accepted, %d emitted for a draft of %d", engine.ErrInvalidInput, accepted, len(emit), len(draft))
	}
	base := len(d.gen)
	d.gen = append(d.gen, emit...)
	d.nextValid = false
	// The rows past the last accepted draft token were mixed after
	// rejected ones.
	d.ev.dropAfter(base + accepted)
	d.bindEvidence()
	return d.truncateKV(base + accepted)
}

// forward brings every sequence's KV up to prompt+gen (+draft) in one
// batch (several when it exceeds the batch size) and computes the mixtures
// at the last len(draft)+1 positions (all rows when allRows).
func (d *Decoder) forward(ctx context.Context, draft []engine.Token, allRows bool, calib func(int, [][]engine.TokenLogit) error) error {
	nOut := len(draft) + 1
	d.resetMixes(nOut)
	d.ev.dropPass()
	// A token without its terms is decoded again from the row before it:
	// the pass then recomputes the next distribution too.
	missing := -1
	if d.ev.on {
		if missing = d.ev.firstMissing(len(d.gen)); missing >= 0 {
			d.nextValid = false
		}
	}
	if d.nextValid && len(draft) > 0 {
		// Nothing pending: the first row is the distribution already known.
		copy(d.mixes[0], d.next)
	}
	var wants []rowWant
	rows := 0
	var calRows [][][]engine.TokenLogit
	if calib != nil {
		calRows = make([][][]engine.TokenLogit, len(d.prompts))
	}
	d.batch.Reset()
	if !d.nextValid {
		// The distribution after the answer comes from the row of its last
		// token: when the KV holds that token already (after a Rewind),
		// decode it again.
		for s, p := range d.prompts {
			if s < len(d.known) && d.known[s] != nil {
				continue // its distribution came with its cached prefix
			}
			last := len(p) + len(d.gen) - 1
			if missing >= 0 {
				last = min(last, len(p)+missing-1)
			}
			if d.held[s] > last {
				if err := d.ectx.Truncate(s, last); err != nil {
					return fmt.Errorf("decoder: sequence %d: %w", s, err)
				}
				d.held[s] = last
			}
		}
	}
	saved := append([]int(nil), d.held...)
	flush := func() (err error) {
		wants, err = d.decodeBatch(ctx, wants, calRows)
		return err
	}
	for s, prompt := range d.prompts {
		start := d.held[s]
		full := len(prompt) + len(d.gen) + len(draft)
		if full > d.opts.CtxPerSeq {
			return fmt.Errorf("decoder: %w: sequence %d would hold %d positions, more than %d", engine.ErrContextFull, s, full, d.opts.CtxPerSeq)
		}
		if calib != nil {
			calRows[s] = make([][]engine.TokenLogit, len(prompt))
		}
		for pos := start; pos < full; pos++ {
			tok := d.tokenAt(prompt, pos, draft)
			out := nOut - (full - pos) // mixture index of this row's output
			w := rowWant{seq: s, out: out, prow: -1}
			if out < 0 || (!allRows && out != nOut-1) {
				w.out = -1
			}
			if calib != nil && pos < len(prompt) {
				w.prow = pos
			}
			if q := pos - len(prompt) + 1; w.out < 0 && d.ev.on && q >= 0 && d.ev.missing(q, s) {
				w.term = q + 1
			}
			d.batch.Add(tok, pos, w.out >= 0 || w.prow >= 0 || w.term > 0, s)
			wants = append(wants, w)
			rows++
			if d.batch.Len() == d.opts.BatchSize {
				if err := flush(); err != nil {
					return d.undo(saved, err)
				}
			}
		}
	}
	err := d.addBranchRows(func(w rowWant, tok engine.Token, pos, seq int) error {
		d.batch.Add(tok, pos, w.hedge > 0, seq)
		wants = append(wants, w)
		if d.batch.Len() == d.opts.BatchSize {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return d.undo(saved, errors.Join(err, d.undoBranches()))
	}
	d.branchesDecoded()
	if d.ordered {
		if err := d.mixOrdered(); err != nil {
			return d.undo(saved, err)
		}
	} else if rows == 0 {
		return fmt.Errorf("decoder: internal error: nothing to decode for the next position")
	}
	for s, p := range d.prompts {
		d.held[s] = len(p) + len(d.gen) + len(draft)
	}
	if d.ev.on {
		d.ev.endPass(len(d.gen))
	}
	copy(d.next, d.mixes[nOut-1])
	d.nextValid = len(draft) == 0
	if calib != nil {
		for s, rows := range calRows {
			if err := calib(s, rows); err != nil {
				return err
			}
		}
	}
	return nil
}

const calibK = 4

// resetMixes zeroes the first n mixtures, allocating what is missing.
func (d *Decoder) resetMixes(n int) {
	for len(d.mixes) < n {
		d.mixes = append(d.mixes, make([]float32, d.vocab))
	}
	for _, m := range d.mixes[:n] {
		clear(m)
	}
}

// rowWant is what one row of d.batch is for: its passage (seq), the
// mixture its distribution joins (out; -1: none), the prompt position
// whose top-k calibration reads (prow; -1: none), the hedge branch whose
// next mixture it joins instead (hedge: slot+1; 0: none), and the answer
// position whose term it gives (term: position+1; 0: none).
type rowWant struct{ seq, out, prow, hedge, term int }

// decodeBatch runs d.batch (nothing when empty), mixes each row into its
// mixture, stores the top-k of calibration rows in calRows[seq][prow], and
// returns wants emptied with the batch.
func (d *Decoder) decodeBatch(ctx context.Context, wants []rowWant, calRows [][][]engine.TokenLogit) ([]rowWant, error) {
	if d.batch.Len() == 0 {
		return wants, nil
	}
	if err := d.ectx.Decode(ctx, &d.batch); err != nil {
		return wants, err
	}
	for row, w := range wants {
		if w.prow >= 0 {
			top, err := d.ectx.TopK(row, calibK, nil)
			if err != nil {
				return wants, err
			}
			calRows[w.seq][w.prow] = top
		}
		if w.hedge > 0 {
			if err := d.mixBranchRow(row, w.hedge-1, w.seq); err != nil {
				return wants, err
			}
			continue
		}
		if w.term > 0 {
			logits, err := d.ectx.Logits(row, d.logits)
			if err != nil {
				return wants, err
			}
			if err := d.termRow(w.term-1, w.seq, d.maskUnused(logits)); err != nil {
				return wants, err
			}
			continue
		}
		if w.out < 0 {
			continue
		}
		if d.ordered {
			// Mixed in sequence order once every row is in (mixOrdered).
			var err error
			if d.lastRow[w.seq], err = d.ectx.Logits(row, d.lastRow[w.seq]); err != nil {
				return wants, err
			}
			continue
		}
		if err := d.mixRow(row, w.out, w.seq); err != nil {
			return wants, err
		}
	}
	d.batch.Reset()
	return wants[:0], nil
}

// mixOrdered mixes each sequence's next-token distribution after its
// prompt, cached or just decoded, in sequence order: the order plain
// prefill mixes them in.
func (d *Decoder) mixOrdered() error {
	for s := range d.prompts {
		logits := d.lastRow[s]
		if s < len(d.known) && d.known[s] != nil {
			logits = d.known[s]
		}
		if len(logits) == 0 {
			return fmt.Errorf("decoder: internal error: no distribution for sequence %d", s)
		}
		switch {
		case d.ev.on:
			logits = d.maskUnused(append(d.ev.slot(0, s, len(d.prompts)), logits...))
		case len(d.unused) > 0:
			// Cached logits are shared with other decoders: mask a copy.
			logits = d.maskUnused(append(d.logits[:0], logits...))
		}
		logZ, err := vecmath.SoftmaxMix(d.mixes[0], logits, d.w[s])
		if err != nil {
			return fmt.Errorf("decoder: passage %d: %w", s, err)
		}
		if d.ev.on {
			d.ev.set(0, s, logits, logZ)
		}
	}
	return nil
}

// mixBranchRow adds batch row row's next-token distribution, weighted by
// passage seq's document weight, into hedge branch h's next mixture.
func (d *Decoder) mixBranchRow(row, h, seq int) error {
	logits, err := d.ectx.Logits(row, d.logits)
	if err != nil {
		return err
	}
	if _, err := vecmath.SoftmaxMix(d.hedges[h].next, d.maskUnused(logits), d.w[seq]); err != nil {
		return fmt.Errorf("decoder: branch %d, passage %d: %w", h, seq, err)
	}
	return nil
}

// mixRow adds batch row row's next-token distribution, weighted by passage
// seq's document weight, into mixture out.
func (d *Decoder) mixRow(row, out, seq int) error {
	buf := d.logits
	if d.ev.on {
		// Kept for the term of whatever token is decided there.
		buf = d.ev.slot(out, seq, len(d.prompts))
	}
	logits, err := d.ectx.Logits(row, buf)
	if err != nil {
		return err
	}
	logZ, err := vecmath.SoftmaxMix(d.mixes[out], d.maskUnused(logits), d.w[seq])
	if err != nil {
		return fmt.Errorf("decoder: passage %d: %w", seq, err)
	}
	if d.ev.on {
		d.ev.set(out, seq, logits, logZ)
	}
	return nil
}

// maskUnused sets the logits of the ids the tokenizer marks unused (the
// padding rows of Qwen2.5's output matrix) to -Inf, so that no side's
// distribution, and so no mixture, gives them mass.
func (d *Decoder) maskUnused(logits []float32) []float32 {
	for _, t := range d.unused {
		if int(t) < len(logits) {
			logits[t] = float32(math.Inf(-1))
		}
	}
	return logits
}

// maxSeqs is llama.cpp's limit on the sequences of one context.
const maxSeqs = 256

func (d *Decoder) tokenAt(prompt []engine.Token, pos int, draft []engine.Token) engine.Token {
	if pos < len(prompt) {
		return prompt[pos]
	}
	if i := pos - len(prompt); i < len(d.gen) {
		return d.gen[i]
	}
	return draft[pos-len(prompt)-len(d.gen)]
}

// undo returns every sequence to what it held before a failed forward (an
// earlier batch of a split forward may have succeeded).
func (d *Decoder) undo(held []int, err error) error {
	for s, n := range held {
		if terr := d.ectx.Truncate(s, n); terr != nil {
			return errors.Join(err, terr)
		}
		d.held[s] = n
	}
	return fmt.Errorf("decoder: %w", err)
}

// SetScores replaces the current generation's passage scores, so the
// weights and h̃ of every mixture made from now on: teacher-forced
// evaluation of dynamic weights (nodebench.NLLDynamic), which verifies a
// known continuation in chunks. Step keeps its own epochs instead.
func (d *Decoder) SetScores(scores []float64) error {
	if len(scores) != len(d.prompts) {
		return fmt.Errorf("decoder: %w: %d scores for %d sequences", engine.ErrInvalidInput, len(scores), len(d.prompts))
	}
	d.w, d.hTilde = weights(scores)
	return nil
}

// dropEpochsAfter forgets the weights of positions past n, whose answer
// prefix the token at n is part of: an epoch from b was made from the
// answer's first b tokens, so it outlives a change at n only if b ≤ n.
// (syncWeights drops those past the answer's end; this drops the one that
// starts right after a rewound token, whose position the answer reaches
// again.)
func (d *Decoder) dropEpochsAfter(n int) {
	for len(d.epochs) > 1 && d.epochs[len(d.epochs)-1].from > n {
		d.epochs = d.epochs[:len(d.epochs)-1]
	}
}

// weightsEvery is how many answer tokens the weights hold (0: all).
func (d *Decoder) weightsEvery() int {
	switch {
	case d.posterior > 0:
		return d.posterior
	case d.opts.RescoreEvery > 0 && d.opts.Rescore != nil:
		return d.opts.RescoreEvery
	}
	return 0
}

// epochScores are the passages' scores from answer position b on: the
// first epoch's plus their evidence of the answer's first b tokens
// (posterior weights), or the re-scorer's against them.
func (d *Decoder) epochScores(ctx context.Context, b int) ([]float64, error) {
	if d.posterior > 0 {
		if d.ev.firstMissing(b) >= 0 {
			// The pass that decodes the missing terms mixes the next
			// token's distribution under the last epoch's weights: it is
			// mixed again under the new ones.
			if err := d.forward(ctx, nil, false, nil); err != nil {
				return nil, err
			}
			d.nextValid = false
		}
		ll, err := d.Evidence(ctx, b)
		if err != nil {
			return nil, fmt.Errorf("decoder: posterior weights at token %d: %w", b, err)
		}
		scores := passageScores(d.passages)
		for i := range scores {
			scores[i] += ll[i]
		}
		return scores, nil
	}
	detok := engine.NewDetokenizer(d.model)
	var answer strings.Builder
	for _, t := range d.gen[:b] {
		answer.WriteString(detok.Add(t))
	}
	answer.WriteString(detok.Flush())
	scores, err := d.opts.Rescore(ctx, d.query, answer.String(), d.passages)
	if err != nil {
		return nil, fmt.Errorf("decoder: rescore at token %d: %w", b, err)
	}
	if len(scores) != len(d.passages) {
		return nil, fmt.Errorf("decoder: rescore returned %d scores for %d passages", len(scores), len(d.passages))
	}
	return scores, nil
}

// weightEpoch is the document weights from answer position from on.
type weightEpoch struct {
	from   int
	w      []float32
	hTilde float64
}

// dynamic reports whether the weights follow the answer
// (Options.RescoreEvery, PosteriorEvery).
func (d *Decoder) dynamic() bool {
	return d.weightsEvery() > 0 && len(d.passages) > 0 &&
		len(d.passages) == len(d.prompts) && d.mode != ContextAggregation
}

// syncWeights makes the weights those of answer position len(gen): the
// epoch starting at b = ⌊len(gen)/every⌋·every, scored against the
// answer's first b tokens (scored now if no epoch starts there, dropping
// epochs a rewind left behind). It returns how many positions, from
// len(gen), keep these weights: no forward pass may mix past them.
func (d *Decoder) syncWeights(ctx context.Context) (int, error) {
	if !d.dynamic() {
		return math.MaxInt, nil
	}
	every, n := d.weightsEvery(), len(d.gen)
	b := n / every * every
	for len(d.epochs) > 1 && d.epochs[len(d.epochs)-1].from > b {
		d.epochs = d.epochs[:len(d.epochs)-1]
	}
	if last := d.epochs[len(d.epochs)-1]; last.from != b {
		scores, err := d.epochScores(ctx, b)
		if err != nil {
			return 0, err
		}
		w, hTilde := weights(scores)
		d.epochs = append(d.epochs, weightEpoch{from: b, w: w, hTilde: hTilde})
	}
	e := d.epochs[len(d.epochs)-1]
	// A mixture already made for position len(gen) exists only after
	// Begin (position 0, the first epoch's) and within a step.
	d.w, d.hTilde = e.w, e.hTilde
	return b + every - n, nil
}

// since is a tiny helper for millisecond timings.
func since(t time.Time) float64 { return float64(time.Since(t).Nanoseconds()) / 1e6 }
