package specdec

import (
	"errors"
	"fmt"
)

// ErrInvalid reports a caller error: bad options, unknown document, a
// rollback past the prompt, mismatched slice lengths.
var ErrInvalid = errors.New("spec: invalid argument")

// Options configure local speculative decoding.
type Options struct {
	Enabled bool
	// MaxDraft is the longest linear draft and the deepest tree.
	MaxDraft int
	// TreeBudget is the most draft nodes of a token tree; at most 1 means
	// linear drafts.
	TreeBudget int
	// Branching is the most children a tree node is offered.
	Branching int
	// Calibration hangs the model's own likely successors off context
	// positions (sd.npu §3.3). They rank the context's continuations and
	// continue where the context does not, but never displace the
	// context's own continuation (Index.Best).
	Calibration bool
	// Reuse re-offers the plausible tail of a rejected draft (sd.npu §3.4)
	// where it fits: right after the correction, or once the answer
	// reaches the draft token it followed.
	Reuse bool
	// ReuseBudget is how many drafted tokens a held segment survives: it is
	// dropped once verified, or once drafts made while holding it add up
	// past the budget.
	ReuseBudget int
	Calibrate   CalibrationOptions
}

// CalibrationOptions shape the calibrated paths.
type CalibrationOptions struct {
	// MinProb is the smallest successor probability followed.
	MinProb float32
	// MinJoint is the smallest probability of a whole path.
	MinJoint float32
	// MaxDepth is the most calibrated tokens hung off one context position.
	MaxDepth int
	// Weight scales a calibrated node's probability into occurrences: a
	// successor with probability p counts Weight·p times, against 1 for a
	// context occurrence, so a confident model (p > 1/Weight) outvotes
	// the raw context.
	Weight float32
	// MaxOrder is the longest n-gram looked up in the context to find where
	// to read the successors of a calibrated token.
	MaxOrder int
}

// TreeBudget of token trees when they are turned on.
const DefaultTreeBudget = 16

// DefaultOptions: linear drafts up to 8 tokens from the context (lookup)
// under the cost model. In-context calibration and draft reuse are
// opt-in, for they do not pay here (docs/EXPERIMENTS.md, E5): under the
// cost model calibration moves tokens per forward pass by no more than 2%
// either way while asking the prefill for every prompt row's logits makes
// the prefill a quarter to a third longer, and reused segments land where
// nothing else is proposed and are hardly ever accepted. Token trees (TreeBudget > 1,
// e.g. DefaultTreeBudget) are opt-in too: each branch is a KV stream of its
// own per passage, and on a 2-core CPU the cost model hardly ever grows one
// unless the weights are read from storage (docs/BENCHMARKS.md).
func DefaultOptions() Options {
	return Options{
		Enabled:     true,
		MaxDraft:    8,
		TreeBudget:  1,
		Branching:   3,
		Calibration: false,
		Reuse:       false,
		ReuseBudget: 16,
		Calibrate: CalibrationOptions{
			MinProb:  0.1,
			MinJoint: 0.05,
			MaxDepth: 4,
			Weight:   4,
			MaxOrder: 3,
		},
	}
}

// Validate checks the options.
func (o Options) Validate() error {
	c := o.Calibrate
	switch {
	case o.MaxDraft < 1:
		return fmt.Errorf("%w: MaxDraft %d < 1", ErrInvalid, o.MaxDraft)
	case o.TreeBudget < 0:
		return fmt.Errorf("%w: TreeBudget %d < 0", ErrInvalid, o.TreeBudget)
	case o.Branching < 1:
		return fmt.Errorf("%w: Branching %d < 1", ErrInvalid, o.Branching)
	case o.ReuseBudget < 0:
		return fmt.Errorf("%w: ReuseBudget %d < 0", ErrInvalid, o.ReuseBudget)
	case c.MinProb < 0 || c.MinProb > 1 || c.MinJoint < 0 || c.MinJoint > 1:
		return fmt.Errorf("%w: calibration probabilities %v, %v outside [0, 1]", ErrInvalid, c.MinProb, c.MinJoint)
	case c.MaxDepth < 1 || c.MaxOrder < 1 || c.Weight <= 0:
		return fmt.Errorf("%w: calibration MaxDepth %d, MaxOrder %d, Weight %v must be positive", ErrInvalid, c.MaxDepth, c.MaxOrder, c.Weight)
	}
	return nil
}

// Stats are plain counters for export as metrics.
type Stats struct {
	Steps          uint64 // verification passes
	Drafts         uint64 // passes that verified at least one draft token
	DraftedTokens  uint64
	AcceptedTokens uint64
	ReusedDrafts   uint64 // drafts that came from a reused segment
	BranchedTrees  uint64 // drafts that were token trees of several branches
	// ByOrigin splits the linear drafts (RecordDraft) by where they came
	// from, indexed by Origin.
	ByOrigin [numOrigins]OriginStats
}

// OriginStats count the verified drafts of one Origin.
type OriginStats struct {
	Drafts, DraftedTokens, AcceptedTokens uint64
}

// RecordDraft is Record for a linear draft from src, also counted under
// ByOrigin.
func (s *Stats) RecordDraft(src Origin, drafted, accepted int) {
	s.Record(drafted, accepted, src == OriginReuse)
	s.CountOrigin(src, drafted, accepted)
}

// CountOrigin counts a draft from src under ByOrigin alone: a draft
// model's chain verified inside a token tree, whose pass RecordTree
// counts.
func (s *Stats) CountOrigin(src Origin, drafted, accepted int) {
	if drafted == 0 {
		return
	}
	b := &s.ByOrigin[src]
	b.Drafts++
	b.DraftedTokens += uint64(drafted)
	b.AcceptedTokens += uint64(accepted)
}

// Add adds o's counters to s.
func (s *Stats) Add(o Stats) {
	s.Steps += o.Steps
	s.Drafts += o.Drafts
	s.DraftedTokens += o.DraftedTokens
	s.AcceptedTokens += o.AcceptedTokens
	s.ReusedDrafts += o.ReusedDrafts
	s.BranchedTrees += o.BranchedTrees
	for i, b := range o.ByOrigin {
		s.ByOrigin[i].Drafts += b.Drafts
		s.ByOrigin[i].DraftedTokens += b.DraftedTokens
		s.ByOrigin[i].AcceptedTokens += b.AcceptedTokens
	}
}

// Record counts one verification pass of drafted tokens.
func (s *Stats) Record(drafted, accepted int, reused bool) {
	s.Steps++
	if drafted == 0 {
		return
	}
	s.Drafts++
	s.DraftedTokens += uint64(drafted)
	s.AcceptedTokens += uint64(accepted)
	if reused {
		s.ReusedDrafts++
	}
}

// RecordTree counts one verification pass of a token tree.
func (s *Stats) RecordTree(t *Tree, accepted int) {
	s.Record(t.Size(), accepted, false)
	if len(t.Leaves) > 1 {
		s.BranchedTrees++
	}
}

// MeanAccepted is the mean number of accepted draft tokens per draft.
func (s Stats) MeanAccepted() float64 {
	if s.Drafts == 0 {
		return 0
	}
	return float64(s.AcceptedTokens) / float64(s.Drafts)
}
