package session

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/engine"
)

// hedger decides which of this side's drafts to hedge (issue 42; the rule
// is DESIGN-NOTES' "Hedge width"). A hedge of draft d's runner-up is a
// branch that costs this side Δc a pass for every pass it lives (the rows
// of one more answer: c(n·(b+2)) − c(n·(b+1)) for n passages with b
// branches live, from the decoder's measured table of pass costs), and
// that saves the c of every one of those passes the answer would
// otherwise wait for the corrected draft, when the aggregator decides the
// runner-up. So it pays when
//
//	P(hit | q) · c > Δc,
//
// q the draft's own probability, and P(hit | q) the share of this side's
// decided drafts of probability below q whose step took their runner-up,
// counted over the answer (buckets at aggregator.HedgeThresholds, from a
// prior of 1 hit in 12). Where extra rows cost nearly nothing (a GPU) it
// hedges every uncertain draft; on a CPU whose extra rows cost a third of
// a pass, only drafts whose runner-up wins a third of the time. A side
// hedges only while the peer aggregates: its own rejections cost it one
// decode.
type hedger struct {
	// below, when > 0, replaces the rule: hedge every draft of probability
	// under it (experiments).
	below float64

	mu      sync.Mutex
	buckets [len(aggregator.HedgeThresholds)]struct{ seen, hits float64 }
	// sent are this side's undecided main drafts by step.
	sent map[uint64]sentDraft
}

type sentDraft struct {
	epoch    uint32
	prob     float32
	runnerUp int32
}

const (
	hedgePriorHits = 1
	hedgePriorSeen = 12
)

func newHedger(below float64) *hedger {
	return &hedger{below: below, sent: map[uint64]sentDraft{}}
}

// drafted notes a main draft of this side as the Node takes it.
func (h *hedger) drafted(d *aggregator.Draft) {
	if _, branch := d.Fork(); branch {
		return
	}
	alt, _ := d.RunnerUp()
	h.mu.Lock()
	h.sent[d.Step()] = sentDraft{epoch: d.Epoch(), prob: d.Dist().Prob(d.Token()), runnerUp: alt}
	h.mu.Unlock()
}

// decided counts a decided step of this side's draft.
func (h *hedger) decided(v aggregator.Verdict, self aggregator.Side) {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := self.Index()
	s, ok := h.sent[v.Step]
	delete(h.sent, v.Step)
	if !ok || s.epoch != v.Epoch[i] {
		return
	}
	hit := !v.Accept[i] && v.Target == s.runnerUp
	for k, t := range aggregator.HedgeThresholds {
		if s.prob < t {
			h.buckets[k].seen++
			if hit {
				h.buckets[k].hits++
			}
		}
	}
}

// hitRate is P(hit | q): the rate of the smallest bucket q falls in; a
// draft above every threshold is never hedged.
func (h *hedger) hitRate(q float32) float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, t := range aggregator.HedgeThresholds {
		if q < t {
			b := h.buckets[k]
			return (b.hits + hedgePriorHits) / (b.seen + hedgePriorSeen)
		}
	}
	return 0
}

// should says whether to hedge a draft of probability q whose side
// decodes a token in perTokenMS and would pay extraMS a pass for the
// branch.
func (h *hedger) should(q float32, perTokenMS, extraMS float64) bool {
	if h.below > 0 {
		return float64(q) < h.below
	}
	return h.hitRate(q)*perTokenMS > extraMS
}

// liveHedge is a hedge of this side whose branch the decoder decodes.
type liveHedge struct {
	slot  int
	fork  uint64
	epoch uint32
}

// adopt makes the branch of the hedge at step the decoder's answer.
func (r *run) adopt(live []liveHedge, step uint64) error {
	for _, h := range live {
		if h.fork == step {
			if err := r.dec.AdoptBranch(h.slot); err != nil {
				return fmt.Errorf("session: adopt the hedge at step %d: %w", step, err)
			}
			return nil
		}
	}
	return fmt.Errorf("session: internal error: the hedge at step %d was adopted, but this side no longer decodes it", step)
}

// pruneHedges drops the branches of hedges whose step was decided on the
// main chain's draft (before settled, and not adopted: an adoption would
// be pending).
func (r *run) pruneHedges(live []liveHedge, settled uint64) ([]liveHedge, error) {
	kept := live[:0]
	for _, h := range live {
		if h.fork >= settled {
			kept = append(kept, h)
			continue
		}
		if err := r.dec.DropBranch(h.slot); err != nil {
			return nil, fmt.Errorf("session: %w", err)
		}
	}
	return kept, nil
}

// extendHedges drafts the next step of every live branch the last pass
// decoded, within the negotiated depth and the answer's length, and
// appends the drafts to burst.
func (r *run) extendHedges(prop *aggregator.Proposer, live []liveHedge, burst []aggregator.Draft, meta aggregator.Meta) ([]aggregator.Draft, error) {
	var probs, scores []float32
	for _, h := range live {
		mix := r.dec.BranchNext(h.slot)
		fork, toks, ok := r.dec.Branch(h.slot)
		if mix == nil || !ok || r.model.IsEOG(toks[len(toks)-1]) {
			continue
		}
		step := uint64(fork + len(toks))
		if step-h.fork > uint64(r.opts.HedgeDepth) || step >= uint64(r.opts.MaxTokens) {
			continue
		}
		hist := append(slices.Clone(r.dec.Generated()[:fork]), toks...)
		probs, scores = r.process(mix, hist, probs, scores)
		d, err := prop.ProposeBranch(probs, step, h.epoch, r.dec.HTilde(), h.fork)
		if err != nil {
			return nil, err
		}
		d.Meta = meta
		d.Meta.Context += uint32(step)
		if err := r.dec.PushBranch(h.slot, d.Token()); err != nil {
			if errors.Is(err, engine.ErrContextFull) {
				continue
			}
			return nil, fmt.Errorf("session: %w", err)
		}
		burst = append(burst, d)
	}
	return burst, nil
}

// openHedges hedges the runner-up of the burst's main drafts that the
// rule picks, while the peer aggregates, the drafts were made without the
// peer's draft of their step, and slots are free; the decoder forks each
// one's branch, decoded from the next pass on.
func (r *run) openHedges(live []liveHedge, burst []aggregator.Draft, blind map[int]bool, epoch uint32, perTokenMS float64) ([]liveHedge, error) {
	limit := min(r.opts.hedges(), r.dec.Hedges())
	if limit == 0 || r.aggregating.Load() {
		return live, nil
	}
	table, n := r.dec.VerifyTable(), r.dec.Seqs()
	for i := range burst {
		d := &burst[i]
		if len(live) >= limit {
			break
		}
		if _, branch := d.Fork(); branch || !blind[int(d.Step())] || d.Epoch() != epoch || r.model.IsEOG(d.Token()) {
			continue
		}
		alt, ok := d.RunnerUp()
		if !ok {
			continue
		}
		b := len(live)
		extra := table.At(n*(b+2)) - table.At(n*(b+1))
		if !r.hedge.should(d.Dist().Prob(d.Token()), perTokenMS, extra) {
			continue
		}
		slot, err := r.dec.Fork(int(d.Step()), alt)
		if err != nil {
			return nil, fmt.Errorf("session: %w", err)
		}
		hd, err := d.WithHedge(alt)
		if err != nil {
			return nil, err
		}
		*d = hd
		live = append(live, liveHedge{slot: slot, fork: d.Step(), epoch: epoch})
	}
	return live, nil
}
